//! A GPT as a Hugging Face directory: `config.json` (a `GPT2Config`) and `model.safetensors`
//! with GPT-2's tensor names and layouts, which `transformers` loads as `GPT2LMHeadModel`.
//! `coordinator export` writes one from a GPT's checkpoint; `--init DIR` reads one, so a
//! GPT-2-format checkpoint can be trained further by tabs.
//!
//! crowdtrain's layout already is GPT-2's (`Conv1D` weights `[in, out]`), so the tensors go
//! as they are, under `transformer.` (as `save_pretrained` writes them). The output head is
//! tied to `wte` and not stored; on reading, `lm_head.weight` is accepted only if it is
//! `wte`, and the attention's mask buffers (`attn.bias`, `attn.masked_bias`) of older files
//! are ignored.

use std::path::{Path, PathBuf};

use model::gpt::GptSpec;
use model::Network;
use serde_json::{json, Value};

use super::tensors_file::{self, le_bytes};

/// The file names in the directory.
pub const CONFIG: &str = "config.json";
pub const WEIGHTS: &str = "model.safetensors";
const PREFIX: &str = "transformer.";

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

fn invalid(path: &Path, reason: impl Into<String>) -> HfError {
    HfError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// `config.json` for a GPT of this shape (dropout 0, GPT-2's GELU and epsilon).
pub fn config_json(spec: &GptSpec) -> String {
    let config = json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": spec.vocab,
        "n_positions": spec.context,
        "n_embd": spec.width,
        "n_layer": spec.layers,
        "n_head": spec.heads,
        "n_inner": null,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
    });
    serde_json::to_string_pretty(&config).expect("JSON") + "\n"
}

/// The GPT a `config.json` describes, refusing what crowdtrain does not compute.
pub fn parse_config(path: &Path, text: &str) -> Result<GptSpec, HfError> {
    let v: Value = serde_json::from_str(text).map_err(|e| invalid(path, e.to_string()))?;
    let get = |key: &str| -> Result<usize, HfError> {
        v.get(key)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| invalid(path, format!("`{key}` must be a whole number")))
    };
    let spec = GptSpec {
        vocab: get("vocab_size")?,
        context: get("n_positions")?,
        layers: get("n_layer")?,
        heads: get("n_head")?,
        width: get("n_embd")?,
    };
    spec.check().map_err(|e| invalid(path, e))?;
    let is =
        |key: &str, want: Value, default: Value| v.get(key).cloned().unwrap_or(default) == want;
    if v.get("model_type").and_then(Value::as_str) != Some("gpt2") {
        return Err(invalid(path, "`model_type` must be \"gpt2\""));
    }
    if !is("activation_function", json!("gelu_new"), json!("gelu_new")) {
        return Err(invalid(
            path,
            "only `activation_function` \"gelu_new\" (GPT-2's) is computed",
        ));
    }
    let inner = v.get("n_inner").cloned().unwrap_or(Value::Null);
    if !(inner.is_null() || inner.as_u64() == Some(4 * spec.width as u64)) {
        return Err(invalid(
            path,
            "only `n_inner` null (4 × n_embd) is computed",
        ));
    }
    let eps = v
        .get("layer_norm_epsilon")
        .and_then(Value::as_f64)
        .unwrap_or(1e-5);
    if (eps - model::gpt::LN_EPS).abs() > 1e-12 {
        return Err(invalid(
            path,
            format!("only `layer_norm_epsilon` 1e-5 is computed, not {eps}"),
        ));
    }
    for (key, default) in [("scale_attn_weights", true), ("tie_word_embeddings", true)] {
        if !is(key, json!(default), json!(default)) {
            return Err(invalid(path, format!("only `{key}` {default} is computed")));
        }
    }
    for key in ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"] {
        if !is(key, json!(false), json!(false)) {
            return Err(invalid(path, format!("only `{key}` false is computed")));
        }
    }
    Ok(spec)
}

/// Writes `params` of the GPT `net` as a Hugging Face directory `dir` (created if need be;
/// each file written beside its place and renamed).
pub fn write_dir(dir: &Path, net: &Network, params: &[f32]) -> Result<(), HfError> {
    let gpt = net
        .as_gpt()
        .ok_or_else(|| invalid(dir, "only a GPT is written as a Hugging Face directory"))?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| HfError::Io { path, error }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let bytes = le_bytes(params);
    let names: Vec<String> = net
        .layout()
        .tensors()
        .iter()
        .map(|t| format!("{PREFIX}{}", t.name))
        .collect();
    let weights = tensors_file::encode(
        net.layout().tensors().iter().zip(&names).map(|(t, name)| {
            (
                name.as_str(),
                t.shape.as_slice(),
                &bytes[t.offset * 4..(t.offset + t.len()) * 4],
            )
        }),
        ("format", "pt".into()),
    );
    for (name, contents) in [
        (CONFIG, config_json(gpt.spec()).into_bytes()),
        (WEIGHTS, weights),
    ] {
        let path = dir.join(name);
        let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        std::fs::write(&temp, contents)
            .and_then(|()| std::fs::rename(&temp, &path))
            .map_err(io(&path))?;
    }
    Ok(())
}

/// Reads a Hugging Face GPT-2 directory: its shape, and its parameters in crowdtrain's
/// layout.
pub fn read_dir(dir: &Path) -> Result<(GptSpec, Vec<f32>), HfError> {
    let io = |path: PathBuf| move |error| HfError::Io { path, error };
    let config_path = dir.join(CONFIG);
    let text = std::fs::read_to_string(&config_path).map_err(io(config_path.clone()))?;
    let spec = parse_config(&config_path, &text)?;
    let net = Network::new(model::NetSpec::gpt(spec), spec.vocab)
        .map_err(|e| invalid(&config_path, e.to_string()))?;
    let path = dir.join(WEIGHTS);
    let bytes = std::fs::read(&path).map_err(io(path.clone()))?;
    let params = read_weights(&path, &bytes, &net)?;
    Ok((spec, params))
}

/// The tensors of `bytes`, named with or without `transformer.`, in `net`'s layout.
fn read_weights(path: &Path, bytes: &[u8], net: &Network) -> Result<Vec<f32>, HfError> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| invalid(path, format!("not a safetensors file: {e:?}")))?;
    let bare = |name: &str| name.strip_prefix(PREFIX).unwrap_or(name).to_string();
    let mut params = vec![0.0f32; net.param_count()];
    let mut seen = vec![false; net.layout().tensors().len()];
    let mut head = None;
    for (name, view) in st.tensors() {
        let key = bare(&name);
        if key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias") {
            continue; // the causal mask, a buffer of older files
        }
        let values = || -> Result<Vec<f32>, HfError> {
            if view.dtype() != safetensors::Dtype::F32 {
                return Err(invalid(
                    path,
                    format!("tensor {name:?} is {}, expected F32", view.dtype()),
                ));
            }
            Ok(view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        if key == "lm_head.weight" {
            head = Some((view.shape().to_vec(), values()?));
            continue;
        }
        let (i, t) = net
            .layout()
            .tensors()
            .iter()
            .enumerate()
            .find(|(_, t)| t.name == key)
            .ok_or_else(|| invalid(path, format!("tensor {name:?} is not one of a GPT-2's")))?;
        if view.shape() != t.shape.as_slice() {
            return Err(invalid(
                path,
                format!(
                    "tensor {name:?} has shape {:?}, expected {:?}",
                    view.shape(),
                    t.shape
                ),
            ));
        }
        params[t.range()].copy_from_slice(&values()?);
        seen[i] = true;
    }
    if let Some(missing) = net.layout().tensors().iter().zip(&seen).find(|(_, s)| !**s) {
        return Err(invalid(
            path,
            format!("tensor {:?} is missing", missing.0.name),
        ));
    }
    if let Some((_, head)) = head {
        let wte = &net.layout().tensors()[0];
        if head != params[wte.range()] {
            return Err(invalid(
                path,
                "`lm_head.weight` is not tied to `wte.weight`: crowdtrain's head is the embedding",
            ));
        }
    }
    if let Some(i) = params.iter().position(|p| !p.is_finite()) {
        return Err(invalid(path, format!("value {i} is not finite")));
    }
    Ok(params)
}

#[cfg(test)]
mod tests;

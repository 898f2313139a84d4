//! `coordinator export`: the newest valid checkpoint's parameters as a safetensors file, or,
//! for a GPT, as a Hugging Face directory (`storage::hf`).

use std::io::Write;
use std::path::{Path, PathBuf};

use model::ParamLayout;

use super::format::PARAMS;
use super::{CheckpointError, Store};

/// The checkpoint's network if it is a GPT (its spec is in the fingerprint).
pub(super) fn gpt_of(intact: &super::format::Intact) -> Result<Option<model::Network>, String> {
    let spec: Option<model::NetSpec> = intact
        .state()
        .ok()
        .and_then(|s| s.fingerprint.model.parse().ok());
    spec.and_then(|s| s.as_gpt())
        .map(|gpt| {
            model::Network::new(model::NetSpec::gpt(gpt), gpt.vocab).map_err(|e| e.to_string())
        })
        .transpose()
}

/// The tokeniser the checkpoint keeps, if any; `from` names it in errors.
pub(super) fn saved_tokenizer(
    intact: &super::format::Intact,
    from: &Path,
) -> Result<Option<crate::dataset::Tokenizer>, String> {
    let state = intact.state().map_err(|e| e.to_string())?;
    state
        .tokenizer
        .map(|saved| saved.tokenizer(&from.join(super::format::STATE)))
        .transpose()
}

/// What was exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub version: u64,
    pub from: PathBuf,
    pub bytes: usize,
}

/// Copies the newest intact checkpoint's `params.safetensors` in `dir` to `out`, written
/// to a temporary file beside it and renamed, so `out` is never half written. A GPT's is
/// written as the Hugging Face directory `out` (`config.json`, `model.safetensors`), with
/// the run's `tokenizer.json` beside them: the one given (checked first: it must load, and
/// have the model's vocabulary), else the one the checkpoint keeps, so that `transformers`
/// loads the tokeniser with the model. A character or byte tokeniser has no such file.
pub fn export(
    dir: &Path,
    out: &Path,
    tokenizer: Option<&Path>,
) -> Result<Exported, CheckpointError> {
    let store = Store::new(dir.to_path_buf(), usize::MAX, ParamLayout::default());
    let (from, intact, _) = store.newest_intact()?;
    let params = &intact.files[PARAMS];
    let fail = |reason: String| CheckpointError::Export {
        path: from.clone(),
        reason,
    };
    let net = gpt_of(&intact).map_err(fail)?;
    let given = match tokenizer {
        Some(file) => {
            let Some(gpt) = net.as_ref().and_then(model::Network::as_gpt) else {
                return Err(fail(
                    "--tokenizer: only a GPT has a tokeniser to export".into(),
                ));
            };
            let kind = crate::dataset::TokenizerKind::File(file.to_path_buf());
            let read = crate::dataset::Tokenizer::fit(&kind, "").map_err(fail)?;
            read.fits(gpt.spec().vocab).map_err(|e| {
                fail(format!(
                    "{}: {e}: give the run's tokenizer.json",
                    file.display()
                ))
            })?;
            Some(read)
        }
        None => None,
    };
    if let Some(net) = net {
        let kept = match given {
            Some(given) => Some(given),
            None => saved_tokenizer(&intact, &from).map_err(fail)?,
        };
        let json = match kept {
            Some(crate::dataset::Tokenizer::File(file)) => Some(file.json().to_owned()),
            _ => None,
        };
        let (values, _) = crate::storage::tensors_file::decode_params(params, net.layout())
            .map_err(|e| fail(e.to_string()))?;
        crate::storage::hf::write_dir(out, &net, &values).map_err(|e| fail(e.to_string()))?;
        if let Some(json) = json {
            let to = out.join("tokenizer.json");
            std::fs::write(&to, json)
                .map_err(|error| CheckpointError::Write { path: to, error })?;
        }
        return Ok(Exported {
            version: intact.version,
            from,
            bytes: params.len(),
        });
    }
    let temp = out.with_extension(format!("tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(params)?;
        file.sync_all()?;
        std::fs::rename(&temp, out)
    };
    write().map_err(|error| {
        let _ = std::fs::remove_file(&temp);
        CheckpointError::Write {
            path: out.to_path_buf(),
            error,
        }
    })?;
    Ok(Exported {
        version: intact.version,
        from,
        bytes: params.len(),
    })
}

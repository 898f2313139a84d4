//! A [`Checkpoint`] as files, and back, checking every byte on the way in.
//!
//! `MANIFEST` is text, one line per file with its size and CRC-32, ending with the CRC-32 of
//! everything above that line:
//!
//! ```text
//! crowdtrain checkpoint 1
//! version 120
//! file params.safetensors 407096 9c1d0e55
//! file optimizer.safetensors 814184 0b7e61a2
//! file state.json 1830 77a0c3f1
//! crc32 5d2f9a10
//! ```

use std::collections::HashMap;
use std::path::Path;

use model::{OptimizerState, ParamLayout};

use super::{Checkpoint, RunState};
use crate::storage::tensors_file::{self, TensorsFileError};

pub const MANIFEST: &str = "MANIFEST";
pub const PARAMS: &str = "params.safetensors";
pub const OPTIMIZER: &str = "optimizer.safetensors";
pub const STATE: &str = "state.json";
const FILES: [&str; 3] = [PARAMS, OPTIMIZER, STATE];
const HEADER: &str = "crowdtrain checkpoint 1";

/// Why a checkpoint cannot be used, naming the file at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Fault {
    #[error("{file}: {error}")]
    Io { file: String, error: String },
    #[error("{0} is missing")]
    Missing(String),
    #[error("MANIFEST: {0}")]
    Manifest(String),
    #[error("{file} is {got} bytes, the manifest says {expected} (truncated or overwritten)")]
    Size {
        file: String,
        expected: u64,
        got: u64,
    },
    #[error("{file}: checksum mismatch (the file was altered after it was written)")]
    Checksum { file: String },
    #[error("{file}: {error}")]
    Tensors {
        file: String,
        error: TensorsFileError,
    },
    #[error("state.json: {0}")]
    State(String),
}

/// The files of `checkpoint` (name, bytes), `MANIFEST` last.
pub fn encode(checkpoint: &Checkpoint, layout: &ParamLayout) -> Vec<(&'static str, Vec<u8>)> {
    let version = checkpoint.run.version.to_string();
    let params = tensors_file::encode_params(
        layout,
        &tensors_file::le_bytes(&checkpoint.params),
        ("round", version.clone()),
    );
    let optimizer = encode_optimizer(&checkpoint.optimizer);
    let state = serde_json::to_vec_pretty(&checkpoint.run).expect("plain data serialises");
    let files = vec![(PARAMS, params), (OPTIMIZER, optimizer), (STATE, state)];
    let mut manifest = format!("{HEADER}\nversion {version}\n");
    for (name, bytes) in &files {
        manifest += &format!(
            "file {name} {} {:08x}\n",
            bytes.len(),
            crc32fast::hash(bytes)
        );
    }
    manifest += &format!("crc32 {:08x}\n", crc32fast::hash(manifest.as_bytes()));
    let mut files = files;
    files.push((MANIFEST, manifest.into_bytes()));
    files
}

fn encode_optimizer(state: &OptimizerState) -> Vec<u8> {
    let shapes: Vec<[usize; 1]> = state.tensors.iter().map(|(_, v)| [v.len()]).collect();
    let bytes: Vec<Vec<u8>> = state
        .tensors
        .iter()
        .map(|(_, v)| tensors_file::le_bytes(v))
        .collect();
    tensors_file::encode(
        state
            .tensors
            .iter()
            .zip(&shapes)
            .zip(&bytes)
            .map(|(((name, _), shape), data)| (name.as_str(), &shape[..], data.as_slice())),
        ("step", state.step.to_string()),
    )
}

/// A checkpoint whose every file is present and matches its manifest.
#[derive(Debug)]
pub struct Intact {
    pub version: u64,
    pub files: HashMap<&'static str, Vec<u8>>,
}

/// Reads the checkpoint in `dir` and checks every file against `MANIFEST`.
pub fn read_intact(dir: &Path) -> Result<Intact, Fault> {
    let manifest = read(dir, MANIFEST)?;
    let (version, listed) = parse_manifest(&manifest)?;
    let mut files = HashMap::new();
    for name in FILES {
        let (size, crc) = listed
            .get(name)
            .copied()
            .ok_or_else(|| Fault::Manifest(format!("{name} is not listed")))?;
        let bytes = read(dir, name)?;
        if bytes.len() as u64 != size {
            return Err(Fault::Size {
                file: name.into(),
                expected: size,
                got: bytes.len() as u64,
            });
        }
        if crc32fast::hash(&bytes) != crc {
            return Err(Fault::Checksum { file: name.into() });
        }
        files.insert(name, bytes);
    }
    Ok(Intact { version, files })
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, Fault> {
    std::fs::read(dir.join(name)).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Fault::Missing(name.into()),
        _ => Fault::Io {
            file: name.into(),
            error: e.to_string(),
        },
    })
}

type Listed = HashMap<String, (u64, u32)>;

fn parse_manifest(bytes: &[u8]) -> Result<(u64, Listed), Fault> {
    let bad = |what: &str| Fault::Manifest(what.to_string());
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not text"))?;
    let body_end = text
        .trim_end_matches('\n')
        .rfind('\n')
        .map(|i| i + 1)
        .ok_or_else(|| bad("too short"))?;
    let (body, last) = text.split_at(body_end);
    let crc = last
        .trim_end()
        .strip_prefix("crc32 ")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| bad("no closing crc32 line (truncated?)"))?;
    if crc32fast::hash(body.as_bytes()) != crc {
        return Err(bad("checksum mismatch (the manifest was altered)"));
    }
    let mut lines = body.lines();
    if lines.next() != Some(HEADER) {
        return Err(bad(
            "not a crowdtrain checkpoint manifest, or another format",
        ));
    }
    let version = lines
        .next()
        .and_then(|l| l.strip_prefix("version "))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad("no version line"))?;
    let mut listed = Listed::new();
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        let parsed = match parts.as_slice() {
            ["file", name, size, crc] => size
                .parse()
                .ok()
                .zip(u32::from_str_radix(crc, 16).ok())
                .map(|entry| (name.to_string(), entry)),
            _ => None,
        };
        let (name, entry) = parsed.ok_or_else(|| bad(&format!("bad line {line:?}")))?;
        listed.insert(name, entry);
    }
    Ok((version, listed))
}

impl Intact {
    /// `state.json`, parsed.
    pub fn state(&self) -> Result<RunState, Fault> {
        let state: RunState =
            serde_json::from_slice(&self.files[STATE]).map_err(|e| Fault::State(e.to_string()))?;
        if state.version != self.version {
            return Err(Fault::State(format!(
                "version {} but the manifest says {}",
                state.version, self.version
            )));
        }
        Ok(state)
    }

    /// The whole checkpoint, its tensors checked against `layout` and the optimizer's
    /// tensor `names` (each one value per parameter).
    pub fn decode(
        &self,
        run: RunState,
        layout: &ParamLayout,
        names: &[String],
    ) -> Result<Checkpoint, Fault> {
        let tensors = |file: &'static str| {
            move |error| Fault::Tensors {
                file: file.into(),
                error,
            }
        };
        let (params, _) =
            tensors_file::decode_params(&self.files[PARAMS], layout).map_err(tensors(PARAMS))?;
        let shape = [layout.total()];
        let expected: Vec<(&str, &[usize])> =
            names.iter().map(|n| (n.as_str(), &shape[..])).collect();
        let (values, metadata) =
            tensors_file::decode(&self.files[OPTIMIZER], &expected).map_err(tensors(OPTIMIZER))?;
        let step = metadata
            .get("step")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Fault::Io {
                file: OPTIMIZER.into(),
                error: "no step count in its metadata".into(),
            })?;
        Ok(Checkpoint {
            params,
            optimizer: OptimizerState {
                step,
                tensors: names.iter().cloned().zip(values).collect(),
            },
            run,
        })
    }
}

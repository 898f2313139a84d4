//! `coordinator export`: the newest valid checkpoint's parameters as a safetensors file.

use std::io::Write;
use std::path::{Path, PathBuf};

use model::ParamLayout;

use super::format::PARAMS;
use super::{CheckpointError, Store};

/// What was exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub version: u64,
    pub from: PathBuf,
    pub bytes: usize,
}

/// Copies the newest intact checkpoint's `params.safetensors` in `dir` to `out`, written
/// to a temporary file beside it and renamed, so `out` is never half written.
pub fn export(dir: &Path, out: &Path) -> Result<Exported, CheckpointError> {
    let store = Store::new(dir.to_path_buf(), usize::MAX, ParamLayout::default());
    let (from, intact, _) = store.newest_intact()?;
    let params = &intact.files[PARAMS];
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

//! The checkpoint directory: atomic writes, the newest intact checkpoint, the last K kept.
//!
//! A write goes to `.tmp-ckpt-<version>-<pid>/`: each file is written and fsynced, then the
//! directory, then it is renamed to `ckpt-<version>` and the parent directory is fsynced.
//! A crash at any point leaves either the whole checkpoint or none of it under its name.
//! Older checkpoints are removed only after a newer one is in place, and nothing is removed
//! or rewritten while looking for one to resume from.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use model::ParamLayout;
use tracing::warn;

use super::format::{self, Fault, Intact};
use super::{Checkpoint, Fingerprint};

const PREFIX: &str = "ckpt-";
const TEMP_PREFIX: &str = ".tmp-ckpt-";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot write checkpoints to {}: {error}", dir.display())]
    Unwritable { dir: PathBuf, error: std::io::Error },
    #[error("writing {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("no checkpoint to resume from in {} (--resume needs one; drop --resume to start afresh)", dir.display())]
    Empty { dir: PathBuf },
    #[error("no valid checkpoint in {}, nothing was changed:{}", dir.display(), list(faults))]
    NoneValid {
        dir: PathBuf,
        faults: Vec<(PathBuf, Fault)>,
    },
    #[error("exporting {}: {reason}", path.display())]
    Export { path: PathBuf, reason: String },
    #[error("{} does not belong to this run; what differs:\n  {}", path.display(), differences.join("\n  "))]
    Incompatible {
        path: PathBuf,
        differences: Vec<String>,
    },
}

fn list(faults: &[(PathBuf, Fault)]) -> String {
    faults
        .iter()
        .map(|(path, fault)| format!("\n  {}: {fault}", path.display()))
        .collect()
}

/// A checkpoint read back, with the newer ones passed over and why.
#[derive(Debug)]
pub struct Loaded {
    pub checkpoint: Checkpoint,
    pub path: PathBuf,
    pub skipped: Vec<(PathBuf, Fault)>,
}

/// The checkpoint found (its path, what was read) and the newer ones passed over.
pub type Found<T> = (PathBuf, T, Vec<(PathBuf, Fault)>);

/// A checkpoint written: where, and how many bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub path: PathBuf,
    pub bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    keep: usize,
    layout: ParamLayout,
}

impl Store {
    pub fn new(dir: PathBuf, keep: usize, layout: ParamLayout) -> Self {
        Self {
            dir,
            keep: keep.max(1),
            layout,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the directory if needed and proves a file can be written, synced and removed
    /// there: a read-only or full disk is found at start, not at the first checkpoint.
    pub fn probe(&self) -> Result<(), CheckpointError> {
        let unwritable = |error| CheckpointError::Unwritable {
            dir: self.dir.clone(),
            error,
        };
        std::fs::create_dir_all(&self.dir).map_err(unwritable)?;
        let probe = self.dir.join(format!(".probe-{}", std::process::id()));
        let written = write_file(&probe, &[0u8; 64 * 1024]);
        let _ = std::fs::remove_file(&probe);
        written.map_err(unwritable)
    }

    /// The checkpoints in the directory, newest first.
    pub fn list(&self) -> std::io::Result<Vec<(u64, PathBuf)>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let version = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .filter(|v| v.len() == 12)
                .and_then(|v| v.parse::<u64>().ok());
            if let Some(version) = version {
                if entry.file_type()?.is_dir() {
                    found.push((version, entry.path()));
                }
            }
        }
        found.sort_by_key(|&(version, _)| std::cmp::Reverse(version));
        Ok(found)
    }

    /// The newest checkpoint whose files all match its manifest, with those passed over.
    pub fn newest_intact(&self) -> Result<Found<Intact>, CheckpointError> {
        self.newest(|_, intact| Ok(intact))
    }

    /// The newest valid checkpoint, checked against this run's `fingerprint` and shapes (the
    /// optimizer's tensor `names`). A corrupt one is passed over (and reported in
    /// [`Loaded::skipped`]); one from another run is an error, as is finding none.
    pub fn load_newest(
        &self,
        fingerprint: &Fingerprint,
        names: &[String],
    ) -> Result<Loaded, CheckpointError> {
        let (path, checkpoint, skipped) = self.newest(|path, intact| {
            let run = intact.state().map_err(Ok)?;
            let differences = run.fingerprint.differences(fingerprint);
            if !differences.is_empty() {
                return Err(Err(CheckpointError::Incompatible {
                    path: path.to_path_buf(),
                    differences,
                }));
            }
            intact.decode(run, &self.layout, names).map_err(Ok)
        })?;
        Ok(Loaded {
            checkpoint,
            path,
            skipped,
        })
    }

    /// Tries each checkpoint, newest first, with `accept`, which may pass one over (`Ok`
    /// fault) or stop the search (`Err` error).
    fn newest<T>(
        &self,
        accept: impl Fn(&Path, Intact) -> Result<T, Result<Fault, CheckpointError>>,
    ) -> Result<Found<T>, CheckpointError> {
        let listed = self.list().map_err(|error| CheckpointError::Unwritable {
            dir: self.dir.clone(),
            error,
        })?;
        if listed.is_empty() {
            return Err(CheckpointError::Empty {
                dir: self.dir.clone(),
            });
        }
        let mut skipped = Vec::new();
        for (_, path) in listed {
            let tried = format::read_intact(&path)
                .map_err(Ok)
                .and_then(|intact| accept(&path, intact));
            match tried {
                Ok(found) => return Ok((path, found, skipped)),
                Err(Ok(fault)) => {
                    warn!(checkpoint = %path.display(), %fault, "checkpoint passed over");
                    skipped.push((path, fault));
                }
                Err(Err(error)) => return Err(error),
            }
        }
        Err(CheckpointError::NoneValid {
            dir: self.dir.clone(),
            faults: skipped,
        })
    }

    /// Writes `checkpoint` atomically, then removes all but the newest `keep`.
    pub fn write(&self, checkpoint: &Checkpoint) -> Result<Written, CheckpointError> {
        let version = checkpoint.run.version;
        let files = format::encode(checkpoint, &self.layout);
        let name = format!("{PREFIX}{version:012}");
        let temp = self
            .dir
            .join(format!("{TEMP_PREFIX}{version:012}-{}", std::process::id()));
        let target = self.dir.join(&name);
        let written = self.write_into(&temp, &target, &files);
        if written.is_err() {
            let _ = std::fs::remove_dir_all(&temp);
        }
        written.map_err(|error| CheckpointError::Write {
            path: target.clone(),
            error,
        })?;
        self.prune();
        Ok(Written {
            path: target,
            bytes: files.iter().map(|(_, b)| b.len() as u64).sum(),
        })
    }

    fn write_into(
        &self,
        temp: &Path,
        target: &Path,
        files: &[(&'static str, Vec<u8>)],
    ) -> std::io::Result<()> {
        if temp.exists() {
            std::fs::remove_dir_all(temp)?;
        }
        std::fs::create_dir_all(temp)?;
        for (name, bytes) in files {
            write_file(&temp.join(name), bytes)?;
        }
        sync_dir(temp)?;
        // The same version again (a run resumed from an older checkpoint because this one was
        // corrupt): the new one replaces it, the old one is removed once the new is in place.
        let old = target.with_extension(format!("replaced-{}", std::process::id()));
        let replacing = target.exists();
        if replacing {
            std::fs::rename(target, &old)?;
        }
        if let Err(err) = std::fs::rename(temp, target) {
            if replacing {
                // Put the one it was to replace back where it was.
                let _ = std::fs::rename(&old, target);
            }
            return Err(err);
        }
        sync_dir(&self.dir)?;
        if replacing {
            let _ = std::fs::remove_dir_all(&old);
        }
        Ok(())
    }

    /// Removes all but the newest `keep` checkpoints, and leftovers of interrupted writes.
    fn prune(&self) {
        let Ok(listed) = self.list() else { return };
        for (_, path) in listed.into_iter().skip(self.keep) {
            if let Err(err) = std::fs::remove_dir_all(&path) {
                warn!(checkpoint = %path.display(), %err, "could not remove an old checkpoint");
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let leftover = entry.file_name().to_str().is_some_and(|n| {
                n.starts_with(TEMP_PREFIX) || (n.starts_with(PREFIX) && n.contains(".replaced-"))
            });
            if leftover {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Writes a new file readable by its owner only (it holds resume tokens) and syncs it.
fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

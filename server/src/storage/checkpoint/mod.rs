//! Checkpoints: everything a run needs to continue after its coordinator dies.
//!
//! A checkpoint is a directory `ckpt-<version, 12 digits>` in `--checkpoint-dir`, holding
//! `params.safetensors` (the parameters, one tensor per layer), `optimizer.safetensors`
//! (momentum or Adam's moments, the step count in its metadata), `state.json` (the round,
//! the RNG state, identities, bans, shard assignment, deadline and norm-bound history, counters,
//! last evaluation, and the [`Fingerprint`] of what it was trained with) and `MANIFEST`,
//! which gives every file's size and CRC-32 and ends with a CRC-32 of itself.
//!
//! Files: [`format`](mod@format) (a [`Checkpoint`] to files and back, checking every byte),
//! [`store`] (the directory: atomic writes, the newest intact one, keeping the last K),
//! [`writer`] (a thread that writes, so a round never waits on the disk), [`fingerprint`]
//! (what must match for a checkpoint to be resumed), [`export`](mod@export) (`coordinator export`).

pub mod export;
pub mod fingerprint;
pub mod format;
pub mod sample;
pub mod store;
pub mod writer;

mod saved;

use std::time::Duration;

use coordinator_core::Snapshot;
use model::{Evaluation, OptimizerState};
use serde::{Deserialize, Serialize};

pub use self::export::{export, Exported};
pub use self::fingerprint::Fingerprint;
pub use self::format::Fault;
pub use self::sample::{sample, Sampled};
pub use self::saved::{SavedBans, SavedTokenizer};
pub use self::store::{CheckpointError, Loaded, Store};
pub use self::writer::{Report, Writer};

/// One checkpoint, in memory: what the coordinator copies out, consistently, between two
/// events, and what [`Store::load_newest`] gives back.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub params: Vec<f32>,
    pub optimizer: OptimizerState,
    pub run: RunState,
}

impl Checkpoint {
    /// The core's copy as it goes to disk, with what it was trained with.
    pub fn of(
        snapshot: Snapshot,
        fingerprint: Fingerprint,
        tokenizer: Option<SavedTokenizer>,
    ) -> Self {
        let written_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self {
            params: snapshot.params,
            optimizer: snapshot.optimizer,
            run: RunState {
                version: snapshot.version,
                fingerprint,
                written_unix_ms,
                audit_rng: snapshot.audit_rng,
                next_worker: snapshot.next_worker,
                identities: snapshot.identities,
                shards: snapshot.shards,
                deadline_latencies_ns: snapshot
                    .deadline_latencies
                    .iter()
                    .map(|d| d.as_nanos() as u64)
                    .collect(),
                norm_history: snapshot.norm_history,
                counters: snapshot.counters.clone(),
                bans: SavedBans::from(&snapshot.bans),
                evaluation: snapshot.evaluation.map(|(v, e)| (v, e.loss, e.accuracy)),
                tokenizer,
            },
        }
    }

    /// What the core continues from.
    pub fn into_snapshot(self) -> Snapshot {
        let run = self.run;
        Snapshot {
            params: self.params,
            optimizer: self.optimizer,
            version: run.version,
            audit_rng: run.audit_rng,
            next_worker: run.next_worker,
            identities: run.identities,
            shards: run.shards,
            deadline_latencies: run
                .deadline_latencies_ns
                .iter()
                .map(|&ns| Duration::from_nanos(ns))
                .collect(),
            norm_history: run.norm_history,
            counters: run.counters,
            bans: run.bans.into(),
            evaluation: run
                .evaluation
                .map(|(version, loss, accuracy)| (version, Evaluation { loss, accuracy })),
        }
    }
}

/// `state.json`: everything but the tensors. Its own types all the way down, so renaming
/// something in the coordinator does not change the file format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunState {
    /// Updates applied: the round (sync) or version (async) the parameters are at.
    pub version: u64,
    pub fingerprint: Fingerprint,
    /// When it was taken, in milliseconds since the Unix epoch.
    pub written_unix_ms: u64,
    /// The recomputation sampler's state.
    pub audit_rng: u64,
    /// The id the next new worker gets.
    pub next_worker: u32,
    /// Resume tokens (secrets: the files are written readable by their owner only) and each
    /// identity's accepted gradients.
    pub identities: Vec<(String, u64)>,
    /// Who held which train samples: (worker id, first, end).
    pub shards: Vec<(u32, usize, usize)>,
    /// The adaptive deadline's answer latencies, in nanoseconds.
    pub deadline_latencies_ns: Vec<u64>,
    /// The adaptive norm bound's accepted norms.
    pub norm_history: Vec<f64>,
    pub counters: coordinator_core::counters::Counters,
    /// Banned workers and addresses, and strikes so far.
    #[serde(default)]
    pub bans: SavedBans,
    /// The last evaluation: (version, loss, accuracy).
    pub evaluation: Option<(u64, f64, f64)>,
    /// A language model's tokeniser (absent from a checkpoint written before it was kept,
    /// and for a model that does not read text).
    #[serde(default)]
    pub tokenizer: Option<SavedTokenizer>,
}

#[cfg(test)]
mod tests;

//! Everything a restart needs, as the coordinator copies it between two inputs (the
//! checkpoint's file format is the server's: `server::storage::checkpoint`).

use std::time::Duration;

use model::{Evaluation, OptimizerState};

use crate::counters::Counters;
use crate::registry::SavedBans;

/// Everything a restart needs, copied between two inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub params: Vec<f32>,
    pub optimizer: OptimizerState,
    /// Updates applied: the round (sync) or version (async) the parameters are at.
    pub version: u64,
    /// The recomputation sampler's state.
    pub audit_rng: u64,
    /// The id the next new worker gets.
    pub next_worker: u32,
    /// Resume tokens and each identity's accepted gradients.
    pub identities: Vec<(String, u64)>,
    /// Who held which train samples: (worker id, first, end).
    pub shards: Vec<(u32, usize, usize)>,
    /// The adaptive deadline's answer latencies.
    pub deadline_latencies: Vec<Duration>,
    /// The adaptive norm bound's accepted norms.
    pub norm_history: Vec<f64>,
    pub counters: Counters,
    /// Banned workers and addresses, and strikes so far.
    pub bans: SavedBans,
    /// The last evaluation and the version it scored.
    pub evaluation: Option<(u64, Evaluation)>,
}

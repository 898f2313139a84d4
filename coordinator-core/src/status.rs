//! What the coordinator publishes about itself: `/api/status` and the dashboard read it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Fewer workers than `--min-workers`: no round is open.
    #[default]
    Waiting,
    /// A round is open.
    Training,
    /// Training finished (a plateau, a target, `--max-rounds`): the coordinator serves the
    /// finished run until it is stopped (or exits, with `--exit-when-finished`).
    Done,
    /// The operator paused training (admin API); a round open then still completes.
    Paused,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct WorkerStatus {
    pub id: u32,
    pub kind: &'static str,
    /// It said its products fuse each multiply and add (a tab whose relaxed SIMD fuses),
    /// so its work is replayed fused.
    pub fused: bool,
    /// How its weights and gradients travel: `none`, `f16` or `int8`.
    pub compression: &'static str,
    /// When this connection joined, and its last gradient, in Unix milliseconds.
    pub connected_at_ms: u64,
    pub last_seen_ms: Option<u64>,
    /// Samples its gradients covered, a second, since it joined.
    pub samples_per_sec: Option<f64>,
    /// Gradients accepted from this worker.
    pub gradients: u64,
    /// Its gradients scaled down by the norm bound.
    pub clipped: u64,
    /// Its gradients the coordinator recomputed and found equal.
    pub verified: u64,
    /// Its gradients dropped, by reason: `late`, `stale`, `duplicate`, `round_not_open`,
    /// `not_participant`, `mismatch` (recomputed and found different).
    pub rejected: BTreeMap<&'static str, u64>,
    /// A GPU's committed phases: how many were challenged, the bytes of states it revealed,
    /// the segments the coordinator replayed and the milliseconds of a core they took.
    pub challenged: u64,
    pub bytes_revealed: u64,
    pub segments_replayed: u64,
    pub replay_ms: u64,
    /// Strikes against it (mismatches); at `--ban-after` it is banned.
    pub strikes: u32,
    /// Samples in its current shard (0 until its first round).
    pub shard_len: usize,
    /// Sync: missed too many deadlines in a row; not waited for until it answers again.
    pub skipped: bool,
    /// `--local-steps`: the length of its next phase.
    pub local_steps: Option<u32>,
    /// `--probation`: steps of accepted work it still owes before its answers are only
    /// sampled; 0: past probation. Every answer of a worker on probation is recomputed
    /// before it counts.
    pub probation_left: u32,
    /// The cores its latest answer was computed on (the parts it split its batches into:
    /// a tab's Web Workers, a native worker's `--threads`); 0: on a GPU (unordered).
    pub cores: u8,
    /// The compute time its answers reported, over its time connected (to its last
    /// answer); `None` before its first answer.
    pub compute_share: Option<f64>,
}

/// The latest closed round (or applied update, in async modes).
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct RoundReport {
    pub round: u64,
    /// Gradients in the update.
    pub answered: usize,
    /// Participants that had not answered when the deadline closed the round.
    pub missed: usize,
    /// Refused since the previous round: late (round already closed), stale (async, beyond
    /// --max-staleness), duplicate.
    pub late: u64,
    pub stale_rejected: u64,
    pub duplicate_rejected: u64,
    /// Closed by its deadline (with quorum) rather than by every participant answering.
    pub deadline_hit: bool,
    pub ms: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Status {
    pub state: State,
    /// `--role edge`: the whole run (every live edge, the root's version).
    pub cluster: Option<Arc<crate::remote::ClusterView>>,
    /// `sync`, `async` or `hogwild`.
    pub mode: &'static str,
    /// `mean`, `trimmed-mean` or `median`.
    pub aggregator: &'static str,
    /// Completed rounds, which is also the version of the current weights.
    pub round: u64,
    /// Connected (welcomed) workers.
    pub workers: usize,
    /// Participants of the open round, and how many of them have answered.
    pub round_participants: usize,
    pub round_answered: usize,
    /// Test-split accuracy and loss at the latest evaluation (null before the first).
    pub test_accuracy: Option<f64>,
    pub test_loss: Option<f64>,
    /// A language model's validation loss as perplexity and bits per token (null for
    /// other models, and before the first evaluation).
    pub language: Option<crate::language::LossReadings>,
    /// What a language model wrote after its latest evaluation.
    pub sample: Option<crate::Sample>,
    pub evaluated_round: Option<u64>,
    /// The version being evaluated now, off the coordinator's task, and the one waiting for
    /// it (one at most: a newer one replaces it, `evaluations_replaced`).
    pub evaluating: Option<u64>,
    pub evaluation_waiting: Option<u64>,
    /// Sample-weighted mean training loss reported for the latest round.
    pub train_loss: Option<f64>,
    /// The current bound on a gradient's L2 norm (`--max-grad-norm`, or adaptive).
    pub grad_norm_bound: f64,
    /// Seconds of a core spent recomputing answers off the coordinator's task
    /// (`--verify-cores`), and the answers held for it now, running or waiting.
    pub recompute_seconds: f64,
    pub recomputing: usize,
    /// `--replicate`: answers that agreed with a partner's, and disagreements recomputed.
    pub replicas_agreed: u64,
    pub replicas_disputed: u64,
    /// Bans, in order: `w7` (an identity), `address 203.0.113.5`.
    /// Shared, and rebuilt only when a ban is added (they only grow).
    pub bans: Arc<Vec<String>>,
    /// The current round timeout (sync).
    pub round_timeout_ms: Option<f64>,
    /// Workers skipped from the quorum for missing deadlines.
    pub skipped_workers: usize,
    pub last_round: Option<RoundReport>,
    pub last_round_ms: Option<f64>,
    /// The model's spec in its text form (`input 1x28x28; conv2d 16 k5 s1 p0; ...`).
    pub model: Arc<str>,
    /// `mlp`, `cnn` or the spec file it was read from.
    pub model_name: Arc<str>,
    pub param_count: usize,
    pub optimizer: Arc<str>,
    pub batch_size: u32,
    /// `--verify-cores`: the recomputations run at once, each on a core (the budget
    /// `recompute_seconds` is spent from).
    pub verify_cores: usize,
    /// What is being trained on.
    pub dataset: Arc<str>,
    /// Class names, by label.
    pub classes: Arc<Vec<String>>,
    /// Bytes both ways per sample trained on; `None` before the first update.
    pub bytes_per_sample: Option<f64>,
    /// `--local-steps`: the mean length of the latest phases (H̄); `None` without.
    pub local_steps: Option<f64>,
    /// The mean compute share of the workers that answered.
    pub utilisation: Option<f64>,
    /// Sync: the gradient noise scale against the crowd's batch (`noise.rs`); `None`
    /// before an update of two answers.
    pub noise_scale: Option<crate::noise::NoiseReport>,
    /// `--probation`: steps of accepted work a new identity owes (0: off).
    pub probation: u32,
    /// Connected workers on probation (their every answer is recomputed).
    pub on_probation: usize,
    /// `--checkpoint-dir`: what the checkpoint writer has done (absent without one; the
    /// driver that writes them fills it in).
    pub checkpoints: Option<Arc<CheckpointReport>>,
    /// Rebuilt when membership or a round changes (not per gradient) and shared, so the
    /// status can be republished after every event in O(1).
    pub worker_list: Arc<Vec<WorkerStatus>>,
    /// The run's counters (`counters.rs`), each a field of its own in the JSON.
    #[serde(flatten)]
    pub counters: crate::counters::Counters,
}

/// What the checkpoint writer has done, as `/api/status` shows it under `checkpoints`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CheckpointReport {
    pub dir: String,
    pub written: u64,
    pub failed: u64,
    /// Due while the disk was still busy with earlier ones.
    pub skipped_busy: u64,
    pub last_version: Option<u64>,
    pub last_bytes: u64,
    pub last_write_ms: f64,
    /// The last failure; cleared by the next success.
    pub last_error: Option<String>,
}

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
    /// `--max-rounds` or `--target-accuracy` was reached; the coordinator is stopping.
    Done,
    /// The operator paused training (admin API); a round open then still completes.
    Paused,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct WorkerStatus {
    pub id: u32,
    pub kind: &'static str,
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
    /// Sample-weighted mean training loss reported for the latest round.
    pub train_loss: Option<f64>,
    /// Training samples behind all applied gradients.
    pub samples_seen: u64,
    pub gradients_accepted: u64,
    /// Gradients refused for any reason (late, stale, duplicate, not a participant, ...).
    pub gradients_rejected: u64,
    /// Of those: arrived after their round closed.
    pub late: u64,
    /// Of those: async, computed on weights more than --max-staleness versions old.
    pub stale_rejected: u64,
    /// Of those: a second gradient for the same round (or the same weights, in async).
    pub duplicate_rejected: u64,
    /// Gradients longer than the norm bound, scaled down to it before they were combined.
    pub gradients_clipped: u64,
    /// The current bound on a gradient's L2 norm (`--max-grad-norm`, or adaptive).
    pub grad_norm_bound: f64,
    /// Updates not applied because they would have made a parameter non-finite.
    pub updates_refused: u64,
    /// Gradients recomputed by the coordinator (`--verify-fraction`), and of those the ones
    /// that did not match (dropped, a strike each).
    pub gradients_verified: u64,
    pub verification_mismatches: u64,
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
    /// Σ answers over applied rounds. With `round_answered` (the open round) it equals
    /// `gradients_accepted`: every accepted gradient is counted in exactly one round.
    pub answered_total: u64,
    /// Rounds closed by their deadline with quorum, and deadlines extended without quorum.
    pub deadline_closes: u64,
    pub deadline_extensions: u64,
    /// The current round timeout (sync).
    pub round_timeout_ms: Option<f64>,
    /// Workers skipped from the quorum for missing deadlines.
    pub skipped_workers: usize,
    /// Joins that resumed an earlier identity with its token.
    pub resumed: u64,
    pub last_round: Option<RoundReport>,
    /// Sessions closed for bad input (undecodable frame, wrong shape, NaN/Inf, ...).
    pub sessions_rejected: u64,
    pub last_round_ms: Option<f64>,
    /// The model's spec in its text form (`input 1x28x28; conv2d 16 k5 s1 p0; ...`).
    pub model: Arc<str>,
    /// `mlp`, `cnn` or the spec file it was read from.
    pub model_name: Arc<str>,
    pub param_count: usize,
    pub optimizer: Arc<str>,
    pub batch_size: u32,
    /// What is being trained on.
    pub dataset: Arc<str>,
    /// Class names, by label.
    pub classes: Arc<Vec<String>>,
    /// Bytes of gradient frames received, and of frames sent to workers.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Bytes both ways per sample trained on; `None` before the first update.
    pub bytes_per_sample: Option<f64>,
    /// `--local-steps`: the mean length of the latest phases (H̄); `None` without.
    pub local_steps: Option<f64>,
    /// The mean compute share of the workers that answered.
    pub utilisation: Option<f64>,
    /// `--probation`: steps of accepted work a new identity owes (0: off).
    pub probation: u32,
    /// Connected workers on probation (their every answer is recomputed).
    pub on_probation: usize,
    /// Answers recomputed because their worker was on probation (not sampled).
    pub probation_checks: u64,
    /// Answers of workers on probation dropped because they could not be recomputed (no
    /// room for their weights; no strike).
    pub probation_unchecked: u64,
    /// A ReLU model's GPU phases checked by segments: the near-tie branches their revealed
    /// logs named, and those the replay took only because they were logged (its own pass
    /// went the other way: a flip between the two float orders).
    pub branches_logged: u64,
    pub branches_forced: u64,
    /// `--checkpoint-dir`: what the checkpoint writer has done (absent without one; the
    /// driver that writes them fills it in).
    pub checkpoints: Option<Arc<CheckpointReport>>,
    /// Rebuilt when membership or a round changes (not per gradient) and shared, so the
    /// status can be republished after every event in O(1).
    pub worker_list: Arc<Vec<WorkerStatus>>,
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

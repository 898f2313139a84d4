//! What the coordinator publishes about itself: `/api/status` and the dashboard read it.

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
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkerStatus {
    pub id: u32,
    pub kind: &'static str,
    /// Gradients accepted from this worker.
    pub gradients: u64,
    /// Samples in its current shard (0 until its first round).
    pub shard_len: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Status {
    pub state: State,
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
    pub evaluated_round: Option<u64>,
    /// Sample-weighted mean training loss reported for the latest round.
    pub train_loss: Option<f64>,
    /// Training samples behind all applied gradients.
    pub samples_seen: u64,
    pub gradients_accepted: u64,
    /// Gradients refused (wrong round, duplicate, not a participant).
    pub gradients_rejected: u64,
    /// Sessions closed for bad input (undecodable frame, wrong shape, NaN/Inf, ...).
    pub sessions_rejected: u64,
    pub last_round_ms: Option<f64>,
    pub model: Vec<usize>,
    pub param_count: usize,
    pub optimizer: String,
    pub batch_size: u32,
    pub worker_list: Vec<WorkerStatus>,
}

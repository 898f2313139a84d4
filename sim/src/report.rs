//! What a simulated run measured, in virtual time.

use serde::Serialize;

/// The run as a whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Virtual seconds simulated.
    pub seconds: f64,
    /// Updates applied.
    pub rounds: u64,
    /// Samples in the updates applied.
    pub samples: u64,
    pub samples_per_sec: f64,
    /// When an evaluation first reached the scenario's target accuracy.
    pub seconds_to_target: Option<f64>,
    /// The last evaluation: its round and accuracy.
    pub evaluated_round: Option<u64>,
    pub accuracy: Option<f64>,
    /// The last evaluation's loss (a language model's validation loss, in nats a token).
    pub loss: Option<f64>,
    /// Bytes on the wire, both ways, per sample in the updates.
    pub bytes_per_sample: f64,
    /// Compute time over connected time, averaged over the workers that computed.
    pub mean_compute_share: f64,
    pub gradients_accepted: u64,
    pub gradients_rejected: u64,
    pub verification_mismatches: u64,
    /// Answers recomputed (what they cost this machine's cores is in `run_measured`'s time).
    pub gradients_verified: u64,
    /// Answers recomputed because their worker was on probation.
    pub probation_checks: u64,
    /// Answers on probation dropped unchecked for lack of room to recompute them.
    pub probation_unchecked: u64,
    /// Pulls past probation sampled at the floor rather than their decaying rate, the
    /// checks being full.
    pub sampling_floored: u64,
    /// Trusted workers' sampled phases excused from their round rather than holding it.
    pub sampled_aside: u64,
    /// Sync: deadlines that passed without a quorum, and were extended.
    pub deadline_extensions: u64,
    /// `--replicate`: answers that agreed with their partner's, and ones recomputed.
    pub replicas_agreed: u64,
    pub replicas_disputed: u64,
    pub bans: usize,
    /// Sync: the gradient noise scale against the crowd's batch, at the end.
    pub noise_scale: Option<coordinator_core::noise::NoiseReport>,
    /// Each evaluation, in turn.
    pub curve: Vec<Point>,
    pub workers: Vec<WorkerReport>,
}

impl Report {
    /// The mean steps of a local phase over every answer sent (1 a gradient without
    /// `--local-steps`); `None` before any answer.
    pub fn steps_a_phase(&self) -> Option<f64> {
        let (steps, phases) = self.workers.iter().fold((0, 0), |(s, p), w| {
            (s + w.local_steps, p + w.gradients_sent)
        });
        (phases > 0 && steps > 0).then(|| steps as f64 / phases as f64)
    }
}

/// One evaluation of the run's model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// Virtual seconds since the start.
    pub seconds: f64,
    /// The update it evaluated.
    pub round: u64,
    pub accuracy: f64,
    /// Validation loss (a language model's in nats a token), where evaluated.
    pub loss: Option<f64>,
}

/// One simulated worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerReport {
    pub gradients_sent: u64,
    /// Inner steps taken in local phases (`--local-steps`), in all.
    pub local_steps: u64,
    /// Compute time over the time it was connected.
    pub compute_share: f64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Connections it opened.
    pub sessions: u32,
    /// How its last session ended, if it did: a refusal's code name, or `left`.
    pub ended: Option<String>,
    /// Answers it sent altered (a hostile behaviour's), whether they counted or not.
    pub poisoned: u64,
    /// Identities it was issued (more than one: it came back fresh after a ban).
    pub identities: u32,
    /// Its answers that counted (accepted into an update or the async buffer), under all
    /// its identities.
    pub accepted: u64,
}

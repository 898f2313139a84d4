//! The coordinator's counters, and the one place that turns them into the published
//! [`Status`]. `Status` is output only: nothing reads counts back out of it.

use std::sync::Arc;

use model::Evaluation;
use protocol::ErrorCode;

use crate::counters::Counters;
use crate::noise::NoiseScale;
use crate::schedule::{Standing, Update};
use crate::status::{RoundReport, State, Status, WorkerStatus};

/// What does not change during a run, as the status shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub mode: &'static str,
    pub aggregator: &'static str,
    /// The model's spec in its text form.
    pub model: Arc<str>,
    pub model_name: Arc<str>,
    pub classes: Arc<Vec<String>>,
    pub param_count: usize,
    /// Shared with every published status (a refcount per event, not a copy).
    pub optimizer: Arc<str>,
    pub batch_size: u32,
    /// `--verify-cores`: the recomputations run at once.
    pub verify_cores: usize,
    pub dataset: Arc<str>,
    /// A language model's token: `character` or `byte`.
    pub token_unit: Option<&'static str>,
}

/// Refusals counted since the last update, for its report and log line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SinceUpdate {
    pub late: u64,
    pub stale: u64,
    pub duplicate: u64,
}

/// The live part of the status, which the coordinator owns elsewhere.
#[derive(Debug, Clone)]
pub struct Live {
    pub state: State,
    pub round: u64,
    pub workers: usize,
    pub standing: Standing,
    pub worker_list: Arc<Vec<WorkerStatus>>,
    pub grad_norm_bound: f64,
    pub bans: Arc<Vec<String>>,
    /// `--replicate`: (agreed, disputed).
    pub replicas: (u64, u64),
    /// `--local-steps`: the mean length of the latest phases.
    pub local_steps: Option<f64>,
    /// The mean compute share of the listed workers that answered.
    pub utilisation: Option<f64>,
    /// (`--probation`, connected workers on probation).
    pub probation: (u32, usize),
    /// The version being evaluated, and the one waiting for it.
    pub evaluations: (Option<u64>, Option<u64>),
}

#[derive(Debug)]
pub struct Metrics {
    info: RunInfo,
    counters: Counters,
    since_update: SinceUpdate,
    train_loss: Option<f64>,
    last_round: Option<RoundReport>,
    evaluation: Option<(u64, Evaluation)>,
    /// What a language model wrote last.
    sample: Option<crate::Sample>,
    /// Answers held for recomputation, and seconds of a core spent on it (this process).
    recompute: (usize, f64),
    /// The gradient noise scale, from how each update's answers spread.
    noise: NoiseScale,
}

impl Metrics {
    pub fn new(info: RunInfo) -> Self {
        Self {
            info,
            counters: Counters::default(),
            since_update: SinceUpdate::default(),
            train_loss: None,
            last_round: None,
            evaluation: None,
            sample: None,
            recompute: (0, 0.0),
            noise: NoiseScale::default(),
        }
    }

    /// A language model wrote `sample`.
    pub fn sampled(&mut self, sample: crate::Sample) {
        self.sample = Some(sample);
    }

    /// The optimizer as the status describes it (after a learning-rate change).
    pub fn set_optimizer(&mut self, optimizer: String) {
        self.info.optimizer = optimizer.into();
    }

    /// A gradient frame of `bytes` arrived; frames of `sent` bytes were queued to workers.
    pub fn traffic(&mut self, bytes: u64, sent: u64) {
        self.counters.bytes_in += bytes;
        self.counters.bytes_out += sent;
    }

    /// The run's gradient noise scale, from every update so far (`noise.rs`).
    pub fn noise_scale(&self) -> Option<crate::noise::NoiseReport> {
        self.noise.report()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The counters and the last evaluation, for a checkpoint.
    pub fn saved(&self) -> (Counters, Option<(u64, Evaluation)>) {
        (self.counters.clone(), self.evaluation)
    }

    /// Continues from a checkpoint's counters and evaluation.
    pub fn restore(&mut self, counters: Counters, evaluation: Option<(u64, Evaluation)>) {
        self.counters = counters;
        self.evaluation = evaluation;
    }

    pub fn accepted(&mut self) {
        self.counters.gradients_accepted += 1;
    }

    /// A gradient was dropped (non-fatal refusal); counted by reason.
    pub fn refused(&mut self, code: ErrorCode) {
        self.counters.gradients_rejected += 1;
        let s = &mut self.since_update;
        match code {
            ErrorCode::Late => (self.counters.late += 1, s.late += 1),
            ErrorCode::Stale => (self.counters.stale_rejected += 1, s.stale += 1),
            ErrorCode::Duplicate => (self.counters.duplicate_rejected += 1, s.duplicate += 1),
            _ => ((), ()),
        };
    }

    /// A gradient was scaled down by the norm bound.
    pub fn clipped(&mut self) {
        self.counters.gradients_clipped += 1;
    }

    /// A gradient was recomputed; `matched` says whether it was equal.
    pub fn verified(&mut self, matched: bool) {
        self.counters.gradients_verified += 1;
        self.counters.verification_mismatches += u64::from(!matched);
    }

    /// A recomputation's ReLU segments named these logged branches, and forced these.
    pub fn branches(&mut self, b: crate::checks::segment::Branches) {
        self.counters.branches_logged += b.logged;
        self.counters.branches_forced += b.forced;
    }

    /// A recomputation of `seconds` came back; `held` answers are still being recomputed.
    pub fn recomputing(&mut self, held: usize, seconds: f64) {
        self.recompute.0 = held;
        self.recompute.1 += seconds;
    }

    /// An answer was recomputed because its worker is on probation.
    pub fn probation_checked(&mut self) {
        self.counters.probation_checks += 1;
    }

    /// A trusted worker's pull was sampled at the floor, not its higher decaying rate: the
    /// checks were full.
    pub fn sampling_floored(&mut self) {
        self.counters.sampling_floored += 1;
    }

    /// An answer on probation was dropped: there was no room to recompute it.
    pub fn probation_unchecked(&mut self) {
        self.counters.probation_unchecked += 1;
    }

    pub fn sampled_aside(&mut self) {
        self.counters.sampled_aside += 1;
    }

    /// A GPU phase was challenged for its states.
    pub fn phase_challenged(&mut self) {
        self.counters.phases_challenged += 1;
    }

    /// `bytes` of a challenged phase's states came in.
    pub fn revealed(&mut self, bytes: u64) {
        self.counters.bytes_revealed += bytes;
    }

    /// A challenged phase's `segments` were replayed, in `ms` of a core.
    pub fn segments_replayed(&mut self, segments: u32, ms: u64) {
        self.counters.segments_replayed += u64::from(segments);
        self.counters.segment_replay_ms += ms;
    }

    /// A replayed segment was marginal.
    pub fn segment_marginal(&mut self) {
        self.counters.segments_marginal += 1;
    }

    /// A challenged phase's states did not come.
    pub fn states_missing(&mut self) {
        self.counters.states_missing += 1;
    }

    /// An answer whose check could not be finished was dropped, without a strike.
    pub fn answer_dropped(&mut self) {
        self.counters.answers_dropped += 1;
    }

    /// An evaluation waiting for the one running was replaced by a newer one.
    pub fn evaluation_replaced(&mut self) {
        self.counters.evaluations_replaced += 1;
    }

    /// An update was not applied: it would have made a parameter non-finite.
    pub fn update_refused(&mut self) {
        self.counters.updates_refused += 1;
    }

    pub fn resumed(&mut self) {
        self.counters.resumed += 1;
    }

    /// A session was closed for bad input.
    pub fn session_rejected(&mut self) {
        self.counters.sessions_rejected += 1;
    }

    pub fn extended(&mut self) {
        self.counters.deadline_extensions += 1;
    }

    /// An update was applied, making `round` (its version before the update) final.
    /// Returns the refusals counted since the previous one, for the log line.
    pub fn updated(&mut self, update: &Update, round: u64) -> SinceUpdate {
        let since = std::mem::take(&mut self.since_update);
        let ms = update.duration.as_secs_f64() * 1e3;
        self.counters.samples_seen += update.samples;
        self.counters.answered_total += update.answered as u64;
        self.counters.deadline_closes += u64::from(update.deadline_hit);
        self.train_loss = Some(update.mean_loss);
        if let Some(spread) = &update.spread {
            self.noise.observe(spread);
        }
        self.last_round = Some(RoundReport {
            round,
            answered: update.answered,
            missed: update.missed,
            late: since.late,
            stale_rejected: since.stale,
            duplicate_rejected: since.duplicate,
            deadline_hit: update.deadline_hit,
            ms,
        });
        since
    }

    pub fn evaluated(&mut self, version: u64, evaluation: Evaluation) {
        self.evaluation = Some((version, evaluation));
    }

    pub fn snapshot(&self, live: Live) -> Status {
        let evaluation = self.evaluation.map(|(_, e)| e);
        Status {
            state: live.state,
            cluster: None,
            mode: self.info.mode,
            aggregator: self.info.aggregator,
            round: live.round,
            workers: live.workers,
            round_participants: live.standing.participants,
            round_answered: live.standing.answered,
            test_accuracy: evaluation.map(|e| e.accuracy),
            test_loss: evaluation.map(|e| e.loss),
            language: self
                .info
                .token_unit
                .zip(evaluation)
                .map(|(unit, e)| crate::language::LossReadings::of(e.loss, unit)),
            sample: self.sample.clone(),
            evaluated_round: self.evaluation.map(|(v, _)| v),
            evaluating: live.evaluations.0,
            evaluation_waiting: live.evaluations.1,
            train_loss: self.train_loss,
            grad_norm_bound: live.grad_norm_bound,
            recompute_seconds: self.recompute.1,
            recomputing: self.recompute.0,
            bans: live.bans,
            replicas_agreed: live.replicas.0,
            replicas_disputed: live.replicas.1,
            round_timeout_ms: live.standing.round_timeout.map(|t| t.as_secs_f64() * 1e3),
            skipped_workers: live.standing.skipped,
            last_round_ms: self.last_round.as_ref().map(|r| r.ms),
            last_round: self.last_round.clone(),
            model: self.info.model.clone(),
            model_name: self.info.model_name.clone(),
            classes: self.info.classes.clone(),
            param_count: self.info.param_count,
            optimizer: self.info.optimizer.clone(),
            batch_size: self.info.batch_size,
            verify_cores: self.info.verify_cores,
            dataset: self.info.dataset.clone(),
            bytes_per_sample: (self.counters.samples_seen > 0).then(|| {
                (self.counters.bytes_in + self.counters.bytes_out) as f64
                    / self.counters.samples_seen as f64
            }),
            local_steps: live.local_steps,
            utilisation: live.utilisation,
            noise_scale: self.noise_scale(),
            probation: live.probation.0,
            on_probation: live.probation.1,
            checkpoints: None,
            counters: self.counters.clone(),
            worker_list: live.worker_list,
        }
    }
}

/// A metric for the log line: four decimals, or `-` on rounds without one.
#[derive(Debug, Clone, Copy)]
pub struct LogValue(pub Option<f64>);

impl std::fmt::Display for LogValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(v) => write!(f, "{v:.4}"),
            None => f.write_str("-"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn metrics() -> Metrics {
        Metrics::new(RunInfo {
            mode: "sync",
            aggregator: "mean",
            model: "input 4; dense 2".into(),
            model_name: "mlp".into(),
            classes: Arc::new(vec!["a".into(), "b".into()]),
            param_count: 10,
            optimizer: "sgd".into(),
            batch_size: 8,
            verify_cores: 1,
            token_unit: None,
            dataset: "test".into(),
        })
    }

    fn live() -> Live {
        Live {
            state: State::Training,
            round: 3,
            workers: 2,
            standing: Standing {
                training: true,
                participants: 2,
                answered: 1,
                skipped: 0,
                round_timeout: Some(Duration::from_millis(250)),
            },
            worker_list: Arc::default(),
            grad_norm_bound: 2.5,
            bans: Arc::new(vec!["worker 3".into()]),
            local_steps: None,
            utilisation: None,
            probation: (0, 0),
            replicas: (4, 1),
            evaluations: (None, None),
        }
    }

    #[test]
    fn refusals_are_counted_by_reason_and_reported_with_the_next_update() {
        let mut m = metrics();
        for code in [ErrorCode::Late, ErrorCode::Late, ErrorCode::Stale] {
            m.refused(code);
        }
        m.refused(ErrorCode::Duplicate);
        m.refused(ErrorCode::NotParticipant);
        m.accepted();
        m.accepted();
        let update = Update {
            gradient: vec![0.0; 10],
            samples: 64,
            mean_loss: 0.5,
            answered: 2,
            missed: 1,
            deadline_hit: true,
            duration: Duration::from_millis(12),
            spread: None,
        };
        let since = m.updated(&update, 2);
        assert_eq!(
            since,
            SinceUpdate {
                late: 2,
                stale: 1,
                duplicate: 1
            }
        );
        let s = m.snapshot(live());
        assert_eq!(
            (
                s.counters.gradients_rejected,
                s.counters.late,
                s.counters.stale_rejected
            ),
            (5, 2, 1)
        );
        assert_eq!(
            (s.counters.duplicate_rejected, s.counters.gradients_accepted),
            (1, 2)
        );
        assert_eq!(
            (
                s.counters.answered_total,
                s.counters.samples_seen,
                s.counters.deadline_closes
            ),
            (2, 64, 1)
        );
        let report = s.last_round.expect("reported");
        assert_eq!((report.round, report.late, report.missed), (2, 2, 1));
        assert_eq!(s.last_round_ms, Some(12.0));
        assert_eq!(s.round_timeout_ms, Some(250.0));
        // The next update starts from zero.
        assert_eq!(m.updated(&update, 3), SinceUpdate::default());
    }

    #[test]
    fn log_values_have_four_decimals_or_a_dash() {
        assert_eq!(LogValue(Some(0.93456)).to_string(), "0.9346");
        assert_eq!(LogValue(None).to_string(), "-");
    }

    #[test]
    fn snapshot_carries_the_run_info_the_evaluation_and_the_live_state() {
        let mut m = metrics();
        m.evaluated(
            3,
            Evaluation {
                loss: 0.25,
                accuracy: 0.9,
            },
        );
        m.resumed();
        m.session_rejected();
        m.extended();
        m.clipped();
        m.update_refused();
        m.verified(true);
        m.verified(false);
        let s = m.snapshot(live());
        assert_eq!((s.mode, s.param_count, s.batch_size), ("sync", 10, 8));
        assert_eq!((s.test_accuracy, s.test_loss), (Some(0.9), Some(0.25)));
        assert_eq!(s.evaluated_round, Some(3));
        assert_eq!(
            (
                s.counters.resumed,
                s.counters.sessions_rejected,
                s.counters.deadline_extensions
            ),
            (1, 1, 1)
        );
        assert_eq!((s.state, s.round, s.workers), (State::Training, 3, 2));
        assert_eq!((s.round_participants, s.round_answered), (2, 1));
        assert_eq!(
            (s.counters.gradients_clipped, s.counters.updates_refused),
            (1, 1)
        );
        assert_eq!(s.grad_norm_bound, 2.5);
        assert_eq!(
            (
                s.counters.gradients_verified,
                s.counters.verification_mismatches
            ),
            (2, 1)
        );
        assert_eq!(*s.bans, ["worker 3"]);
        assert_eq!((s.replicas_agreed, s.replicas_disputed), (4, 1));
    }
}

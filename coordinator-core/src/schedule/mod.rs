//! What a schedule is: the part of the coordinator that decides when gradients become an
//! update, and who is sent weights. Two implement it: [`sync::SyncSchedule`] (rounds
//! with a barrier, deadline and quorum) and [`asynchronous::AsyncSchedule`] (apply as
//! gradients arrive; hogwild is its unbounded case).
//!
//! A schedule is sans-IO: it keeps only its own bookkeeping, is told the time, and answers
//! with [`Action`]s for the coordinator to carry out in order. It never touches outboxes,
//! parameters or counters.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use protocol::{Gradient, Round, WorkerId};

pub mod asynchronous;
pub mod deadline;
pub mod round;
pub mod sync;

use self::asynchronous::AsyncSchedule;
use self::sync::SyncSchedule;
use crate::aggregate::AggregatorKind;
use crate::refusal::Refusal;
use crate::settings::Mode;

/// The schedule a mode runs: the one place the mode is matched.
pub fn for_mode(
    mode: Mode,
    aggregator: AggregatorKind,
    min_workers: usize,
    param_count: usize,
    now: Instant,
) -> Box<dyn Schedule> {
    match mode {
        Mode::Sync {
            timeout,
            miss_limit,
        } => Box::new(SyncSchedule::new(
            timeout,
            min_workers,
            miss_limit,
            aggregator,
            param_count,
        )),
        Mode::Async {
            buffer,
            max_staleness,
        } => Box::new(AsyncSchedule::new(
            buffer,
            Some(max_staleness),
            aggregator,
            param_count,
            now,
        )),
        Mode::Hogwild => Box::new(AsyncSchedule::hogwild(aggregator, param_count, now)),
    }
}

/// What the coordinator knows that a schedule needs to decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct View {
    /// The version of the current weights (= updates applied so far).
    pub version: u64,
    /// Training has finished: open nothing new.
    pub finished: bool,
    /// The operator paused training: open no new round (the open one completes).
    pub paused: bool,
    /// `--local-steps`: how long the slowest worker's next phase should take (its link
    /// included), when measured: an automatic deadline is at least 1.5 times that.
    pub expected: Option<std::time::Duration>,
}

/// A gradient as a schedule combines it: validated by the session, weighed by the
/// coordinator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contribution<'a> {
    /// The round (sync) or version (async) it was computed on.
    pub round: Round,
    pub grads: &'a [f32],
    /// The samples the coordinator assigned (the worker's batch), not what it claimed.
    pub samples: u32,
    /// The worker's reported loss, for the log line only.
    pub loss: f32,
    /// The norm bound's clipping factor (1 or less) times, for a local phase, its
    /// length's (`local.rs`).
    pub scale: f32,
    /// Steps behind it: a local phase's length, else 1. It is weighed by `samples` alone
    /// (one step's), and counts `samples × steps`.
    pub steps: u32,
}

impl<'a> Contribution<'a> {
    /// A gradient taken as it claims to be, unclipped.
    pub fn of(gradient: &'a Gradient) -> Self {
        Self {
            round: gradient.round,
            grads: &gradient.grads,
            samples: gradient.samples,
            loss: gradient.loss,
            scale: 1.0,
            steps: 1,
        }
    }
}

/// One update, ready for the optimizer: the combined gradient and what the round log line,
/// the metrics and the status say about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub gradient: Vec<f32>,
    /// Samples behind the gradient.
    pub samples: u64,
    /// Sample-weighted mean of the workers' reported losses.
    pub mean_loss: f64,
    /// Gradients combined.
    pub answered: usize,
    /// Sync: participants that had not answered when the deadline closed the round.
    pub missed: usize,
    /// Sync: closed by its deadline (with quorum) rather than by everyone answering.
    pub deadline_hit: bool,
    /// From the round's opening (or the previous version's publication) to now.
    pub duration: Duration,
    /// How the answers spread around their mean (`None` with fewer than two), for the
    /// gradient noise scale (`noise.rs`).
    pub spread: Option<crate::noise::Reading>,
}

/// What a schedule asks the coordinator to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Re-cut the train split over the connected workers and send changed shards.
    Rebalance,
    /// Send the current weights to this worker (the coordinator then calls
    /// [`Schedule::sent`] with the version it sent).
    Weights(WorkerId),
    /// The worker's gradient was taken into the round or buffer.
    Accepted(WorkerId),
    /// The worker's gradient was dropped: send it this (non-fatal) refusal and count it.
    Refuse(WorkerId, Refusal),
    /// Step the optimizer with this update. Settling again afterwards sees the new version.
    Apply(Update),
    /// Sync: the worker left (`false`) or rejoined (`true`) the quorum.
    Quorum(WorkerId, bool),
    /// Sync: the deadline passed without quorum and the round was extended.
    Extended,
}

/// Where a schedule stands, for the status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// A round is open (sync) or workers are pulling (async).
    pub training: bool,
    pub participants: usize,
    pub answered: usize,
    /// Workers skipped from the quorum for missing deadlines.
    pub skipped: usize,
    /// The timeout of the latest round opened (sync).
    pub round_timeout: Option<Duration>,
}

/// Who takes part in the open sync round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roster {
    /// Participants, the excused included.
    pub participants: usize,
    /// Those whose answers counted or are still waited for (not excused).
    pub counting: Vec<WorkerId>,
}

pub trait Schedule: Send + Debug {
    /// A worker was admitted (new, or resuming its identity on a new connection).
    fn joined(&mut self, worker: WorkerId, view: View) -> Vec<Action>;
    /// A worker left; it is not waited for any more.
    fn left(&mut self, worker: WorkerId);
    /// A gradient that passed the session's checks (shape, finiteness) and the norm bound.
    fn gradient(
        &mut self,
        worker: WorkerId,
        gradient: &Contribution<'_>,
        view: View,
        now: Instant,
    ) -> Vec<Action>;
    /// The coordinator sent `worker` the weights of `version`.
    fn sent(&mut self, worker: WorkerId, version: u64);
    /// Time passed the [`Schedule::deadline`].
    fn tick(&mut self, now: Instant) -> Vec<Action>;
    /// Closes what is finished and opens what is due. The coordinator calls it after every
    /// event and again after carrying out its actions, until it asks for nothing.
    fn settle(&mut self, view: View, now: Instant) -> Vec<Action>;
    /// When [`Schedule::tick`] is next due, if ever.
    fn deadline(&self) -> Option<Instant>;
    /// The answer latencies an adaptive deadline learned from (for a checkpoint); none for
    /// schedules without deadlines.
    fn deadline_history(&self) -> Vec<std::time::Duration> {
        Vec::new()
    }
    /// Continues from a checkpoint's [`Schedule::deadline_history`].
    fn restore_deadlines(&mut self, _latencies: &[std::time::Duration]) {}
    fn standing(&self) -> Standing;
    /// Sync: the open round's participants. Empty for schedules without rounds.
    fn roster(&self) -> Roster {
        Roster::default()
    }
    /// Sync: skipped from the quorum.
    fn is_skipped(&self, worker: WorkerId) -> bool;
    /// `worker`'s answer was dropped (it failed verification). Sync: the round stops
    /// waiting for it, as it will not answer again. Async: its pull is answered; it gets
    /// the freshest weights.
    fn excuse(&mut self, worker: WorkerId) -> Vec<Action>;
}

/// What the schedules' own tests share.
#[cfg(test)]
pub(crate) mod testing {
    use protocol::{Gradient, Round};

    use super::View;

    /// The coordinator at `version`, still training.
    pub fn view(version: u64) -> View {
        View {
            version,
            ..View::default()
        }
    }

    /// A gradient of `len` values all `value`, claiming `samples`, with loss 2.
    pub fn gradient(round: u64, value: f32, samples: u32, len: usize) -> Gradient {
        Gradient {
            compute_us: 0,
            parts: 1,
            round: Round(round),
            samples,
            loss: 2.0,
            grads: vec![value; len],
        }
    }
}

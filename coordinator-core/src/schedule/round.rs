//! The synchronous round as a sans-IO state machine: no sockets, no clocks (time is passed
//! in), so every transition is a plain unit test.
//!
//! A round opens for a set of participants with a deadline and a quorum. Each participant may
//! contribute one gradient, which goes straight into the round's [`Aggregator`]. The round is
//! complete when every participant still connected has answered, or when the deadline passes
//! with at least `quorum` answers. A deadline without quorum extends the round; it is never
//! applied with fewer answers. A participant that leaves is no longer waited for (its
//! gradient, if it already sent one, stays counted: it was valid work).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use protocol::{ErrorCode, Round, WorkerId};
use thiserror::Error;

use super::Contribution;
use crate::aggregate::Aggregator;
use crate::noise::{Reading, Spread};
use crate::refusal::Refusal;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RoundError {
    #[error("round {got} already closed (the open round is {current}); gradient dropped")]
    Late { got: Round, current: Round },
    #[error("round {got} is not open (the open round is {current})")]
    NotOpen { got: Round, current: Round },
    #[error("{0} is not a participant of this round (it joined after the round started)")]
    NotParticipant(WorkerId),
    #[error("{0} already sent a gradient for this round")]
    Duplicate(WorkerId),
}

impl From<RoundError> for Refusal {
    fn from(err: RoundError) -> Self {
        Refusal::new(err.code(), err.to_string())
    }
}

impl RoundError {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Late { .. } => ErrorCode::Late,
            Self::NotOpen { .. } => ErrorCode::RoundNotOpen,
            Self::NotParticipant(_) => ErrorCode::NotParticipant,
            Self::Duplicate(_) => ErrorCode::Duplicate,
        }
    }
}

/// What a round's state machine says after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Some participants have yet to answer and the deadline has not passed.
    Waiting,
    /// Close it: everyone remaining answered, or the deadline passed with quorum.
    Complete,
    /// The deadline passed without quorum: the round was extended to a new deadline.
    Extended,
    /// Every participant left before anyone answered: discard it and start again.
    Abandoned,
}

#[derive(Debug)]
pub struct OpenRound {
    round: Round,
    pending: BTreeSet<WorkerId>,
    answered: BTreeSet<WorkerId>,
    /// Participants the checks excused: not waited for, not admitted again.
    excused: BTreeSet<WorkerId>,
    aggregator: Box<dyn Aggregator>,
    spread: Spread,
    loss_sum: f64,
    started_at: Instant,
    deadline: Instant,
    quorum: usize,
    deadline_hit: bool,
    extensions: u32,
    latencies: Vec<Duration>,
}

/// A closed round: the combined gradient and what the log line and status need.
#[derive(Debug)]
pub struct ClosedRound {
    pub round: Round,
    /// The run's aggregator, back for the next round.
    pub aggregator: Box<dyn Aggregator>,
    /// `None` if nothing was contributed (cannot happen for a `Complete` round).
    pub gradient: Option<Vec<f32>>,
    pub samples: u64,
    pub answered: usize,
    /// Participants that had not answered when it closed (deadline with quorum).
    pub missed: Vec<WorkerId>,
    pub deadline_hit: bool,
    pub extensions: u32,
    /// Sample-weighted mean of the workers' reported losses.
    pub mean_loss: f64,
    pub duration: Duration,
    /// How the answers spread around their mean.
    pub spread: Option<Reading>,
    /// How long after opening each answer arrived (feeds the adaptive deadline).
    pub latencies: Vec<Duration>,
}

impl OpenRound {
    /// `timeout` sets the deadline (and every extension); `quorum` is the number of answers
    /// needed to close at the deadline.
    pub fn new(
        round: Round,
        participants: impl IntoIterator<Item = WorkerId>,
        aggregator: Box<dyn Aggregator>,
        now: Instant,
        timeout: Duration,
        quorum: usize,
    ) -> Self {
        Self {
            round,
            pending: participants.into_iter().collect(),
            answered: BTreeSet::new(),
            excused: BTreeSet::new(),
            aggregator,
            spread: Spread::default(),
            loss_sum: 0.0,
            started_at: now,
            deadline: now + timeout,
            quorum: quorum.max(1),
            deadline_hit: false,
            extensions: 0,
            latencies: Vec::new(),
        }
    }

    pub fn round(&self) -> Round {
        self.round
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn answered(&self) -> usize {
        self.answered.len()
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether `worker` takes part (or took part, or was excused from it).
    pub fn is_participant(&self, worker: WorkerId) -> bool {
        self.pending.contains(&worker)
            || self.answered.contains(&worker)
            || self.excused.contains(&worker)
    }

    /// Participants: answered, waited for, or excused.
    pub fn size(&self) -> usize {
        self.pending.len() + self.answered.len() + self.excused.len()
    }

    /// The participants whose answers count or will: answered, or still waited for (not
    /// excused).
    pub fn counting(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.answered.iter().chain(&self.pending).copied()
    }

    /// Makes `worker` a participant (a skipped worker answering again).
    pub fn admit(&mut self, worker: WorkerId) {
        if !self.answered.contains(&worker) {
            self.pending.insert(worker);
        }
    }

    /// Accumulates `gradient` from `worker`. Shape and finiteness are the session's checks;
    /// this one checks that the gradient belongs here.
    pub fn accept(
        &mut self,
        worker: WorkerId,
        gradient: &Contribution<'_>,
        now: Instant,
    ) -> Result<Progress, RoundError> {
        if gradient.round < self.round {
            return Err(RoundError::Late {
                got: gradient.round,
                current: self.round,
            });
        }
        if gradient.round > self.round {
            return Err(RoundError::NotOpen {
                got: gradient.round,
                current: self.round,
            });
        }
        if self.answered.contains(&worker) {
            return Err(RoundError::Duplicate(worker));
        }
        if !self.pending.remove(&worker) {
            return Err(RoundError::NotParticipant(worker));
        }
        self.answered.insert(worker);
        let samples = gradient.samples.saturating_mul(gradient.steps);
        let weight = gradient.samples as f32;
        self.aggregator
            .add(gradient.grads, samples, weight, gradient.scale);
        self.spread
            .add(gradient.grads, gradient.scale, u64::from(samples));
        self.loss_sum += f64::from(gradient.loss) * f64::from(samples);
        self.latencies
            .push(now.saturating_duration_since(self.started_at));
        Ok(self.progress())
    }

    /// A participant disconnected: stop waiting for it.
    pub fn remove(&mut self, worker: WorkerId) -> Progress {
        self.pending.remove(&worker);
        self.progress()
    }

    /// A participant's answer will not count (excused by the checks): stop waiting for it,
    /// and do not admit it again at an extension, where it would compute the same weights
    /// once more and hold the round for another phase.
    pub fn excuse(&mut self, worker: WorkerId) -> Progress {
        if self.pending.remove(&worker) {
            self.excused.insert(worker);
        }
        self.progress()
    }

    /// Time passes: at the deadline, close with quorum or extend by `extension`.
    pub fn tick(&mut self, now: Instant, extension: Duration) -> Progress {
        let progress = self.progress();
        if progress != Progress::Waiting || now < self.deadline {
            return progress;
        }
        if self.answered.len() >= self.quorum {
            self.deadline_hit = true;
            Progress::Complete
        } else {
            self.extensions += 1;
            self.deadline = now + extension;
            Progress::Extended
        }
    }

    /// Where the round stands without time passing.
    pub fn progress(&self) -> Progress {
        match (self.pending.is_empty(), self.answered.is_empty()) {
            (false, _) if self.deadline_hit => Progress::Complete,
            (false, _) => Progress::Waiting,
            (true, false) => Progress::Complete,
            (true, true) => Progress::Abandoned,
        }
    }

    /// The aggregator of a round discarded unclosed, emptied for the next.
    pub fn into_aggregator(mut self) -> Box<dyn Aggregator> {
        let _ = self.aggregator.take();
        self.aggregator
    }

    pub fn close(mut self, now: Instant) -> ClosedRound {
        let samples = self.aggregator.samples();
        let answered = self.answered.len();
        let gradient = self.aggregator.take();
        ClosedRound {
            round: self.round,
            aggregator: self.aggregator,
            gradient,
            samples,
            answered,
            missed: self.pending.into_iter().collect(),
            deadline_hit: self.deadline_hit,
            extensions: self.extensions,
            mean_loss: if samples == 0 {
                f64::NAN
            } else {
                self.loss_sum / samples as f64
            },
            duration: now.saturating_duration_since(self.started_at),
            spread: self.spread.take(),
            latencies: self.latencies,
        }
    }
}

#[cfg(test)]
mod tests;

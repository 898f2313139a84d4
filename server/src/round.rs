//! The synchronous round as a sans-IO state machine: no sockets, no clocks (time is passed
//! in), so every transition is a plain unit test.
//!
//! A round is opened for a fixed set of participants. Each may contribute one gradient,
//! which goes straight into the running [`GradientSum`]. The round is complete when every
//! participant still connected has answered; a participant that leaves is simply no longer
//! waited for (its gradient, if it already sent one, stays counted: it was valid work).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use model::GradientSum;
use protocol::{ErrorCode, Gradient, Round, WorkerId};
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RoundError {
    #[error("round {got} is not open (the open round is {current})")]
    NotOpen { got: Round, current: Round },
    #[error("{0} is not a participant of this round (it joined after the round started)")]
    NotParticipant(WorkerId),
    #[error("{0} already sent a gradient for this round")]
    Duplicate(WorkerId),
}

impl RoundError {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotOpen { .. } => ErrorCode::RoundNotOpen,
            Self::NotParticipant(_) => ErrorCode::NotParticipant,
            Self::Duplicate(_) => ErrorCode::Duplicate,
        }
    }
}

/// What a round's state machine says after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Some participants have yet to answer.
    Waiting,
    /// Every remaining participant answered: close it.
    Complete,
    /// Every participant left before anyone answered: discard it and start again.
    Abandoned,
}

#[derive(Debug)]
pub struct OpenRound {
    round: Round,
    pending: BTreeSet<WorkerId>,
    answered: BTreeSet<WorkerId>,
    sum: GradientSum,
    loss_sum: f64,
    started_at: Instant,
}

/// A closed round: the averaged gradient and what the log line needs.
#[derive(Debug)]
pub struct ClosedRound {
    pub round: Round,
    /// `None` if no samples were contributed (cannot happen for a `Complete` round).
    pub mean_gradient: Option<Vec<f32>>,
    pub samples: u64,
    pub contributors: usize,
    /// Sample-weighted mean of the workers' reported losses.
    pub mean_loss: f64,
    pub duration: Duration,
}

impl OpenRound {
    pub fn new(
        round: Round,
        participants: impl IntoIterator<Item = WorkerId>,
        param_count: usize,
        now: Instant,
    ) -> Self {
        Self {
            round,
            pending: participants.into_iter().collect(),
            answered: BTreeSet::new(),
            sum: GradientSum::new(param_count),
            loss_sum: 0.0,
            started_at: now,
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

    pub fn is_participant(&self, worker: WorkerId) -> bool {
        self.pending.contains(&worker) || self.answered.contains(&worker)
    }

    /// Accumulates `gradient` from `worker`. Shape and finiteness are the session's checks;
    /// this one checks that the gradient belongs here.
    pub fn accept(
        &mut self,
        worker: WorkerId,
        gradient: &Gradient,
    ) -> Result<Progress, RoundError> {
        if gradient.round != self.round {
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
        self.sum.accumulate(&gradient.grads, gradient.samples);
        self.loss_sum += f64::from(gradient.loss) * f64::from(gradient.samples);
        Ok(self.progress())
    }

    /// A participant disconnected: stop waiting for it.
    pub fn remove(&mut self, worker: WorkerId) -> Progress {
        self.pending.remove(&worker);
        self.progress()
    }

    pub fn progress(&self) -> Progress {
        match (self.pending.is_empty(), self.answered.is_empty()) {
            (false, _) => Progress::Waiting,
            (true, false) => Progress::Complete,
            (true, true) => Progress::Abandoned,
        }
    }

    pub fn close(mut self, now: Instant) -> ClosedRound {
        let samples = self.sum.samples();
        let contributors = self.sum.contributions();
        ClosedRound {
            round: self.round,
            mean_gradient: self.sum.take_mean(),
            samples,
            contributors,
            mean_loss: if samples == 0 {
                f64::NAN
            } else {
                self.loss_sum / samples as f64
            },
            duration: now.saturating_duration_since(self.started_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grad(round: u64, value: f32, samples: u32) -> Gradient {
        Gradient {
            round: Round(round),
            samples,
            loss: value,
            grads: vec![value; 3],
        }
    }

    fn open(ids: &[u32]) -> (OpenRound, Instant) {
        let now = Instant::now();
        (
            OpenRound::new(Round(4), ids.iter().map(|&i| WorkerId(i)), 3, now),
            now,
        )
    }

    #[test]
    fn completes_when_every_participant_answered_and_weights_by_samples() {
        let (mut r, t0) = open(&[1, 2]);
        assert_eq!(
            r.accept(WorkerId(1), &grad(4, 1.0, 1)),
            Ok(Progress::Waiting)
        );
        assert_eq!(
            r.accept(WorkerId(2), &grad(4, 4.0, 3)),
            Ok(Progress::Complete)
        );
        let closed = r.close(t0 + Duration::from_millis(250));
        assert_eq!(closed.mean_gradient, Some(vec![3.25; 3])); // (1·1 + 4·3) / 4
        assert_eq!((closed.samples, closed.contributors), (4, 2));
        assert_eq!(closed.mean_loss, 3.25);
        assert_eq!(closed.duration, Duration::from_millis(250));
    }

    #[test]
    fn wrong_round_duplicate_and_outsider_are_refused_without_touching_the_sum() {
        let (mut r, t0) = open(&[1, 2]);
        assert_eq!(
            r.accept(WorkerId(1), &grad(3, 9.0, 1)),
            Err(RoundError::NotOpen {
                got: Round(3),
                current: Round(4)
            })
        );
        assert_eq!(
            r.accept(WorkerId(9), &grad(4, 9.0, 1)),
            Err(RoundError::NotParticipant(WorkerId(9)))
        );
        assert_eq!(
            r.accept(WorkerId(1), &grad(4, 1.0, 1)),
            Ok(Progress::Waiting)
        );
        assert_eq!(
            r.accept(WorkerId(1), &grad(4, 9.0, 1)),
            Err(RoundError::Duplicate(WorkerId(1)))
        );
        assert_eq!(
            r.accept(WorkerId(2), &grad(4, 1.0, 1)),
            Ok(Progress::Complete)
        );
        assert_eq!(r.close(t0).mean_gradient, Some(vec![1.0; 3]));
        assert_eq!(
            RoundError::Duplicate(WorkerId(1)).code(),
            ErrorCode::Duplicate
        );
    }

    #[test]
    fn a_leaver_is_not_waited_for_but_its_answer_counts() {
        let (mut r, t0) = open(&[1, 2, 3]);
        assert_eq!(
            r.accept(WorkerId(1), &grad(4, 2.0, 1)),
            Ok(Progress::Waiting)
        );
        assert_eq!(r.remove(WorkerId(1)), Progress::Waiting); // answered, then left
        assert_eq!(r.remove(WorkerId(3)), Progress::Waiting);
        assert_eq!(
            r.accept(WorkerId(2), &grad(4, 4.0, 1)),
            Ok(Progress::Complete)
        );
        assert_eq!(r.close(t0).mean_gradient, Some(vec![3.0; 3]));
    }

    #[test]
    fn last_pending_leaving_completes_and_everyone_leaving_abandons() {
        let (mut r, _) = open(&[1, 2]);
        r.accept(WorkerId(1), &grad(4, 1.0, 1))
            .expect("participant");
        assert_eq!(r.remove(WorkerId(2)), Progress::Complete);

        let (mut r, _) = open(&[1, 2]);
        assert_eq!(r.remove(WorkerId(1)), Progress::Waiting);
        assert_eq!(r.remove(WorkerId(2)), Progress::Abandoned);
        assert!(!r.is_participant(WorkerId(1)));
    }
}

//! The asynchronous schedule: no rounds. Each worker holds exactly one pull (the version of
//! the weights it was sent); its gradient on that pull goes into a buffer, and every
//! `--buffer` gradients the buffer becomes an update. Gradients computed on weights more
//! than `--max-staleness` versions old are refused; fresher stale ones are down-weighted by
//! `1 / (1 + staleness)`. Every answer is followed by the freshest weights.
//!
//! Hogwild is this schedule with a buffer of 1 and no staleness bound: everything is applied
//! at full weight, whatever weights it was computed on.

use std::collections::BTreeMap;
use std::time::Instant;

use protocol::{ErrorCode, WorkerId};

use super::{Action, Contribution, Schedule, Standing, Update, View};
use crate::aggregate::{Aggregator, AggregatorKind};
use crate::refusal::Refusal;

#[derive(Debug)]
pub struct AsyncSchedule {
    buffer_size: usize,
    /// `None`: hogwild.
    max_staleness: Option<u64>,
    /// The version each connected worker was sent and has not answered yet.
    awaiting: BTreeMap<WorkerId, Option<u64>>,
    buffer: Box<dyn Aggregator>,
    buffer_loss: f64,
    /// When the current version was published.
    version_since: Instant,
    /// Shards must be re-cut (a worker left).
    rebalance: bool,
}

impl AsyncSchedule {
    pub fn new(
        buffer_size: usize,
        max_staleness: Option<u64>,
        aggregator: AggregatorKind,
        param_count: usize,
        now: Instant,
    ) -> Self {
        Self {
            buffer_size,
            max_staleness,
            awaiting: BTreeMap::new(),
            buffer: {
                let mut buffer = aggregator.build(param_count);
                buffer.begin(buffer_size);
                buffer
            },
            buffer_loss: 0.0,
            version_since: now,
            rebalance: false,
        }
    }

    pub fn hogwild(aggregator: AggregatorKind, param_count: usize, now: Instant) -> Self {
        Self::new(1, None, aggregator, param_count, now)
    }
}

impl Schedule for AsyncSchedule {
    fn joined(&mut self, worker: WorkerId, _view: View) -> Vec<Action> {
        self.awaiting.insert(worker, None);
        // Re-cut the shards (the newcomer gets one first), then its first pull.
        vec![Action::Rebalance, Action::Weights(worker)]
    }

    fn left(&mut self, worker: WorkerId) {
        self.awaiting.remove(&worker);
        self.rebalance = true;
    }

    fn gradient(
        &mut self,
        worker: WorkerId,
        gradient: &Contribution<'_>,
        view: View,
        now: Instant,
    ) -> Vec<Action> {
        let Some(awaiting) = self.awaiting.get_mut(&worker) else {
            return Vec::new();
        };
        // Exactly one pull is outstanding per worker, of a known version: the gradient must
        // be computed on it. An older version answers a pull already answered.
        let got = gradient.round.0;
        let pulled = match *awaiting {
            Some(v) if got == v => v,
            Some(v) if got > v => {
                let msg = format!("{worker} was sent version {v}, not {}", gradient.round);
                return vec![Action::Refuse(
                    worker,
                    Refusal::new(ErrorCode::RoundNotOpen, msg),
                )];
            }
            _ => {
                let msg = format!("{worker} already answered version {}", gradient.round);
                return vec![Action::Refuse(
                    worker,
                    Refusal::new(ErrorCode::Duplicate, msg),
                )];
            }
        };
        *awaiting = None;
        let staleness = view.version - pulled;
        let samples = gradient.samples.saturating_mul(gradient.steps);
        let weight = match self.max_staleness {
            Some(max) if staleness > max => {
                let msg =
                    format!("computed on version {pulled}, {staleness} versions old (max {max})");
                return vec![
                    Action::Refuse(worker, Refusal::new(ErrorCode::Stale, msg)),
                    Action::Weights(worker),
                ];
            }
            // Stale within the bound: down-weighted by 1 / (1 + staleness).
            Some(_) => gradient.samples as f32 / (1 + staleness) as f32,
            // Hogwild: every gradient at full weight.
            None => gradient.samples as f32,
        };
        self.buffer
            .add(gradient.grads, samples, weight, gradient.scale);
        self.buffer_loss += f64::from(gradient.loss) * f64::from(samples);
        let mut actions = vec![Action::Accepted(worker)];
        if self.buffer.contributions() >= self.buffer_size {
            let answered = self.buffer.contributions();
            let samples = self.buffer.samples();
            let mean_loss = self.buffer_loss / samples.max(1) as f64;
            self.buffer_loss = 0.0;
            let taken = self.buffer.take();
            self.buffer.begin(self.buffer_size);
            if let Some(gradient) = taken {
                let duration = now.saturating_duration_since(self.version_since);
                self.version_since = now;
                actions.push(Action::Apply(Update {
                    gradient,
                    samples,
                    mean_loss,
                    answered,
                    missed: 0,
                    deadline_hit: false,
                    duration,
                    // Answers computed on different versions: their differences would
                    // count as noise.
                    spread: None,
                }));
            }
        }
        // Its next pull: the freshest weights (after the update, if there was one).
        actions.push(Action::Weights(worker));
        actions
    }

    fn sent(&mut self, worker: WorkerId, version: u64) {
        if let Some(awaiting) = self.awaiting.get_mut(&worker) {
            *awaiting = Some(version);
        }
    }

    fn tick(&mut self, _now: Instant) -> Vec<Action> {
        Vec::new()
    }

    fn settle(&mut self, view: View, _now: Instant) -> Vec<Action> {
        if std::mem::take(&mut self.rebalance) && !view.finished {
            vec![Action::Rebalance]
        } else {
            Vec::new()
        }
    }

    fn deadline(&self) -> Option<Instant> {
        None
    }

    fn standing(&self) -> Standing {
        Standing {
            training: !self.awaiting.is_empty(),
            ..Standing::default()
        }
    }

    fn is_skipped(&self, _worker: WorkerId) -> bool {
        false
    }

    fn excuse(&mut self, worker: WorkerId) -> Vec<Action> {
        match self.awaiting.get_mut(&worker) {
            Some(awaiting) => {
                *awaiting = None;
                vec![Action::Weights(worker)]
            }
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;

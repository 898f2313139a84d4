//! The synchronous schedule: rounds with a barrier, a deadline and a quorum.
//!
//! A round opens when at least `--min-workers` are connected: shards are re-cut and every
//! active worker is sent the weights. It closes when every participant answered, or at its
//! deadline with a quorum (else it is extended, and workers that joined since are admitted).
//! A worker that misses `--miss-limit` deadlines in a row is skipped from the quorum until
//! it answers again; while it sits on unanswered weights it is sent no new ones.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use protocol::{Round, WorkerId};
use tracing::{debug, info};

use super::deadline::{DeadlinePolicy, RoundTimeout};
use super::round::{OpenRound, Progress, RoundError};
use super::{Action, Contribution, Roster, Schedule, Standing, Update, View};
use crate::aggregate::{Aggregator, AggregatorKind};

/// Sync-only state of one connected worker.
#[derive(Debug, Clone, Copy)]
struct Member {
    /// Deadlines missed in a row; at `miss_limit` the worker leaves the quorum.
    misses: u32,
    /// Counted in rounds' quorum (false once skipped, true again when it answers).
    active: bool,
    /// Holds weights it has not answered yet. A skipped worker in that state is sent
    /// nothing more until it answers: new frames would only pile up behind a frozen tab.
    unanswered: bool,
}

impl Default for Member {
    fn default() -> Self {
        Self {
            misses: 0,
            active: true,
            unanswered: false,
        }
    }
}

#[derive(Debug)]
pub struct SyncSchedule {
    members: BTreeMap<WorkerId, Member>,
    round: Option<OpenRound>,
    deadline: DeadlinePolicy,
    min_workers: usize,
    miss_limit: u32,
    /// The run's aggregator while no round holds it.
    aggregator: Option<Box<dyn Aggregator>>,
    round_timeout: Option<Duration>,
}

impl SyncSchedule {
    pub fn new(
        timeout: RoundTimeout,
        min_workers: usize,
        miss_limit: u32,
        aggregator: AggregatorKind,
        param_count: usize,
    ) -> Self {
        Self {
            members: BTreeMap::new(),
            round: None,
            deadline: DeadlinePolicy::new(timeout),
            min_workers,
            miss_limit,
            aggregator: Some(aggregator.build(param_count)),
            round_timeout: None,
        }
    }

    fn open(&mut self, view: View, now: Instant) -> Vec<Action> {
        let mut actions = vec![Action::Rebalance];
        let active = self.members.values().filter(|m| m.active).count();
        // Too few active workers for a quorum: give the skipped ones another chance.
        let everyone = active < self.min_workers;
        let mut participants = Vec::with_capacity(self.members.len());
        for (&id, m) in &self.members {
            if everyone || m.active {
                participants.push(id);
                actions.push(Action::Weights(id));
            } else if !m.unanswered {
                // Skipped, but not sitting on older weights: it may answer and rejoin.
                actions.push(Action::Weights(id));
            }
        }
        let timeout = self.deadline.timeout_at_least(view.expected);
        self.round_timeout = Some(timeout);
        debug!(
            round = view.version,
            participants = participants.len(),
            "round opened"
        );
        let mut aggregator = self.aggregator.take().expect("no round holds it");
        aggregator.begin(participants.len());
        self.round = Some(OpenRound::new(
            Round(view.version),
            participants,
            aggregator,
            now,
            timeout,
            self.min_workers,
        ));
        actions
    }

    fn close(&mut self, round: OpenRound, now: Instant) -> Vec<Action> {
        let closed = round.close(now);
        self.aggregator = Some(closed.aggregator);
        for &latency in &closed.latencies {
            self.deadline.record(latency);
        }
        let mut actions = Vec::new();
        for id in &closed.missed {
            if let Some(m) = self.members.get_mut(id) {
                m.misses += 1;
                if m.active && m.misses >= self.miss_limit {
                    m.active = false;
                    info!(worker = %id, misses = m.misses, "worker missed too many deadlines; skipped from the quorum until it answers");
                    actions.push(Action::Quorum(*id, false));
                }
            }
        }
        if let Some(gradient) = closed.gradient {
            actions.push(Action::Apply(Update {
                gradient,
                samples: closed.samples,
                mean_loss: closed.mean_loss,
                answered: closed.answered,
                missed: closed.missed.len(),
                deadline_hit: closed.deadline_hit,
                duration: closed.duration,
                spread: closed.spread,
            }));
        }
        actions
    }
}

impl Schedule for SyncSchedule {
    fn joined(&mut self, worker: WorkerId, _view: View) -> Vec<Action> {
        self.members.insert(worker, Member::default());
        // Joining mid-round: the current weights at once; it takes part from the next round.
        if self.round.is_some() {
            vec![Action::Weights(worker)]
        } else {
            Vec::new()
        }
    }

    fn left(&mut self, worker: WorkerId) {
        self.members.remove(&worker);
        if let Some(round) = self.round.as_mut() {
            round.remove(worker);
        }
    }

    fn gradient(
        &mut self,
        worker: WorkerId,
        gradient: &Contribution<'_>,
        view: View,
        now: Instant,
    ) -> Vec<Action> {
        let current = Round(view.version);
        let result = match self.round.as_mut() {
            None if gradient.round < current => Err(RoundError::Late {
                got: gradient.round,
                current,
            }),
            None => Err(RoundError::NotOpen {
                got: gradient.round,
                current,
            }),
            Some(round) => {
                let skipped = self.members.get(&worker).is_some_and(|m| !m.active);
                if skipped && gradient.round == round.round() {
                    // A skipped worker answering again rejoins the quorum with this answer.
                    round.admit(worker);
                }
                round.accept(worker, gradient, now)
            }
        };
        let mut actions = Vec::with_capacity(2);
        let answered_again = matches!(result, Ok(_) | Err(RoundError::Late { .. }));
        if let (true, Some(m)) = (answered_again, self.members.get_mut(&worker)) {
            let returned = !m.active;
            *m = Member::default();
            if returned {
                info!(%worker, "worker answered again; back in the quorum");
                actions.push(Action::Quorum(worker, true));
            }
        }
        let complete = matches!(result, Ok(Progress::Complete));
        actions.push(match result {
            Ok(_) => Action::Accepted(worker),
            Err(err) => Action::Refuse(worker, err.into()),
        });
        if complete {
            // The last answer closes the round: its update goes out with this answer.
            let round = self.round.take().expect("an answer was accepted into it");
            actions.extend(self.close(round, now));
        }
        actions
    }

    fn sent(&mut self, worker: WorkerId, _version: u64) {
        if let Some(m) = self.members.get_mut(&worker) {
            m.unanswered = true;
        }
    }

    fn tick(&mut self, now: Instant) -> Vec<Action> {
        let extension = self.deadline.timeout();
        let Some(round) = self.round.as_mut() else {
            return Vec::new();
        };
        if round.tick(now, extension) != Progress::Extended {
            return Vec::new();
        }
        // Widen the round to workers that joined after it opened: without them a quorum
        // may be impossible (e.g. a frozen participant and a newcomer waiting outside).
        let newcomers: Vec<WorkerId> = self
            .members
            .iter()
            .filter(|(id, m)| m.active && !round.is_participant(**id))
            .map(|(id, _)| *id)
            .collect();
        for &id in &newcomers {
            round.admit(id);
        }
        info!(
            round = %round.round(),
            answered = round.answered(),
            quorum = self.min_workers,
            admitted = newcomers.len(),
            extended_by_ms = extension.as_millis() as u64,
            "deadline passed without quorum; round extended"
        );
        let mut actions = vec![Action::Extended];
        if !newcomers.is_empty() {
            actions.push(Action::Rebalance);
            actions.extend(newcomers.into_iter().map(Action::Weights));
        }
        actions
    }

    fn settle(&mut self, view: View, now: Instant) -> Vec<Action> {
        match self.round.as_ref().map(OpenRound::progress) {
            Some(Progress::Complete) => {
                let round = self.round.take().expect("checked above");
                // Opening the next round waits for the next settle, after the update.
                let actions = self.close(round, now);
                if !actions.is_empty() {
                    return actions;
                }
            }
            Some(Progress::Abandoned) => {
                let round = self.round.take().expect("checked above");
                info!(round = %round.round(), "every participant left; restarting the round");
                self.aggregator = Some(round.into_aggregator());
            }
            Some(Progress::Waiting | Progress::Extended) | None => {}
        }
        let may_open = !view.finished && !view.paused;
        if self.round.is_none() && may_open && self.members.len() >= self.min_workers {
            return self.open(view, now);
        }
        Vec::new()
    }

    fn deadline(&self) -> Option<Instant> {
        self.round.as_ref().map(OpenRound::deadline)
    }

    fn deadline_history(&self) -> Vec<Duration> {
        self.deadline.history()
    }

    fn restore_deadlines(&mut self, latencies: &[Duration]) {
        self.deadline.restore(latencies);
    }

    fn standing(&self) -> Standing {
        Standing {
            training: self.round.is_some(),
            participants: self
                .round
                .as_ref()
                .map_or(0, |r| r.pending() + r.answered()),
            answered: self.round.as_ref().map_or(0, OpenRound::answered),
            skipped: self.members.values().filter(|m| !m.active).count(),
            round_timeout: self.round_timeout,
        }
    }

    fn roster(&self) -> Roster {
        self.round
            .as_ref()
            .map_or_else(Roster::default, |r| Roster {
                participants: r.size(),
                counting: r.counting().collect(),
            })
    }

    fn is_skipped(&self, worker: WorkerId) -> bool {
        self.members.get(&worker).is_some_and(|m| !m.active)
    }

    fn excuse(&mut self, worker: WorkerId) -> Vec<Action> {
        if let Some(round) = self.round.as_mut() {
            round.excuse(worker);
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests;

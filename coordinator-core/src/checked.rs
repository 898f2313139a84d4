//! What the checks' [`Step`]s become (`checks/machine.rs` decides them): an admitted answer
//! passes the norm bound and is weighed by its assigned batch before the schedule takes it;
//! a refused one may strike and ban its worker; an excused one lets its round go on; a
//! challenge and a recomputation go out to the driver.

use std::time::Instant;

use protocol::{Gradient, WorkerId};
use tracing::debug;

use crate::checks::step::{Context, Step};
use crate::checks::Checks;
use crate::io::Output;
use crate::refusal::Refusal;
use crate::registry::tally::Note;
use crate::schedule::{Action, Contribution};
use crate::session::Outbound;
use crate::Coordinator;

impl Coordinator {
    /// The checks, and what they may read and count while they decide.
    pub(crate) fn checks(&mut self) -> (&mut Checks, Context<'_>) {
        let rounds = self.is_sync();
        let cx = Context {
            registry: &self.registry,
            metrics: &mut self.metrics,
            trainer: &mut self.trainer,
            train: &self.train,
            local: self.local.as_ref(),
            batch_size: self.settings.batch_size,
            rounds,
            schedule: &*self.schedule,
            finished: self.outcome.is_some(),
        };
        (&mut self.checks, cx)
    }

    /// Carries out the checks' steps, in order.
    pub(crate) fn carry_out(&mut self, steps: Vec<Step<'_>>, now: Instant) {
        for step in steps {
            match step {
                Step::Admit {
                    worker,
                    gradient,
                    norm,
                } => self.admit(worker, &gradient, norm, now),
                Step::Recompute(job) => self.outputs.push_back(Output::Recompute(*job)),
                Step::Ask(worker, challenge) => {
                    let frame = protocol::encode_from_coordinator(
                        &protocol::CoordinatorToWorker::Challenge(challenge),
                    );
                    self.send(worker, Outbound::frame(frame));
                }
                Step::Excuse(worker) => {
                    let actions = self.schedule.excuse(worker);
                    self.execute(actions);
                }
                Step::Note(worker, note) => self.registry.note(worker, note),
                Step::Vouch { worker, steps } => self.registry.vouch(worker, steps),
                Step::Refuse {
                    worker,
                    refusal,
                    strike,
                    excuse,
                    tell,
                } => self.refuse(worker, refusal, strike, excuse, tell),
            }
        }
    }

    /// `--replicate`: a deadline came or a partner left; answers still held alone are
    /// recomputed.
    pub(crate) fn release_replicas(&mut self, now: Instant) {
        let (checks, mut cx) = self.checks();
        let steps = checks.release_replicas(&mut cx);
        self.carry_out(steps, now);
    }

    /// Challenged phases whose states did not come in time, or whose worker left.
    pub(crate) fn expire_challenges(&mut self, now: Instant) {
        let (checks, mut cx) = self.checks();
        let steps = checks.expire(&mut cx, now);
        self.carry_out(steps, now);
    }

    /// Length, norm bound, assigned batch, then the schedule. A local phase's answer is
    /// first brought to the common length (`local.rs`): its norm too.
    fn admit(&mut self, worker: WorkerId, gradient: &Gradient, norm: f64, now: Instant) {
        let steps = self
            .registry
            .pull(worker)
            .and_then(|p| p.local)
            .map_or(1, |l| l.steps);
        let length = self.local.as_ref().map_or(1.0, |plan| plan.scale(steps));
        let norm = norm * f64::from(length);
        let clip = self.bound.clip(norm);
        if clip.clipped {
            debug!(%worker, norm, bound = self.bound.bound(), "gradient clipped to the norm bound");
            self.metrics.clipped();
            self.registry.note(worker, Note::Clipped);
        }
        let samples = self
            .registry
            .assigned_batch(worker, self.settings.batch_size)
            .unwrap_or(gradient.samples);
        let scale = clip.scale * length;
        // `--worker-momentum`: the rule combines the worker's momentum, kept if accepted.
        let momentum = self
            .momenta
            .as_mut()
            .and_then(|m| m.blend(worker, &gradient.grads, scale));
        let contribution = match &momentum {
            Some(m) => Contribution {
                samples,
                grads: m,
                scale: 1.0,
                steps,
                ..Contribution::of(gradient)
            },
            None => Contribution {
                samples,
                scale,
                steps,
                ..Contribution::of(gradient)
            },
        };
        let actions = self
            .schedule
            .gradient(worker, &contribution, self.view(), now);
        if actions.contains(&Action::Accepted(worker)) {
            self.bound.learn(norm);
            if let (Some(momenta), Some(m)) = (self.momenta.as_mut(), momentum) {
                momenta.keep(worker, m);
            }
        }
        self.execute(actions);
    }

    /// A refused answer or frame: noted; a strike if it counts (at `--ban-after`, a ban:
    /// its session is closed with why); its round goes on without it if `excuse`; its
    /// session told why if `tell` (and still open).
    fn refuse(
        &mut self,
        worker: WorkerId,
        refusal: Refusal,
        strike: bool,
        excuse: bool,
        tell: bool,
    ) {
        self.registry.note(worker, Note::Rejected(refusal.code));
        let banned = match strike.then(|| self.registry.strike(worker)) {
            Some((_, true)) => {
                self.ban_close(worker, Some(&refusal.message));
                true
            }
            Some((strikes, false)) => {
                debug!(%worker, strikes, "struck");
                false
            }
            None => false,
        };
        if tell && !banned {
            self.send_error(worker, refusal);
        }
        if excuse {
            let actions = self.schedule.excuse(worker);
            self.execute(actions);
        }
    }

    /// Sends a non-fatal error frame: the session goes on.
    pub(crate) fn send_error(&mut self, worker: WorkerId, refusal: Refusal) {
        let frame = protocol::encode_from_coordinator(&protocol::CoordinatorToWorker::Error {
            code: refusal.code,
            message: refusal.message,
        });
        self.send(worker, Outbound::frame(frame));
    }

    /// `worker` was just banned (`why`: what its last strike was for): its session is closed
    /// with `Banned`, and its answers still waiting for a core to check them are dropped.
    pub(crate) fn ban_close(&mut self, worker: WorkerId, why: Option<&str>) {
        let dropped = self.checks.banned(worker);
        if dropped > 0 {
            debug!(%worker, dropped, "a banned worker's queued checks dropped");
        }
        let msg = match why {
            Some(why) => format!("{worker} is banned from this run: {why}"),
            None => format!("{worker} is banned from this run"),
        };
        self.send(
            worker,
            Outbound::Close(Refusal::new(protocol::ErrorCode::Banned, msg)),
        );
    }

    /// Values in one revealed state: the weights and the inner optimizer's tensors.
    #[cfg(test)]
    pub(crate) fn state_len(&self) -> usize {
        crate::checks::step::state_len(&self.trainer, self.local.as_ref())
    }
}

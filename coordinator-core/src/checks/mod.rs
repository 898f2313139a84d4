//! What the coordinator checks in a gradient the session validated, before its schedule sees
//! it: recomputation for a sampled fraction ([`audit`], [`verify`](mod@verify), off its task
//! within a budget of cores: [`recompute`]), agreement with its
//! replicas (`--replicate`, [`replicas`]), the norm bound ([`clip`]), the weight it deserves
//! (its assigned batch). A GPU's local phase is checked by segments instead: [`challenge`]
//! asks for its committed states, and [`segment`] replays each segment.

pub mod audit;
pub mod challenge;
pub mod clip;
pub mod job;
pub mod recompute;
pub mod replicas;
pub mod segment;
pub mod verdict;
pub mod verify;

use std::sync::Arc;
use std::time::Instant;

use protocol::{Compression, ErrorCode, Gradient, WorkerId};
use tracing::{debug, warn};

use self::recompute::{Held, Inputs, Recomputed, Refuted, Then};
use self::replicas::Fate;
use crate::io::Output;
use crate::refusal::Refusal;
use crate::registry::tally::Note;
use crate::schedule::{Action, Contribution};
use crate::session::{Outbound, SessionId};
use crate::Coordinator;

/// A seed nobody outside the process can know, for sampling what to verify.
pub(crate) fn unpredictable_seed() -> u64 {
    let mut seed = [0u8; 8];
    // Without the OS's randomness, the time: sampling still happens, only less secretly.
    if getrandom::fill(&mut seed).is_err() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        return now.map_or(0, |d| d.as_nanos() as u64);
    }
    u64::from_le_bytes(seed)
}

/// Bad input that counts against an address (a broken or hostile client), unlike being
/// replaced, too slow, unauthorized or on an old protocol version.
pub(crate) fn strikes_an_address(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::Malformed
            | ErrorCode::UnexpectedMessage
            | ErrorCode::ShapeMismatch
            | ErrorCode::NonFinite
            | ErrorCode::RateLimited
    )
}

impl Coordinator {
    /// Weighs a validated gradient from `session`, has it recomputed if sampled (off the
    /// coordinator's task: it goes on when the verdict comes back, `recomputed`), and hands
    /// it to the schedule.
    pub(crate) fn check(
        &mut self,
        worker: WorkerId,
        session: SessionId,
        gradient: &Gradient,
        norm: f64,
        now: Instant,
    ) {
        if self.audits.unchecked(worker, gradient.round.0) {
            debug!(%worker, round = %gradient.round, "on probation and not recomputed; dropped");
            return self.unchecked(worker);
        }
        let committed = self.committed(worker, gradient);
        let Some(audit) = self.audits.take(worker, gradient.round.0) else {
            return self.replicated(worker, gradient, norm, now);
        };
        let probation = self.registry.on_probation(worker);
        // A GPU's phase: held while its states are asked for, then replayed by segments.
        if let Some(local) = committed {
            if probation {
                self.metrics.probation_checked();
            }
            let held = Held {
                worker,
                session,
                gradient: Arc::new(gradient.clone()),
                norm,
                pull: audit.pull.clone(),
                then: Then::Check,
            };
            return self.challenge(held, audit, local, now);
        }
        if probation {
            self.metrics.probation_checked();
        }
        // A trusted worker's sampled phase counts at once and is judged when its replay
        // comes back: held, it would hold its whole round for a phase's replay
        // (`recompute.rs`). Only while a core is free: a busy budget holds answers back.
        let after = !probation && self.local.is_some() && self.recomputations.core_free();
        let held = Held {
            worker,
            session,
            gradient: Arc::new(gradient.clone()),
            norm,
            pull: audit.pull,
            then: if after { Then::Judge } else { Then::Check },
        };
        self.hold(held, audit.weights, audit.compression, None, now);
        if after {
            self.replicated(worker, gradient, norm, now);
        }
    }

    /// On probation and not recomputed: dropped, without a strike.
    fn unchecked(&mut self, worker: WorkerId) {
        self.metrics.probation_unchecked();
        let actions = self.schedule.excuse(worker);
        self.execute(actions);
    }

    /// `--replicate`: held until its partners' answers agree (or it is recomputed); else
    /// on to the schedule.
    fn replicated(&mut self, worker: WorkerId, gradient: &Gradient, norm: f64, now: Instant) {
        let Some((key, size)) = self.registry.replica_group(worker) else {
            return self.admit(worker, gradient, norm, now);
        };
        let arrival = self.replicas.arrive(&key, size, worker, gradient, norm);
        for (r, fate) in arrival.earlier {
            self.settle_replica(r.worker, &r.gradient, r.norm, fate, now);
        }
        self.settle_replica(worker, gradient, norm, arrival.this, now);
    }

    /// `--replicate`: answers still held alone go on if the coordinator's recomputation
    /// agrees with them.
    pub(crate) fn release_replicas(&mut self, now: Instant) {
        for r in self.replicas.release_alone() {
            self.settle_replica(r.worker, &r.gradient, r.norm, Fate::Disputed, now);
        }
    }

    /// An agreed answer goes on; a disputed one is recomputed on the weights of its round, as
    /// its worker decoded them, and goes on if it matches (a mismatch is a strike, as for a
    /// sampled one). An answer to a round that already closed cannot be recomputed: the
    /// schedule refuses it as late.
    fn settle_replica(
        &mut self,
        worker: WorkerId,
        gradient: &Gradient,
        norm: f64,
        fate: Fate,
        now: Instant,
    ) {
        match fate {
            Fate::Held => {}
            Fate::Agreed => self.admit(worker, gradient, norm, now),
            Fate::Disputed => {
                debug!(%worker, round = %gradient.round, "replica disputed or left alone; recomputing");
                // Only the current version's weights are at hand: an answer to a round that
                // already closed is refused as late by the schedule anyway.
                let current = gradient.round.0 == self.trainer.version();
                let pull = self.registry.pull(worker).cloned();
                let session = self.registry.session(worker);
                match (pull, self.registry.compression(worker), session) {
                    (Some(pull), Some(compression), Some(session))
                        if current && pull.version == gradient.round.0 =>
                    {
                        let weights = self.trainer.weights_as_seen(compression);
                        let held = Held {
                            worker,
                            session,
                            gradient: Arc::new(gradient.clone()),
                            norm,
                            pull,
                            then: Then::Admit,
                        };
                        self.hold(held, weights, compression, None, now);
                    }
                    _ => self.admit(worker, gradient, norm, now),
                }
            }
        }
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

    /// `--verify-fraction`, `--probation`, `--replicate`: `held` is recomputed on `weights`
    /// (as its worker decoded them, in `compression`) and the batch its pull's `Task` named,
    /// off the coordinator's task (`recompute.rs`). With no room left for it, a probation
    /// answer or a disputed replica is dropped without a strike, and a sampled one goes on
    /// unchecked.
    pub(crate) fn hold(
        &mut self,
        held: Held,
        weights: Arc<[f32]>,
        compression: Compression,
        segments: Option<segment::Revealed>,
        now: Instant,
    ) {
        let order = self
            .registry
            .kind(held.worker)
            .map_or(model::Order::Library, verify::likely_order);
        let inputs = Inputs {
            net: self.trainer.net(),
            train: &self.train,
            weights,
            compression,
            batch_size: self.settings.batch_size as usize,
            order,
            segments,
        };
        let started = self.recomputations.start(held, inputs);
        self.metrics.recomputing(self.recomputations.len(), 0.0);
        match started {
            Ok(Some(job)) => self.outputs.push_back(Output::Recompute(job)),
            Ok(None) => {}
            Err(held) if held.then == Then::Judge => {
                warn!(worker = %held.worker, "no room to recompute a phase that counted");
            }
            Err(held) => {
                let probation = self.registry.on_probation(held.worker);
                warn!(worker = %held.worker, probation, "no room to recompute an answer");
                if probation || held.then == Then::Admit {
                    self.unchecked(held.worker);
                } else {
                    self.replicated(held.worker, &held.gradient, held.norm, now);
                }
            }
        }
    }

    /// Input: a recomputation the driver ran came back. A match goes on as if it had never
    /// waited; a mismatch drops the answer with a `Mismatch` error and a strike. A worker
    /// that left or reconnected meanwhile is not sent anything, and its answer goes
    /// nowhere; a mismatch still strikes its identity.
    pub fn recomputed(&mut self, done: Recomputed, now: Instant) {
        self.now = now;
        let (held, next) = self.recomputations.done(&done);
        if let Some(job) = next {
            self.outputs.push_back(Output::Recompute(job));
        }
        // A verdict for no job of this coordinator's (a stale one) is not counted.
        let seconds = if held.is_some() { done.seconds } else { 0.0 };
        self.metrics.recomputing(self.recomputations.len(), seconds);
        if let Some(held) = held.as_ref() {
            self.metrics.branches(done.branches);
            if done.segments > 0 {
                let ms = (done.seconds * 1e3) as u64;
                self.metrics.segments_replayed(done.segments, ms);
                let note = Note::Replayed {
                    segments: done.segments,
                    ms,
                };
                self.registry.note(held.worker, note);
            }
        }
        if let (Some(held), None) = (held, &self.outcome) {
            self.judge(held, done.verdict, now);
        }
        self.done(now);
    }

    /// An answer refuted before (or without) its recomputation: as a mismatch's verdict.
    pub(crate) fn refute(&mut self, held: Held, refuted: Refuted, now: Instant) {
        self.judge(held, Ok(Err(refuted)), now);
    }

    fn judge(&mut self, held: Held, verdict: Result<Result<(), Refuted>, String>, now: Instant) {
        let verdict = match verdict {
            Ok(Err(Refuted::Marginal { segment, why })) => {
                return self.marginal(held, segment, why, now);
            }
            other => other,
        };
        self.close_challenge(&held);
        if self.registry.is_banned(held.worker) {
            // A check that was running when its worker was banned: nothing left to judge.
            debug!(worker = %held.worker, "a banned worker's verdict; dropped");
            return;
        }
        let Held {
            worker,
            session,
            gradient,
            norm,
            pull,
            then,
        } = held;
        let current = self.registry.is_current(worker, session);
        match verdict {
            Ok(Ok(())) => {
                self.metrics.verified(true);
                self.registry.note(worker, Note::Verified);
                self.go_on(worker, &gradient, norm, then, current, now);
            }
            Ok(Err(mismatch)) => {
                self.metrics.verified(false);
                self.registry
                    .note(worker, Note::Rejected(ErrorCode::Mismatch));
                let (strikes, banned) = if self.audits.strikes(worker, &pull) {
                    self.registry.strike(worker)
                } else {
                    debug!(%worker, "the same work again: dropped, not struck again");
                    (self.registry.strikes(worker), false)
                };
                if banned {
                    self.ban_close(worker);
                }
                let message = if then == Then::Judge {
                    warn!(%worker, strikes, %mismatch, "a phase that counted does not match its replay");
                    format!(
                        "the phase for {} did not match its replay: {mismatch}",
                        gradient.round
                    )
                } else {
                    warn!(%worker, strikes, %mismatch, "recomputed gradient does not match; dropped");
                    if current {
                        let actions = self.schedule.excuse(worker);
                        self.execute(actions);
                    }
                    format!("gradient for {} dropped: {mismatch}", gradient.round)
                };
                if current {
                    self.send_error(worker, Refusal::new(ErrorCode::Mismatch, message));
                }
            }
            Err(err) => {
                warn!(%worker, %err, "could not recompute a gradient; not verified");
                self.go_on(worker, &gradient, norm, then, current, now);
            }
        }
    }

    /// A verdict that does not hold the answer back: on to its replicas or the schedule, if
    /// it was waiting and its session is still the worker's.
    fn go_on(
        &mut self,
        worker: WorkerId,
        gradient: &Gradient,
        norm: f64,
        then: Then,
        current: bool,
        now: Instant,
    ) {
        match (current, then) {
            (false, _) | (true, Then::Judge) => {}
            (true, Then::Check) => self.replicated(worker, gradient, norm, now),
            (true, Then::Admit) => self.admit(worker, gradient, norm, now),
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

    /// `worker` was just banned: its session is closed with `Banned`, and its answers still
    /// waiting for a core to check them are dropped.
    pub(crate) fn ban_close(&mut self, worker: WorkerId) {
        let dropped = self.recomputations.forget(worker);
        if dropped > 0 {
            debug!(%worker, dropped, "a banned worker's queued checks dropped");
        }
        let msg = format!("{worker} is banned from this run");
        self.send(
            worker,
            Outbound::Close(Refusal::new(ErrorCode::Banned, msg)),
        );
    }
}

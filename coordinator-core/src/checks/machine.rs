//! [`Checks`]: everything that stands between an answer the session validated and the
//! schedule, as a state machine of its own. It owns the audits ([`super::audit`]), the
//! replicas ([`super::replicas`]), the recomputations running off the coordinator's task
//! ([`super::recompute`]) and the challenges of GPU phases ([`super::challenge`]). Each
//! input (an answer, a verdict, commitments, a revealed chunk, the time) comes with a
//! [`Context`] to read, and is answered with [`Step`]s (admit, recompute, ask, excuse,
//! vouch, refuse, note) that the coordinator carries out in order (`checked.rs`).
//!
//! Probation's state is the registry's (`registry/trust.rs`: who is on it, how often an
//! answer is sampled); what probation means for an answer is decided here. A newcomer's
//! answer counts only once replayed; in a sync round of local phases, one that would wait
//! behind more than one replay a core is excused from its round instead of holding it,
//! and its verdict only judges its worker ([`Then::Vouch`]): a crowd that arrives at once
//! no longer waits for every newcomer's replay in series (sixteen tabs of the 0.8M GPT
//! waited 25 % of their time for them on one core; docs/BENCHMARKS.md, "The crowd"). Tried
//! alone, it lost (its replays queued ahead of the trusted samples that follow probation,
//! which held their rounds behind them); with those samples at the floor while the checks
//! are full (`Coordinator::check_for`), sixteen tabs reach 2.0 in 401.7 s against 439.3 s
//! with the floor alone and 459.4 s with neither. A trusted worker's sampled phase is
//! treated alike once its replay would wait behind others ([`Then::Aside`]), as long as
//! another trusted participant carries its round, its verdict would come back later than
//! one participant's share of the round's time, and at most one answer in
//! [`ASIDE_SHARE`] of the round's is set aside: a crowd's round closes on the answers
//! that count, and does not wait long for a replay of one answer among many.

use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::{Commitments, Compression, ErrorCode, Gradient, LocalPhase, RevealChunk, WorkerId};
use tracing::{debug, info, warn};

use super::audit::{Audit, Audits};
use super::challenge::{calls_for, committed, Challenges};
use super::job::{Held, Inputs, Recomputed, Then};
use super::recompute::Recomputations;
use super::replicas::{Fate, Replicas};
use super::segment::Revealed;
use super::step::{Answer, Context, Step};
use super::verdict::Refuted;
use crate::local::LocalPlan;
use crate::refusal::Refusal;
use crate::registry::tally::Note;
use crate::session::SessionId;

/// The checks' state: see the module's documentation.
#[derive(Debug)]
pub(crate) struct Checks {
    /// `--verify-fraction`, `--probation`: the pulls whose answers are recomputed, sampled
    /// with a seed workers cannot predict.
    pub(crate) audits: Audits,
    /// `--replicate`: answers held until a partner's agrees.
    pub(crate) replicas: Replicas,
    /// Answers being recomputed off the coordinator's task, and those waiting for a core.
    pub(crate) recomputations: Recomputations,
    /// GPU phases' commitments, and the challenges open for their states.
    pub(crate) challenges: Challenges,
    /// The sync round whose sampled phases were last set aside, and how many were.
    aside: (u64, usize),
}

/// One of `participants`' share of the round's expected time: what holding the round for
/// one answer may cost before setting it aside costs less (the answer is worth about that
/// share of the round's progress, and less past the noise scale).
fn share_of_round(cx: &Context<'_>, participants: usize) -> Option<Duration> {
    let round = cx.local.and_then(LocalPlan::expected)?;
    Some(round / u32::try_from(participants.max(1)).unwrap_or(u32::MAX))
}

/// At most one answer in this many of a round's participants is set aside
/// ([`Then::Aside`]): a crowd keeps three quarters of its work however many of its answers
/// are sampled, and a round of two or three holds as before. Where every answer is sampled
/// (`--verify-fraction 1`), setting them all aside would drop half of two workers' work
/// and never slow the rounds to what the cores can check; held, they do.
pub const ASIDE_SHARE: usize = 4;

type Steps<'g> = Vec<Step<'g>>;

impl Checks {
    /// Draws with `seed`; recomputes on at most `cores` cores at once.
    pub fn new(seed: u64, cores: usize) -> Self {
        Self {
            audits: Audits::new(seed),
            replicas: Replicas::default(),
            recomputations: Recomputations::new(cores),
            challenges: Challenges::new(seed),
            aside: (0, 0),
        }
    }

    /// `worker` left: nothing of its is kept.
    pub fn left(&mut self, worker: WorkerId) {
        self.audits.left(worker);
        self.challenges.left(worker);
    }

    /// `worker` was banned: its answers still waiting for a core are dropped. Returns how
    /// many.
    pub fn banned(&mut self, worker: WorkerId) -> usize {
        self.recomputations.forget(worker)
    }

    /// When the first challenged phase's states are due.
    pub fn due(&self) -> Option<Instant> {
        self.challenges.due()
    }

    /// Whether the checks are full for a round of `round`: the replays running and waiting,
    /// with the audited pulls of `version` still out, would keep every core busy for the
    /// round's time or longer. A trusted worker's pull is then sampled at the floor
    /// (`Coordinator::check_for`).
    pub fn full(&self, version: u64, round: Duration) -> bool {
        let ahead = self.audits.outstanding(version);
        self.recomputations.outlast(ahead, round)
    }

    /// Answers held for a partner (`--replicate`).
    pub fn holding_replicas(&self) -> bool {
        self.replicas.holding()
    }

    /// Input: an answer from `worker`'s current session, of L2 norm `norm`. Weighed,
    /// recomputed if its pull was sampled (a GPU's phase challenged for its states), held
    /// for its replicas, or admitted.
    pub fn answer<'g>(
        &mut self,
        cx: &mut Context<'_>,
        worker: WorkerId,
        session: SessionId,
        gradient: &'g Gradient,
        norm: f64,
        now: Instant,
    ) -> Steps<'g> {
        let mut out = Vec::new();
        if self.audits.unchecked(worker, gradient.round.0) {
            debug!(%worker, round = %gradient.round, "on probation and not recomputed; dropped");
            unchecked(cx, worker, &mut out);
            return out;
        }
        let committed = committed(cx.registry.pull(worker), gradient);
        let Some(audit) = self.audits.take(worker, gradient.round.0) else {
            self.replicated(cx, worker, Answer::Arrived(gradient), norm, &mut out);
            return out;
        };
        let probation = cx.registry.on_probation(worker);
        // A newcomer's phase does not hold its sync round while a trusted worker's answer
        // can carry the round, nor when its replay would wait longer than one a core:
        // excused at once, its replay only judges its worker (`Then::Vouch`), after every
        // replay that holds or judges an answer. While one such phase waits for its
        // verdict, the worker's later ones are excused unreplayed: that verdict is what its
        // probation waits for.
        let vouch = probation
            && cx.rounds
            && cx.local.is_some()
            && (cx.registry.any_trusted() || !self.recomputations.short_wait());
        if vouch && self.recomputations.vouching(worker) {
            debug!(%worker, round = %gradient.round, "an earlier phase awaits its verdict; excused unreplayed");
            unchecked(cx, worker, &mut out);
            return out;
        }
        if probation {
            cx.metrics.probation_checked();
        }
        // A GPU's phase: held while its states are asked for, then replayed by segments.
        if let Some(local) = committed {
            let held = Held {
                worker,
                session,
                gradient: Arc::new(gradient.clone()),
                norm,
                pull: audit.pull.clone(),
                then: Then::Check,
            };
            self.challenge(cx, held, audit, local, now, &mut out);
            return out;
        }
        // A trusted worker's sampled phase counts at once and is judged when its replay
        // comes back: held, it would hold its whole round for a phase's replay
        // (`recompute.rs`). Only while its replay waits at most one job a core: a budget
        // that cannot keep up holds answers back.
        let after = !probation && cx.local.is_some() && self.recomputations.short_wait();
        // Past that, in a sync round, it may be set aside: excused from its round and
        // replayed only to judge its worker (`may_set_aside`).
        let aside = !probation
            && !after
            && cx.rounds
            && cx.local.is_some()
            && self.may_set_aside(cx, worker, gradient.round.0);
        let held = Held {
            worker,
            session,
            gradient: Arc::new(gradient.clone()),
            norm,
            pull: audit.pull,
            then: match (after, aside, vouch) {
                (true, _, _) => Then::Judge,
                (false, true, _) => Then::Aside,
                (false, false, true) => Then::Vouch,
                (false, false, false) => Then::Check,
            },
        };
        if aside {
            debug!(%worker, round = %gradient.round, "a sampled phase set aside rather than holding its round");
            cx.metrics.sampled_aside();
            self.aside = (gradient.round.0, self.set_aside(gradient.round.0) + 1);
        }
        if vouch || aside {
            out.push(Step::Excuse(worker));
        }
        self.hold(cx, held, audit.weights, audit.compression, None, &mut out);
        if after {
            self.replicated(cx, worker, Answer::Arrived(gradient), norm, &mut out);
        }
        out
    }

    /// Sampled phases of `round` set aside so far.
    fn set_aside(&self, round: u64) -> usize {
        if self.aside.0 == round {
            self.aside.1
        } else {
            0
        }
    }

    /// Whether `worker`'s sampled phase of `round`, past the short wait, is set aside: its
    /// replay would cost the round more than the answer is worth (one participant's share
    /// of the round's time), another trusted participant carries the round, and fewer than
    /// one answer in [`ASIDE_SHARE`] of the round's is set aside already. Held otherwise,
    /// saying which bound held it.
    fn may_set_aside(&self, cx: &Context<'_>, worker: WorkerId, round: u64) -> bool {
        let roster = cx.schedule.roster();
        let carried = roster
            .counting
            .iter()
            .any(|&w| w != worker && !cx.registry.on_probation(w));
        let room = (self.set_aside(round) + 1) * ASIDE_SHARE <= roster.participants;
        let share = share_of_round(cx, roster.participants);
        let outwaits = self.recomputations.outwaits(share);
        let aside = carried && room && outwaits;
        if !aside {
            debug!(%worker, round, carried, room, outwaits, "a sampled phase held: it could not be set aside");
        }
        aside
    }

    /// `--replicate`: held until its partners' answers agree (or it is recomputed); else
    /// admitted.
    fn replicated<'g>(
        &mut self,
        cx: &mut Context<'_>,
        worker: WorkerId,
        gradient: Answer<'g>,
        norm: f64,
        out: &mut Steps<'g>,
    ) {
        let Some((key, size)) = cx.registry.replica_group(worker) else {
            return out.push(Step::Admit {
                worker,
                gradient,
                norm,
            });
        };
        let arrival = self.replicas.arrive(&key, size, worker, &gradient, norm);
        for (r, fate) in arrival.earlier {
            let earlier = Answer::Held(Arc::new(r.gradient));
            self.settle_replica(cx, r.worker, earlier, r.norm, fate, out);
        }
        self.settle_replica(cx, worker, gradient, norm, arrival.this, out);
    }

    /// Input: a round's deadline came, or a partner left. Answers still held alone go on
    /// if the coordinator's recomputation agrees with them.
    pub fn release_replicas(&mut self, cx: &mut Context<'_>) -> Steps<'static> {
        let mut out = Vec::new();
        for r in self.replicas.release_alone() {
            let alone = Answer::Held(Arc::new(r.gradient));
            self.settle_replica(cx, r.worker, alone, r.norm, Fate::Disputed, &mut out);
        }
        out
    }

    /// An agreed answer is admitted; a disputed one is recomputed on the weights of its
    /// round, as its worker decoded them, and admitted if it matches (a mismatch is a
    /// strike, as for a sampled one). An answer to a round that already closed cannot be
    /// recomputed: the schedule refuses it as late.
    fn settle_replica<'g>(
        &mut self,
        cx: &mut Context<'_>,
        worker: WorkerId,
        gradient: Answer<'g>,
        norm: f64,
        fate: Fate,
        out: &mut Steps<'g>,
    ) {
        match fate {
            Fate::Held => {}
            Fate::Agreed => out.push(Step::Admit {
                worker,
                gradient,
                norm,
            }),
            Fate::Disputed => {
                debug!(%worker, round = %gradient.round, "replica disputed or left alone; recomputing");
                // Only the current version's weights are at hand: an answer to a round that
                // already closed is refused as late by the schedule anyway.
                let current = gradient.round.0 == cx.trainer.version();
                let pull = cx.registry.pull(worker).cloned();
                let session = cx.registry.session(worker);
                match (pull, cx.registry.compression(worker), session) {
                    (Some(pull), Some(compression), Some(session))
                        if current && pull.version == gradient.round.0 =>
                    {
                        let weights = cx.trainer.weights_as_seen(compression);
                        let held = Held {
                            worker,
                            session,
                            gradient: gradient.held(),
                            norm,
                            pull,
                            then: Then::Admit,
                        };
                        self.hold(cx, held, weights, compression, None, out);
                    }
                    _ => out.push(Step::Admit {
                        worker,
                        gradient,
                        norm,
                    }),
                }
            }
        }
    }

    /// `held` is recomputed on `weights` (as its worker decoded them, in `compression`) and
    /// the batch its pull's `Task` named, off the coordinator's task (`recompute.rs`). With
    /// no room left for it, a probation answer or a disputed replica is dropped without a
    /// strike, and a sampled one goes on unchecked.
    fn hold<'g>(
        &mut self,
        cx: &mut Context<'_>,
        held: Held,
        weights: Arc<[f32]>,
        compression: Compression,
        segments: Option<Revealed>,
        out: &mut Steps<'g>,
    ) {
        let order = cx
            .registry
            .order(held.worker)
            .unwrap_or(model::Order::Library);
        let inputs = Inputs {
            net: cx.trainer.net(),
            train: cx.train,
            weights,
            compression,
            batch_size: cx.batch_size as usize,
            order,
            segments,
        };
        let started = self.recomputations.start(held, inputs);
        cx.metrics.recomputing(self.recomputations.len(), 0.0);
        match started {
            Ok(started) => {
                if let Some(job) = started.job {
                    out.push(Step::Recompute(Box::new(job)));
                }
                match started.evicted {
                    Some(turned) if turned.then == Then::Vouch => {
                        // Excused from its round already: its probation waits for a later phase.
                        debug!(worker = %turned.worker, "a newcomer's phase gave its place to a more urgent check");
                        cx.metrics.probation_unchecked();
                    }
                    Some(turned) => {
                        warn!(worker = %turned.worker, "a phase set aside gave its place to a more urgent check");
                    }
                    None => {}
                }
            }
            Err(held) if held.then == Then::Judge => {
                warn!(worker = %held.worker, "no room to recompute a phase that counted");
            }
            Err(held) if held.then == Then::Aside => {
                // Excused from its round already: nothing of it reaches the model.
                warn!(worker = %held.worker, "no room to recompute a phase set aside");
            }
            Err(held) if held.then == Then::Vouch => {
                // Excused from its round already: its probation waits for a later phase.
                warn!(worker = %held.worker, "no room to recompute a newcomer's phase");
                cx.metrics.probation_unchecked();
            }
            Err(held) => {
                let probation = cx.registry.on_probation(held.worker);
                warn!(worker = %held.worker, probation, "no room to recompute an answer");
                if probation || held.then == Then::Admit {
                    unchecked(cx, held.worker, out);
                } else {
                    let answer = Answer::Held(held.gradient);
                    self.replicated(cx, held.worker, answer, held.norm, out);
                }
            }
        }
    }

    /// Input: a recomputation the driver ran came back. A match goes on as if it had never
    /// waited; a mismatch refuses the answer with a `Mismatch` error and a strike. A worker
    /// that left or reconnected meanwhile is not sent anything, and its answer goes
    /// nowhere; a mismatch still strikes its identity.
    pub fn recomputed(
        &mut self,
        cx: &mut Context<'_>,
        done: Recomputed,
        now: Instant,
    ) -> Steps<'static> {
        let mut out = Vec::new();
        let (held, next) = self.recomputations.done(&done);
        if let Some(job) = next {
            out.push(Step::Recompute(Box::new(job)));
        }
        // A verdict for no job of this coordinator's (a stale one) is not counted.
        let seconds = if held.is_some() { done.seconds } else { 0.0 };
        cx.metrics.recomputing(self.recomputations.len(), seconds);
        if let Some(held) = held.as_ref() {
            cx.metrics.branches(done.branches);
            if done.segments > 0 {
                let ms = (done.seconds * 1e3) as u64;
                cx.metrics.segments_replayed(done.segments, ms);
                let note = Note::Replayed {
                    segments: done.segments,
                    ms,
                };
                out.push(Step::Note(held.worker, note));
            }
        }
        if let (Some(held), false) = (held, cx.finished) {
            self.judge(cx, held, done.verdict, now, &mut out);
        }
        out
    }

    fn judge<'g>(
        &mut self,
        cx: &mut Context<'_>,
        held: Held,
        verdict: Result<Result<(), Refuted>, String>,
        now: Instant,
        out: &mut Steps<'g>,
    ) {
        let verdict = match verdict {
            Ok(Err(Refuted::Marginal { segment, why })) => {
                return self.marginal(cx, held, segment, &why, now, out);
            }
            other => other,
        };
        self.close_challenge(&held);
        if cx.registry.is_banned(held.worker) {
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
        let current = cx.registry.is_current(worker, session);
        match verdict {
            Ok(Ok(())) => {
                cx.metrics.verified(true);
                out.push(Step::Note(worker, Note::Verified));
                if then == Then::Vouch {
                    let steps = pull.local.map_or(1, |l| l.steps);
                    return out.push(Step::Vouch { worker, steps });
                }
                let answer = Answer::Held(gradient);
                self.go_on(cx, worker, answer, norm, then, current, out);
            }
            Ok(Err(mismatch)) => {
                cx.metrics.verified(false);
                let strike = self.audits.strikes(worker, &pull);
                if !strike {
                    debug!(%worker, "the same work again: dropped, not struck again");
                }
                let (message, excuse) = if matches!(then, Then::Judge | Then::Aside | Then::Vouch) {
                    // Gone on already (counted, or excused from its round): only its worker
                    // is judged.
                    warn!(%worker, %mismatch, ?then, "a phase that went on does not match its replay");
                    let why = format!("the phase for {} did not match its replay", gradient.round);
                    (why, false)
                } else {
                    warn!(%worker, %mismatch, "recomputed gradient does not match; dropped");
                    (format!("gradient for {} dropped", gradient.round), current)
                };
                out.push(Step::Refuse {
                    worker,
                    refusal: Refusal::new(ErrorCode::Mismatch, format!("{message}: {mismatch}")),
                    strike,
                    excuse,
                    tell: current,
                });
            }
            Err(err) => {
                warn!(%worker, %err, "could not recompute a gradient; not verified");
                let answer = Answer::Held(gradient);
                self.go_on(cx, worker, answer, norm, then, current, out);
            }
        }
    }

    /// A verdict that does not hold the answer back: on to its replicas or the schedule, if
    /// it was waiting and its session is still the worker's.
    #[allow(clippy::too_many_arguments)]
    fn go_on<'g>(
        &mut self,
        cx: &mut Context<'_>,
        worker: WorkerId,
        gradient: Answer<'g>,
        norm: f64,
        then: Then,
        current: bool,
        out: &mut Steps<'g>,
    ) {
        match (current, then) {
            (false, _) | (true, Then::Judge | Then::Aside | Then::Vouch) => {}
            (true, Then::Check) => self.replicated(cx, worker, gradient, norm, out),
            (true, Then::Admit) => out.push(Step::Admit {
                worker,
                gradient,
                norm,
            }),
        }
    }

    /// Holds a GPU phase's `held` answer and asks its worker for the states its check
    /// needs; an answer without its commitments is a mismatch.
    fn challenge<'g>(
        &mut self,
        cx: &mut Context<'_>,
        held: Held,
        audit: Audit,
        local: LocalPhase,
        now: Instant,
        out: &mut Steps<'g>,
    ) {
        let (worker, round) = (held.worker, held.gradient.round);
        let Some(hashes) = self.challenges.take(worker, round, local) else {
            let why =
                "a phase in the GPU's own order came without its commitments, one every segment";
            let refuted = Ok(Err(Refuted::Mismatch(why.into())));
            return self.judge(cx, held, refuted, now, out);
        };
        // An older challenge still open is given up: its worker has moved on.
        if let Some(older) = self.challenges.open.remove(&worker).and_then(|o| o.held) {
            unrevealed(cx, older, out);
        }
        let state_len = cx.state_len();
        cx.metrics.phase_challenged();
        out.push(Step::Note(worker, Note::Challenged));
        let boundaries = self.challenges.open(
            held,
            audit.weights,
            audit.compression,
            local,
            hashes,
            state_len,
            now,
        );
        out.push(ask(worker, round, boundaries));
    }

    /// Every state asked for is in: the segments replay off the coordinator's task.
    fn replay_segments<'g>(&mut self, cx: &mut Context<'_>, worker: WorkerId, out: &mut Steps<'g>) {
        let Some(open) = self.challenges.open.get_mut(&worker) else {
            return;
        };
        let Some(held) = open.held.take() else {
            return;
        };
        let revealed = open.revealed();
        let (start, compression) = (Arc::clone(&open.start), open.compression);
        self.hold(cx, held, start, compression, Some(revealed), out);
    }

    /// A verdict came back for `held`: a committed phase's challenge is over unless a
    /// marginal segment asks for its neighbours.
    fn close_challenge(&mut self, held: &Held) {
        let worker = held.worker;
        if self
            .challenges
            .open
            .get(&worker)
            .is_some_and(|o| o.round == held.gradient.round && o.held.is_none())
        {
            self.challenges.open.remove(&worker);
        }
    }

    /// A marginal segment: its neighbours are asked for, once; marginal again (or with no
    /// neighbour left), the answer is dropped without a strike.
    fn marginal<'g>(
        &mut self,
        cx: &mut Context<'_>,
        held: Held,
        segment: u32,
        why: &str,
        now: Instant,
        out: &mut Steps<'g>,
    ) {
        let worker = held.worker;
        let state_len = cx.state_len();
        let open = self
            .challenges
            .open
            .get_mut(&worker)
            .filter(|o| o.round == held.gradient.round && o.held.is_none());
        let Some(open) = open else {
            // Its challenge was given up meanwhile (the worker moved on or left).
            return unrevealed(cx, held, out);
        };
        cx.metrics.segment_marginal();
        let neighbours = open.neighbours(segment);
        if open.escalated || neighbours.is_empty() {
            warn!(%worker, segment, %why, "a marginal segment, again: dropped, not struck");
            self.challenges.open.remove(&worker);
            return unrevealed(cx, held, out);
        }
        info!(%worker, segment, %why, ?neighbours, "a marginal segment: asking for its neighbours");
        open.escalated = true;
        let round = open.round;
        let asked = open.ask(held, neighbours, state_len, now);
        if asked.is_empty() {
            return self.replay_segments(cx, worker, out);
        }
        out.push(ask(worker, round, asked));
    }

    /// Input: the time. Challenges whose worker left or did not reveal in time: their
    /// answers are dropped, no strike.
    pub fn expire(&mut self, cx: &mut Context<'_>, now: Instant) -> Steps<'static> {
        let mut out = Vec::new();
        if self.challenges.open.is_empty() {
            return out;
        }
        let registry = cx.registry;
        let expired = self
            .challenges
            .expire(now, |w, s| registry.is_current(w, s));
        for held in expired {
            warn!(worker = %held.worker, round = %held.gradient.round, "a challenged phase's states did not come; its answer is dropped");
            cx.metrics.states_missing();
            unrevealed(cx, held, &mut out);
        }
        out
    }

    /// Input: `worker` committed to its phase's states; kept for its answer. Commitments
    /// nothing called for are refused, and from the second on each is a strike.
    pub fn commitments(
        &mut self,
        cx: &mut Context<'_>,
        worker: WorkerId,
        commitments: Commitments,
    ) -> Steps<'static> {
        match calls_for(cx.registry.pull(worker), &commitments) {
            Ok(true) => {
                self.challenges.commit(worker, commitments);
                Vec::new()
            }
            Ok(false) => {
                debug!(%worker, round = %commitments.round, "commitments for an older task; dropped");
                Vec::new()
            }
            Err(why) => vec![self.unsolicited(worker, "Commitments", &why)],
        }
    }

    /// `worker` sent a frame its task did not call for: refused with an error saying why,
    /// and from the second on, each a strike (at `--ban-after`, a ban).
    fn unsolicited(&mut self, worker: WorkerId, frame: &str, why: &str) -> Step<'static> {
        let n = self.challenges.unsolicited(worker);
        let message = format!("a {frame} frame nothing asked for: {why}");
        warn!(%worker, n, %message, "refused");
        Step::Refuse {
            worker,
            refusal: Refusal::new(ErrorCode::UnexpectedMessage, message),
            strike: n > 1,
            excuse: false,
            tell: true,
        }
    }

    /// Input: one chunk of a state `worker`'s session `session` reveals. A chunk for no
    /// open challenge (one that expired while it travelled) is dropped; one other than the
    /// chunk asked for, or a state that is not its hash, is a mismatch. Once every state
    /// asked for is in, its segments are replayed off the coordinator's task.
    pub fn revealed(
        &mut self,
        cx: &mut Context<'_>,
        worker: WorkerId,
        session: SessionId,
        chunk: RevealChunk,
        now: Instant,
    ) -> Steps<'static> {
        let mut out = Vec::new();
        let expected = cx.reveal_len();
        let open = self
            .challenges
            .open
            .get_mut(&worker)
            .filter(|o| o.session == session && o.held.is_some());
        let Some(open) = open else {
            if !cx.registry.is_current(worker, session) {
                return out;
            }
            if self.challenges.was_challenged(worker, chunk.round) {
                debug!(%worker, round = %chunk.round, "a revealed state for a challenge that ended; dropped");
            } else {
                let why = format!("no challenge asked for a state of {}", chunk.round);
                out.push(self.unsolicited(worker, "Reveal", &why));
            }
            return out;
        };
        let bytes = chunk.values.len() as u64 * 4;
        cx.metrics.revealed(bytes);
        out.push(Step::Note(worker, Note::Revealed(bytes)));
        match open.take(chunk, expected) {
            Ok(false) => {}
            Ok(true) => self.replay_segments(cx, worker, &mut out),
            Err(why) => {
                let held = self
                    .challenges
                    .open
                    .remove(&worker)
                    .and_then(|o| o.held)
                    .expect("open, with its answer");
                let refuted = Ok(Err(Refuted::Mismatch(why)));
                self.judge(cx, held, refuted, now, &mut out);
            }
        }
        out
    }
}

/// On probation and not recomputed: dropped, without a strike.
fn unchecked(cx: &mut Context<'_>, worker: WorkerId, out: &mut Steps<'_>) {
    cx.metrics.probation_unchecked();
    out.push(Step::Excuse(worker));
}

/// An answer whose check could not be finished: dropped without a strike (its round goes
/// on without it).
fn unrevealed(cx: &mut Context<'_>, held: Held, out: &mut Steps<'_>) {
    cx.metrics.answer_dropped();
    if cx.registry.is_current(held.worker, held.session) {
        out.push(Step::Excuse(held.worker));
    }
}

fn ask(worker: WorkerId, round: protocol::Round, boundaries: Vec<u32>) -> Step<'static> {
    Step::Ask(worker, protocol::Challenge { round, boundaries })
}

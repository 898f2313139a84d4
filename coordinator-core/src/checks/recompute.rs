//! Recomputation off the coordinator's task, within a budget of cores (`--verify-cores`).
//!
//! Replaying one GPT phase of 32 steps costs a core about a second; a newcomer's first ten
//! phases are all replayed (probation). Done in line, each replay held every other worker's
//! frames and every round for as long. Now the coordinator copies what a check needs into a
//! [`RecomputeJob`] (the weights as that worker decoded them, shared; the answer, shared; the
//! model and the train split, shared) and asks its driver to run it
//! ([`Output::Recompute`](crate::Output::Recompute)); the [`Recomputed`] verdict comes back as
//! an input, and the answer then goes on (or is dropped, with a strike) exactly as it did in
//! line. Meanwhile the answer is held: it has not reached the schedule, so a round that
//! needs it waits for it, as it waited before, while everything else goes on.
//!
//! Except a trusted worker's sampled local phase: held, it would hold its whole sync round
//! for as long as the phase took to compute (the replay is the phase again), and with `n`
//! workers sampled at `f` a round waits a replay with probability `1 − (1 − f)ⁿ`: at 5 % and
//! 4 workers 19 % of rounds take twice as long, at 100 workers nearly all. So such a phase
//! counts at once and its verdict only judges its worker: a mismatch strikes (and bans) as
//! before. Only while its replay waits at most one other check a core ([`Recomputations::
//! short_wait`]): past that, while another trusted participant carries its sync round, it
//! is set aside (`Then::Aside`, `machine.rs`): excused from the round, and replayed only
//! to judge its worker, if its verdict would come back later than one participant's
//! share of the round's time ([`Recomputations::outwaits`]), one answer in four of a round
//! at most; the last trusted answer that could carry its round, any beyond the quarter,
//! and any whose replay comes back soon enough are held as any other (a round of two or
//! three holds them all, as before: with every answer sampled, setting them aside dropped
//! half of two workers' work, and nothing slowed the rounds to the cores; and a crowd of
//! quick replays lost answers for no time at all). Until later on 2026-11-29 every such
//! answer was held, so that the rounds slowed down to what the cores could check: sixteen
//! tabs then spent a fifth of their time in rounds held by two sampled phases on the one
//! core (docs/BENCHMARKS.md, "Sampled phases set aside"). Now the cores' limit falls on the
//! excused phases instead, which a full room turns away (a sample lost, its answer not
//! counted). (Until 2026-11-28 it counted at once only while
//! a core was free: eight tabs' sampled phases then queued behind one core often enough
//! that their rounds waited 17 % of the time, where a core for each took none;
//! docs/BENCHMARKS.md, "The crowd".) What that gives a cheat who earned trust: the sampled
//! answers that catch it count too, at most `--ban-after` of them, each within the norm
//! bound and the robust rule, as its unsampled ones always did, and its ban comes at most
//! two replays later, besides the held answers' replays that pass it (below). A newcomer's
//! phases (probation), and every per-step answer, still count only once checked.
//!
//! At most `cores` jobs run at once; more wait, up to [`WAITING_PER_CORE`] a core, in order
//! of urgency and oldest first within it: a replay that holds its round's answer, then one
//! whose answer counted already (a cheat's ban waits on it), then the phases excused from
//! their rounds, first come, first served: a newcomer's (it only ends a probation) and a
//! trusted worker's set aside (it only judges its worker; placed with the counted ones, the
//! simulator's busy core starved its last newcomers, and a cheat among them went unchecked
//! past the target). [`Recomputations::short_wait`] counts only the first two, so
//! newcomers arriving at once neither push the trusted workers' sampled phases into
//! holding their rounds (until 2026-11-29 they did: sixteen tabs' rounds waited 5-15 s more
//! behind their replays, docs/BENCHMARKS.md, "The start of a crowd") nor turn them away: a
//! full room gives its newest excused phase's place to a check. A held
//! answer's replay may pass a counted one's, since an open round waits on it (with FIFO
//! between them, the simulator's busy core of 24 workers took 3.41 s to 92 % against 2.81).
//! An answer that finds no room is treated as one whose pull could not be audited: on
//! probation it is dropped unchecked (without a strike), otherwise it goes on unchecked;
//! both are counted. A verdict for a worker that has left since, or reconnected, is
//! dropped: its answer goes nowhere, and a mismatch still strikes the identity.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use protocol::WorkerId;

use super::job::Then;
pub(crate) use super::job::{Held, Inputs};
pub use super::job::{RecomputeJob, Recomputed};
pub use super::verdict::Refuted;

/// Answers that may wait for a core, per core of the budget.
pub const WAITING_PER_CORE: usize = 8;

/// The jobs running and waiting, and the answers they hold.
#[derive(Debug)]
pub(crate) struct Recomputations {
    cores: usize,
    next: u64,
    running: BTreeMap<u64, Held>,
    waiting: VecDeque<(RecomputeJob, Held)>,
    /// A job's seconds on a core, on average (exponentially weighted); none before the first.
    seconds: Option<f64>,
}

/// The weight of each job's seconds in [`Recomputations::seconds`].
const SECONDS_WEIGHT: f64 = 0.2;

/// What [`Recomputations::start`] did with a job.
#[derive(Debug)]
pub(crate) struct Started {
    /// The job to run now: a core was free.
    pub job: Option<RecomputeJob>,
    /// An excused phase that was waiting, turned out for it: a newcomer's (it stays on
    /// probation, and its next phase is replayed instead) or one set aside (a sample lost;
    /// its answer reached nothing).
    pub evicted: Option<Held>,
}

/// The order jobs wait in, most urgent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Urgency {
    /// Its answer holds its round until the verdict.
    Round,
    /// Its answer counted already; the verdict judges a trusted worker (a cheat's ban
    /// comes with it).
    Judge,
    /// A phase excused from its round, whose answer reaches nothing: a newcomer's (the
    /// verdict only ends a probation) or a trusted worker's set aside (it only judges the
    /// worker). First come, first replayed, with what the checks above leave of the cores.
    Excused,
}

fn urgency(held: &Held) -> Urgency {
    match held.then {
        Then::Check | Then::Admit => Urgency::Round,
        Then::Judge => Urgency::Judge,
        Then::Vouch | Then::Aside => Urgency::Excused,
    }
}

impl Recomputations {
    /// At most `cores` jobs at once (at least one).
    pub fn new(cores: usize) -> Self {
        Self {
            cores: cores.max(1),
            next: 0,
            running: BTreeMap::new(),
            waiting: VecDeque::new(),
            seconds: None,
        }
    }

    /// `held` is to be recomputed: the job to run now, if a core is free, and an excused
    /// phase turned out of the waiting room to make room for it. `Err(held)`: no
    /// room, even to wait.
    pub fn start(&mut self, held: Held, inputs: Inputs<'_>) -> Result<Started, Held> {
        let mut evicted = None;
        if self.running.len() >= self.cores && self.waiting.len() >= self.cores * WAITING_PER_CORE {
            // A full room gives way only to a check whose answer holds a round or counted,
            // and only its newest excused phase.
            let last = self.waiting.back().map(|(_, h)| urgency(h));
            if urgency(&held) == Urgency::Excused || last != Some(Urgency::Excused) {
                return Err(held);
            }
            evicted = self.waiting.pop_back().map(|(_, h)| h);
        }
        self.next += 1;
        let job = RecomputeJob {
            id: self.next,
            net: inputs.net.clone(),
            train: Arc::clone(inputs.train),
            weights: inputs.weights,
            gradient: Arc::clone(&held.gradient),
            shard: held.pull.shard.clone(),
            batch_index: held.pull.batch,
            batch_size: inputs.batch_size,
            compression: inputs.compression,
            local: held.pull.local,
            order: inputs.order,
            segments: inputs.segments,
        };
        if self.running.len() < self.cores {
            self.running.insert(job.id, held);
            return Ok(Started {
                job: Some(job),
                evicted,
            });
        }
        // Behind every job as urgent or more, ahead of the rest: oldest first within each.
        let rank = urgency(&held);
        let at = self
            .waiting
            .iter()
            .position(|(_, h)| urgency(h) > rank)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, (job, held));
        Ok(Started { job: None, evicted })
    }

    /// Job `done` came back: the answer it held (`None` for an unknown job), and the next
    /// job to run, if one was waiting.
    pub fn done(&mut self, done: &Recomputed) -> (Option<Held>, Option<RecomputeJob>) {
        let Some(held) = self.running.remove(&done.id) else {
            return (None, None);
        };
        if done.seconds.is_finite() && done.seconds >= 0.0 {
            let mean = self.seconds.unwrap_or(done.seconds);
            self.seconds = Some(mean + SECONDS_WEIGHT * (done.seconds - mean));
        }
        let next = self.waiting.pop_front().map(|(job, waiting)| {
            self.running.insert(job.id, waiting);
            job
        });
        (Some(held), next)
    }

    /// `worker` was banned: its answers still waiting for a core are dropped (the jobs
    /// running finish, and their verdicts strike nobody: see `judge`). Returns how many.
    pub fn forget(&mut self, worker: WorkerId) -> usize {
        let before = self.waiting.len();
        self.waiting.retain(|(_, held)| held.worker != worker);
        before - self.waiting.len()
    }

    /// Whether a check asked for now would start within one replay: a core is free, or
    /// fewer checks wait than there are cores (excused phases wait behind it).
    pub fn short_wait(&self) -> bool {
        let ahead = self
            .waiting
            .iter()
            .filter(|(_, h)| urgency(h) != Urgency::Excused)
            .count();
        self.running.len() < self.cores || ahead < self.cores
    }

    /// Whether a replay that holds its round, asked for now, would come back later than
    /// `share` (of a round's time): the jobs that hold rounds and wait before it, a core
    /// coming free, then its own, at the jobs' measured seconds. Where either is not known
    /// yet (no verdict came back, no round was timed), it is taken to.
    pub fn outwaits(&self, share: Option<Duration>) -> bool {
        let (Some(seconds), Some(share)) = (self.seconds, share) else {
            return true;
        };
        let ahead = self
            .waiting
            .iter()
            .filter(|(_, h)| urgency(h) == Urgency::Round)
            .count();
        let busy = usize::from(self.running.len() >= self.cores);
        let jobs = ahead / self.cores + busy + 1;
        jobs as f64 * seconds > share.as_secs_f64()
    }

    /// Whether the jobs running and waiting, with `ahead` more to come, would keep every core
    /// busy for `round` or longer, at the jobs' measured seconds (never before one came back).
    pub fn outlast(&self, ahead: usize, round: Duration) -> bool {
        self.seconds.is_some_and(|seconds| {
            (self.len() + ahead) as f64 * seconds >= self.cores as f64 * round.as_secs_f64()
        })
    }

    /// Whether a newcomer's excused phase of `worker`'s waits for its verdict (running or
    /// waiting): its later phases need not be replayed to end its probation.
    pub fn vouching(&self, worker: WorkerId) -> bool {
        let of = |held: &Held| held.worker == worker && held.then == Then::Vouch;
        self.running.values().any(of) || self.waiting.iter().any(|(_, held)| of(held))
    }

    /// Answers held, running or waiting.
    pub fn len(&self) -> usize {
        self.running.len() + self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::job::Then;
    use crate::checks::segment::Branches;
    use crate::registry::Pull;
    use crate::session::SessionId;
    use model::{Network, Order};
    use protocol::{Compression, Gradient};

    /// `job`'s replay matched, `seconds` after it started.
    fn matched(job: &RecomputeJob, seconds: f64) -> Recomputed {
        Recomputed {
            id: job.id,
            verdict: Ok(Ok(())),
            seconds,
            branches: Branches::default(),
            segments: 0,
        }
    }

    fn held(worker: u32) -> Held {
        Held {
            worker: WorkerId(worker),
            session: SessionId(worker.into()),
            gradient: Arc::new(Gradient {
                round: protocol::Round(0),
                samples: 1,
                loss: 1.0,
                compute_us: 0,
                parts: 1,
                grads: vec![0.0; 4],
            }),
            norm: 0.0,
            pull: Pull {
                version: 0,
                batch: 0,
                shard: 0..10,
                local: None,
                timed: false,
            },
            then: Then::Check,
        }
    }

    /// A small model and the digits, for jobs that are never run here.
    fn model_and_data() -> (Network, Arc<model::Dataset>) {
        let data = crate::data::digits(1);
        let net =
            Network::new(model::NetSpec::mlp(data.train.shape(), &[2], 10), 10).expect("model");
        (net, Arc::new(data.train))
    }

    fn held_then(worker: u32, then: Then) -> Held {
        Held {
            then,
            ..held(worker)
        }
    }

    fn inputs<'a>(net: &'a Network, train: &'a Arc<model::Dataset>) -> Inputs<'a> {
        Inputs {
            net,
            train,
            weights: Arc::from(vec![0.0; 4]),
            compression: Compression::None,
            batch_size: 1,
            order: Order::Library,
            segments: None,
        }
    }

    /// Whether a held answer's verdict would outwait its share of a round: taken to before
    /// a job came back or a round was timed; then the replays that hold rounds ahead of it
    /// (not the excused phases behind it), a core coming free, and its own.
    #[test]
    fn a_held_replay_outwaits_its_share_of_a_round_by_the_jobs_ahead_of_it() {
        let (net, train) = model_and_data();
        let inputs = || inputs(&net, &train);
        let ms = std::time::Duration::from_millis;
        let mut r = Recomputations::new(1);
        assert!(
            r.outwaits(Some(ms(1))) && r.outwaits(None),
            "nothing measured yet"
        );
        let first = r
            .start(held(1), inputs())
            .unwrap()
            .job
            .expect("a free core");
        let (_, next) = r.done(&matched(&first, 0.1));
        assert!(next.is_none());
        assert!(!r.outwaits(Some(ms(150))), "a free core: its own 100 ms");
        assert!(r.outwaits(Some(ms(50))));
        assert!(r.outwaits(None), "no round timed yet");
        r.start(held_then(2, Then::Judge), inputs()).unwrap();
        r.start(held_then(3, Then::Vouch), inputs()).unwrap();
        assert!(
            !r.outwaits(Some(ms(250))),
            "a core to come free, then its own: the newcomer's waits behind it"
        );
        r.start(held_then(4, Then::Check), inputs()).unwrap();
        assert!(
            r.outwaits(Some(ms(250))),
            "one that holds a round goes first"
        );
        assert!(!r.outwaits(Some(ms(350))));
    }

    /// Whether the queue outlasts a round is judged at the jobs' measured seconds: never
    /// before one came back; then the jobs held with those still to come, against the
    /// round's time on every core.
    #[test]
    fn a_backlog_outlasts_a_round_at_the_jobs_measured_seconds() {
        let (net, train) = model_and_data();
        let inputs = || inputs(&net, &train);
        let round = std::time::Duration::from_secs(2);
        let mut r = Recomputations::new(2);
        assert!(!r.outlast(100, round), "nothing measured yet");
        let job = r
            .start(held(1), inputs())
            .unwrap()
            .job
            .expect("a free core");
        r.done(&matched(&job, 1.0));
        // One second a job, two cores, a round of two seconds: four jobs fill it.
        assert!(!r.outlast(3, round));
        assert!(r.outlast(4, round));
        let _running = r
            .start(held(2), inputs())
            .unwrap()
            .job
            .expect("a free core");
        assert!(r.outlast(3, round), "the job held counts");
        // A job of three seconds moves the mean a fifth of the way: 1.4 s a job.
        let job = r
            .start(held(3), inputs())
            .unwrap()
            .job
            .expect("a free core");
        r.done(&matched(&job, 3.0));
        assert!(!r.outlast(1, round), "2 × 1.4 s < 4 s");
        assert!(r.outlast(2, round), "3 × 1.4 s ≥ 4 s");
        // A stale verdict, and a non-finite one, are not measured.
        r.done(&matched(&job, 100.0));
        let job = r
            .start(held(4), inputs())
            .unwrap()
            .job
            .expect("a free core");
        r.done(&matched(&job, f64::NAN));
        assert!(!r.outlast(1, round));
    }

    #[test]
    fn jobs_run_within_the_budget_wait_in_order_and_are_turned_away_beyond() {
        let (net, train) = model_and_data();
        let inputs = || inputs(&net, &train);
        let mut r = Recomputations::new(2);
        assert!(r.short_wait());
        let first = r
            .start(held(1), inputs())
            .unwrap()
            .job
            .expect("a free core");
        let second = r
            .start(held(2), inputs())
            .unwrap()
            .job
            .expect("a free core");
        let room = 2 * WAITING_PER_CORE;
        for w in 0..room {
            // Both cores busy: a job would wait one replay while fewer than two wait.
            assert_eq!(r.short_wait(), w < 2, "{w} waiting");
            assert!(
                r.start(held(3 + w as u32), inputs()).unwrap().job.is_none(),
                "waits"
            );
        }
        assert!(r.start(held(99), inputs()).is_err(), "no room: turned away");
        assert_eq!(r.len(), 2 + room);
        let (held2, next) = r.done(&matched(&second, 0.5));
        assert_eq!(held2.map(|h| h.worker), Some(WorkerId(2)));
        let next = next.expect("the oldest waiting job runs");
        assert_eq!(next.gradient.samples, 1);
        assert_eq!(
            r.done(&matched(&second, 0.5)).0.map(|h| h.worker),
            None,
            "once"
        );
        let (held1, _) = r.done(&matched(&first, 0.5));
        assert_eq!(held1.map(|h| h.worker), Some(WorkerId(1)));
        let (held3, _) = r.done(&matched(&next, 0.5));
        assert_eq!(held3.map(|h| h.worker), Some(WorkerId(3)), "oldest first");
    }

    /// A replay that holds a round waits only behind others that do; one whose answer
    /// counted already, behind those; the excused phases (a newcomer's, a trusted one set
    /// aside) behind everything, first come first served, and a full room turns the newest
    /// of those out for a check.
    #[test]
    fn newcomers_excused_phases_wait_behind_every_check_that_holds_or_judges_an_answer() {
        let (net, train) = model_and_data();
        let inputs = || inputs(&net, &train);
        let mut r = Recomputations::new(1);
        let running = r.start(held_then(1, Then::Vouch), inputs()).unwrap();
        let running = running.job.expect("a free core");
        for w in 2..=5 {
            let then = if w == 3 { Then::Aside } else { Then::Vouch };
            let started = r.start(held_then(w, then), inputs()).unwrap();
            assert!(started.job.is_none() && started.evicted.is_none());
        }
        assert!(
            r.short_wait(),
            "only excused phases wait: a check starts next"
        );
        r.start(held_then(7, Then::Judge), inputs()).unwrap();
        assert!(
            !r.short_wait(),
            "a check waits: the next one would wait two replays"
        );
        r.start(held_then(8, Then::Check), inputs()).unwrap();
        r.start(held_then(9, Then::Admit), inputs()).unwrap();
        r.start(held_then(10, Then::Judge), inputs()).unwrap();
        // Eight wait: 8, 9 (hold rounds), 7, 10 (judge), 2..=5 (excused): the room is full.
        let full = r.start(held_then(11, Then::Vouch), inputs());
        assert_eq!(full.err().map(|h| h.worker), Some(WorkerId(11)), "no room");
        let full = r.start(held_then(13, Then::Aside), inputs());
        assert_eq!(full.err().map(|h| h.worker), Some(WorkerId(13)), "no room");
        let started = r.start(held_then(12, Then::Check), inputs()).unwrap();
        let turned = started
            .evicted
            .expect("the newest newcomer's phase gives way");
        assert_eq!(turned.worker, WorkerId(5));
        assert!(!r.vouching(WorkerId(5)), "its next phase may be replayed");
        assert!(r.vouching(WorkerId(2)));
        let mut order = Vec::new();
        let mut next = Some(running);
        while let Some(job) = next {
            let (held, then) = r.done(&matched(&job, 1.0));
            order.push(held.expect("running").worker.0);
            next = then;
        }
        assert_eq!(order, [1, 8, 9, 12, 7, 10, 2, 3, 4]);
    }
}

//! Transitions of the coordinator, driven input by input with explicit time: no sockets, no
//! channels. What it sends lands in a mailbox per session.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use protocol::{decode_from_coordinator, CoordinatorToWorker};
use protocol::{ErrorCode, Gradient, Hello, Round, WorkerId, WorkerKind};

use crate::aggregate::{AggregatorKind, Rule};
use crate::checks::clip;
use crate::schedule::deadline::RoundTimeout;
use crate::status::State;
use crate::*;

/// Messages queued per session, as the driver would hand them to the sockets.
type Mailboxes = Rc<RefCell<HashMap<SessionId, VecDeque<Outbound>>>>;

struct Harness {
    c: Coordinator,
    t0: Instant,
    params: usize,
    mail: Mailboxes,
}

struct Client {
    id: WorkerId,
    session: SessionId,
    token: String,
    mail: Mailboxes,
}

impl Client {
    /// Every message queued for this client so far.
    fn drain(&mut self) -> Vec<CoordinatorToWorker> {
        let mut out = Vec::new();
        let queued = self
            .mail
            .borrow_mut()
            .remove(&self.session)
            .unwrap_or_default();
        for msg in queued {
            match msg {
                Outbound::Close(r) => out.push(CoordinatorToWorker::Error {
                    code: r.code,
                    message: r.message,
                }),
                frames => out.extend(
                    frames
                        .frames()
                        .map(|f| decode_from_coordinator(f).expect("valid frame")),
                ),
            }
        }
        out
    }

    fn errors(&mut self) -> Vec<ErrorCode> {
        self.drain()
            .into_iter()
            .filter_map(|m| match m {
                CoordinatorToWorker::Error { code, .. } => Some(code),
                _ => None,
            })
            .collect()
    }
}

/// The settings the coordinator's flags of the same names give (the few these tests use).
/// Most of these tests send made-up gradients, which recomputation would refuse: there is no
/// probation unless `--probation` is given.
pub(crate) fn settings(flags: &[&str]) -> Settings {
    let mut s = Settings {
        probation: 0,
        ..Settings::default()
    };
    let (mut timeout, mut miss_limit) = (RoundTimeout::Auto, 3);
    let (mut mode, mut buffer, mut staleness) = ("sync", 1, 8);
    let (mut optimizer, mut lr) = ("adam", None);
    for pair in flags.chunks(2) {
        let [flag, value] = pair else {
            panic!("flags come in pairs: {flags:?}")
        };
        let number = || value.parse::<f64>().expect("a number");
        match *flag {
            "--min-workers" => s.min_workers = number() as usize,
            "--round-timeout" => {
                timeout = RoundTimeout::Fixed(Duration::from_secs_f64(number()));
            }
            "--miss-limit" => miss_limit = number() as u32,
            "--mode" => mode = value,
            "--buffer" => buffer = number() as usize,
            "--max-staleness" => staleness = number() as u64,
            "--optimizer" => optimizer = value,
            "--lr" => lr = Some(number() as f32),
            "--max-grad-norm" => s.max_grad_norm = Some(number()),
            "--verify-fraction" => s.verify_fraction = number(),
            "--probation" => s.probation = number() as u32,
            "--max-rounds" => s.max_rounds = Some(number() as u64),
            "--eval-interval" => s.eval_interval = number() as u64,
            "--target-accuracy" => s.target_accuracy = Some(number()),
            "--aggregator" if *value == "mean" => {
                s.aggregator = AggregatorKind {
                    rule: Rule::Mean,
                    ..AggregatorKind::default()
                }
            }
            other => panic!("no such flag in these tests: {other}"),
        }
    }
    s.mode = match mode {
        "async" => Mode::Async {
            buffer,
            max_staleness: staleness,
        },
        "hogwild" => Mode::Hogwild,
        _ => Mode::Sync {
            timeout,
            miss_limit,
        },
    };
    s.optimizer = match optimizer {
        "sgd" => model::OptimizerKind::Sgd {
            lr: lr.unwrap_or(0.1),
        },
        _ => model::OptimizerKind::Adam {
            lr: lr.unwrap_or(0.001),
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    };
    s
}

/// A coordinator for a tiny model whose norm bound never clips (the transitions under test
/// use made-up gradients); [`harness_adaptive`] keeps the default bound.
fn harness(flags: &[&str]) -> Harness {
    let mut all = vec!["--max-grad-norm", "1e30"];
    all.extend_from_slice(flags);
    harness_adaptive(&all)
}

fn harness_adaptive(flags: &[&str]) -> Harness {
    // Made-up gradients: nothing to recompute them against.
    let mut all = vec!["--verify-fraction", "0"];
    all.extend_from_slice(flags);
    harness_of(settings(&all))
}

/// A coordinator with these settings for the tiny model on the digits.
fn harness_of(settings: Settings) -> Harness {
    let data = crate::data::digits(1);
    let net =
        model::Network::new(model::NetSpec::mlp(data.train.shape(), &[4], 10), 10).expect("model");
    let t0 = Instant::now();
    let c = Coordinator::new(settings, net, data, t0).expect("model");
    let params = c.trainer.params().len();
    let mut h = Harness {
        c,
        t0,
        params,
        mail: Mailboxes::default(),
    };
    h.deliver();
    h
}

impl Harness {
    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// What the coordinator asked for: messages go to their session's mailbox.
    /// Recomputations run at once, as if a core were always free, at the time of the input
    /// that asked for them.
    fn deliver(&mut self) {
        while let Some(output) = self.c.poll_output() {
            match output {
                Output::Send {
                    session, message, ..
                } => {
                    let mut mail = self.mail.borrow_mut();
                    mail.entry(session).or_default().push_back(message);
                }
                Output::Recompute(job) => {
                    let now = self.c.now;
                    self.c.recomputed(job.run(), now);
                }
                _ => {}
            }
        }
    }

    fn hello(&mut self, hello: &Hello, ms: u64) -> Result<Joined, Refusal> {
        let peer = std::net::Ipv4Addr::LOCALHOST.into();
        let joined = self.c.join(hello, peer, self.at(ms));
        self.deliver();
        joined
    }

    fn join(&mut self, token: Option<&str>, ms: u64) -> Client {
        let hello = Hello {
            kind: Some(WorkerKind::Native),
            join_token: None,
            resume_token: token.map(str::to_owned),
            compression: protocol::Compression::None,
            fused: false,
        };
        let joined = self.hello(&hello, ms).expect("admitted");
        let mut client = Client {
            id: joined.worker,
            session: joined.session,
            token: String::new(),
            mail: Rc::clone(&self.mail),
        };
        let first = self
            .mail
            .borrow_mut()
            .get_mut(&joined.session)
            .and_then(VecDeque::pop_front);
        let Some(Outbound::Frames(f)) = first else {
            panic!("no welcome")
        };
        let CoordinatorToWorker::Welcome(w) = decode_from_coordinator(&f[0]).expect("frame") else {
            panic!("first frame is Welcome")
        };
        assert_eq!(w.worker_id, joined.worker);
        client.token = w.resume_token;
        client
    }

    fn gradient(&mut self, client: &Client, round: u64, ms: u64) {
        self.gradient_from(client.id, client.session, round, ms, 0.01);
    }

    fn gradient_valued(&mut self, client: &Client, round: u64, ms: u64, value: f32) {
        self.gradient_from(client.id, client.session, round, ms, value);
    }

    fn tick(&mut self, at: Instant) {
        self.c.handle_timeout(at);
        self.deliver();
    }

    /// Ticks at the open round's deadline; returns it in ms since t0.
    fn tick_at_deadline(&mut self) -> u64 {
        let deadline = self.c.poll_timeout().expect("a round is open");
        self.tick(deadline);
        deadline.duration_since(self.t0).as_millis() as u64
    }

    fn gradient_from(
        &mut self,
        worker: WorkerId,
        session: SessionId,
        round: u64,
        ms: u64,
        value: f32,
    ) {
        self.gradient_claiming(worker, session, round, ms, value, 4);
    }

    /// A gradient of `value` everywhere that claims `samples` samples.
    fn gradient_claiming(
        &mut self,
        worker: WorkerId,
        session: SessionId,
        round: u64,
        ms: u64,
        value: f32,
        samples: u32,
    ) {
        let gradient = Gradient {
            compute_us: 0,
            parts: 1,
            round: Round(round),
            samples,
            loss: 1.0,
            grads: vec![value; self.params],
        };
        let norm = clip::norm_and_finite(&gradient.grads).0;
        self.c
            .gradient(worker, session, &gradient, norm, self.at(ms));
        self.deliver();
    }

    fn leave(&mut self, client: &Client, ms: u64) {
        self.c.leave(client.id, client.session, self.at(ms));
        self.deliver();
    }

    fn admin(&mut self, command: Command, ms: u64) -> Result<String, String> {
        let answer = self.c.admin(command, "127.0.0.1:1", self.at(ms));
        self.deliver();
        answer
    }

    fn status(&self) -> Status {
        self.c.status().clone()
    }

    /// The weights frames `id` is sent, in the compression it negotiated.
    fn weights_for(&mut self, id: WorkerId) -> Frames {
        let compression = self.c.registry.compression(id).expect("connected");
        self.c.trainer.weights(compression)
    }
}

#[test]
fn deadline_with_quorum_closes_and_a_straggler_is_skipped_after_k_misses() {
    let mut h = harness(&[
        "--round-timeout",
        "0.1",
        "--miss-limit",
        "2",
        "--min-workers",
        "2",
    ]);
    let (a, b, mut slow) = (h.join(None, 0), h.join(None, 0), h.join(None, 0));
    // Round 0 opened when `b` joined; `slow` joined mid-round and takes part from round 1.
    assert_eq!(h.status().round_participants, 2);
    h.gradient(&a, 0, 5);
    h.gradient(&b, 0, 5);
    assert_eq!(h.status().round_participants, 3);
    let mut t = 5;
    for round in 1..3 {
        h.gradient(&a, round, t + 10);
        h.gradient(&b, round, t + 10);
        h.tick(h.at(t + 50));
        assert_eq!(
            h.status().round,
            round,
            "waits for the straggler before the deadline"
        );
        t = h.tick_at_deadline();
        assert_eq!(
            h.status().round,
            round + 1,
            "the deadline closes it with quorum"
        );
        let report = h.status().last_round.clone().expect("report");
        assert_eq!(
            (report.answered, report.missed, report.deadline_hit),
            (2, 1, true)
        );
    }
    assert_eq!(h.status().counters.deadline_closes, 2);
    assert_eq!(
        h.status().skipped_workers,
        1,
        "two misses in a row: skipped"
    );
    // Sitting on unanswered weights, the skipped worker is sent no more of them.
    slow.drain();
    // Skipped: the round closes as soon as the active ones answer, without a deadline.
    assert_eq!(h.status().round_participants, 2);
    h.gradient(&a, 3, t + 5);
    h.gradient(&b, 3, t + 5);
    assert_eq!(h.status().round, 4);
    assert!(!h.status().last_round.clone().expect("report").deadline_hit);
    assert!(
        !slow
            .drain()
            .iter()
            .any(|m| matches!(m, CoordinatorToWorker::Weights(_))),
        "a skipped worker with unanswered weights gets no new ones"
    );
    // The straggler answers again (late for round 3: dropped, counted) and is back.
    slow.drain();
    h.gradient(&slow, 3, t + 6);
    assert_eq!(slow.errors(), [ErrorCode::Late]);
    assert_eq!(h.status().skipped_workers, 0);
    // Round 4 opened while it was skipped; it is waited for again from round 5 on.
    h.gradient(&a, 4, t + 7);
    h.gradient(&b, 4, t + 7);
    assert_eq!(h.status().round, 5);
    assert_eq!(h.status().round_participants, 3);
    h.gradient(&a, 5, t + 8);
    h.gradient(&b, 5, t + 8);
    assert_eq!(h.status().round, 5, "back in the quorum: waited for");
    h.gradient(&slow, 5, t + 9);
    assert_eq!(h.status().round, 6);
    assert_eq!(h.status().counters.late, 1);
    assert_eq!(
        h.status().counters.answered_total,
        h.status().counters.gradients_accepted
    );
    // Per worker, by reason: the straggler's late answer is its own, nobody else's.
    let list = h.status().worker_list.clone();
    let rejected = |id: WorkerId| {
        let w = list.iter().find(|w| w.id == id.0).expect("listed");
        w.rejected.clone().into_iter().collect::<Vec<_>>()
    };
    assert_eq!(rejected(slow.id), [("late", 1)]);
    assert_eq!(rejected(a.id), []);
    assert_eq!(rejected(b.id), []);
}

#[test]
fn deadline_without_quorum_extends_until_quorum() {
    let mut h = harness(&["--round-timeout", "0.1", "--min-workers", "2"]);
    let (a, _b) = (h.join(None, 0), h.join(None, 0));
    h.gradient(&a, 0, 10);
    h.tick(h.at(100));
    assert_eq!(
        (h.status().round, h.status().counters.deadline_extensions),
        (0, 1)
    );
    h.tick(h.at(150)); // before the extended deadline: nothing
    assert_eq!(h.status().counters.deadline_extensions, 1);
    h.tick(h.at(200));
    assert_eq!(
        (h.status().round, h.status().counters.deadline_extensions),
        (0, 2)
    );
}

#[test]
fn an_extension_admits_workers_that_joined_mid_round() {
    let mut h = harness(&["--round-timeout", "0.1", "--min-workers", "2"]);
    let (a, _frozen) = (h.join(None, 0), h.join(None, 0));
    let mut late = h.join(None, 1); // mid-round: not a participant
    late.drain();
    h.gradient(&a, 0, 10);
    h.gradient(&late, 0, 11);
    assert_eq!(late.errors(), [ErrorCode::NotParticipant]);
    h.tick_at_deadline(); // no quorum: extended, and `late` is admitted with a shard
    let frames = late.drain();
    assert!(
        matches!(frames[0], CoordinatorToWorker::Shard(_)),
        "{frames:?}"
    );
    assert!(matches!(frames.last(), Some(CoordinatorToWorker::Weights(w)) if w.round == Round(0)));
    h.gradient(&late, 0, 120);
    assert_eq!(
        h.status().round,
        0,
        "the frozen one is still awaited until the deadline"
    );
    h.tick_at_deadline();
    assert_eq!(
        (h.status().round, h.status().counters.deadline_closes),
        (1, 1)
    );
}

#[test]
fn duplicate_late_and_outsider_gradients_are_dropped_and_counted() {
    let mut h = harness(&[]);
    let mut a = h.join(None, 0);
    let mut b = h.join(None, 0);
    // `b` joined mid-round: it got the weights but is not a participant of round 0.
    h.gradient(&b, 0, 1);
    assert_eq!(b.errors(), [ErrorCode::NotParticipant]);
    h.gradient(&a, 0, 2);
    assert_eq!(h.status().round, 1);
    h.gradient(&a, 0, 3);
    assert_eq!(a.errors(), [ErrorCode::Late]);
    h.gradient(&a, 1, 4);
    h.gradient(&a, 1, 5);
    assert_eq!(a.errors(), [ErrorCode::Duplicate]);
    h.gradient(&a, 9, 6);
    assert_eq!(a.errors(), [ErrorCode::RoundNotOpen]);
    let s = h.status();
    assert_eq!(
        (
            s.counters.late,
            s.counters.duplicate_rejected,
            s.counters.gradients_rejected
        ),
        (1, 1, 4)
    );
    assert_eq!(
        s.counters.answered_total + 1,
        s.counters.gradients_accepted,
        "round 1 is still open with one answer"
    );
}

#[test]
fn a_worker_leaving_mid_round_is_not_waited_for() {
    let mut h = harness(&["--min-workers", "2"]);
    let (a, b) = (h.join(None, 0), h.join(None, 0));
    h.gradient(&a, 0, 1);
    h.leave(&b, 2);
    assert_eq!((h.status().round, h.status().workers), (1, 1));
    assert_eq!(
        h.status().state,
        State::Waiting,
        "below --min-workers: no new round"
    );
}

#[test]
fn resuming_with_the_token_keeps_the_id_and_replaces_a_live_session() {
    let mut h = harness(&[]);
    let a = h.join(None, 0);
    let other = h.join(None, 0);
    h.gradient(&a, 0, 1);
    // Reconnect while the old connection is still registered: the old one is told to go.
    let mut old = a;
    let a2 = h.join(Some(&old.token), 2);
    assert_eq!(a2.id, old.id);
    assert_ne!(a2.session, old.session);
    assert!(old.errors().contains(&ErrorCode::Replaced));
    // The old session's late events are ignored: no leave, no gradient.
    h.leave(&old, 3);
    h.gradient_from(old.id, old.session, 1, 3, 0.01);
    assert_eq!(h.status().workers, 2);
    assert_eq!(h.status().counters.resumed, 1);
    // Gone and back with the token: same id, gradients remembered.
    h.leave(&a2, 4);
    let a3 = h.join(Some(&a2.token), 5);
    assert_eq!(a3.id, old.id);
    let me = h
        .status()
        .worker_list
        .iter()
        .find(|w| w.id == a3.id.0)
        .cloned()
        .expect("listed");
    assert_eq!(me.gradients, 1);
    // An unknown token is a new identity.
    let stranger = h.join(Some("not-a-token"), 6);
    assert!(stranger.id != a3.id && stranger.id != other.id);
}

#[test]
fn async_mode_rejects_beyond_the_bound_and_duplicates() {
    let mut h = harness(&["--mode", "async", "--max-staleness", "1"]);
    let mut a = h.join(None, 0);
    let mut b = h.join(None, 0);
    h.gradient(&a, 0, 1); // applied at once (buffer 1): version 1
    h.gradient(&a, 1, 2); // version 2
    assert_eq!(h.status().round, 2);
    // b computed on version 0: 2 versions behind > max 1.
    h.gradient(&b, 0, 3);
    assert!(b.errors().ends_with(&[ErrorCode::Stale]));
    // Answering the same pull again is a duplicate; a version it was not sent is not open.
    h.gradient(&b, 0, 3);
    h.gradient(&b, 7, 3);
    assert_eq!(b.errors(), [ErrorCode::Duplicate, ErrorCode::RoundNotOpen]);
    h.gradient(&b, 2, 4); // fresh: version 3
    h.gradient(&a, 2, 5); // 1 behind, within the bound: version 4
    let s = h.status();
    assert_eq!(
        (
            s.round,
            s.counters.stale_rejected,
            s.counters.duplicate_rejected
        ),
        (4, 1, 1)
    );
    assert!(a.errors().is_empty());
    assert_eq!(s.counters.answered_total, s.counters.gradients_accepted);
}

#[test]
fn async_stale_gradients_are_down_weighted_by_one_over_one_plus_staleness() {
    let mut h = harness(&[
        "--mode",
        "async",
        "--buffer",
        "2",
        "--optimizer",
        "sgd",
        "--lr",
        "1",
    ]);
    let a = h.join(None, 0);
    let b = h.join(None, 0);
    let c = h.join(None, 0);
    h.gradient_valued(&a, 0, 1, 0.5);
    h.gradient_valued(&b, 0, 1, 0.5); // buffer full: version 1
    let before = h.c.trainer.params().to_vec();
    // `a` was answered with version 0 again (the buffer had not filled), `b` with version 1.
    h.gradient_valued(&b, 1, 2, 0.25); // fresh, weight 4
    h.gradient_valued(&c, 0, 2, 1.0); // 1 behind, weight 4 / 2 = 2
    assert_eq!(h.status().round, 2);
    // SGD with lr 1: the step is the weighted mean, (0.25·4 + 1.0·2) / 6 = 0.5.
    for (p, q) in h.c.trainer.params().iter().zip(&before) {
        assert!((q - p - 0.5).abs() < 1e-6, "{q} - {p}");
    }
}

#[test]
fn async_buffer_applies_every_b_gradients_and_hogwild_applies_each() {
    let mut h = harness(&["--mode", "async", "--buffer", "3"]);
    let clients: Vec<Client> = (0..3).map(|_| h.join(None, 0)).collect();
    h.gradient(&clients[0], 0, 1);
    h.gradient(&clients[1], 0, 1);
    assert_eq!(h.status().round, 0);
    h.gradient(&clients[2], 0, 1);
    assert_eq!(h.status().round, 1);
    assert_eq!(h.status().last_round.clone().expect("report").answered, 3);

    let mut h = harness(&["--mode", "hogwild"]);
    let a = h.join(None, 0);
    let b = h.join(None, 0);
    h.gradient(&a, 0, 1);
    h.gradient(&b, 0, 1); // stale by one: hogwild does not care
    assert_eq!(
        (h.status().round, h.status().counters.stale_rejected),
        (2, 0)
    );
}

/// A browser that asks for `c` joins: the frames queued to it, and what `join` returned.
fn join_asking(h: &mut Harness, c: protocol::Compression) -> (Vec<bytes::Bytes>, Joined) {
    let hello = Hello {
        kind: Some(WorkerKind::Browser),
        compression: c,
        ..Hello::default()
    };
    let joined = h.hello(&hello, 0).expect("admitted");
    let queued = h
        .mail
        .borrow_mut()
        .remove(&joined.session)
        .unwrap_or_default();
    let frames = queued.iter().flat_map(|m| m.frames().cloned()).collect();
    (frames, joined)
}

#[test]
fn compression_is_negotiated_per_worker_and_encoded_once_per_version() {
    let mut h = harness(&["--min-workers", "3"]);
    let join = join_asking;
    let (welcome, _a) = join(&mut h, protocol::Compression::F16);
    let (_, _b) = join(&mut h, protocol::Compression::F16);
    let (_, _c) = join(&mut h, protocol::Compression::Int8);
    let CoordinatorToWorker::Welcome(w) = decode_from_coordinator(&welcome[0]).expect("frame")
    else {
        panic!("welcome first")
    };
    assert_eq!(w.compression, protocol::Compression::F16);
    // Round 0 opened on the third join: each got its weights in its own compression.
    let f16 = h.weights_for(WorkerId(1));
    let f16_again = h.weights_for(WorkerId(2));
    assert!(
        std::sync::Arc::ptr_eq(&f16, &f16_again),
        "one f16 encoding shared by both"
    );
    let int8 = h.weights_for(WorkerId(3));
    let plain = h.c.trainer.weights(protocol::Compression::None);
    let len = |frames: &Frames| frames.iter().map(|f| f.len()).sum::<usize>();
    assert!(len(&f16) < len(&plain) / 2 + 64 && len(&int8) < len(&plain) / 4 + 1024);
    let [frame] = &f16[..] else {
        panic!("this model fits one chunk")
    };
    let CoordinatorToWorker::Weights(w) = decode_from_coordinator(frame).expect("frame") else {
        panic!("weights")
    };
    let worst = w
        .params
        .iter()
        .zip(h.c.trainer.params())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-3, "f16 weights within rounding: {worst}");
}

/// `int2` answers are for local phases: a worker that asks for them where each answer is one
/// gradient is confirmed `int4` (and registered so, which is what its answers are decoded
/// and checked as); with local phases, `int2`; any other encoding as asked.
#[test]
fn int2_is_confirmed_for_local_phases_and_int4_for_single_gradients() {
    let welcomed = |h: &mut Harness, asked: protocol::Compression| {
        let (frames, joined) = join_asking(h, asked);
        let CoordinatorToWorker::Welcome(w) = decode_from_coordinator(&frames[0]).expect("frame")
        else {
            panic!("welcome first")
        };
        let registered = h.c.registry.compression(joined.worker).expect("joined");
        assert_eq!(registered, w.compression, "registered as confirmed");
        w.compression
    };
    use protocol::Compression::{Int2, Int4, Int8};
    let mut single = harness(&["--min-workers", "9"]);
    assert_eq!(welcomed(&mut single, Int2), Int4);
    assert_eq!(welcomed(&mut single, Int4), Int4);
    assert_eq!(welcomed(&mut single, Int8), Int8);
    let mut phases = harness_of(Settings {
        local: Some(crate::local::Local {
            steps: crate::LocalSteps::Fixed(4),
            inner: model::OptimizerKind::Sgd { lr: 0.05 },
            segment: 0,
        }),
        min_workers: 9,
        ..settings(&["--verify-fraction", "0"])
    });
    assert_eq!(welcomed(&mut phases, Int2), Int2);
    assert_eq!(welcomed(&mut phases, Int4), Int4);
}

#[test]
fn a_gradient_beyond_the_norm_bound_moves_the_model_by_the_bound_and_no_further() {
    let mut h = harness_adaptive(&["--optimizer", "sgd", "--lr", "1", "--min-workers", "2"]);
    let (a, b) = (h.join(None, 0), h.join(None, 0));
    let bound = h.status().grad_norm_bound;
    assert!(
        bound.is_finite() && bound > 0.0,
        "from the coordinator's own gradient: {bound}"
    );
    let before = h.c.trainer.params().to_vec();
    // `a` answers with a finite 1e30 everywhere; `b` with zeros.
    h.gradient_valued(&a, 0, 1, 1e30);
    h.gradient_valued(&b, 0, 1, 0.0);
    let s = h.status();
    assert_eq!((s.round, s.counters.gradients_clipped), (1, 1));
    assert_eq!(
        s.worker_list.iter().map(|w| w.clipped).collect::<Vec<_>>(),
        [1, 0]
    );
    // SGD with lr 1: the step is the mean, (bound · unit + 0) / 2, so it has length bound / 2.
    let moved: f64 = before
        .iter()
        .zip(h.c.trainer.params())
        .map(|(p, q)| f64::from(p - q).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!(
        (moved / (bound / 2.0) - 1.0).abs() < 1e-3,
        "moved {moved}, bound {bound}"
    );
    assert!(h.c.trainer.params().iter().all(|p| p.is_finite()));
}

#[test]
fn a_workers_weight_is_its_assigned_batch_not_its_claim() {
    let mut h = harness(&["--optimizer", "sgd", "--lr", "1", "--min-workers", "2"]);
    let (a, b) = (h.join(None, 0), h.join(None, 0));
    let before = h.c.trainer.params().to_vec();
    // Both were assigned a full batch; `a` claims 1 sample, `b` 32.
    h.gradient_claiming(a.id, a.session, 0, 1, 1.0, 1);
    h.gradient_claiming(b.id, b.session, 0, 1, 3.0, 32);
    assert_eq!(h.status().round, 1);
    for (p, q) in before.iter().zip(h.c.trainer.params()) {
        // Equal weights: the mean is 2, not (1·1 + 3·32) / 33.
        assert!((p - q - 2.0).abs() < 1e-5, "{p} - {q}");
    }
}

/// What a checkpoint copies out is what a fresh coordinator continues from: the weights and
/// version, identities (a worker resumes as itself), bans (a banned one stays out), strikes,
/// counters, and new workers get ids nobody had.
#[test]
fn a_snapshot_restored_into_a_new_coordinator_continues_the_run() {
    let mut h = harness(&["--min-workers", "2"]);
    let (a, b) = (h.join(None, 0), h.join(None, 0));
    for round in 0..3 {
        h.gradient(&a, round, 10 * round + 1);
        h.gradient(&b, round, 10 * round + 2);
    }
    assert_eq!(h.status().round, 3);
    h.admin(Command::Ban(b.id), 40).expect("banned");
    let saved = h.c.snapshot();
    let before = h.status();

    let mut fresh = harness(&["--min-workers", "2"]);
    assert_ne!(fresh.c.trainer.params(), h.c.trainer.params());
    fresh.c.restore(saved, fresh.at(0)).expect("fits");
    assert_eq!(fresh.c.trainer.params(), h.c.trainer.params());
    let after = fresh.status();
    assert_eq!(after.round, 3);
    assert_eq!(
        after.counters.gradients_accepted,
        before.counters.gradients_accepted
    );
    assert_eq!(*after.bans, [b.id.to_string()], "the ban survives");

    let a2 = fresh.join(Some(&a.token), 1);
    assert_eq!(a2.id, a.id, "resumed as itself");
    let me = fresh
        .status()
        .worker_list
        .iter()
        .find(|w| w.id == a.id.0)
        .cloned();
    assert_eq!(me.expect("listed").gradients, 3, "its gradients remembered");

    let hello = Hello {
        kind: Some(WorkerKind::Native),
        join_token: None,
        resume_token: Some(b.token.clone()),
        compression: protocol::Compression::None,
        fused: false,
    };
    let refused = fresh.hello(&hello, 2).expect_err("banned");
    assert_eq!(refused.code, ErrorCode::Banned, "{refused}");

    let newcomer = fresh.join(None, 3);
    assert!(newcomer.id.0 > b.id.0, "a fresh id: {:?}", newcomer.id);
}

/// Weights uploaded while a sync round is open replace the model when it closes, so the
/// round's update (computed on the old weights) does not land on them.
#[test]
fn weights_uploaded_during_a_round_replace_the_model_when_it_closes() {
    let mut h = harness(&["--min-workers", "2"]);
    let (a, b) = (h.join(None, 0), h.join(None, 0));
    let uploaded: Vec<f32> = (0..h.params).map(|i| (i % 7) as f32 * 0.01).collect();
    let command = Command::ReplaceParams(vec![(0..uploaded.len(), uploaded.clone())]);
    let said = h.admin(command, 1).expect("accepted");
    assert!(said.contains("when round 1 closes"), "{said}");
    assert_ne!(h.c.trainer.params(), uploaded.as_slice(), "not yet");
    h.gradient(&a, 0, 2);
    h.gradient(&b, 0, 3);
    assert_eq!(
        h.c.trainer.params(),
        uploaded.as_slice(),
        "replaced as the round closed"
    );
    assert_eq!(
        h.c.trainer.version(),
        2,
        "the round's update, then the upload"
    );
    // With no round open (nobody connected), an upload replaces the model at once.
    let mut idle = harness(&[]);
    let command = Command::ReplaceParams(vec![(0..uploaded.len(), uploaded.clone())]);
    let said = idle.admin(command, 0).expect("accepted");
    assert!(said.contains("now version 1"), "{said}");
    assert_eq!(idle.c.trainer.params(), uploaded.as_slice());
}

/// `--init` (and a checkpoint): the norm bound's warm-up reference is the coordinator's own
/// gradient at the weights given, not at the random initialisation they replaced.
#[test]
fn the_norm_bound_starts_from_the_weights_training_starts_from() {
    let mut h = harness_adaptive(&[]);
    let at_random = h.c.bound.bound();
    // All zeros: only the last bias has a gradient, far smaller than a random model's.
    h.c.start_from(vec![0.0; h.params]).expect("fits");
    let own =
        h.c.trainer
            .reference_norm(&h.c.train, 32, None)
            .expect("a gradient");
    assert_eq!(h.c.bound.bound(), clip::MULTIPLIER * own);
    assert!(
        h.c.bound.bound() < at_random / 2.0,
        "{} at the given weights, {at_random} at random ones",
        h.c.bound.bound()
    );
    assert_eq!(h.status().grad_norm_bound, h.c.bound.bound(), "published");
}

/// A `Commitments` or `Reveal` frame that nothing called for (here: a model trained without
/// local phases) is refused with `UnexpectedMessage`, says why, and keeps nothing; from the
/// second on each is a strike, and the third strike bans. The honest worker beside it is
/// never struck.
#[test]
fn commitments_and_reveals_nothing_called_for_are_refused_and_repeats_strike() {
    let mut h = harness(&["--min-workers", "2"]);
    let mut honest = h.join(None, 0);
    let mut rogue = h.join(None, 0);
    let hashes = vec![[7u8; 32]; 2048];
    let commit = |h: &mut Harness, c: &Client, ms| {
        let commitments = protocol::Commitments {
            round: Round(0),
            hashes: hashes.clone(),
        };
        h.c.commitments(c.id, c.session, commitments, h.at(ms));
        h.deliver();
    };
    commit(&mut h, &rogue, 10);
    let refused: Vec<String> = rogue
        .drain()
        .into_iter()
        .filter_map(|m| match m {
            CoordinatorToWorker::Error { code, message } => {
                assert_eq!(code, ErrorCode::UnexpectedMessage);
                Some(message)
            }
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("Commitments") && refused[0].contains("not a phase committed"),
        "{refused:?}"
    );
    assert_eq!(
        h.c.checks.challenges.committed_workers(),
        1,
        "only its count is kept"
    );
    assert_eq!(
        h.c.registry.strikes(rogue.id),
        0,
        "the first is not a strike"
    );

    // A revealed state no challenge asked for: refused the same way, a strike this time.
    let chunk = protocol::RevealChunk {
        round: Round(0),
        boundary: 1,
        total: 4,
        offset: 0,
        values: vec![0.0; 4],
    };
    h.c.revealed(rogue.id, rogue.session, chunk, h.at(20));
    h.deliver();
    assert_eq!(rogue.errors(), vec![ErrorCode::UnexpectedMessage]);
    assert_eq!(h.c.registry.strikes(rogue.id), 1);
    commit(&mut h, &rogue, 30);
    assert_eq!(h.c.registry.strikes(rogue.id), 2);
    commit(&mut h, &rogue, 40);
    // The frame that bans it closes its session, saying why.
    assert_eq!(
        rogue.errors(),
        vec![ErrorCode::UnexpectedMessage, ErrorCode::Banned]
    );
    assert!(h.c.registry.is_banned(rogue.id));
    h.leave(&rogue, 50);
    assert_eq!(
        h.c.checks.challenges.committed_workers(),
        0,
        "nothing kept for it"
    );
    assert_eq!(h.c.registry.strikes(honest.id), 0);
    assert!(honest.errors().is_empty());
}

/// A committed phase's commitments are kept for its answer, and freed when their worker
/// leaves: 3,000 identities that each commit and leave leave nothing behind. Commitments
/// for a round ahead of the task's, or of the wrong length, are refused; a second set for
/// the same task replaces the first (one set a worker).
#[test]
fn commitments_are_freed_when_their_worker_leaves() {
    let mut settings = settings(&["--verify-fraction", "0", "--min-workers", "1"]);
    settings.local = Some(Local {
        steps: LocalSteps::Fixed(8),
        inner: model::OptimizerKind::Sgd { lr: 0.1 },
        segment: 4,
    });
    let mut h = harness_of(settings);
    let mut stays = h.join(None, 0);
    let commit = |h: &mut Harness, c: &Client, round: u64, n: usize, ms: u64| {
        let commitments = protocol::Commitments {
            round: Round(round),
            hashes: vec![[1u8; 32]; n],
        };
        h.c.commitments(c.id, c.session, commitments, h.at(ms));
        h.deliver();
    };
    // Its task is round 0's 8-step phase in segments of 4: two hashes.
    commit(&mut h, &stays, 0, 3, 1);
    commit(&mut h, &stays, 5, 2, 2);
    assert_eq!(
        stays.errors(),
        vec![ErrorCode::UnexpectedMessage, ErrorCode::UnexpectedMessage]
    );
    commit(&mut h, &stays, 0, 2, 3);
    assert!(stays.errors().is_empty(), "the right ones are kept");
    commit(&mut h, &stays, 0, 2, 4);
    assert!(stays.errors().is_empty(), "the same task's again: replaces");
    assert_eq!(
        h.c.checks.challenges.committed_workers(),
        2,
        "one set, and its count"
    );

    h.leave(&stays, 5);
    assert_eq!(h.c.checks.challenges.committed_workers(), 0);

    // Visitors, one at a time: each is given the open round's phase, commits to it (kept:
    // no error) and leaves.
    for i in 0..3000 {
        let mut visitor = h.join(None, 10 + i);
        let round = visitor
            .drain()
            .into_iter()
            .find_map(|m| match m {
                CoordinatorToWorker::Task(t) => Some(t.round.0),
                _ => None,
            })
            .expect("a task");
        commit(&mut h, &visitor, round, 2, 10 + i);
        assert!(visitor.errors().is_empty(), "kept for its answer");
        assert_eq!(h.c.checks.challenges.committed_workers(), 1);
        h.leave(&visitor, 10 + i);
    }
    assert_eq!(
        h.c.checks.challenges.committed_workers(),
        0,
        "nothing left behind"
    );
}

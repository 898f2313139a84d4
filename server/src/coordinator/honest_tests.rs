//! Honest workers are never struck: the real coordinator and real [`WorkerCore`]s, every frame
//! through the codec and the session's own checks, time passed in, at `--verify-fraction 1`
//! (every answer recomputed), through the paths where the coordinator could recompute on
//! other weights, another batch or another shard than the worker was given: a resume from a
//! checkpoint older than the workers, the same weights pulled many times (async), a plain
//! reconnect with a token, the operator's new weights and learning rate, and shards re-cut
//! while answers are pending.

use std::time::Duration;

use protocol::{decode_worker_frame, ErrorCode, WorkerFrame, WorkerKind, WorkerToCoordinator};
use tokio::sync::oneshot;
use worker_core::WorkerCore;

use super::*;
use crate::checkpoint::{Checkpoint, Fingerprint};
use crate::upload::{Progress, Upload};

/// One connection of a worker: its outbox, and its gradient arriving as its session holds it.
struct Conn {
    joined: Joined,
    rx: mpsc::Receiver<Outbound>,
    upload: Upload,
}

/// A volunteer: one core kept across connections (as `worker --reconnect` and the page do).
struct Volunteer {
    core: WorkerCore,
    conn: Option<Conn>,
    /// Gradient frames computed and not yet uploaded.
    outgoing: Vec<Vec<u8>>,
}

struct Swarm {
    c: Coordinator,
    now: Instant,
    data: crate::dataset::Split,
    flags: Vec<String>,
    volunteers: Vec<Volunteer>,
}

fn data() -> crate::dataset::Split {
    // Decompressing the digits takes longer than a test's training: once per process.
    static DATA: std::sync::OnceLock<crate::dataset::Split> = std::sync::OnceLock::new();
    DATA.get_or_init(|| crate::dataset::load_default(1).expect("data"))
        .clone()
}

fn coordinator(flags: &[String], data: &crate::dataset::Split) -> Coordinator {
    let args = ["coordinator", "--verify-fraction", "1", "--hidden", "32"]
        .into_iter()
        .chain(flags.iter().map(String::as_str));
    let config = Config::from_args(args).expect("valid flags");
    Coordinator::new(config, data.clone(), CancellationToken::new()).expect("model")
}

impl Swarm {
    fn new(flags: &[&str], volunteers: usize) -> Self {
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_string()).collect();
        let data = data();
        let c = coordinator(&flags, &data);
        let mut swarm = Self {
            c,
            now: Instant::now(),
            data,
            flags,
            volunteers: Vec::new(),
        };
        for _ in 0..volunteers {
            swarm.add();
        }
        swarm
    }

    /// A new volunteer, connected.
    fn add(&mut self) -> usize {
        self.volunteers.push(Volunteer {
            core: WorkerCore::new(WorkerKind::Native, None),
            conn: None,
            outgoing: Vec::new(),
        });
        let i = self.volunteers.len() - 1;
        self.connect(i);
        i
    }

    /// `i` connects: its core's `Hello` (with its resume token once it has one).
    fn connect(&mut self, i: usize) {
        let WorkerToCoordinator::Hello(hello) =
            protocol::decode_from_worker(&self.volunteers[i].core.hello_frame()).expect("hello")
        else {
            panic!("a Hello")
        };
        let (outbox, rx) = mpsc::channel(OUTBOX_CAPACITY);
        let (reply, mut answer) = oneshot::channel();
        let peer = std::net::Ipv4Addr::LOCALHOST.into();
        self.tick(1);
        self.c.handle(
            Event::Join {
                hello,
                outbox,
                peer,
                reply,
            },
            self.now,
        );
        let joined = answer.try_recv().expect("answered").expect("admitted");
        let v = &mut self.volunteers[i];
        v.outgoing.clear();
        v.conn = Some(Conn {
            joined,
            rx,
            upload: Upload::default(),
        });
    }

    /// `i`'s connection drops (what it had not uploaded is lost).
    fn disconnect(&mut self, i: usize) {
        let Some(conn) = self.volunteers[i].conn.take() else {
            return;
        };
        self.volunteers[i].outgoing.clear();
        self.tick(1);
        let event = Event::Leave {
            worker: conn.joined.worker,
            session: conn.joined.session,
        };
        self.c.handle(event, self.now);
    }

    fn tick(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        if self.c.next_deadline().is_some_and(|d| d <= self.now) {
            self.c.tick(self.now);
        }
    }

    /// `i` reads what the coordinator sent it and computes its answers. Returns whether
    /// anything arrived.
    fn deliver(&mut self, i: usize) -> bool {
        let v = &mut self.volunteers[i];
        let Some(conn) = v.conn.as_mut() else {
            return false;
        };
        let mut any = false;
        let mut closed = false;
        while let Ok(msg) = conn.rx.try_recv() {
            any = true;
            if let Outbound::Close(refusal) = &msg {
                assert!(
                    !matches!(refusal.code, ErrorCode::Banned),
                    "an honest worker was banned: {refusal}"
                );
                closed = true;
                break;
            }
            for frame in msg.frames() {
                let reply = v.core.handle_frame(frame).expect("an honest worker's core");
                v.outgoing.extend(reply);
            }
        }
        if closed {
            self.disconnect(i);
        }
        any
    }

    /// `i`'s computed gradients go up, checked chunk by chunk as its session does.
    fn upload(&mut self, i: usize) -> bool {
        let v = &mut self.volunteers[i];
        let Some(conn) = v.conn.as_mut() else {
            return false;
        };
        let frames = std::mem::take(&mut v.outgoing);
        let any = !frames.is_empty();
        for frame in frames {
            let Ok(WorkerFrame::Gradient(chunk)) = decode_worker_frame(&frame) else {
                panic!("a worker sends gradient chunks")
            };
            match conn.upload.take(&chunk, &conn.joined).expect("valid") {
                Progress::More => {}
                Progress::Done(gradient, norm) => {
                    self.now += Duration::from_millis(1);
                    let event = Event::Gradient {
                        worker: conn.joined.worker,
                        session: conn.joined.session,
                        gradient,
                        norm,
                        slot: None,
                    };
                    self.c.handle(event, self.now);
                }
            }
        }
        any
    }

    /// Everyone reads what it was sent, computes, and uploads its answers, once.
    fn step(&mut self) {
        for i in 0..self.volunteers.len() {
            self.deliver(i);
            self.upload(i);
        }
        self.tick(1);
    }

    /// Trains until `pred` holds for the status.
    fn until(&mut self, what: &str, pred: impl Fn(&Status) -> bool) -> Status {
        for _ in 0..100_000 {
            let status = self.c.status();
            if pred(&status) {
                return status;
            }
            self.step();
        }
        panic!("{what}: never happened; {:?}", self.c.status())
    }

    fn round(&self) -> u64 {
        self.c.trainer.version()
    }

    fn checkpoint(&self) -> Checkpoint {
        let net = self.c.trainer.net();
        let fingerprint = Fingerprint::of(&self.c.config, &self.data, net);
        self.c.snapshot(fingerprint)
    }

    /// `kill -9` and `--resume` from `checkpoint`: a new coordinator; every volunteer's
    /// connection is gone, and each comes back with its token.
    fn restart_from(&mut self, checkpoint: Checkpoint) {
        self.c = coordinator(&self.flags, &self.data);
        self.c.restore(checkpoint, self.now).expect("restores");
        for i in 0..self.volunteers.len() {
            self.volunteers[i].conn = None;
            self.volunteers[i].outgoing.clear();
            self.connect(i);
        }
    }

    fn admin(&mut self, command: Command) -> String {
        let (reply, mut answer) = oneshot::channel();
        let event = Event::Admin {
            command,
            from: "test".into(),
            reply,
        };
        self.c.handle(event, self.now);
        answer.try_recv().expect("answered").expect("done")
    }
}

/// Every answer accepted since the start (at least `min` of them) was recomputed first and
/// matched; nobody was struck or banned.
fn assert_never_struck(s: &Status, min: u64) {
    assert_eq!(s.verification_mismatches, 0, "{s:?}");
    assert!(
        s.gradients_accepted >= min,
        "{} accepted: {s:?}",
        s.gradients_accepted
    );
    assert!(s.gradients_verified >= s.gradients_accepted, "{s:?}");
    assert!(s.bans.is_empty(), "{s:?}");
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
}

#[test]
fn a_resume_from_a_checkpoint_older_than_the_workers_strikes_nobody() {
    let mut swarm = Swarm::new(&["--min-workers", "2"], 2);
    swarm.until("round 10", |s| s.round >= 10);
    let checkpoint = swarm.checkpoint();
    assert_eq!(checkpoint.run.version, 10);
    // The workers go on well past the checkpoint: their batches run ahead of it.
    swarm.until("round 40", |s| s.round >= 40);
    swarm.restart_from(checkpoint);
    assert_eq!(swarm.round(), 10);
    let s = swarm.until("40 rounds after the resume", |s| s.round >= 50);
    assert_eq!(s.resumed, 2, "both came back as themselves");
    assert_never_struck(&s, 2 * 39);
}

#[test]
fn the_same_weights_pulled_many_times_are_checked_on_the_batch_each_was_given() {
    // One worker and a buffer of 4: it answers the same version 4 times before it changes.
    let mut swarm = Swarm::new(&["--mode", "async", "--buffer", "4"], 1);
    let s = swarm.until("40 updates", |s| s.round >= 40);
    assert_never_struck(&s, 160);
    // Three workers of one version, and hogwild.
    let mut swarm = Swarm::new(&["--mode", "async", "--buffer", "5"], 3);
    assert_never_struck(&swarm.until("20 updates", |s| s.round >= 20), 100);
    let mut swarm = Swarm::new(&["--mode", "hogwild"], 2);
    assert_never_struck(&swarm.until("60 updates", |s| s.round >= 60), 60);
}

#[test]
fn a_worker_back_with_its_token_mid_round_is_checked_on_what_it_was_given() {
    let mut swarm = Swarm::new(&["--min-workers", "2", "--round-timeout", "60s"], 3);
    swarm.until("round 3", |s| s.round >= 3);
    for _ in 0..10 {
        // Worker 0 has its weights and computed its answer; the connection drops before
        // the answer goes up, and it comes back with its token within the round.
        let round = swarm.round();
        swarm.deliver(0);
        swarm.disconnect(0);
        swarm.connect(0);
        swarm.until("the next round", |s| s.round > round);
        // Now it drops with its answer half uploaded and its next weights unread.
        swarm.deliver(0);
        let half = swarm.volunteers[0].outgoing.len() / 2;
        swarm.volunteers[0].outgoing.truncate(half);
        swarm.upload(0);
        swarm.disconnect(0);
        swarm.connect(0);
        swarm.step();
    }
    let s = swarm.until("round 40", |s| s.round >= 40);
    assert_eq!(s.resumed, 20);
    assert_never_struck(&s, 3 * 30);
}

#[test]
fn new_weights_and_learning_rates_from_the_operator_mid_round_strike_nobody() {
    for mode in [&["--min-workers", "2"][..], &["--mode", "async"][..]] {
        let mut swarm = Swarm::new(mode, 3);
        swarm.until("round 5", |s| s.round >= 5);
        let fresh = swarm.c.trainer.net().init(99);
        for k in 0..6u32 {
            // Weights out, answers computed, not uploaded yet: the operator acts.
            for i in 0..3 {
                swarm.deliver(i);
            }
            if k % 2 == 0 {
                let patch = (0..fresh.len(), fresh.clone());
                swarm.admin(Command::ReplaceParams(vec![patch]));
            } else {
                swarm.admin(Command::SetLr(0.0005 * k as f32));
            }
            swarm.step();
            let round = swarm.round();
            swarm.until("two more updates", |s| s.round >= round + 2);
        }
        let s = swarm.until("round 40", |s| s.round >= 40);
        assert_never_struck(&s, 40);
    }
}

#[test]
fn shards_re_cut_while_answers_are_pending_strike_nobody() {
    for mode in [
        &["--min-workers", "2", "--round-timeout", "60s"][..],
        &["--mode", "async"][..],
    ] {
        let mut swarm = Swarm::new(mode, 2);
        swarm.until("round 3", |s| s.round >= 3);
        for _ in 0..8 {
            // Everyone holds weights it has not read; a newcomer (async) or the next round
            // (sync) re-cuts the shards, and the new shards queue behind the weights.
            let newcomer = swarm.add();
            for i in 0..swarm.volunteers.len() {
                swarm.deliver(i);
            }
            swarm.step();
            let round = swarm.round();
            swarm.until("an update with the newcomer", |s| s.round >= round + 2);
            // And one leaves with answers pending elsewhere.
            for i in 0..swarm.volunteers.len() {
                swarm.deliver(i);
            }
            swarm.disconnect(newcomer);
            swarm.step();
        }
        let s = swarm.until("round 40", |s| s.round >= 40);
        assert_never_struck(&s, 60);
    }
}

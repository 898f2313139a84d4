//! In-process swarms for the coordinator's tests: the real core and real [`WorkerCore`]s,
//! every frame through the codec and the session's own checks, time passed in. No sockets,
//! no threads, no sleeps.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use coordinator_core::{
    Command, Coordinator, EvalJob, Joined, Outbound, Output, RecomputeJob, Snapshot,
};
use protocol::{decode_worker_frame, ErrorCode, WorkerFrame, WorkerKind, WorkerToCoordinator};
use worker_core::WorkerCore;

use crate::config::Config;
use crate::edge::upload::{Progress, Upload};

/// One connection of a worker: what was queued to it, and its gradient arriving as its
/// session holds it.
pub struct Conn {
    joined: Joined,
    inbox: VecDeque<Outbound>,
    upload: Upload,
}

/// A volunteer: one core kept across connections (as `worker --reconnect` and the page do).
pub struct Volunteer {
    pub core: WorkerCore,
    pub conn: Option<Conn>,
    /// Gradient frames computed and not yet uploaded.
    pub outgoing: Vec<Vec<u8>>,
}

pub struct Swarm {
    pub c: Coordinator,
    pub now: Instant,
    flags: Vec<String>,
    pub volunteers: Vec<Volunteer>,
    /// Evaluations the core asked for, not run yet.
    pub evaluations: Vec<EvalJob>,
    /// Recomputations the core asked for, kept here until `run_recomputation` when held
    /// (`hold_recomputations`); else run at once, as if a core were always free.
    pub recomputations: Option<VecDeque<RecomputeJob>>,
}

/// A coordinator for a 784-32-10 MLP on the embedded digits, with `flags`.
fn coordinator(flags: &[String], now: Instant) -> Coordinator {
    // Decompressing the digits takes longer than a test's training: once per process.
    static DATA: std::sync::OnceLock<crate::dataset::Split> = std::sync::OnceLock::new();
    let split = DATA.get_or_init(|| crate::dataset::load_default(1).expect("data"));
    let args = ["coordinator", "--hidden", "32"]
        .into_iter()
        .chain(flags.iter().map(String::as_str));
    let config = Config::from_args(args).expect("valid flags");
    let net = split.network(&config.model).expect("model");
    Coordinator::new(config.training.clone(), net, split.data(), now).expect("model")
}

impl Swarm {
    pub fn new(flags: &[&str], volunteers: usize) -> Self {
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_string()).collect();
        let now = Instant::now();
        let mut swarm = Self {
            c: coordinator(&flags, now),
            now,
            flags,
            volunteers: Vec::new(),
            evaluations: Vec::new(),
            recomputations: None,
        };
        for _ in 0..volunteers {
            swarm.add();
        }
        swarm
    }

    /// A new volunteer, connected.
    pub fn add(&mut self) -> usize {
        self.volunteers.push(Volunteer {
            core: WorkerCore::new(WorkerKind::Native, None),
            conn: None,
            outgoing: Vec::new(),
        });
        let i = self.volunteers.len() - 1;
        self.connect(i);
        i
    }

    /// What the core asked for: messages into their session's inbox, evaluations kept.
    fn route(&mut self) {
        while let Some(output) = self.c.poll_output() {
            match output {
                Output::Send {
                    session, message, ..
                } => {
                    let conn = self
                        .volunteers
                        .iter_mut()
                        .filter_map(|v| v.conn.as_mut())
                        .find(|c| c.joined.session == session);
                    if let Some(conn) = conn {
                        conn.inbox.push_back(message);
                    }
                }
                Output::Evaluate(job) => self.evaluations.push(job),
                Output::Recompute(job) => match self.recomputations.as_mut() {
                    Some(held) => held.push_back(job),
                    // At once, as if a core were always free: its verdict's outputs follow.
                    None => {
                        let now = self.now;
                        self.c.recomputed(job.run(), now);
                    }
                },
                Output::Checkpoint(_)
                | Output::Observe(_)
                | Output::Stop(_)
                | Output::Partial(_) => {}
            }
        }
    }

    /// `i` connects: its core's `Hello` (with its resume token once it has one).
    pub fn connect(&mut self, i: usize) {
        let WorkerToCoordinator::Hello(hello) =
            protocol::decode_from_worker(&self.volunteers[i].core.hello_frame()).expect("hello")
        else {
            panic!("a Hello")
        };
        self.tick(1);
        let peer = std::net::Ipv4Addr::LOCALHOST.into();
        let joined = self.c.join(&hello, peer, self.now).expect("admitted");
        let v = &mut self.volunteers[i];
        v.outgoing.clear();
        v.conn = Some(Conn {
            joined,
            inbox: VecDeque::new(),
            upload: Upload::default(),
        });
        self.route();
    }

    /// `i`'s connection drops (what it had not uploaded is lost).
    pub fn disconnect(&mut self, i: usize) {
        let Some(conn) = self.volunteers[i].conn.take() else {
            return;
        };
        self.volunteers[i].outgoing.clear();
        self.tick(1);
        self.c
            .leave(conn.joined.worker, conn.joined.session, self.now);
        self.route();
    }

    pub fn tick(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        if self.c.poll_timeout().is_some_and(|d| d <= self.now) {
            self.c.handle_timeout(self.now);
        }
        self.route();
    }

    /// The codes of the refusals queued to `i` and not yet read.
    pub fn queued_refusals(&self, i: usize) -> Vec<ErrorCode> {
        let queued = self.volunteers[i].conn.as_ref().map(|c| &c.inbox);
        queued
            .into_iter()
            .flatten()
            .filter_map(|m| match m {
                Outbound::Close(r) => Some(r.code),
                _ => None,
            })
            .collect()
    }

    /// The codes of every error queued to `i` and not yet read, fatal or not.
    pub fn queued_errors(&self, i: usize) -> Vec<ErrorCode> {
        let queued = self.volunteers[i].conn.as_ref().map(|c| &c.inbox);
        let frames = queued.into_iter().flatten().flat_map(|m| match m {
            Outbound::Close(r) => vec![r.code],
            m => m
                .frames()
                .filter_map(|f| match protocol::decode_from_coordinator(f) {
                    Ok(protocol::CoordinatorToWorker::Error { code, .. }) => Some(code),
                    _ => None,
                })
                .collect(),
        });
        frames.collect()
    }

    /// `i` reads what the coordinator sent it and computes its answers. Returns whether
    /// anything arrived.
    pub fn deliver(&mut self, i: usize) -> bool {
        let v = &mut self.volunteers[i];
        let Some(conn) = v.conn.as_mut() else {
            return false;
        };
        let mut any = false;
        let mut closed = false;
        while let Some(msg) = conn.inbox.pop_front() {
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
        // A local phase: its steps, one after the other.
        while v.core.working() {
            let reply = v.core.work().expect("an honest worker's core");
            v.outgoing.extend(reply);
        }
        if closed {
            self.disconnect(i);
        }
        any
    }

    /// `i`'s computed gradients go up, checked chunk by chunk as its session does.
    pub fn upload(&mut self, i: usize) -> bool {
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
                    let (worker, session) = (conn.joined.worker, conn.joined.session);
                    self.c.gradient(worker, session, &gradient, norm, self.now);
                }
            }
        }
        self.route();
        any
    }

    /// Everyone reads what it was sent, computes, and uploads its answers, once.
    pub fn step(&mut self) {
        for i in 0..self.volunteers.len() {
            self.deliver(i);
            self.upload(i);
        }
        self.tick(1);
    }

    /// Trains until `pred` holds for the status.
    pub fn until(
        &mut self,
        what: &str,
        pred: impl Fn(&coordinator_core::Status) -> bool,
    ) -> coordinator_core::Status {
        for _ in 0..100_000 {
            let status = self.c.status().clone();
            if pred(&status) {
                return status;
            }
            self.step();
        }
        panic!("{what}: never happened; {:?}", self.c.status())
    }

    pub fn round(&self) -> u64 {
        self.c.version()
    }

    pub fn checkpoint(&self) -> Snapshot {
        self.c.snapshot()
    }

    /// `kill -9` and `--resume` from `snapshot`: a new coordinator; every volunteer's
    /// connection is gone, and each comes back with its token.
    pub fn restart_from(&mut self, snapshot: Snapshot) {
        self.c = coordinator(&self.flags, self.now);
        self.evaluations.clear();
        self.c.restore(snapshot, self.now).expect("restores");
        for i in 0..self.volunteers.len() {
            self.volunteers[i].conn = None;
            self.volunteers[i].outgoing.clear();
            self.connect(i);
        }
    }

    pub fn admin(&mut self, command: Command) -> String {
        let answer = self.c.admin(command, "test", self.now).expect("done");
        self.route();
        answer
    }

    /// From now on, recomputations wait in `recomputations` for `run_recomputation`.
    pub fn hold_recomputations(&mut self) {
        self.recomputations.get_or_insert_with(VecDeque::new);
    }

    /// The oldest recomputation asked for, run here, its verdict handed back.
    pub fn run_recomputation(&mut self) -> coordinator_core::Recomputed {
        let job = self.recomputations.as_mut().and_then(VecDeque::pop_front);
        let done = job.expect("a recomputation was asked for").run();
        self.c.recomputed(done.clone(), self.now);
        self.route();
        done
    }

    /// The evaluation asked for first, run here, its result handed back.
    pub fn run_evaluation(&mut self) -> coordinator_core::Evaluated {
        let job = self.evaluations.remove(0);
        let done = job.run();
        self.c.evaluated(done.clone(), self.now);
        self.route();
        done
    }
}

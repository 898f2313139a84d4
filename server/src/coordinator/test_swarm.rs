//! In-process swarms for the coordinator's tests: the real coordinator and real
//! [`WorkerCore`]s, every frame through the codec and the session's own checks, time passed
//! in. No sockets, no threads, no sleeps.

use std::time::Duration;

use protocol::{decode_worker_frame, ErrorCode, WorkerFrame, WorkerKind, WorkerToCoordinator};
use tokio::sync::oneshot;
use worker_core::WorkerCore;

use super::*;
use crate::checkpoint::{Checkpoint, Fingerprint};
use crate::upload::{Progress, Upload};

/// One connection of a worker: its outbox, and its gradient arriving as its session holds it.
pub struct Conn {
    joined: Joined,
    rx: mpsc::Receiver<Outbound>,
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
    data: crate::dataset::Split,
    flags: Vec<String>,
    pub volunteers: Vec<Volunteer>,
}

fn data() -> crate::dataset::Split {
    // Decompressing the digits takes longer than a test's training: once per process.
    static DATA: std::sync::OnceLock<crate::dataset::Split> = std::sync::OnceLock::new();
    DATA.get_or_init(|| crate::dataset::load_default(1).expect("data"))
        .clone()
}

/// A coordinator for a 784-32-10 MLP on the embedded digits, with `flags`.
fn coordinator(flags: &[String], data: &crate::dataset::Split) -> Coordinator {
    let args = ["coordinator", "--hidden", "32"]
        .into_iter()
        .chain(flags.iter().map(String::as_str));
    let config = Config::from_args(args).expect("valid flags");
    Coordinator::new(config, data.clone(), CancellationToken::new()).expect("model")
}

impl Swarm {
    pub fn new(flags: &[&str], volunteers: usize) -> Self {
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

    /// `i` connects: its core's `Hello` (with its resume token once it has one).
    pub fn connect(&mut self, i: usize) {
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
    pub fn disconnect(&mut self, i: usize) {
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

    pub fn tick(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        if self.c.next_deadline().is_some_and(|d| d <= self.now) {
            self.c.tick(self.now);
        }
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
    pub fn step(&mut self) {
        for i in 0..self.volunteers.len() {
            self.deliver(i);
            self.upload(i);
        }
        self.tick(1);
    }

    /// Trains until `pred` holds for the status.
    pub fn until(&mut self, what: &str, pred: impl Fn(&Status) -> bool) -> Status {
        for _ in 0..100_000 {
            let status = self.c.status();
            if pred(&status) {
                return status;
            }
            self.step();
        }
        panic!("{what}: never happened; {:?}", self.c.status())
    }

    pub fn round(&self) -> u64 {
        self.c.trainer.version()
    }

    pub fn checkpoint(&self) -> Checkpoint {
        let net = self.c.trainer.net();
        let fingerprint = Fingerprint::of(&self.c.config, &self.data, net);
        self.c.snapshot(fingerprint)
    }

    /// `kill -9` and `--resume` from `checkpoint`: a new coordinator; every volunteer's
    /// connection is gone, and each comes back with its token.
    pub fn restart_from(&mut self, checkpoint: Checkpoint) {
        self.c = coordinator(&self.flags, &self.data);
        self.c.restore(checkpoint, self.now).expect("restores");
        for i in 0..self.volunteers.len() {
            self.volunteers[i].conn = None;
            self.volunteers[i].outgoing.clear();
            self.connect(i);
        }
    }

    pub fn admin(&mut self, command: Command) -> String {
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

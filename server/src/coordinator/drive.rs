//! Drives a coordinator through a sequence of events with explicit time, checking its
//! invariants after each: the property test (`sequence_tests.rs`) and the coverage-guided
//! fuzzer (`fuzz/fuzz_targets/events.rs`, feature `fuzzing`) share it.

use std::time::{Duration, Instant};

use std::collections::VecDeque;

use coordinator_core::checks::clip::norm_and_finite;
use coordinator_core::{Coordinator, Joined, Outbound, Output, SessionId};
use protocol::{
    decode_worker_frame, encode_gradient, Compression, CoordinatorToWorker, Gradient, Hello, Round,
    WorkerFrame, WorkerId, WorkerKind,
};

use super::OUTBOX_CAPACITY;
use crate::config::Config;
use crate::edge::upload::{Progress, Upload};
use crate::refusal::Refusal;

/// One step of a sequence.
#[derive(Debug, Clone)]
pub enum Op {
    Join {
        /// Resume with the token of the n-th worker that joined.
        resume: Option<usize>,
    },
    /// A gradient straight to the coordinator (no session checks: more hostile than a real
    /// session lets through), for the current round plus `round`.
    Gradient {
        who: usize,
        round: i8,
        value: usize,
        samples: u32,
    },
    /// Bytes as a worker's frame: decoded and validated as the session does.
    Frame {
        who: usize,
        bytes: Vec<u8>,
    },
    Leave {
        who: usize,
    },
    /// Read every frame queued for this worker (the others' outboxes may fill up).
    Drain {
        who: usize,
    },
    Wait {
        ms: u16,
    },
    Rejected,
}

/// Gradient values: ordinary, zero, and finite but huge.
pub const VALUES: [f32; 6] = [0.0, 1e-3, -0.5, 3e38, -3e38, 1e20];

/// The flag sets sequences run under: every mode, and `--replicate 2`.
pub const MODES: [&[&str]; 4] = [
    &["--min-workers", "2", "--round-timeout", "1s"],
    &["--mode", "async"],
    &["--mode", "hogwild"],
    // Made-up answers disagree: every pair goes to recomputation, and strikes.
    &[
        "--min-workers",
        "2",
        "--round-timeout",
        "1s",
        "--replicate",
        "2",
    ],
];

/// A gradient frame for `round` of `params` values repeating `values`: what a (possibly
/// hostile) worker would send. One chunk: at most `CHUNK_VALUES` parameters.
pub fn gradient_frame(round: u64, samples: u32, values: &[f32], params: usize) -> Vec<u8> {
    assert!(params <= protocol::CHUNK_VALUES, "one chunk only");
    let grads = (0..params).map(|i| values[i % values.len()]).collect();
    let g = Gradient {
        compute_us: 0,
        parts: 1,
        round: Round(round),
        samples,
        loss: 1.0,
        grads,
    };
    let mut frames = encode_gradient(&g, Compression::None);
    frames.swap_remove(0)
}

/// A sequence from a fuzzer's bytes: the first picks the mode, then each op takes a tag byte
/// and its fields from the bytes after it.
pub fn from_bytes(data: &[u8]) -> (&'static [&'static str], Vec<Op>) {
    let mut bytes = data.iter().copied();
    let mut next = move || bytes.next();
    let mode = MODES[usize::from(next().unwrap_or(0)) % MODES.len()];
    let mut ops = Vec::new();
    while let Some(tag) = next() {
        let mut field = || usize::from(next().unwrap_or(0));
        let op = match tag % 8 {
            0 => Op::Join {
                resume: (field() % 2 == 1).then(|| field() % 8),
            },
            1 => Op::Gradient {
                who: field(),
                round: (field() % 5) as i8 - 2,
                value: field() % VALUES.len(),
                samples: (field() % 40) as u32,
            },
            2 => Op::Leave { who: field() },
            3 => Op::Drain { who: field() },
            4 => Op::Wait {
                ms: (field() * 12) as u16,
            },
            5 => Op::Rejected,
            // A well-formed frame whose fields come from the bytes (`round` 0..5 is relative
            // to round 0: early rounds), or raw bytes of the length given.
            6 => Op::Frame {
                who: field(),
                bytes: gradient_frame(
                    (field() % 5) as u64,
                    (field() % 40) as u32,
                    &[
                        VALUES[field() % VALUES.len()],
                        f32::from_bits(field() as u32 * 0x0101_0101),
                    ],
                    PARAMS_OF_HIDDEN_3,
                ),
            },
            _ => {
                let who = field();
                let len = field();
                Op::Frame {
                    who,
                    bytes: (0..len).map(|_| field() as u8).collect(),
                }
            }
        };
        ops.push(op);
    }
    (mode, ops)
}

/// Parameters of `--hidden 3`: 784·3 + 3 + 3·10 + 10.
pub const PARAMS_OF_HIDDEN_3: usize = 784 * 3 + 3 + 3 * 10 + 10;

struct Client {
    joined: Joined,
    worker: WorkerId,
    session: SessionId,
    token: String,
    /// Its outbox, bounded as the server's are.
    rx: VecDeque<Outbound>,
    /// Its gradient arriving in chunks, as its session would hold it.
    upload: Upload,
}

/// What the driver does with the core's outputs: messages into the sessions' bounded
/// outboxes (a full or gone one is told back), the rest dropped.
fn route(c: &mut Coordinator, clients: &mut [Client], now: Instant) {
    while let Some(output) = c.poll_output() {
        let (worker, session, message) = match output {
            Output::Send {
                worker,
                session,
                message,
            } => (worker, session, message),
            // At once, as if a core were always free.
            Output::Recompute(job) => {
                c.recomputed(job.run(), now);
                continue;
            }
            _ => continue,
        };
        match clients.iter_mut().find(|c| c.session == session) {
            Some(client) if client.rx.len() < OUTBOX_CAPACITY => client.rx.push_back(message),
            _ => c.unreachable(worker, session, now),
        }
    }
}

/// Runs `ops` against a coordinator with `mode`'s flags, checking after each one that the
/// model is finite and every accepted gradient is counted in exactly one round. Panics
/// otherwise (a property-test or fuzzer failure).
pub fn run(mode: &[&str], ops: &[Op]) {
    let args = ["coordinator", "--hidden", "3", "--verify-fraction", "0"]
        .into_iter()
        .chain(mode.iter().copied());
    let config = Config::from_args(args).expect("valid flags");
    // Decompressing the digits takes longer than a whole sequence: once per process.
    static DATA: std::sync::OnceLock<crate::dataset::Split> = std::sync::OnceLock::new();
    let data = DATA.get_or_init(|| crate::dataset::load_default(1).expect("data"));
    let net = data.network(&config.model).expect("model");
    let mut now = Instant::now();
    let mut c = Coordinator::new(config.training.clone(), net, data.data(), now).expect("model");
    let params = c.net().trainable_count();
    let mut clients: Vec<Client> = Vec::new();
    let mut tokens: Vec<String> = Vec::new();
    for op in ops {
        match op {
            Op::Join { resume } => {
                let resume_token = resume.and_then(|i| tokens.get(i).cloned());
                let hello = Hello {
                    kind: Some(WorkerKind::Browser),
                    resume_token,
                    ..Hello::default()
                };
                let peer = std::net::Ipv4Addr::LOCALHOST.into();
                if let Ok(joined) = c.join(&hello, peer, now) {
                    let mut client = Client {
                        joined,
                        worker: joined.worker,
                        session: joined.session,
                        token: String::new(),
                        rx: VecDeque::new(),
                        upload: Upload::default(),
                    };
                    clients.push(client);
                    route(&mut c, &mut clients, now);
                    client = clients.pop().expect("just pushed");
                    while let Some(Outbound::Frames(f)) = client.rx.pop_front() {
                        if let Ok(CoordinatorToWorker::Welcome(w)) =
                            protocol::decode_from_coordinator(&f[0])
                        {
                            client.token = w.resume_token;
                            break;
                        }
                    }
                    tokens.push(client.token.clone());
                    clients.push(client);
                }
            }
            Op::Gradient {
                who,
                round,
                value,
                samples,
            } if !clients.is_empty() => {
                let client = &clients[who % clients.len()];
                let current = c.status().round as i64;
                let gradient = Gradient {
                    compute_us: 0,
                    parts: 1,
                    round: Round((current + i64::from(*round)).max(0) as u64),
                    samples: *samples,
                    loss: 1.0,
                    grads: vec![VALUES[*value]; params],
                };
                let (norm, _) = norm_and_finite(&gradient.grads);
                c.gradient(client.worker, client.session, &gradient, norm, now);
            }
            Op::Frame { who, bytes } if !clients.is_empty() => {
                // What the session does with a frame: decode, check, forward when whole. A
                // refusal would end the session; here the partial is dropped.
                let n = clients.len();
                let client = &mut clients[who % n];
                if let Ok(WorkerFrame::Gradient(chunk)) = decode_worker_frame(bytes) {
                    match client.upload.take(&chunk, &client.joined) {
                        Ok(Progress::Done(gradient, norm)) => {
                            c.gradient(client.worker, client.session, &gradient, norm, now);
                        }
                        Ok(Progress::More) => {}
                        Err(_) => client.upload = Upload::default(),
                    }
                }
            }
            Op::Leave { who } if !clients.is_empty() => {
                let client = clients.remove(who % clients.len());
                c.leave(client.worker, client.session, now);
            }
            Op::Drain { who } if !clients.is_empty() => {
                let n = clients.len();
                clients[who % n].rx.clear();
            }
            Op::Wait { ms } => {
                now += Duration::from_millis(u64::from(*ms));
                if c.poll_timeout().is_some_and(|d| d <= now) {
                    c.handle_timeout(now);
                }
            }
            Op::Rejected => {
                let refusal = Refusal::new(protocol::ErrorCode::Malformed, "garbage");
                let peer = std::net::Ipv4Addr::LOCALHOST.into();
                c.rejected(&refusal, peer, now);
            }
            _ => {}
        }
        route(&mut c, &mut clients, now);
        let s = c.status();
        assert!(c.params().iter().all(|p| p.is_finite()), "{op:?}");
        assert_eq!(s.round, c.version());
        assert_eq!(
            s.counters.answered_total + s.round_answered as u64,
            s.counters.gradients_accepted,
            "every accepted gradient is in exactly one round, after {op:?}: {s:?}"
        );
        assert!(s.workers <= clients.len());
    }
}

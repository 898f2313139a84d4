//! Property test: arbitrary sequences of joins, resumes, gradients (for any round, with any
//! finite values, huge ones included), leaves, silent workers and the passing of time, in
//! every mode (and with `--replicate 2`). Nothing panics, the model stays finite, and every accepted gradient is counted
//! in exactly one round.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use protocol::{CoordinatorToWorker, Gradient, Hello, Round, WorkerId, WorkerKind};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::clip::norm_and_finite;
use super::*;
use crate::refusal::Refusal;

#[derive(Debug, Clone)]
enum Op {
    Join {
        resume: Option<usize>,
    },
    Gradient {
        who: usize,
        round: i8,
        value: usize,
        samples: u32,
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

const VALUES: [f32; 6] = [0.0, 1e-3, -0.5, 3e38, -3e38, 1e20];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => proptest::option::of(0usize..8).prop_map(|resume| Op::Join { resume }),
        6 => (0usize..8, -2i8..3, 0..VALUES.len(), 0u32..40).prop_map(|(who, round, value, samples)| {
            Op::Gradient { who, round, value, samples }
        }),
        1 => (0usize..8).prop_map(|who| Op::Leave { who }),
        3 => (0usize..8).prop_map(|who| Op::Drain { who }),
        2 => (0u16..3000).prop_map(|ms| Op::Wait { ms }),
        1 => Just(Op::Rejected),
    ]
}

struct Client {
    worker: WorkerId,
    session: SessionId,
    token: String,
    rx: mpsc::Receiver<Outbound>,
}

fn run(mode: &[&str], ops: &[Op]) {
    let args = ["coordinator", "--hidden", "3", "--verify-fraction", "0"]
        .into_iter()
        .chain(mode.iter().copied());
    let config = Config::from_args(args).expect("valid flags");
    let data = crate::dataset::load_default(1).expect("data");
    let mut c = Coordinator::new(config, data, CancellationToken::new()).expect("model");
    let params = c.trainer.params().len();
    let mut now = Instant::now();
    let mut clients: Vec<Client> = Vec::new();
    let mut tokens: Vec<String> = Vec::new();
    for op in ops {
        match op {
            Op::Join { resume } => {
                let (outbox, rx) = mpsc::channel(OUTBOX_CAPACITY);
                let (reply, mut answer) = oneshot::channel();
                let resume_token = resume.and_then(|i| tokens.get(i).cloned());
                let hello = Hello {
                    kind: Some(WorkerKind::Browser),
                    resume_token,
                    ..Hello::default()
                };
                let peer = std::net::Ipv4Addr::LOCALHOST.into();
                c.handle(
                    Event::Join {
                        hello,
                        outbox,
                        peer,
                        reply,
                    },
                    now,
                );
                if let Ok(Ok(joined)) = answer.try_recv() {
                    let mut client = Client {
                        worker: joined.worker,
                        session: joined.session,
                        token: String::new(),
                        rx,
                    };
                    while let Ok(Outbound::Frame(f)) = client.rx.try_recv() {
                        if let Ok(CoordinatorToWorker::Welcome(w)) =
                            protocol::decode_from_coordinator(&f)
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
                    round: Round((current + i64::from(*round)).max(0) as u64),
                    samples: *samples,
                    loss: 1.0,
                    grads: vec![VALUES[*value]; params],
                };
                let (norm, _) = norm_and_finite(&gradient.grads);
                c.handle(
                    Event::Gradient {
                        worker: client.worker,
                        session: client.session,
                        gradient,
                        norm,
                    },
                    now,
                );
            }
            Op::Leave { who } if !clients.is_empty() => {
                let client = clients.remove(who % clients.len());
                let event = Event::Leave {
                    worker: client.worker,
                    session: client.session,
                };
                c.handle(event, now);
            }
            Op::Drain { who } if !clients.is_empty() => {
                let n = clients.len();
                while clients[who % n].rx.try_recv().is_ok() {}
            }
            Op::Wait { ms } => {
                now += Duration::from_millis(u64::from(*ms));
                if c.next_deadline().is_some_and(|d| d <= now) {
                    c.tick(now);
                }
            }
            Op::Rejected => {
                let refusal = Refusal::new(protocol::ErrorCode::Malformed, "garbage");
                let peer = std::net::Ipv4Addr::LOCALHOST.into();
                c.handle(Event::Rejected { refusal, peer }, now);
            }
            _ => {}
        }
        let s = c.status();
        assert!(c.trainer.params().iter().all(|p| p.is_finite()), "{op:?}");
        assert_eq!(s.round, c.trainer.version());
        assert_eq!(
            s.answered_total + s.round_answered as u64,
            s.gradients_accepted,
            "every accepted gradient is in exactly one round, after {op:?}: {s:?}"
        );
        assert!(s.workers <= clients.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_sequence_of_events_keeps_the_model_finite_and_the_counts_exact(
        mode in 0usize..4,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let modes: [&[&str]; 4] = [
            &["--min-workers", "2", "--round-timeout", "1s"],
            &["--mode", "async"],
            &["--mode", "hogwild"],
            // Made-up answers disagree: every pair goes to recomputation, and strikes.
            &["--min-workers", "2", "--round-timeout", "1s", "--replicate", "2"],
        ];
        run(modes[mode], &ops);
    }
}

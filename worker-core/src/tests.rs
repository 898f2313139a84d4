use protocol::{delta, encode_from_coordinator, ModelSpec};

use super::*;

fn core_with_shard() -> WorkerCore {
    let shard = Shard {
        first_index: 0,
        shape: [2, 1, 1],
        labels: vec![0, 1, 0],
        values: ShardValues::U8(vec![10, 20, 30, 40, 50, 60]),
        mean: vec![0.0],
        std: vec![255.0],
    };
    joined(
        WorkerCore::new(WorkerKind::Native, None),
        "input 2; dense 2",
        1,
        shard,
    )
}

/// `core` welcomed to a run of the model `spec` at `batch_size`, with `shard`.
fn joined(mut core: WorkerCore, spec: &str, batch_size: u32, shard: Shard) -> WorkerCore {
    let spec: NetSpec = spec.parse().expect("valid");
    core.handle(CoordinatorToWorker::Welcome(Welcome {
        worker_id: WorkerId(3),
        resume_token: "tok".into(),
        model: ModelSpec {
            text: spec.to_string(),
            fingerprint: spec.fingerprint(),
        },
        batch_size,
        compression: Compression::None,
    }))
    .expect("welcome");
    core.handle(CoordinatorToWorker::Shard(shard))
        .expect("shard");
    core
}

fn weights(round: u64) -> CoordinatorToWorker {
    CoordinatorToWorker::Weights(Weights::whole(Round(round), PARAMS.to_vec()))
}

const PARAMS: [f32; 6] = [0.1, -0.2, 0.3, 0.4, 0.0, 0.0];

fn task(round: u64, batch: u64) -> CoordinatorToWorker {
    CoordinatorToWorker::Task(Task {
        local: None,
        round: Round(round),
        batch,
    })
}

/// A `Task` then its `Weights`: one pull, as the coordinator sends it.
fn pull(core: &mut WorkerCore, round: u64, batch: u64) -> Option<Gradient> {
    core.handle(task(round, batch)).expect("task");
    core.handle(weights(round)).expect("weights")
}

/// What the gradient on batch `batch` of `core_with_shard`'s shard must be.
fn expected(batch: u64) -> Vec<f32> {
    gradient_on(&PARAMS, batch)
}

#[test]
fn the_batch_is_the_one_the_task_names_whatever_came_before() {
    let mut core = core_with_shard();
    // The same weights twice with two batches (async, before the buffer applies), then an
    // older round with a smaller index (a coordinator resumed from a checkpoint): each is
    // computed on exactly the batch its task names.
    for (round, batch) in [(0, 0), (0, 1), (7, 7), (3, 2), (3, 2)] {
        let g = pull(&mut core, round, batch).expect("gradient");
        assert_eq!((g.round, &g.grads), (Round(round), &expected(batch)));
    }
    assert_ne!(expected(0), expected(1), "the batches differ");
}

#[test]
fn weights_without_their_task_are_refused() {
    let mut core = core_with_shard();
    assert!(matches!(
        core.handle(weights(0)),
        Err(WorkerError::Protocol(_))
    ));
    // A task is used once.
    let mut core = core_with_shard();
    assert!(pull(&mut core, 1, 1).is_some());
    assert!(core.handle(weights(1)).is_err(), "its task was used");
    // A task for another round does not serve.
    let mut core = core_with_shard();
    core.handle(task(2, 2)).expect("task");
    assert!(core.handle(weights(3)).is_err());
    // A task in the middle of a weights message is out of place.
    let mut core = core_with_shard();
    core.handle(task(0, 0)).expect("task");
    let half = CoordinatorToWorker::Weights(Weights {
        round: Round(0),
        total: 6,
        offset: 0,
        params: PARAMS[..3].to_vec(),
    });
    assert_eq!(core.handle(half).expect("first chunk"), None);
    assert!(core.handle(task(0, 1)).is_err());
}

/// `core_with_shard`'s worker, on `compression`.
fn on(compression: Compression) -> WorkerCore {
    let mut core = core_with_shard();
    let joined = core.joined.as_mut().expect("joined");
    joined.compression = compression;
    core
}

/// The gradient of `core_with_shard`'s batch `batch` on `params`.
fn gradient_on(params: &[f32], batch: u64) -> Vec<f32> {
    let net = Network::new("input 2; dense 2".parse().expect("valid"), 2).expect("net");
    let data = Dataset::from_parts(
        Shape::flat(2),
        Values::U8(vec![10, 20, 30, 40, 50, 60]),
        vec![0, 1, 0],
        Normalization::new(vec![0.0], vec![255.0]),
    )
    .expect("valid");
    let (x, labels) = data.batch(batch_positions(3, batch, 1));
    let (_, grads) = net
        .loss_and_grad(params, x.view(), &labels, batch_seed(batch, 0))
        .expect("ok");
    grads
}

/// On int4 (weights in int8) a version comes whole, the next ones as deltas from it: each
/// answer is computed on the held weights plus the delta, settled through int8, as the
/// coordinator computes them. A delta from a version not held, or to a worker whose weights
/// are not in int8, or interleaved with a `Weights` message, is a protocol error.
#[test]
fn a_delta_is_added_to_the_weights_held() {
    let mut core = on(Compression::Int4);
    let send = |core: &mut WorkerCore, frames: Vec<Vec<u8>>| {
        let mut out = Vec::new();
        for frame in frames {
            out = core.handle_frame(&frame)?;
        }
        Ok::<_, WorkerError>(out)
    };
    core.handle(task(0, 0)).expect("task");
    send(
        &mut core,
        protocol::encode_weights(Round(0), &PARAMS, Compression::Int8),
    )
    .expect("key");
    let mut held = delta::settle(&PARAMS);
    for round in 1..4u64 {
        let next: Vec<f32> = PARAMS
            .iter()
            .map(|p| p + 0.01 * round as f32 * (p - 0.05))
            .collect();
        let difference: Vec<f32> = next.iter().zip(&held).map(|(n, h)| n - h).collect();
        core.handle(task(round, round)).expect("task");
        let frames = protocol::encode_weights_delta(Round(round), &difference, Compression::Int4);
        let answer = send(&mut core, frames).expect("a delta on the version held");
        assert!(!answer.is_empty(), "round {round} answered");
        let sent = delta::delta(&next, &held, Compression::Int4).expect("one layout");
        held = delta::settle(&delta::target(&held, &sent).expect("one layout"));
        let Ok(protocol::WorkerFrame::Gradient(g)) = protocol::decode_worker_frame(&answer[0])
        else {
            panic!("a gradient")
        };
        let mut got = Vec::new();
        g.decode_append(&mut got);
        let mut want = Vec::new();
        protocol::tensor::encode_payload(&mut want, &gradient_on(&held, round), Compression::Int4);
        assert_eq!(
            got,
            protocol::tensor::decode_payload(&want, 6, Compression::Int4),
            "round {round}"
        );
    }
    // Version 5 on 3: not the version held.
    core.handle(task(5, 5)).expect("task");
    let skip = protocol::encode_weights_delta(Round(5), &[0.0; 6], Compression::Int4);
    assert!(matches!(
        send(&mut core, skip),
        Err(WorkerError::Protocol(_))
    ));

    let mut plain = on(Compression::None);
    plain.handle(task(0, 0)).expect("task");
    assert!(plain.handle(weights(0)).expect("whole").is_some());
    plain.handle(task(1, 1)).expect("task");
    let delta = protocol::encode_weights_delta(Round(1), &[0.0; 6], Compression::Int4);
    assert!(matches!(
        send(&mut plain, delta),
        Err(WorkerError::Protocol(_))
    ));

    let mut mixed = on(Compression::Int8);
    mixed.handle(task(0, 0)).expect("task");
    let half = |round| Weights {
        round: Round(round),
        total: 6,
        offset: 0,
        params: vec![0.0; 3],
    };
    assert_eq!(
        mixed
            .handle(CoordinatorToWorker::WeightsDelta(half(0)))
            .expect("a first chunk"),
        None
    );
    assert!(mixed.handle(CoordinatorToWorker::Weights(half(0))).is_err());
}

#[test]
fn resume_token_is_sent_after_welcome_and_can_be_preset() {
    let core = core_with_shard();
    assert_eq!(core.resume_token(), Some("tok"));
    let fresh = WorkerCore::new(WorkerKind::Browser, None).with_resume_token(Some("abc".into()));
    let hello = protocol::decode_from_worker(&fresh.hello_frame()).expect("hello");
    assert!(
        matches!(hello, WorkerToCoordinator::Hello(h) if h.resume_token.as_deref() == Some("abc"))
    );
}

#[test]
fn without_a_shard_weights_are_not_answered_and_fatal_errors_stop() {
    let mut core = WorkerCore::new(WorkerKind::Native, None);
    assert!(matches!(
        core.handle(weights(0)),
        Err(WorkerError::Protocol(_))
    ));
    // Joined without a shard: the weights are not answered.
    let mut core = WorkerCore::new(WorkerKind::Native, None);
    core.handle(welcome("input 2; dense 2", None))
        .expect("welcome");
    core.handle(task(0, 0)).expect("task");
    assert_eq!(core.handle(weights(0)).expect("no shard yet"), None);
    let mut core = core_with_shard();
    let frame = encode_from_coordinator(&CoordinatorToWorker::Error {
        code: ErrorCode::Late,
        message: "late".into(),
    });
    assert!(core.handle_frame(&frame).expect("non-fatal").is_empty());
    assert!(core.stats().last_warning.is_some());
    let fatal = CoordinatorToWorker::Error {
        code: ErrorCode::Replaced,
        message: "x".into(),
    };
    assert!(matches!(
        core.handle(fatal),
        Err(WorkerError::Rejected { .. })
    ));
}

fn welcome(text: &str, fingerprint: Option<u64>) -> CoordinatorToWorker {
    let spec: NetSpec = text.parse().expect("valid");
    CoordinatorToWorker::Welcome(Welcome {
        worker_id: WorkerId(1),
        resume_token: "t".into(),
        model: ModelSpec {
            text: text.into(),
            fingerprint: fingerprint.unwrap_or_else(|| spec.fingerprint()),
        },
        batch_size: 2,
        compression: Compression::None,
    })
}

#[test]
fn a_model_whose_fingerprint_differs_is_refused() {
    let mut core = WorkerCore::new(WorkerKind::Native, None);
    let err = core
        .handle(welcome("input 2; dense 2", Some(7)))
        .expect_err("fingerprint");
    assert!(
        err.to_string()
            .contains("coordinator and worker versions differ"),
        "{err}"
    );
    assert!(core.handle(welcome("input 2; dense 2", None)).is_ok());
}

#[test]
fn f32_shards_are_normalised_and_frozen_layers_are_left_out_of_the_gradient() {
    let mut core = WorkerCore::new(WorkerKind::Native, None);
    core.handle(welcome("input 2; dense 3 frozen; relu; dense 2", None))
        .expect("welcome");
    core.handle(CoordinatorToWorker::Shard(Shard {
        first_index: 5,
        shape: [2, 1, 1],
        labels: vec![0, 1],
        values: ShardValues::F32(vec![10.0, -3.0, 12.0, 1.0]),
        mean: vec![11.0, -1.0],
        std: vec![1.0, 2.0],
    }))
    .expect("shard");
    let params: Vec<f32> = (0..17).map(|i| (i as f32 - 8.0) / 10.0).collect();
    let net = Network::new(
        "input 2; dense 3 frozen; relu; dense 2"
            .parse()
            .expect("ok"),
        2,
    )
    .expect("net");
    // The frozen part once, then the trained part in two chunks.
    let frozen = net.frozen_part(&params);
    let frozen = CoordinatorToWorker::Frozen {
        total: frozen.len() as u32,
        offset: 0,
        params: frozen,
    };
    assert_eq!(core.handle(frozen).expect("frozen"), None);
    core.handle(CoordinatorToWorker::Task(Task {
        local: None,
        round: Round(0),
        batch: 0,
    }))
    .expect("task");
    let trained = net.trained_part(&params);
    let chunk = |offset: usize, end: usize| {
        CoordinatorToWorker::Weights(Weights {
            round: Round(0),
            total: 8,
            offset: offset as u32,
            params: trained[offset..end].to_vec(),
        })
    };
    assert_eq!(core.handle(chunk(0, 5)).expect("first chunk"), None);
    assert!(
        core.handle(chunk(0, 5)).is_err(),
        "a chunk out of order is refused, and changes nothing"
    );
    let g = core
        .handle(chunk(5, 8))
        .expect("ok")
        .expect("gradient after the last chunk");
    // 2×3 + 3 frozen values are not sent: the last layer's 3×2 + 2.
    assert_eq!(g.grads.len(), 8);
    let data = Dataset::from_parts(
        Shape::flat(2),
        Values::F32(vec![10.0, -3.0, 12.0, 1.0]),
        vec![0, 1],
        Normalization::new(vec![11.0, -1.0], vec![1.0, 2.0]),
    )
    .expect("valid");
    let (x, _) = data.batch(0..2);
    assert_eq!(
        x.iter().copied().collect::<Vec<f32>>(),
        [-1.0, -1.0, 1.0, 1.0]
    );
    let (_, full) = net
        .loss_and_grad(&params, x.view(), &[0, 1], 0)
        .expect("ok");
    assert_eq!(g.grads, full[9..]);
}

/// A `Shard` that arrives mid-phase (the coordinator re-cut the shards for the next pull)
/// does not change the phase under way: the coordinator replays it on the shard of its pull,
/// so an honest worker's answer must come from that shard.
#[test]
fn a_shard_arriving_mid_phase_is_for_the_next_phase() {
    let phase_task = CoordinatorToWorker::Task(Task {
        round: Round(4),
        batch: 1,
        local: Some(protocol::LocalPhase {
            steps: 5,
            optimizer: model::OptimizerKind::Sgd { lr: 0.5 },
            segment: 0,
        }),
    });
    let run = |recut: bool| {
        let mut core = core_with_shard();
        core.handle(phase_task.clone()).expect("task");
        assert_eq!(core.handle(weights(4)).expect("weights"), None);
        let mut frames = Vec::new();
        for step in 0..5 {
            if recut && step == 2 {
                core.handle(CoordinatorToWorker::Shard(Shard {
                    first_index: 7,
                    shape: [2, 1, 1],
                    labels: vec![1, 1],
                    values: ShardValues::U8(vec![200, 100, 0, 255]),
                    mean: vec![0.0],
                    std: vec![255.0],
                }))
                .expect("shard");
            }
            assert!(core.working());
            frames = core.work().expect("a step");
        }
        assert!(!core.working());
        frames
    };
    let (steady, recut) = (run(false), run(true));
    assert!(!steady.is_empty());
    assert_eq!(steady, recut);
}

/// A shard of ten samples of two values, alternately labelled 0 and 1.
fn ten_samples() -> Shard {
    Shard {
        first_index: 0,
        shape: [2, 1, 1],
        labels: (0..10).map(|i| i % 2).collect(),
        values: ShardValues::U8((0..20).map(|v| v * 12).collect()),
        mean: vec![0.0],
        std: vec![255.0],
    }
}

/// A core whose transport computes (`Compute::Deferred`, a tab's Web Workers) answers what
/// a core computing on its own threads answers, byte for byte, plain gradients and local
/// phases alike; the answers say how many parts. An unordered one (a tab's GPU) computes a
/// batch at once and says 0, but for a local phase, which stays ordered (replayed exactly).
#[test]
fn a_deferred_job_answers_what_threads_answer() {
    let spec = "input 2; dense 3; relu; dense 2";
    let core = |compute| {
        joined(
            WorkerCore::new(WorkerKind::Native, None).with_compute(compute),
            spec,
            8,
            ten_samples(),
        )
    };
    let params: Vec<f32> = Network::new(spec.parse().expect("valid"), 2)
        .expect("net")
        .init(5);
    let weights = encode_from_coordinator(&CoordinatorToWorker::Weights(Weights::whole(
        Round(1),
        params,
    )));
    let phase = Some(protocol::LocalPhase {
        steps: 3,
        optimizer: model::OptimizerKind::Sgd { lr: 0.1 },
        segment: 0,
    });
    for local in [None, phase] {
        let task = encode_from_coordinator(&CoordinatorToWorker::Task(Task {
            round: Round(1),
            batch: 2,
            local,
        }));
        // The answer's frames, computing each batch as `compute` says, and how many
        // batches were left to the transport.
        let answer = |compute, parts| {
            let mut core = core(compute);
            assert!(core.handle_frame(&task).expect("task").is_empty());
            let (mut frames, mut jobs) = (core.handle_frame(&weights).expect("weights"), 0);
            while frames.is_empty() {
                assert!(core.working(), "an answer under way");
                frames = match core.job() {
                    Some(job) => {
                        assert_eq!(job.parts().len(), parts);
                        assert_eq!(
                            job.unordered(),
                            compute == Compute::Unordered && local.is_none()
                        );
                        let results = job.parts().into_iter().map(|p| job.part(p));
                        let (loss, grads) = model::add_parts(results).expect("adds");
                        drop(job);
                        jobs += 1;
                        core.complete(loss, grads).expect("completes")
                    }
                    None => core.work().expect("a step"),
                };
            }
            (frames, jobs)
        };
        let (threads, inline) = answer(Compute::Threads(2), 2);
        let (deferred, jobs) = answer(Compute::Deferred(2), 2);
        let steps = local.map_or(1, |l| l.steps);
        assert_eq!(
            (inline, jobs),
            (0, steps),
            "threads compute, a transport is asked"
        );
        assert_eq!(deferred, threads, "{local:?}");
        let Ok(WorkerToCoordinator::Gradient(chunk)) = protocol::decode_from_worker(&threads[0])
        else {
            panic!("a gradient");
        };
        assert_eq!(chunk.parts, 2);
        let (unordered, jobs) = answer(Compute::Unordered, 1);
        assert_eq!(jobs, steps, "the transport computes");
        let Ok(WorkerToCoordinator::Gradient(chunk)) = protocol::decode_from_worker(&unordered[0])
        else {
            panic!("a gradient");
        };
        assert_eq!(chunk.parts, if local.is_none() { 0 } else { 1 });
    }
}

/// A committed phase taken a segment at a time (a transport that keeps the weights and
/// AdamW on its device) answers, commits and reveals what the same steps taken one at a
/// time answer, byte for byte, when its device computes as the CPU does; its segments end
/// at the commitments (4 steps, then the phase's last 2); a state that does not fit is
/// refused and leaves the phase to the steps.
#[test]
fn a_segment_taken_whole_answers_what_its_steps_do() {
    use model::optim::OptimizerState;

    let spec = "input 2; dense 3; tanh; dense 2";
    let params: Vec<f32> = Network::new(spec.parse().expect("valid"), 2)
        .expect("net")
        .init(5);
    let task = encode_from_coordinator(&CoordinatorToWorker::Task(Task {
        round: Round(1),
        batch: 2,
        local: Some(protocol::LocalPhase {
            steps: 6,
            optimizer: model::OptimizerKind::AdamW {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay: 0.1,
            },
            segment: 4,
        }),
    }));
    let weights = encode_from_coordinator(&CoordinatorToWorker::Weights(Weights::whole(
        Round(1),
        params,
    )));
    let start = |core: &mut WorkerCore| {
        assert!(core.handle_frame(&task).expect("task").is_empty());
        assert!(core.handle_frame(&weights).expect("weights").is_empty());
    };
    let challenge = protocol::Challenge {
        round: Round(1),
        boundaries: vec![1, 2],
    };

    // One step at a time.
    let mut stepped = joined(
        WorkerCore::new(WorkerKind::Browser, None).with_compute(Compute::Unordered),
        spec,
        4,
        ten_samples(),
    );
    start(&mut stepped);
    let mut want = Vec::new();
    while want.is_empty() {
        want = match stepped.job() {
            Some(job) => {
                let (loss, grads) = job.run().expect("computes");
                drop(job);
                stepped.complete(loss, grads).expect("completes")
            }
            None => stepped.work().expect("a step"),
        };
    }

    // A segment at a time: the "device" takes AdamW's steps itself.
    let mut whole = joined(
        WorkerCore::new(WorkerKind::Browser, None).with_compute(Compute::Unordered),
        spec,
        4,
        ten_samples(),
    );
    start(&mut whole);
    let (mut got, mut lengths) = (Vec::new(), Vec::new());
    while got.is_empty() {
        assert!(whole.working());
        if whole.job().is_none() {
            got = whole.work().expect("a step");
            continue;
        }
        let segment = whole
            .segment()
            .expect("a committed phase offers its segment");
        lengths.push(segment.batches.len());
        let (step, state) = segment.start();
        let net = segment.net;
        let len = net.param_count();
        let mut optimizer = segment.optimizer.build_masked(len, segment.decayed.clone());
        let like = optimizer.state();
        optimizer
            .restore(OptimizerState::unflatten(&like, step, &state[len..]).expect("fits"))
            .expect("restores");
        let mut w = state[..len].to_vec();
        let mut losses = Vec::new();
        for (x, labels, seed) in &segment.batches {
            let (loss, grads) = net
                .loss_and_grad(&w, x.view(), labels, *seed)
                .expect("computes");
            optimizer.step(&mut w, &grads);
            losses.push(loss);
        }
        let mut end = w;
        optimizer.state().flatten_into(&mut end);
        drop(segment);
        // A state one value short is refused; the phase is as it was.
        assert!(whole.complete_segment(&losses, &end[1..]).is_err());
        assert!(whole.complete_segment(&losses[1..], &end).is_err());
        got = whole.complete_segment(&losses, &end).expect("adopts");
    }
    assert_eq!(lengths, [4, 2], "segments end at the commitments");
    assert!(matches!(
        protocol::decode_from_worker(&got[0]),
        Ok(WorkerToCoordinator::Commitments(_))
    ));
    assert_eq!(got, want);
    assert_eq!(whole.reveal(&challenge), stepped.reveal(&challenge));
    assert_eq!(whole.stats().local_steps, 6);
    assert!(!whole.working());
}

use protocol::{encode_from_coordinator, ModelSpec};

use super::*;

fn core_with_shard() -> WorkerCore {
    let mut core = WorkerCore::new(WorkerKind::Native, None);
    core.handle(CoordinatorToWorker::Welcome(Welcome {
        worker_id: WorkerId(3),
        resume_token: "tok".into(),
        model: {
            let spec: NetSpec = "input 2; dense 2".parse().expect("valid");
            ModelSpec {
                text: spec.to_string(),
                fingerprint: spec.fingerprint(),
            }
        },
        batch_size: 1,
        compression: Compression::None,
    }))
    .expect("welcome");
    core.handle(CoordinatorToWorker::Shard(Shard {
        first_index: 0,
        shape: [2, 1, 1],
        labels: vec![0, 1, 0],
        values: ShardValues::U8(vec![10, 20, 30, 40, 50, 60]),
        mean: vec![0.0],
        std: vec![255.0],
    }))
    .expect("shard");
    core
}

fn weights(round: u64) -> CoordinatorToWorker {
    CoordinatorToWorker::Weights(Weights::whole(
        Round(round),
        vec![0.1, -0.2, 0.3, 0.4, 0.0, 0.0],
    ))
}

#[test]
fn batch_index_is_the_round_and_never_repeats() {
    let mut core = core_with_shard();
    let g0 = core.handle(weights(0)).expect("ok").expect("gradient");
    // The same version again (async: the buffer did not apply yet): the next batch.
    let g0_again = core.handle(weights(0)).expect("ok").expect("gradient");
    assert_ne!(g0.grads, g0_again.grads);
    assert_eq!(core.last_batch, Some(1));
    // Rounds ahead of the index win: synchronous workers use the round itself.
    core.handle(weights(7)).expect("ok");
    assert_eq!(core.last_batch, Some(7));
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

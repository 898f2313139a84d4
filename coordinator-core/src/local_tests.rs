//! Local steps end to end in process: the real coordinator and a real worker core, every
//! frame through the codec and the session's chunk checks.

use std::time::Instant;

use model::{batch_positions, batch_seed, Network, Optimizer, OptimizerKind, Sgd};
use protocol::{decode_worker_frame, Hello, WorkerFrame, WorkerKind};
use worker_core::WorkerCore;

use crate::aggregate::{AggregatorKind, Rule};
use crate::upload::{Progress, Upload};
use crate::*;

/// Moves frames both ways until neither side has anything left to say.
fn exchange(c: &mut Coordinator, w: &mut WorkerCore, joined: &Joined, now: Instant) {
    let mut upload = Upload::default();
    loop {
        let mut replies = Vec::new();
        while let Some(output) = c.poll_output() {
            match output {
                Output::Send { message, .. } => {
                    for frame in message.frames() {
                        replies.extend(w.handle_frame(frame).expect("an honest core"));
                    }
                }
                Output::Recompute(job) => c.recomputed(job.run(), now),
                _ => {}
            }
        }
        while w.working() {
            replies.extend(w.work().expect("an honest core"));
        }
        if replies.is_empty() {
            return;
        }
        for frame in replies {
            let Ok(WorkerFrame::Gradient(chunk)) = decode_worker_frame(&frame) else {
                panic!("a worker core sends gradient chunks")
            };
            if let Progress::Done(g, norm) = upload.take(&chunk, joined).expect("valid") {
                c.gradient(joined.worker, joined.session, &g, norm, now);
            }
        }
    }
}

/// One worker, a phase of H steps of SGD, the outer optimizer SGD at lr 1: the coordinator's
/// new weights are H steps of plain SGD on the same batches in one process. Exactly, but for
/// the rounding of `θ − (θ − θ_H)`: at most one unit in the last place of the larger.
#[test]
fn one_worker_h_local_steps_under_outer_sgd_at_1_are_h_steps_of_sgd() {
    const H: u32 = 7;
    let data = crate::data::digits(3);
    let train = data.train.clone();
    let net = Network::new(model::NetSpec::mlp(train.shape(), &[16], 10), 10).expect("model");
    let settings = Settings {
        optimizer: OptimizerKind::Sgd { lr: 1.0 },
        local: Some(Local {
            steps: LocalSteps::Fixed(H),
            inner: OptimizerKind::Sgd { lr: 0.05 },
            segment: 0,
        }),
        aggregator: AggregatorKind {
            rule: Rule::Mean,
            ..AggregatorKind::default()
        },
        verify_fraction: 1.0,
        max_grad_norm: Some(1e30),
        audit_seed: Some(1),
        max_rounds: Some(1),
        ..Settings::default()
    };
    let now = Instant::now();
    let mut c = Coordinator::new(settings, net.clone(), data, now).expect("model");
    let start = c.trainer.params().to_vec();
    let mut w = WorkerCore::new(WorkerKind::Native, None);
    let hello = Hello {
        kind: Some(WorkerKind::Native),
        ..Hello::default()
    };
    let joined = c
        .join(&hello, std::net::Ipv4Addr::LOCALHOST.into(), now)
        .expect("admitted");
    exchange(&mut c, &mut w, &joined, now);
    assert_eq!(c.trainer.version(), 1, "one round, then the run stops");
    assert_eq!(w.stats().local_steps, u64::from(H));
    let counters = c.metrics.counters();
    assert_eq!(
        (
            counters.gradients_verified,
            counters.verification_mismatches
        ),
        (1, 0),
        "the phase was replayed and matched"
    );

    // The same H steps by hand: the whole train split is the one worker's shard, and the
    // first pull's first batch is 0.
    let mut plain = start.clone();
    let mut sgd = Sgd { lr: 0.05 };
    for b in 0..u64::from(H) {
        let (x, labels) = train.batch(batch_positions(train.len(), b, 32));
        let (_, g) = net
            .loss_and_grad(&plain, x.view(), &labels, batch_seed(b, 0))
            .expect("grad");
        sgd.step(&mut plain, &g);
    }
    let mut moved = 0;
    for ((got, want), was) in c.trainer.params().iter().zip(&plain).zip(&start) {
        let ulp = f32::EPSILON * was.abs().max(want.abs());
        assert!(
            (got - want).abs() <= ulp,
            "{got} against {want} (from {was})"
        );
        moved += usize::from(want != was);
    }
    assert!(moved > start.len() / 2, "the phase trained: {moved} moved");
}

/// A run with local phases of Nesterov stopped at round 2 and resumed from its snapshot in a
/// new coordinator, the worker coming back with its token, gives round 3 bit for bit as the
/// run that never stopped: the outer optimizer's velocity and the batch rule survive. (A
/// fixed norm bound: the adaptive one's warm-up reference is taken again at the weights a
/// run resumes from, by design.)
#[test]
fn a_resumed_run_with_local_steps_continues_bit_for_bit() {
    let data = crate::data::digits(5);
    let net = Network::new(model::NetSpec::mlp(data.train.shape(), &[16], 10), 10).expect("model");
    let settings = |rounds| Settings {
        optimizer: OptimizerKind::Nesterov {
            lr: 0.7,
            momentum: 0.9,
        },
        local: Some(Local {
            steps: LocalSteps::Fixed(6),
            inner: OptimizerKind::Sgd { lr: 0.05 },
            segment: 0,
        }),
        verify_fraction: 1.0,
        audit_seed: Some(2),
        max_grad_norm: Some(1e30),
        max_rounds: Some(rounds),
        ..Settings::default()
    };
    let now = Instant::now();
    let hello = |w: &WorkerCore| match protocol::decode_from_worker(&w.hello_frame()) {
        Ok(protocol::WorkerToCoordinator::Hello(h)) => h,
        other => panic!("a Hello: {other:?}"),
    };
    let peer = std::net::Ipv4Addr::LOCALHOST.into();
    let run = |c: &mut Coordinator, w: &mut WorkerCore| {
        let joined = c.join(&hello(w), peer, now).expect("admitted");
        exchange(c, w, &joined, now);
    };

    let mut whole = Coordinator::new(settings(3), net.clone(), data.clone(), now).expect("model");
    run(&mut whole, &mut WorkerCore::new(WorkerKind::Native, None));
    assert_eq!(whole.trainer.version(), 3);

    let mut first = Coordinator::new(settings(2), net.clone(), data.clone(), now).expect("model");
    let mut w = WorkerCore::new(WorkerKind::Native, None);
    run(&mut first, &mut w);
    assert_eq!(first.trainer.version(), 2);
    let saved = first.snapshot();
    let mut resumed = Coordinator::new(settings(3), net, data, now).expect("model");
    resumed.restore(saved, now).expect("fits");
    run(&mut resumed, &mut w);
    assert_eq!(resumed.trainer.version(), 3);
    let differing = resumed
        .trainer
        .params()
        .iter()
        .zip(whole.trainer.params())
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differing, 0,
        "values that differ from the run that never stopped"
    );
    assert_eq!(resumed.metrics.counters().verification_mismatches, 0);
}

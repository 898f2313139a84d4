//! Inputs shared by `build.rs` (which runs natively on the build machine) and the tests
//! (which run in the browser): the same weights, the same batch, the same messages. The build
//! script writes the native results to `OUT_DIR`; the wasm tests compare against them.

#![allow(dead_code)]

use model::{Dataset, Mlp, SplitMix64};
use protocol::{
    Compression, CoordinatorToWorker, ErrorCode, Gradient, Hello, ModelSpec, Round, Shard, Weights,
    Welcome, WorkerId, WorkerKind, WorkerToCoordinator,
};

/// The default model.
pub const LAYERS: [usize; 3] = [784, 128, 10];
pub const SEED: u64 = 2026;
pub const BATCH: usize = 32;

/// The default model's initial weights and a batch of MNIST-shaped samples.
pub fn inputs() -> (Mlp, Vec<f32>, Dataset) {
    let mlp = Mlp::new(&LAYERS).expect("valid layers");
    let params: Vec<f32> = mlp.init(SEED);
    let mut rng = SplitMix64::new(SEED);
    let pixels = (0..BATCH * LAYERS[0])
        .map(|_| rng.below(256) as u8)
        .collect();
    let labels = (0..BATCH).map(|_| rng.below(10) as u8).collect();
    let data = Dataset::new(LAYERS[0], pixels, labels).expect("consistent");
    (mlp, params, data)
}

/// Mean loss and gradient of the batch, as this build computes it.
pub fn gradient() -> (f32, Vec<f32>) {
    let (mlp, params, data) = inputs();
    let (x, labels) = data.batch(0..BATCH);
    mlp.loss_and_grad(&params, x.view(), &labels)
        .expect("valid shapes")
}

/// `loss` then every gradient value, little-endian.
pub fn gradient_bytes(loss: f32, grads: &[f32]) -> Vec<u8> {
    std::iter::once(loss)
        .chain(grads.iter().copied())
        .flat_map(f32::to_le_bytes)
        .collect()
}

pub fn worker_messages() -> Vec<WorkerToCoordinator> {
    vec![
        WorkerToCoordinator::Hello(Hello {
            kind: Some(WorkerKind::Browser),
            join_token: Some("t\u{f6}ken".into()),
            resume_token: None,
            compression: Compression::F16,
        }),
        WorkerToCoordinator::Gradient(Gradient {
            round: Round(77),
            samples: 31,
            loss: 0.125,
            grads: vec![1.5, -0.0, 3.25e-9, f32::MAX],
        }),
    ]
}

pub fn coordinator_messages() -> Vec<CoordinatorToWorker> {
    vec![
        CoordinatorToWorker::Welcome(Welcome {
            worker_id: WorkerId(12),
            resume_token: "0123abcd".into(),
            model: ModelSpec {
                layers: vec![784, 128, 10],
            },
            batch_size: 32,
            compression: Compression::Int8,
        }),
        CoordinatorToWorker::Shard(Shard {
            first_index: 2000,
            features: 2,
            labels: vec![3, 7],
            pixels: vec![0, 255, 17, 42],
        }),
        CoordinatorToWorker::Weights(Weights {
            round: Round(u64::MAX),
            params: vec![0.5, -2.0, 1e-30],
        }),
        CoordinatorToWorker::Error {
            code: ErrorCode::RoundNotOpen,
            message: "round 3 is not open".into(),
        },
    ]
}

/// Frames as `u32` length + bytes, concatenated.
pub fn pack(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

pub fn unpack(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    while bytes.len() >= 4 {
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        frames.push(bytes[4..4 + len].to_vec());
        bytes = &bytes[4 + len..];
    }
    frames
}

//! Inputs shared by `build.rs` (which runs natively on the build machine) and the tests
//! (which run in the browser): the same weights, the same batch, the same messages. The build
//! script writes the native results to `OUT_DIR`; the wasm tests compare against them.

#![allow(dead_code)]

use model::{
    batch_positions, batch_seed, Dataset, LocalPhase, NetSpec, Network, Normalization,
    OptimizerKind, Shape, SplitMix64, Values,
};
use protocol::{
    Compression, CoordinatorToWorker, ErrorCode, GradientChunk, Hello, ModelSpec, Round, Shard,
    ShardValues, Task, Weights, Welcome, WorkerId, WorkerKind, WorkerToCoordinator,
};

pub const SEED: u64 = 2026;
pub const BATCH: usize = 32;
/// The presets, by name, as `--model` takes them.
pub const PRESETS: [&str; 2] = ["mlp", "cnn"];

/// A preset's spec for MNIST-shaped data.
pub fn spec(preset: &str) -> NetSpec {
    let input = Shape::new(1, 28, 28);
    match preset {
        "cnn" => NetSpec::cnn(input, 10),
        _ => NetSpec::mlp(input, &[128], 10),
    }
}

/// A preset's initial weights and a batch of MNIST-shaped samples.
pub fn inputs(preset: &str) -> (Network, Vec<f32>, Dataset) {
    let net = Network::new(spec(preset), 10).expect("valid spec");
    let params: Vec<f32> = net.init(SEED);
    let mut rng = SplitMix64::new(SEED);
    let pixels = (0..BATCH * 784).map(|_| rng.below(256) as u8).collect();
    let labels = (0..BATCH).map(|_| rng.below(10) as u8).collect();
    let data = Dataset::from_parts(
        Shape::new(1, 28, 28),
        Values::U8(pixels),
        labels,
        Normalization::unit_bytes(),
    )
    .expect("consistent");
    (net, params, data)
}

/// Mean loss and gradient of the batch, as this build computes it (the batch of round 0
/// of a shard starting at sample 0, as a worker computes it).
pub fn gradient(preset: &str) -> (f32, Vec<f32>) {
    let (net, params, data) = inputs(preset);
    let (x, labels) = data.batch(0..BATCH);
    net.loss_and_grad(&params, x.view(), &labels, batch_seed(0, 0))
        .expect("valid shapes")
}

/// A small GPT (2 blocks, 2 heads, width 32, context 16, 40 tokens), its initial weights,
/// and a batch of 8 random windows: every operation a GPT adds (embeddings, LayerNorm's
/// square root, the causal softmax's `exp`, GELU's `tanh`, cross-entropy over positions).
pub fn gpt_inputs() -> (Network, Vec<f32>, Dataset) {
    let spec = model::gpt::GptSpec {
        vocab: 40,
        context: 16,
        layers: 2,
        heads: 2,
        width: 32,
    };
    let net = Network::new(NetSpec::gpt(spec), 40).expect("valid spec");
    let params: Vec<f32> = net.init(SEED);
    let mut rng = SplitMix64::new(SEED ^ 0x6E7);
    let ids = (0..8 * 17).map(|_| rng.below(40) as u8).collect();
    let data = Dataset::from_parts(
        Shape::flat(17),
        Values::U8(ids),
        vec![0; 8],
        Normalization::new(vec![0.0], vec![1.0]),
    )
    .expect("consistent");
    (net, params, data)
}

/// Matrix products as `model`'s layers take them (`C ← alpha · A · B + beta · C`), in this
/// build's order: `(m, k, n, A transposed, B transposed, alpha, beta)`. In wasm the first
/// four take the unfused tile (`model::gemm::tab_takes_tile`; part-filled tiles, two blocks
/// of `k`, transposed operands, an accumulating `beta`), the last two matrixmultiply's
/// kernel.
pub const PRODUCTS: [(usize, usize, usize, bool, bool, f32, f32); 6] = [
    (128, 64, 64, false, false, 1.0, 0.0),
    (131, 300, 67, false, true, 1.0, 1.0),
    (130, 96, 70, true, false, 1.0, 0.0),
    (200, 520, 129, true, true, 0.125, 0.0),
    (64, 32, 64, false, true, 0.125, 0.0),
    (32, 784, 128, false, false, 1.0, 1.0),
];

/// [`PRODUCTS`] of pseudo-random operands, their results one after another.
pub fn products() -> Vec<f32> {
    let mut rng = SplitMix64::new(SEED ^ 0x9E3);
    let mut random = |rows: usize, cols: usize| {
        ndarray::Array2::from_shape_fn((rows, cols), |_| (rng.next_f64() * 2.0 - 1.0) as f32)
    };
    let mut out = Vec::new();
    for (m, k, n, a_t, b_t, alpha, beta) in PRODUCTS {
        let a = if a_t { random(k, m) } else { random(m, k) };
        let b = if b_t { random(n, k) } else { random(k, n) };
        let mut c = random(m, n);
        let (a, b) = (
            if a_t { a.t() } else { a.view() },
            if b_t { b.t() } else { b.view() },
        );
        model::gemm::gemm(alpha, &a, &b, beta, &mut c.view_mut());
        out.extend(c.iter());
    }
    out
}

/// The GPT's mean loss and gradient on its batch, as this build computes it.
pub fn gpt_gradient() -> (f32, Vec<f32>) {
    let (net, params, data) = gpt_inputs();
    let (x, labels) = data.batch(0..8);
    net.loss_and_grad(&params, x.view(), &labels, batch_seed(0, 0))
        .expect("valid shapes")
}

/// The parts of the reference gradient computed as a tab with that many cores does.
pub const PARTS: usize = 3;

/// The same gradient in [`PARTS`] parts added in order (`model::Part`).
pub fn gradient_in_parts(preset: &str) -> (f32, Vec<f32>) {
    let (net, params, data) = inputs(preset);
    let (x, labels) = data.batch(0..BATCH);
    net.loss_and_grad_parts(&params, x.view(), &labels, batch_seed(0, 0), PARTS)
        .expect("valid shapes")
}

/// A GPT's inner optimizer (the coordinator's default for one): AdamW 1e-3.
pub const GPT_ADAMW: OptimizerKind = OptimizerKind::AdamW {
    lr: 1e-3,
    beta1: 0.9,
    beta2: 0.99,
    eps: 1e-8,
    weight_decay: 0.1,
};

/// Steps of the reference local phases.
pub const PHASE_STEPS: u32 = 16;

/// The reference local phases: (preset, inner optimizer's name, the optimizer).
pub fn phases() -> [(&'static str, &'static str, OptimizerKind); 3] {
    let adam = OptimizerKind::Adam {
        lr: 0.001,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    [
        ("mlp", "sgd", OptimizerKind::Sgd { lr: 0.1 }),
        ("mlp", "adam", adam),
        ("cnn", "sgd", OptimizerKind::Sgd { lr: 0.05 }),
    ]
}

/// A local phase of [`PHASE_STEPS`] steps from the preset's weights on batches 0, 1, ... of
/// the fixture's samples, as a worker takes it: its pseudo-gradient.
pub fn local_phase(preset: &str, optimizer: OptimizerKind) -> Vec<f32> {
    let (net, params, data) = inputs(preset);
    let mut phase = LocalPhase::new(&net, &params, optimizer, PHASE_STEPS);
    for k in 0..u64::from(PHASE_STEPS) {
        let (x, labels) = data.batch(batch_positions(data.len(), k, BATCH));
        phase
            .step(&net, x.view(), &labels, batch_seed(k, 0))
            .expect("valid shapes");
    }
    phase.finish().delta
}

/// `Welcome.model` for a spec.
pub fn model_spec(spec: &NetSpec) -> ModelSpec {
    ModelSpec {
        text: spec.to_string(),
        fingerprint: spec.fingerprint(),
    }
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
            fused: true,
        }),
        WorkerToCoordinator::Gradient(GradientChunk {
            compute_us: 0,
            parts: 1,
            round: Round(77),
            samples: 31,
            loss: 0.125,
            total: 16_388,
            offset: 16_384,
            grads: vec![1.5, -0.0, 3.25e-9, f32::MAX],
        }),
    ]
}

pub fn coordinator_messages() -> Vec<CoordinatorToWorker> {
    vec![
        CoordinatorToWorker::Welcome(Welcome {
            worker_id: WorkerId(12),
            resume_token: "0123abcd".into(),
            model: model_spec(&spec("mlp")),
            batch_size: 32,
            compression: Compression::Int8,
        }),
        CoordinatorToWorker::Shard(Shard {
            first_index: 2000,
            shape: [2, 1, 1],
            labels: vec![3, 7],
            values: ShardValues::U8(vec![0, 255, 17, 42]),
            mean: vec![0.0],
            std: vec![255.0],
        }),
        CoordinatorToWorker::Shard(Shard {
            first_index: 3,
            shape: [1, 1, 3],
            labels: vec![1],
            values: ShardValues::F32(vec![0.25, -7.5, 1e20]),
            mean: vec![0.5, 0.0, 1.0],
            std: vec![2.0, 1.0, 3.0],
        }),
        CoordinatorToWorker::Frozen {
            total: 2,
            offset: 0,
            params: vec![1.5, -0.25],
        },
        CoordinatorToWorker::Task(Task {
            local: None,
            round: Round(u64::MAX),
            batch: u64::MAX - 1,
        }),
        CoordinatorToWorker::Weights(Weights {
            round: Round(u64::MAX),
            total: 40_000,
            offset: 32_768,
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

/// An answer as each compression sends it: one `Gradient` of heavy-tailed values over many
/// magnitudes (with exact ties of int8's, int4's and int2's steps, zeros and a partial last
/// chunk), encoded in f16, int8, int4 and int2. The coordinator replays a tab's phase and encodes it
/// natively, bit for bit; so the tab must encode it to the same bytes.
pub fn compressed_answers() -> Vec<Vec<u8>> {
    let mut rng = SplitMix64::new(SEED);
    let mut grads: Vec<f32> = (0..2 * 16_384 + 100)
        .map(|i| {
            let u = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            u * u * u * 2f32.powi(i % 30 - 20)
        })
        .collect();
    // A chunk of int4 ties (scale 1: 7 is its largest) and one of int8's.
    for (k, v) in grads[..64].iter_mut().enumerate() {
        *v = [7.0, -0.0, 0.5, -2.5, 6.5][k % 5];
    }
    for (k, v) in grads[256..512].iter_mut().enumerate() {
        *v = if k == 0 {
            127.0
        } else {
            (k % 254) as f32 - 126.5
        };
    }
    // A chunk of int2's ties (its largest 1, half of it either way).
    for (k, v) in grads[512..576].iter_mut().enumerate() {
        *v = [1.0, 0.5, -0.5, 0.25, -0.0, 0.5f32.next_up()][k % 6];
    }
    [
        Compression::F16,
        Compression::Int8,
        Compression::Int4,
        Compression::Int2,
    ]
    .into_iter()
    .flat_map(|c| {
        let answer = protocol::Gradient {
            round: Round(9),
            samples: 12,
            loss: 2.5,
            compute_us: 1234,
            parts: 1,
            grads: grads.clone(),
        };
        protocol::encode_gradient(&answer, c)
    })
    .collect()
}

/// A GPT of `spec` (65 tokens, as the embedded Shakespeare's characters) and `batch` random
/// windows of `context + 1` ids.
pub fn gpt(spec: model::gpt::GptSpec, batch: usize) -> (Network, Vec<f32>, Dataset) {
    let net = Network::new(NetSpec::gpt(spec), spec.vocab).expect("valid spec");
    let params: Vec<f32> = net.init(1);
    let mut rng = SplitMix64::new(1);
    let width = spec.context + 1;
    let ids = (0..batch * width)
        .map(|_| rng.below(spec.vocab) as u8)
        .collect();
    let data = Dataset::from_parts(
        Shape::flat(width),
        model::Values::U8(ids),
        vec![0; batch],
        Normalization::new(vec![0.0], vec![1.0]),
    )
    .expect("consistent");
    (net, params, data)
}

//! Runs in headless Chromium (`wasm-pack test --headless --chrome`): the wasm build of the
//! shared core against the native build's results, which `build.rs` computed on the host.

#![cfg(target_arch = "wasm32")]

#[path = "../src/fixture.rs"]
mod fixture;

use protocol::{
    decode_from_coordinator, decode_from_worker, encode_from_coordinator, encode_from_worker,
    CoordinatorToWorker, Shard, ShardValues, WorkerKind,
};
use wasm_bindgen_test::*;
use worker_core::WorkerCore;

wasm_bindgen_test_configure!(run_in_browser);

static NATIVE_MLP: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/native_gradient_mlp.bin"));
static NATIVE_CNN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/native_gradient_cnn.bin"));

/// The native reference `NAME` in the order this tab computes in: `NAME_unfused.bin`, or
/// `NAME_fused.bin` in a build with relaxed SIMD on a CPU whose multiply-add fuses
/// (`model::gemm::relaxed_fuses`, what the tab's `Hello` says). `build.rs` writes both.
macro_rules! in_tab_order {
    ($name:literal) => {
        if model::gemm::relaxed_fuses() {
            &include_bytes!(concat!(env!("OUT_DIR"), "/", $name, "_fused.bin"))[..]
        } else {
            &include_bytes!(concat!(env!("OUT_DIR"), "/", $name, "_unfused.bin"))[..]
        }
    };
}

/// The tab's order, for messages.
fn tab_order() -> &'static str {
    if model::gemm::relaxed_fuses() {
        "fused (relaxed SIMD)"
    } else {
        "unfused"
    }
}
static NATIVE_WORKER_FRAMES: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/native_worker_frames.bin"));
static NATIVE_COORDINATOR_FRAMES: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/native_coordinator_frames.bin"));
static NATIVE_COMPRESSED_ANSWERS: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/native_compressed_answers.bin"));

/// A tab on three cores: each part computed by its own `PartWorker` (what each helper Web
/// Worker runs), added in order as the training Web Worker adds them, equals the native
/// gradient in three parts computed in the tab's order, bit for bit: the coordinator replays
/// it exactly.
#[wasm_bindgen_test]
fn parts_computed_by_part_workers_equal_the_native_parts_bit_for_bit() {
    let parts = [
        ("mlp", in_tab_order!("native_gradient_mlp_parts")),
        ("cnn", in_tab_order!("native_gradient_cnn_parts")),
    ];
    for (preset, native) in parts {
        let (net, params, data) = fixture::inputs(preset);
        let (x, labels) = data.batch(0..fixture::BATCH);
        let spec = net.spec().to_string();
        let seed = model::batch_seed(0, 0);
        let results = model::Part::split(fixture::BATCH, fixture::PARTS)
            .into_iter()
            .map(|part| {
                let mut core = worker_wasm::PartWorker::new(&spec).expect("the spec builds");
                let rows = x.slice(ndarray::s![part.rows(), ..]).to_owned();
                let loss = core
                    .compute(
                        &params,
                        rows.as_slice().expect("row-major"),
                        &labels[part.rows()],
                        seed,
                        part.start as u32,
                        part.end as u32,
                        part.batch as u32,
                    )
                    .expect("computes");
                Ok((loss, core.gradient().to_vec()))
            });
        let (loss, grads) = model::add_parts(results).expect("adds");
        let ours = fixture::gradient_bytes(loss, &grads);
        assert!(
            ours == native,
            "{preset}: {} parts from part workers must equal the native parts, bit for bit",
            fixture::PARTS
        );
        // Within rounding of the batch computed at once: the sums over samples in another
        // order (measured: 6.0e-8 for `mlp`, 1.8e-7 for `cnn`, of gradients up to ~0.1).
        let (_, whole) = fixture::gradient(preset);
        let off = grads
            .iter()
            .zip(&whole)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let largest = whole.iter().fold(0f32, |m, g| m.max(g.abs()));
        assert!(
            off <= 1e-5 * largest.max(1.0),
            "{preset}: {off} from the whole batch's"
        );
        console_log!(
            "{preset}: {} parts from part workers == native parts {}: BITWISE identical; \
             largest difference from the batch at once {off:e}",
            fixture::PARTS,
            tab_order()
        );
    }
}

/// A tab's matrix products equal the native ones computed in its order, bit for bit,
/// whichever kernel a tab takes for the shape: the tile for large products, matrixmultiply's
/// for small ones (`model::gemm::tab_takes_tile`).
#[wasm_bindgen_test]
fn wasm_products_equal_the_native_in_the_tabs_order_bit_for_bit_in_both_kernels() {
    let tiled = fixture::PRODUCTS
        .iter()
        .filter(|(m, k, n, ..)| model::gemm::tab_takes_tile(*m, *k, *n))
        .count();
    assert!(
        tiled > 0 && tiled < fixture::PRODUCTS.len(),
        "the products take both kernels ({tiled} of {} the tile)",
        fixture::PRODUCTS.len()
    );
    let wasm = fixture::gradient_bytes(0.0, &fixture::products());
    let native = in_tab_order!("native_products");
    assert_eq!(wasm.len(), native.len(), "same shapes");
    assert_eq!(
        differing(&wasm, native),
        0,
        "product values differing from the native ones, {}",
        tab_order()
    );
    console_log!(
        "{} products ({tiled} on the tile), {} values: BITWISE identical to native {}",
        fixture::PRODUCTS.len(),
        wasm.len() / 4 - 1,
        tab_order()
    );
}

/// A GPT's gradient in wasm equals the native one computed in the tab's order, bit for bit: the
/// embeddings, LayerNorm's square root, the causal softmax's `exp`, GELU's `tanh` and the
/// cross-entropy are the same portable functions on both sides, so the coordinator replays a
/// tab's GPT exactly.
#[wasm_bindgen_test]
fn wasm_gpt_gradient_equals_the_native_in_the_tabs_order_bit_for_bit() {
    let (loss, grads) = fixture::gpt_gradient();
    let wasm = fixture::gradient_bytes(loss, &grads);
    let native = in_tab_order!("native_gradient_gpt");
    assert_eq!(wasm.len(), native.len(), "same parameter count");
    assert_eq!(
        differing(&wasm, native),
        0,
        "gpt: values differing from the native gradient, {}",
        tab_order()
    );
    console_log!(
        "gpt: {} gradient values and the loss {loss}: BITWISE identical to native {}",
        grads.len(),
        tab_order()
    );
    // V8 first runs a module in its baseline compiler and optimises hot functions later:
    // both must round alike (a relaxed multiply-add fuses in both or in neither), so the
    // same gradient, once those functions are hot, has the same bits.
    for _ in 0..30 {
        let (again, grads) = fixture::gpt_gradient();
        assert_eq!(
            fixture::gradient_bytes(again, &grads),
            wasm,
            "gpt: the gradient moved once V8 optimised it"
        );
    }
}

/// How many of the floats in `a` and `b` differ in any bit.
fn differing(a: &[u8], b: &[u8]) -> usize {
    floats(a)
        .iter()
        .zip(floats(b))
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[wasm_bindgen_test]
fn wasm_gradient_equals_the_native_gradient_mlp() {
    compare_with_native("mlp", NATIVE_MLP, in_tab_order!("native_gradient_mlp"));
}

#[wasm_bindgen_test]
fn wasm_gradient_equals_the_native_gradient_cnn() {
    compare_with_native("cnn", NATIVE_CNN, in_tab_order!("native_gradient_cnn"));
}

/// Bit for bit against the native gradient in the tab's order (`model::Order::Unfused`, or
/// `Fused` where its relaxed SIMD fuses: what the coordinator replays a tab's work in);
/// within rounding of the native library's order.
fn compare_with_native(preset: &str, native: &[u8], tab: &[u8]) {
    let (loss, grads) = fixture::gradient(preset);
    let wasm = fixture::gradient_bytes(loss, &grads);
    assert_eq!(wasm.len(), native.len(), "same parameter count");
    assert!(
        wasm == tab,
        "{preset}: the wasm gradient must equal the native one computed {}, bit for bit",
        tab_order()
    );
    console_log!(
        "{preset}: wasm gradient == native gradient {}: BITWISE identical",
        tab_order()
    );
    if wasm == native {
        console_log!(
            "{preset}: wasm gradient == native gradient: BITWISE identical ({} values)",
            grads.len() + 1
        );
        return;
    }
    // Native x86_64 runs matrixmultiply's AVX2+FMA kernel (one rounding per multiply-add);
    // wasm32 runs its simd128 kernel, which has no FMA.
    let native = floats(native);
    let wasm = floats(&wasm);
    let (mut max_diff, mut differing) = (0.0f32, 0);
    for (a, b) in wasm.iter().zip(&native) {
        if a.to_bits() != b.to_bits() {
            differing += 1;
            max_diff = max_diff.max((a - b).abs());
        }
    }
    console_log!(
        "{preset}: wasm gradient vs native: NOT bitwise; {differing} of {} values differ, max abs diff {max_diff:e}",
        native.len()
    );
    assert!(max_diff < 1e-6, "max abs diff {max_diff}");
}

static NATIVE_PHASES: [&[u8]; 3] = [
    include_bytes!(concat!(env!("OUT_DIR"), "/native_phase_mlp_sgd.bin")),
    include_bytes!(concat!(env!("OUT_DIR"), "/native_phase_mlp_adam.bin")),
    include_bytes!(concat!(env!("OUT_DIR"), "/native_phase_cnn_sgd.bin")),
];

/// A local phase of 16 steps in the browser against the same phase computed natively:
/// bitwise equal to the native phase computed in the tab's order; against the library's
/// order (FMA), how far the rounding drifts after 16 steps, and within the coordinator's recomputation tolerance
/// (1e-6 + 1e-4·|value| per value, up to 0.5 % of the values outside it as long as their
/// excess is at most 5 % of the norm: `coordinator-core`'s `checks/verify.rs`).
#[wasm_bindgen_test]
fn a_local_phase_in_wasm_is_the_native_phase_within_the_verification_tolerance() {
    let in_tab_order = [
        in_tab_order!("native_phase_mlp_sgd"),
        in_tab_order!("native_phase_mlp_adam"),
        in_tab_order!("native_phase_cnn_sgd"),
    ];
    let references = NATIVE_PHASES.into_iter().zip(in_tab_order);
    for ((preset, name, optimizer), (native, tab)) in fixture::phases().into_iter().zip(references)
    {
        let wasm = fixture::gradient_bytes(0.0, &fixture::local_phase(preset, optimizer));
        assert_eq!(wasm.len(), native.len());
        assert!(
            wasm == tab,
            "{preset} {name}: the wasm phase must equal the native one computed {}, bit for bit",
            tab_order()
        );
        if wasm == native {
            console_log!("{preset} {name}: a 16-step phase in wasm == native: BITWISE identical");
            continue;
        }
        let (wasm, native) = (floats(&wasm), floats(native));
        let (mut max_diff, mut max_rel, mut differing, mut outside) = (0.0f32, 0.0f32, 0, 0);
        let (mut excess_sq, mut norm_sq) = (0.0f64, 0.0f64);
        for (&a, &e) in wasm.iter().zip(&native) {
            norm_sq += f64::from(e) * f64::from(e);
            let off = (a - e).abs();
            if off > 0.0 {
                differing += 1;
                max_diff = max_diff.max(off);
                max_rel = max_rel.max(off / e.abs().max(1e-12));
            }
            let tolerance = 1e-6 + 1e-4 * e.abs();
            if off > tolerance {
                outside += 1;
                excess_sq += f64::from(off - tolerance).powi(2);
            }
        }
        let excess = (excess_sq / norm_sq).sqrt();
        console_log!(
            "{preset} {name}: a 16-step phase in wasm vs native with FMA: {differing} of {} values differ, max abs diff {max_diff:e}, max relative {max_rel:e}; {outside} outside the per-value tolerance, {:.3} % of the norm",
            native.len(),
            excess * 100.0
        );
        assert!(
            outside <= native.len() / 200 && excess <= 0.05,
            "{preset} {name}: {outside} values outside, {excess} of the norm"
        );
    }
}

#[wasm_bindgen_test]
fn wasm_decodes_what_native_encodes_and_encodes_the_same_bytes() {
    let worker_frames = fixture::unpack(NATIVE_WORKER_FRAMES);
    assert_eq!(worker_frames.len(), fixture::worker_messages().len());
    for (frame, expected) in worker_frames.iter().zip(fixture::worker_messages()) {
        assert_eq!(decode_from_worker(frame).expect("decodes"), expected);
        // Byte-identical encoding means native decodes what wasm encodes.
        assert_eq!(&encode_from_worker(&expected), frame);
    }
    let coordinator_frames = fixture::unpack(NATIVE_COORDINATOR_FRAMES);
    assert_eq!(
        coordinator_frames.len(),
        fixture::coordinator_messages().len()
    );
    for (frame, expected) in coordinator_frames
        .iter()
        .zip(fixture::coordinator_messages())
    {
        assert_eq!(decode_from_coordinator(frame).expect("decodes"), expected);
        assert_eq!(&encode_from_coordinator(&expected), frame);
    }
}

/// A tab's answer in f16, int8, int4 and int2 is the native encoding byte for byte: the
/// coordinator, which replays the phase and encodes it natively, finds the very bytes.
#[wasm_bindgen_test]
fn wasm_compresses_an_answer_to_the_native_bytes() {
    let native = fixture::unpack(NATIVE_COMPRESSED_ANSWERS);
    let wasm = fixture::compressed_answers();
    assert_eq!(native.len(), wasm.len());
    assert_eq!(
        native.len(),
        12,
        "three chunk frames in each of four compressions"
    );
    for (i, (n, w)) in native.iter().zip(&wasm).enumerate() {
        assert!(
            n == w,
            "frame {i} differs ({} and {} bytes)",
            n.len(),
            w.len()
        );
    }
}

#[wasm_bindgen_test]
fn the_worker_core_answers_weights_with_a_gradient_in_the_browser() {
    let (_, params, data) = fixture::inputs("mlp");
    let mut core = WorkerCore::new(WorkerKind::Browser, None);
    let welcome = &fixture::coordinator_messages()[0];
    core.handle(welcome.clone()).expect("welcome");
    core.handle(CoordinatorToWorker::Shard(Shard {
        first_index: 0,
        shape: [1, 28, 28],
        labels: data.labels().to_vec(),
        values: match data.values() {
            model::Values::U8(v) => ShardValues::U8(v.clone()),
            model::Values::F32(v) => ShardValues::F32(v.clone()),
        },
        mean: vec![0.0],
        std: vec![255.0],
    }))
    .expect("shard");
    // The weights as the coordinator sends them: the pull's task, then chunk frames,
    // answered after the last.
    let task = protocol::Task {
        round: protocol::Round(0),
        batch: 0,
        local: None,
    };
    core.handle(CoordinatorToWorker::Task(task)).expect("task");
    let frames = protocol::encode_weights(protocol::Round(0), &params, protocol::Compression::None);
    assert!(frames.len() > 1, "{} frames", frames.len());
    let answers: Vec<_> = frames
        .iter()
        .map(|frame| {
            let msg = protocol::decode_from_coordinator(frame).expect("decodes");
            assert!(matches!(msg, CoordinatorToWorker::Weights(_)));
            core.handle(msg).expect("weights")
        })
        .collect();
    let (last, before) = answers.split_last().expect("frames");
    assert!(
        before.iter().all(Option::is_none),
        "no answer before the last chunk"
    );
    let gradient = last.clone().expect("a participant answers");
    // Round 0 of a 32-sample shard with batch 32 is exactly the fixture batch.
    let (loss, grads) = fixture::gradient("mlp");
    assert_eq!(gradient.samples, 32);
    assert_eq!(gradient.loss.to_bits(), loss.to_bits());
    assert_eq!(gradient.grads, grads);
    assert_eq!(core.stats().gradients_sent, 1);
}

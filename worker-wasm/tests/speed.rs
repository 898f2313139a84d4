//! Browser worker speed, on demand (not part of the test command; a benchmark, not a test):
//! `cd worker-wasm && wasm-pack test --release --headless --chrome --test speed -- --nocapture`
//! (one test: add its name after `--nocapture`, as `gpt_products_per_shape`)
//! Native counterparts: `cargo run --release -p worker-core --example gradient_speed`, and for
//! the GPT `target/release/gpt --preset gpt` (library, unfused and fused orders).
//! The build with relaxed SIMD (what `web/pkg-relaxed` is): the same command run through
//! `source scripts/setup.sh; with_relaxed_simd wasm-pack test ...`.

#![cfg(target_arch = "wasm32")]

#[path = "../src/fixture.rs"]
mod fixture;

use model::gpt::GptSpec;
use model::{batch_seed, LocalPhase};
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

/// Milliseconds from `performance.now()`, to the microsecond (`Date.now()` has whole ones).
fn now_ms() -> f64 {
    let performance =
        js_sys::Reflect::get(&js_sys::global(), &"performance".into()).expect("performance");
    let now: js_sys::Function = js_sys::Reflect::get(&performance, &"now".into())
        .expect("performance.now")
        .into();
    now.call0(&performance)
        .ok()
        .and_then(|t| t.as_f64())
        .expect("a time")
}

#[wasm_bindgen_test]
fn gradient_samples_per_second() {
    for preset in fixture::PRESETS {
        samples_per_second(preset);
    }
}

fn samples_per_second(preset: &str) {
    let (net, params, data) = fixture::inputs(preset);
    let n = fixture::BATCH;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let iters = if preset == "cnn" { 20 } else { 200 };
        let start = now_ms();
        for _ in 0..iters {
            let (x, labels) = data.batch(0..n);
            let seed = model::batch_seed(0, 0);
            let (loss, _) = net
                .loss_and_grad(&params, x.view(), &labels, seed)
                .expect("ok");
            assert!(loss.is_finite());
        }
        runs.push((iters * n) as f64 / ((now_ms() - start) / 1000.0));
    }
    runs.sort_by(f64::total_cmp);
    console_log!(
        "wasm gradient, {preset}, batch {n}: median {:.0} samples/s (runs: {:?})",
        runs[2],
        runs.iter().map(|r| r.round()).collect::<Vec<_>>()
    );
}

/// The module's linear memory, in MiB (what a tab's training holds: weights, optimizer
/// state, activations; the JS heap beside it is small).
fn wasm_memory_mib() -> f64 {
    let memory: js_sys::WebAssembly::Memory = wasm_bindgen::memory().dyn_into().expect("memory");
    let buffer: js_sys::ArrayBuffer = memory.buffer().dyn_into().expect("an ArrayBuffer");
    f64::from(buffer.byte_length()) / f64::from(1u32 << 20)
}

/// nanoGPT's CPU configuration (0.8M parameters), batch 12 × 64 tokens: tokens/s of forward
/// and backward, one core, the tab's own (unfused) order. Then the 10.7M model
/// (`shakespeare_char`'s shape), a local phase of 2 AdamW steps of batch 12 × 256 tokens, as
/// a tab takes it: tokens/s and the module's memory after it.
#[wasm_bindgen_test]
fn gpt_tokens_per_second_and_memory() {
    let batch = 12;
    let (net, params, data) = fixture::gpt(GptSpec::cpu(65), batch);
    let (x, labels) = data.batch(0..batch);
    // Warm-up, untimed, as the native bench's: V8 first compiles a module with its baseline
    // compiler and optimises the functions that turn out hot.
    for _ in 0..4 {
        net.loss_and_grad(&params, x.view(), &labels, batch_seed(0, 0))
            .expect("ok");
    }
    let mut runs = Vec::new();
    for _ in 0..5 {
        let iters = 4;
        let start = now_ms();
        for _ in 0..iters {
            let (loss, _) = net
                .loss_and_grad(&params, x.view(), &labels, batch_seed(0, 0))
                .expect("ok");
            assert!(loss.is_finite());
        }
        runs.push((iters * batch * 64) as f64 / ((now_ms() - start) / 1000.0));
    }
    let mut sorted = runs.clone();
    sorted.sort_by(f64::total_cmp);
    console_log!(
        "wasm gpt 0.8M, batch 12 x 64: median {:.0} tokens/s (runs in turn: {:?}); memory {:.0} MiB",
        sorted[2],
        runs.iter().map(|r| r.round()).collect::<Vec<_>>(),
        wasm_memory_mib()
    );
    let spec = GptSpec::shakespeare_char(65);
    let (net, params, data) = fixture::gpt(spec, batch);
    let adamw = fixture::GPT_ADAMW;
    let mut phase = LocalPhase::new(&net, &params, adamw, 2);
    let start = now_ms();
    while !phase.is_done() {
        let (x, labels) = data.batch(0..batch);
        let loss = phase
            .step(&net, x.view(), &labels, batch_seed(0, 0))
            .expect("ok");
        assert!(loss.is_finite());
    }
    let seconds = (now_ms() - start) / 1000.0;
    let delta = phase.finish().delta;
    assert_eq!(delta.len(), net.trainable_count());
    console_log!(
        "wasm gpt 10.7M ({} parameters), a phase of 2 AdamW steps of batch 12 x 256: {:.0} tokens/s; memory {:.0} MiB",
        params.len(),
        (2 * batch * spec.context) as f64 / seconds,
        wasm_memory_mib()
    );
}

/// Relaxed SIMD's gain on a whole GPT step, in one process (a build with relaxed SIMD):
/// the 0.8M GPT's forward and backward at batch 12 × 64 tokens in the tab's order (fused
/// where this CPU's relaxed multiply-add fuses: matrixmultiply's kernel and the tile in
/// `f32x4.relaxed_madd`) and in `Order::Unfused` (the plain build's tile, for every product,
/// the attention's small ones too, which the plain build gives matrixmultiply's kernel: a
/// few per cent of a step), ten turns of each in turn, then the medians.
#[wasm_bindgen_test]
fn gpt_tokens_fused_against_unfused() {
    let batch = 12;
    let (net, params, data) = fixture::gpt(GptSpec::cpu(65), batch);
    let (x, labels) = data.batch(0..batch);
    let step = || {
        let (loss, _) = net
            .loss_and_grad(&params, x.view(), &labels, batch_seed(0, 0))
            .expect("ok");
        assert!(loss.is_finite());
    };
    for _ in 0..4 {
        step();
        model::with_order(model::Order::Unfused, step);
    }
    let (mut tab, mut unfused) = (Vec::new(), Vec::new());
    for turn in 0..10 {
        for which in [turn % 2, 1 - turn % 2] {
            let iters = 3;
            let start = now_ms();
            for _ in 0..iters {
                if which == 0 {
                    step();
                } else {
                    model::with_order(model::Order::Unfused, step);
                }
            }
            let rate = (iters * batch * 64) as f64 / ((now_ms() - start) / 1000.0);
            if which == 0 { &mut tab } else { &mut unfused }.push(rate);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[4] + v[5]) / 2.0
    };
    let (a, b) = (median(&mut tab), median(&mut unfused));
    console_log!(
        "wasm gpt 0.8M, batch 12 x 64, relaxed SIMD {} (fuses here: {}): the tab's order {a:.0} tokens/s, unfused {b:.0}: {:.3}x",
        cfg!(target_feature = "relaxed-simd"),
        model::gemm::relaxed_fuses(),
        a / b
    );
}

/// A GPT's gradient on the tab's GPU (`Gpu::open(true)`: SwiftShader where there is no
/// real adapter), batch 12: the first batch (pipelines compiled, buffers made), then
/// tokens/s over the next ones, and where a batch's time goes, kernel by kernel. The 0.8M
/// model (64 tokens a window), and on a real adapter the 10.7M one too (256 tokens; on
/// SwiftShader a batch of it takes minutes).
#[wasm_bindgen_test]
async fn gpt_on_the_gpu_tokens_per_second() {
    let gpu = worker_wasm::gpu::Gpu::open(true).await.expect("an adapter");
    let batch = 12;
    for (name, spec) in [
        ("0.8M", GptSpec::cpu(65)),
        ("10.7M", GptSpec::shakespeare_char(65)),
    ] {
        if gpu.fallback && name != "0.8M" {
            console_log!(
                "gpu ({}): the {name} GPT not measured on a fallback adapter",
                gpu.name
            );
            continue;
        }
        let (net, params, data) = fixture::gpt(spec, batch);
        let (x, labels) = data.batch(0..batch);
        let step = || gpu.gradient(&net, &params, x.view(), &labels, batch_seed(0, 0));
        let start = now_ms();
        step().await.expect("computes");
        let first = now_ms() - start;
        let iters = 3;
        let start = now_ms();
        for _ in 0..iters {
            let (loss, _) = step().await.expect("computes");
            assert!(loss.is_finite());
        }
        let ms = (now_ms() - start) / f64::from(iters);
        // A phase's 4 steps: each step's gradient read back and AdamW on the CPU, then
        // the same steps a segment at a time, the state resident on the GPU.
        let steps = 4u32;
        let mut phase = LocalPhase::new(&net, &params, fixture::GPT_ADAMW, steps);
        let start = now_ms();
        while !phase.is_done() {
            let weights = phase.weights(&net).into_owned();
            let (loss, grads) = gpu
                .gradient(&net, &weights, x.view(), &labels, batch_seed(0, 0))
                .await
                .expect("computes");
            phase.apply(&net, loss, &grads);
        }
        let stepwise = (now_ms() - start) / f64::from(steps);
        let phase = LocalPhase::new(&net, &params, fixture::GPT_ADAMW, steps);
        let batches = (0..steps)
            .map(|_| (x.clone(), labels.clone(), batch_seed(0, 0)))
            .collect();
        let segment = worker_core::Segment::new(
            &net,
            (protocol::Round(0), 0),
            fixture::GPT_ADAMW,
            batches,
            &phase,
        );
        let start = now_ms();
        gpu.segment(&segment).await.expect("computes");
        let resident = (now_ms() - start) / f64::from(steps);
        let profile = gpu.kernel_times().await.expect("profiles");
        let total: f64 = profile.iter().map(|(_, ms)| ms).sum();
        console_log!(
            "gpu ({}) gpt {name}, batch {batch} x {}: first batch {first:.0} ms, then {ms:.0} ms \
             a batch, {:.0} tokens/s; a phase's step with AdamW on the CPU {stepwise:.0} ms, \
             resident on the GPU {resident:.0} ms ({:.0} tokens/s); its kernels one at a time \
             ({total:.0} ms in all): {}",
            gpu.name,
            spec.context,
            (batch * spec.context) as f64 / (ms / 1000.0),
            (batch * spec.context) as f64 / (resident / 1000.0),
            profile
                .iter()
                .map(|(kernel, ms)| format!("{kernel} {ms:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The GPTs' matrix products, one by one: GFLOP/s of what the tab computes (`model::gemm`,
/// which takes the tile for large products and matrixmultiply's kernel for small ones), of
/// the unfused tile alone (`Order::Unfused`) and of matrixmultiply's kernel alone, best of
/// five, the three in turn. Built with `-C target-feature=+simd128,+relaxed-simd`, the tab's
/// column and matrixmultiply's multiply and add in `f32x4.relaxed_madd` (fused where this CPU
/// fuses it, which the first line says), and the unfused tile's column is the plain build's
/// tile in the same process: relaxed SIMD's gain per shape, side by side.
#[wasm_bindgen_test]
fn gpt_products_per_shape() {
    use ndarray::linalg::general_mat_mul;
    use ndarray::Array2;
    // (what, m, k, n, A transposed, B transposed): the 0.8M GPT at batch 12 × 64 tokens,
    // then the 10.7M's attention (context 256, heads of 64) and its qkv at 12 × 256 tokens.
    let shapes = [
        ("qkv", 768, 128, 384, false, false),
        ("mlp up", 768, 128, 512, false, false),
        ("mlp down", 768, 512, 128, false, false),
        ("head", 768, 128, 65, false, true),
        ("mlp up, dW", 128, 768, 512, true, false),
        ("mlp up, dx", 768, 512, 128, false, true),
        ("attention q·kᵀ", 64, 32, 64, false, true),
        ("attention a·v", 64, 64, 32, false, false),
        ("10.7M attention q·kᵀ", 256, 64, 256, false, true),
        ("10.7M qkv", 3072, 384, 1152, false, false),
    ];
    console_log!(
        "relaxed SIMD: {}, its multiply-add fuses here: {}",
        cfg!(target_feature = "relaxed-simd"),
        model::gemm::relaxed_fuses()
    );
    for (what, m, k, n, a_t, b_t) in shapes {
        let fill = |rows: usize, cols: usize| {
            Array2::from_shape_fn((rows, cols), |(i, j)| ((i * 7 + j * 3) % 13) as f32 * 0.1)
        };
        let a = if a_t { fill(k, m) } else { fill(m, k) };
        let b = if b_t { fill(n, k) } else { fill(k, n) };
        let (a, b) = (
            if a_t { a.t() } else { a.view() },
            if b_t { b.t() } else { b.view() },
        );
        let mut c = Array2::<f32>::zeros((m, n));
        let iters = (50_000_000 / (m * k * n)).max(2);
        let mut best = [f64::MAX; 3];
        for _ in 0..5 {
            for (i, best) in best.iter_mut().enumerate() {
                let mut product = || match i {
                    0 => model::gemm::gemm(1.0, &a, &b, 0.0, &mut c.view_mut()),
                    1 => model::with_order(model::Order::Unfused, || {
                        model::gemm::gemm(1.0, &a, &b, 0.0, &mut c.view_mut())
                    }),
                    _ => general_mat_mul(1.0, &a, &b, 0.0, &mut c),
                };
                product();
                let start = now_ms();
                for _ in 0..iters {
                    product();
                }
                *best = best.min((now_ms() - start) / iters as f64);
            }
        }
        let gflops = |ms: f64| 2.0 * (m * k * n) as f64 / ms / 1e6;
        console_log!(
            "wasm product {what} {m}x{k}x{n}: the tab {:.1} GFLOP/s, the unfused tile {:.1}, matrixmultiply {:.1}",
            gflops(best[0]),
            gflops(best[1]),
            gflops(best[2])
        );
    }
}

//! Browser worker speed, on demand (not part of the test command; a benchmark, not a test):
//! `cd worker-wasm && wasm-pack test --release --headless --chrome --test speed -- --nocapture`
//! Native counterpart: `cargo run --release -p worker-core --example gradient_speed`.

#![cfg(target_arch = "wasm32")]

#[path = "../src/fixture.rs"]
mod fixture;

use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

fn now_ms() -> f64 {
    js_sys::Date::now()
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

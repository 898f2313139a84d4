//! A tab's GPT step under Node's V8, for a profiler (not part of the test command): the 0.8M
//! GPT's forward and backward at a tab's batch of 6 windows, 150 times after 10 untimed.
//! Node runs wasm as Chromium does (V8, Liftoff then TurboFan), and `perf` can read its
//! code: `cd worker-wasm && NODE_OPTIONS=--perf-prof perf record -k mono -o /tmp/tab.data
//! -- wasm-pack test --release --node --test profile -- --nocapture`, then `perf inject
//! --jit -i /tmp/tab.data -o /tmp/tab.jit.data` and `perf report -i /tmp/tab.jit.data
//! --no-children --sort sym` (V8 writes `jit-*.dump` and `jitted-*.so` files where it runs:
//! delete them after). docs/BENCHMARKS.md, "Where a tab's step goes", is read from it.

#![cfg(target_arch = "wasm32")]

#[path = "../src/fixture.rs"]
mod fixture;

use model::batch_seed;
use model::gpt::GptSpec;
use wasm_bindgen_test::*;

#[wasm_bindgen_test]
fn gpt_steps_for_a_profile() {
    let batch = 6;
    let (net, params, data) = fixture::gpt(GptSpec::cpu(65), batch);
    let (x, labels) = data.batch(0..batch);
    let step = || {
        let (loss, _) = net
            .loss_and_grad(&params, x.view(), &labels, batch_seed(0, 0))
            .expect("a step");
        assert!(loss.is_finite());
    };
    // V8 compiles with its baseline tier first and optimises what turns out hot.
    for _ in 0..10 {
        step();
    }
    let steps = 150;
    let start = js_sys::Date::now();
    for _ in 0..steps {
        step();
    }
    let ms = (js_sys::Date::now() - start) / f64::from(steps);
    console_log!(
        "wasm gpt 0.8M under Node, batch {batch} x 64: {ms:.2} ms a step, {:.0} tokens/s",
        (batch * 64) as f64 / (ms / 1000.0)
    );
}

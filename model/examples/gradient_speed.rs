//! Native worker speed: samples/s of the default model's gradient (784-128-10, batch 32).
//! `cargo run --release -p model --example gradient_speed`
//! The browser counterpart is `worker-wasm/tests/speed.rs`.

use std::time::Instant;

use model::{Dataset, Mlp, SplitMix64};

fn main() {
    let mlp = Mlp::new(&[784, 128, 10]).expect("valid");
    let params: Vec<f32> = mlp.init(1);
    let mut rng = SplitMix64::new(1);
    let n = 32;
    let data = Dataset::new(
        784,
        (0..n * 784).map(|_| rng.below(256) as u8).collect(),
        (0..n).map(|_| rng.below(10) as u8).collect(),
    )
    .expect("consistent");
    let mut runs = Vec::new();
    for _ in 0..5 {
        let iters = 500;
        let start = Instant::now();
        for _ in 0..iters {
            let (x, labels) = data.batch(0..n);
            let (loss, _) = mlp.loss_and_grad(&params, x.view(), &labels).expect("ok");
            assert!(loss.is_finite());
        }
        runs.push((iters * n) as f64 / start.elapsed().as_secs_f64());
    }
    runs.sort_by(f64::total_cmp);
    println!(
        "native gradient, 784-128-10, batch {n}: median {:.0} samples/s (runs: {:?})",
        runs[2],
        runs.iter().map(|r| r.round()).collect::<Vec<_>>()
    );
    // The same products as forward + backward of layer 0 (the bulk of the FLOPs), alone.
    let x = ndarray::Array2::<f32>::from_elem((n, 784), 0.5);
    let w = ndarray::Array2::<f32>::from_elem((784, 128), 0.01);
    let dz = ndarray::Array2::<f32>::from_elem((n, 128), 0.01);
    let iters = 2000;
    let start = Instant::now();
    let mut sink = 0.0;
    for _ in 0..iters {
        sink += x.dot(&w)[[0, 0]] + x.t().dot(&dz)[[0, 0]];
    }
    let gflops = (iters * 2 * 2 * n * 784 * 128) as f64 / start.elapsed().as_secs_f64() / 1e9;
    println!("native layer-0 GEMMs: {gflops:.1} GFLOP/s (sink {sink})");
}

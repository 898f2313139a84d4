//! Native worker speed: samples/s of forward + backward at batch 32, for both presets on
//! MNIST-shaped input, on 1 thread and on every core (each batch in as many parts, as
//! `worker --threads k` computes it). `cargo run --release -p worker-core --example gradient_speed`
//! The browser counterpart is `worker-wasm/tests/speed.rs`.

use std::borrow::Cow;
use std::time::Instant;

use model::{batch_seed, Dataset, NetSpec, Network, Normalization, Shape, SplitMix64, Values};
use worker_core::{Cores, Job};

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let input = Shape::new(1, 28, 28);
    for (name, spec) in [
        ("mlp", NetSpec::mlp(input, &[128], 10)),
        ("cnn", NetSpec::cnn(input, 10)),
    ] {
        let net = Network::new(spec, 10).expect("valid");
        let params: Vec<f32> = net.init(1);
        let mut rng = SplitMix64::new(1);
        let n = 32;
        let data = Dataset::from_parts(
            input,
            Values::U8((0..n * 784).map(|_| rng.below(256) as u8).collect()),
            (0..n).map(|_| rng.below(10) as u8).collect(),
            Normalization::unit_bytes(),
        )
        .expect("consistent");
        let (x, labels) = data.batch(0..n);
        let mut threads: Vec<usize> = vec![1, 2, cores];
        threads.dedup();
        for k in threads.into_iter().filter(|&k| k <= cores.max(2)) {
            let job = Job::new(
                &net,
                Cow::Borrowed(&params),
                (x.view(), &labels),
                batch_seed(0, 0),
                k,
            );
            let mut cores = Cores::new(k);
            let iters = if name == "cnn" { 60 } else { 500 };
            let mut runs = Vec::new();
            for _ in 0..5 {
                let start = Instant::now();
                for _ in 0..iters {
                    let loss = job.run_on(&mut cores).expect("ok");
                    assert!(loss.is_finite());
                }
                runs.push((iters * n) as f64 / start.elapsed().as_secs_f64());
            }
            runs.sort_by(f64::total_cmp);
            println!(
                "{{\"preset\": \"{name}\", \"parameters\": {}, \"batch\": {n}, \"threads\": {k}, \"samples_per_s\": {:.0}, \"runs\": {:?}}}",
                net.param_count(),
                runs[2],
                runs.iter().map(|r| r.round()).collect::<Vec<_>>()
            );
        }
    }
}

//! A GPT's forward and backward: tokens/s of a worker's batch gradient on windows from the
//! embedded Shakespeare (character tokens), in the library's float order (a native
//! worker's), the unfused one (a tab's wasm, and the verifier's replay of a tab) and the
//! fused one (a tab whose relaxed SIMD fuses, and its replay), on one
//! core or, with `--threads K`, as `worker --threads K` computes it (the batch in K parts on
//! K threads, added in part order). One JSON line per (preset, order). PyTorch's figure on
//! the same machine: `scripts/bench/gpt_torch.py`.
//!
//! `cargo run --release -p bench --bin gpt -- --preset gpt --batch 12 --seconds 10`

use std::time::Instant;

use clap::Parser;
use model::{with_order, Network, Order};

#[derive(Debug, Parser)]
struct Cli {
    /// `gpt` (nanoGPT's CPU shape) and/or `gpt-10m` (its `shakespeare_char` shape).
    #[arg(long, value_delimiter = ',', default_value = "gpt")]
    preset: Vec<String>,
    #[arg(long, default_value_t = 12)]
    batch: usize,
    /// Seconds measured per line, after one warm-up batch.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Orders measured: `library`, `unfused` and/or `fused`.
    #[arg(long, value_delimiter = ',', default_value = "library,unfused")]
    order: Vec<String>,
    /// Threads computing each batch, as `worker --threads` (1: on this thread).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    for preset in &cli.preset {
        let choice = server::config::ModelChoice::from_flags(preset, &[], false)?;
        let gpt = choice
            .gpt_spec(2)
            .ok_or_else(|| anyhow::anyhow!("{preset} is not a GPT"))?;
        let split = server::dataset::text::load(
            None,
            gpt.context,
            &server::dataset::TokenizerKind::Char,
            1,
        )?;
        let vocab = split.classes.len();
        let net = Network::new(
            model::NetSpec::gpt(model::gpt::GptSpec { vocab, ..gpt }),
            vocab,
        )?;
        let params = net.init::<f32>(1);
        let mut cores = worker_core::Cores::new(cli.threads.max(1));
        for order in &cli.order {
            let order = match order.as_str() {
                "library" => Order::Library,
                "unfused" => Order::Unfused,
                "fused" => Order::Fused,
                other => anyhow::bail!("unknown order {other} (library, unfused or fused)"),
            };
            let (mut batches, mut spent) = (0usize, 0.0f64);
            let mut b = 0usize;
            loop {
                let (x, labels) = split
                    .train
                    .batch((0..cli.batch).map(|i| (b * cli.batch + i) % split.train.len()));
                b += 1;
                let start = Instant::now();
                let job = worker_core::Job::new(
                    &net,
                    std::borrow::Cow::Borrowed(&params),
                    (x.view(), &labels),
                    0,
                    cli.threads.max(1),
                );
                with_order(order, || job.run_on(&mut cores))?;
                if b > 1 {
                    spent += start.elapsed().as_secs_f64();
                    batches += 1;
                }
                if spent >= cli.seconds {
                    break;
                }
            }
            let tokens = (batches * cli.batch * gpt.context) as f64;
            println!(
                "{}",
                serde_json::json!({
                    "preset": preset,
                    "params": net.param_count(),
                    "order": format!("{order:?}").to_lowercase(),
                    "batch": cli.batch,
                    "threads": cli.threads.max(1),
                    "context": gpt.context,
                    "batches": batches,
                    "tokens_per_s": (tokens / spent).round(),
                    "ms_per_batch": spent / batches as f64 * 1e3,
                })
            );
        }
    }
    Ok(())
}

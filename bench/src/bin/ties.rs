//! `ties`: does verification by recomputation pass honest answers computed in another float
//! order? Writes the weights after `--warmup` SGD steps and the answers to `--batches`
//! batches (`--write FILE`): gradients, or with `--steps H` local phases of H steps; with
//! `--unfused`, in wasm's float order (no FMA: what a browser tab computes, bit for bit).
//! Checks them (`--check FILE`) as the coordinator would (with `--unfused`, as a tab's:
//! wasm's order first). Prints one JSON object per answer outside rounding of that first replay, then a
//! summary: answers outside rounding, answers refused, and the median time of the
//! verifications of answers outside it.
//!
//! ```text
//! target/release/ties --write /tmp/answers.bin --unfused --steps 45 --warmup 0
//! target/release/ties --check /tmp/answers.bin --unfused --steps 45 --warmup 0
//! ```

use std::io::{Read, Write};
use std::time::Instant;

use clap::Parser;
use coordinator_core::checks::verify::{compare, verify, Claim};
use model::{batch_positions, batch_seed};
use protocol::Compression;

#[derive(Debug, Parser)]
#[command(name = "ties")]
struct Cli {
    #[arg(long, default_value = "cnn")]
    model: String,
    #[arg(long, default_value_t = 300)]
    warmup: u64,
    #[arg(long, default_value_t = 60)]
    batches: u64,
    #[arg(long)]
    write: Option<std::path::PathBuf>,
    #[arg(long)]
    check: Option<std::path::PathBuf>,
    /// Local phases of this many SGD steps (lr 0.1, `--local-steps`) instead of single
    /// gradients: each answer is a phase's pseudo-gradient, checked by replay.
    #[arg(long)]
    steps: Option<u32>,
    /// Write the answers in wasm's float order (`model::Order::Unfused`); check them as a
    /// tab's (the verifier tries that order first).
    #[arg(long)]
    unfused: bool,
    /// none, f16 or int8: the answers' wire compression.
    #[arg(long, default_value = "none")]
    compression: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let split = server::dataset::load_default(42)?;
    let args = ["coordinator", "--model", cli.model.as_str()];
    let config = server::config::Config::from_args(args).map_err(anyhow::Error::msg)?;
    let net = split.network(&config.model)?;
    let shard = 0..split.train.len();
    let compression = match cli.compression.as_str() {
        "f16" => Compression::F16,
        "int8" => Compression::Int8,
        _ => Compression::None,
    };
    if let Some(path) = &cli.write {
        let order = if cli.unfused {
            model::Order::Unfused
        } else {
            model::Order::Library
        };
        model::with_order(order, || write(&cli, &split.train, &net, compression, path))?;
    }
    if let Some(path) = &cli.check {
        let mut raw = Vec::new();
        std::fs::File::open(path)?.read_to_end(&mut raw)?;
        let mut at = 0;
        let weights = take(&raw, &mut at);
        let (mut failed, mut outside) = (0, 0);
        let mut slow = Vec::new();
        for b in 0..cli.batches {
            let grads = take(&raw, &mut at);
            let batch = 10_000 + b;
            let claim = Claim {
                weights: &weights,
                shard: shard.clone(),
                batch_index: batch,
                batch_size: 32,
                compression,
                grads: &grads,
                local: cli.steps.map(local),
                parts: 1,
                order: if cli.unfused {
                    model::Order::Unfused
                } else {
                    model::Order::Library
                },
            };
            // The first replay, in the library's order, as the verifier begins.
            let expected = answer(&net, &split.train, &weights, batch, cli.steps)?;
            let Err(outside_rounding) = compare(&grads, &expected, compression) else {
                continue;
            };
            // Outside rounding: the verifier tries the other order, then follows near-ties.
            outside += 1;
            let started = Instant::now();
            let verdict = verify(&net, &split.train, &claim)?;
            slow.push(started.elapsed().as_secs_f64() * 1e3);
            let line = match verdict {
                Err(m) => {
                    failed += 1;
                    serde_json::json!({"batch": batch, "mismatch": m.to_string()})
                }
                Ok(()) => {
                    serde_json::json!({"batch": batch, "outside": outside_rounding.to_string()})
                }
            };
            println!("{line}");
        }
        slow.sort_by(f64::total_cmp);
        let median = slow.get(slow.len() / 2).copied();
        println!(
            "{}",
            serde_json::json!({
                "batches": cli.batches,
                "outside_rounding": outside,
                "refused": failed,
                "verify_ms_when_outside_median": median,
            })
        );
    }
    Ok(())
}

/// The weights after the warmup, then each answer, to `path`.
fn write(
    cli: &Cli,
    train: &model::Dataset,
    net: &model::Network,
    compression: Compression,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let mut weights: Vec<f32> = net.init(42);
    let mut out = Vec::new();
    for step in 0..cli.warmup {
        let (x, labels) = train.batch(batch_positions(train.len(), step, 32));
        let (_, g) = net.loss_and_grad(&weights, x.view(), &labels, step)?;
        for (w, g) in weights.iter_mut().zip(g) {
            *w -= 0.05 * g;
        }
    }
    if compression == Compression::Int8 {
        // What an int8 worker computes on: the weights as int8 decodes them.
        weights = wire(&weights, compression);
    }
    put(&mut out, &weights);
    for b in 0..cli.batches {
        let batch = 10_000 + b;
        let answer = answer(net, train, &weights, batch, cli.steps)?;
        put(&mut out, &wire(&answer, compression));
    }
    std::fs::File::create(path)?.write_all(&out)?;
    Ok(())
}

/// An honest answer for `batch` on `weights`, in this thread's float order: the gradient,
/// or with `steps` the local phase's pseudo-gradient.
fn answer(
    net: &model::Network,
    train: &model::Dataset,
    weights: &[f32],
    batch: u64,
    steps: Option<u32>,
) -> anyhow::Result<Vec<f32>> {
    let shard = 0..train.len();
    Ok(match steps {
        Some(steps) => phase(net, train, &shard, weights, batch, steps)?,
        None => {
            let (x, labels) = train.batch(batch_positions(shard.len(), batch, 32));
            let seed = batch_seed(batch, 0);
            net.compact(net.loss_and_grad(weights, x.view(), &labels, seed)?.1)
        }
    })
}

fn local(steps: u32) -> protocol::LocalPhase {
    protocol::LocalPhase {
        steps,
        optimizer: model::OptimizerKind::Sgd { lr: 0.1 },
        segment: 0,
    }
}

/// A local phase of `steps` steps from `weights`, its batches from `first` on: the
/// pseudo-gradient the worker sends.
fn phase(
    net: &model::Network,
    train: &model::Dataset,
    shard: &std::ops::Range<usize>,
    weights: &[f32],
    first: u64,
    steps: u32,
) -> anyhow::Result<Vec<f32>> {
    let batches = coordinator_core::checks::verify::Batches {
        shard: shard.clone(),
        first,
        size: 32,
        parts: 1,
    };
    let result =
        coordinator_core::checks::verify::replay(net, train, &batches, local(steps), weights)?;
    Ok(result.delta)
}

fn wire(values: &[f32], c: Compression) -> Vec<f32> {
    let mut raw = Vec::new();
    protocol::tensor::encode_payload(&mut raw, values, c);
    protocol::tensor::decode_payload(&raw, values.len(), c)
}

fn put(out: &mut Vec<u8>, values: &[f32]) {
    out.extend_from_slice(&(values.len() as u64).to_le_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn take(raw: &[u8], at: &mut usize) -> Vec<f32> {
    let n = u64::from_le_bytes(raw[*at..*at + 8].try_into().expect("8 bytes")) as usize;
    *at += 8;
    let v = raw[*at..*at + 4 * n]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    *at += 4 * n;
    v
}

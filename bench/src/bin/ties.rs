//! `ties`: does verification by recomputation pass honest answers computed in another float
//! order? Writes, in one process, the weights after `--warmup` SGD steps and the gradients
//! of `--batches` batches (`--write FILE`); checks them in another (`--check FILE`), as the
//! coordinator would. Run the writer with `MMTEST_FEATURE=sse2` (no FMA: what wasm computes,
//! bit for bit; it is read when matrixmultiply is compiled, so build that binary into its own
//! target directory with the variable set) and the checker without, to see what a browser
//! tab's answers meet. Prints one JSON object per refused answer, then a summary: answers
//! outside rounding (which the verifier then explains by near-ties), answers refused, and
//! the median time of those verifications.
//!
//! ```text
//! CARGO_TARGET_DIR=target/sse2 MMTEST_FEATURE=sse2 cargo build --release -p bench --bin ties
//! target/sse2/release/ties --write /tmp/answers.bin --compression int8
//! target/release/ties --check /tmp/answers.bin --compression int8
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
        let mut weights: Vec<f32> = net.init(42);
        let mut out = Vec::new();
        for step in 0..cli.warmup {
            let (x, labels) = split.train.batch(batch_positions(shard.len(), step, 32));
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
            let (x, labels) = split.train.batch(batch_positions(shard.len(), batch, 32));
            let (_, g) = net.loss_and_grad(&weights, x.view(), &labels, batch_seed(batch, 0))?;
            put(&mut out, &wire(&net.compact(g), compression));
        }
        std::fs::File::create(path)?.write_all(&out)?;
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
                local: None,
            };
            let (x, labels) = split.train.batch(batch_positions(shard.len(), batch, 32));
            let (_, expected) =
                net.loss_and_grad(&weights, x.view(), &labels, batch_seed(batch, 0))?;
            if compare(&grads, &net.compact(expected), compression).is_ok() {
                continue;
            }
            // Outside rounding: the verifier follows near-ties.
            outside += 1;
            let started = Instant::now();
            let verdict = verify(&net, &split.train, &claim)?;
            slow.push(started.elapsed().as_secs_f64() * 1e3);
            if let Err(m) = verdict {
                failed += 1;
                println!(
                    "{}",
                    serde_json::json!({"batch": batch, "mismatch": m.to_string()})
                );
            }
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

//! `verify`: what checking answers costs the coordinator, and so what probation costs.
//!
//! For each preset (`mlp`, `cnn`), after `--warmup` SGD steps from the initial weights (near-
//! ties appear as a model trains), over `--batches` batches of 32: the time of one
//! recomputation of an honest answer (`checks::verify::verify`, what probation and sampling
//! run per checked answer), of the near-tie envelope (run only when an answer leaves the
//! rounding tolerance somewhere) with the near-ties it found and followed, and of replaying
//! a local phase of 16 steps; and the same for a browser tab's answers, computed and
//! recomputed in wasm's float order (`model::Order::Unfused`, no FMA).
//!
//! Then what probation costs: the checks an honest newcomer takes by the rule of
//! `registry/trust.rs` (every answer until `P`, then `max(f, P / n)`), over its first 100
//! and 1,000 answers, and the coordinator's CPU seconds a minute at 1, 10 and 100 newcomers
//! a minute. Prints one JSON object.

use std::time::{Duration, Instant};

use clap::Parser;
use coordinator_core::checks::verify::{replay, verify, Batches, Claim};
use model::OptimizerKind;
use model::{batch_positions, batch_seed};
use protocol::{Compression, LocalPhase};

#[derive(Debug, Parser)]
#[command(name = "verify")]
struct Cli {
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    #[arg(long, default_value_t = 20)]
    batches: u64,
    /// `--probation`.
    #[arg(long, default_value_t = coordinator_core::settings::PROBATION)]
    probation: u32,
    /// `--verify-fraction`.
    #[arg(long, default_value_t = 0.05)]
    fraction: f64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let split = server::dataset::load_default(42)?;
    let mut presets = serde_json::Map::new();
    for preset in ["mlp", "cnn"] {
        let args = ["coordinator", "--model", preset];
        let config = server::config::Config::from_args(args).map_err(anyhow::Error::msg)?;
        let net = split.network(&config.model)?;
        let shard = 0..split.train.len();
        let batch_size = 32;
        // Train a little, so that activations sit where a trained model's do.
        let mut weights: Vec<f32> = net.init(42);
        for step in 0..cli.warmup as u64 {
            let (x, labels) = split
                .train
                .batch(batch_positions(shard.len(), step, batch_size));
            let (_, g) = net.loss_and_grad(&weights, x.view(), &labels, step)?;
            for (w, g) in weights.iter_mut().zip(g) {
                *w -= 0.05 * g;
            }
        }
        let (mut check, mut envelope, mut phase) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tab_check, mut tab_phase) = (Vec::new(), Vec::new());
        let (mut ties, mut found) = (0usize, 0usize);
        for b in 0..cli.batches {
            let batch = 1_000 + b;
            let (x, labels) = split
                .train
                .batch(batch_positions(shard.len(), batch, batch_size));
            let seed = batch_seed(batch, shard.start);
            let (_, honest) = net.loss_and_grad(&weights, x.view(), &labels, seed)?;
            let honest = net.compact(honest);
            let claim = Claim {
                weights: &weights,
                shard: shard.clone(),
                batch_index: batch,
                batch_size,
                compression: Compression::None,
                grads: &honest,
                local: None,
                order: model::Order::Library,
                parts: 1,
            };
            let started = Instant::now();
            let verdict = verify(&net, &split.train, &claim)?;
            check.push(started.elapsed());
            anyhow::ensure!(verdict.is_ok(), "an honest answer failed: {verdict:?}");
            let unfused = || {
                model::with_order(model::Order::Unfused, || {
                    net.loss_and_grad(&weights, x.view(), &labels, seed)
                })
            };
            let tab = net.compact(unfused()?.1);
            let tab_claim = Claim {
                grads: &tab,
                order: model::Order::Unfused,
                ..claim.clone()
            };
            let started = Instant::now();
            let verdict = verify(&net, &split.train, &tab_claim)?;
            tab_check.push(started.elapsed());
            anyhow::ensure!(
                verdict.is_ok(),
                "an honest tab's answer failed: {verdict:?}"
            );
            let started = Instant::now();
            let (_, e) = net.loss_grad_envelope(&weights, x.view(), &labels, seed)?;
            envelope.push(started.elapsed());
            (ties, found) = (ties + e.ties, found + e.found);
            let local = LocalPhase {
                steps: 16,
                optimizer: OptimizerKind::Sgd { lr: 0.05 },
                segment: 0,
            };
            let batches = Batches {
                shard: shard.clone(),
                first: batch,
                size: batch_size,
                parts: 1,
            };
            let started = Instant::now();
            replay(&net, &split.train, &batches, local, &weights)?;
            phase.push(started.elapsed());
            let started = Instant::now();
            model::with_order(model::Order::Unfused, || {
                replay(&net, &split.train, &batches, local, &weights)
            })?;
            tab_phase.push(started.elapsed());
        }
        let check_ms = median_ms(&mut check);
        let n = cli.batches as f64;
        let mut costs = serde_json::Map::new();
        for answers in [100u64, 1_000] {
            let checks = newcomer_checks(cli.probation, cli.fraction, answers);
            let per_minute: Vec<serde_json::Value> = [1.0, 10.0, 100.0]
                .iter()
                .map(|rate| {
                    serde_json::json!({
                        "newcomers_per_min": rate,
                        "cpu_s_per_min": rate * checks * check_ms / 1e3,
                    })
                })
                .collect();
            costs.insert(
                format!("staying_{answers}_answers"),
                serde_json::json!({ "checks_per_newcomer": checks, "cpu": per_minute }),
            );
        }
        presets.insert(
            preset.into(),
            serde_json::json!({
                "parameters": net.param_count(),
                "check_ms": check_ms,
                "envelope_ms": median_ms(&mut envelope),
                "near_ties_followed_per_batch": ties as f64 / n,
                "near_ties_found_per_batch": found as f64 / n,
                "phase_16_steps_ms": median_ms(&mut phase),
                "tab_check_ms": median_ms(&mut tab_check),
                "tab_phase_16_steps_ms": median_ms(&mut tab_phase),
                "probation": costs,
            }),
        );
    }
    println!(
        "{}",
        serde_json::json!({
            "probation": cli.probation,
            "verify_fraction": cli.fraction,
            "warmup_steps": cli.warmup,
            "presets": presets,
        })
    );
    Ok(())
}

/// Checks an honest identity takes over its first `answers` answers: every one on
/// probation, then `max(f, P / n)` (expected values).
fn newcomer_checks(probation: u32, fraction: f64, answers: u64) -> f64 {
    (0..answers)
        .map(|n| {
            if n < u64::from(probation) {
                1.0
            } else {
                (f64::from(probation) / n as f64).clamp(fraction, 1.0)
            }
        })
        .sum()
}

fn median_ms(times: &mut [Duration]) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e3
}

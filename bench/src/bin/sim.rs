//! `sim`: a training run in virtual time (the `sim` crate: the real coordinator core and
//! real worker cores over simulated links). Seconds of computing for hours of training.
//!
//! Each worker's link is `--link RTT/MBIT` (repeat the flag for different workers; fewer
//! than `--workers` repeat in turn; `0/0` is loopback), its speed the time one gradient takes
//! here (measured on this machine, the median of 30, unless `--step` gives it). Prints the
//! scenario, then the report, as JSON.
//!
//! `sim --workers 4 --link 50ms/10 --max-rounds 200` is per-step sync on a home link.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use coordinator_core::{Mode, Settings};
use protocol::Compression;
use sim::{Link, Scenario, Until, Way, WorkerSpec};

#[derive(Debug, Parser)]
#[command(name = "sim")]
struct Cli {
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// A worker's link, `RTT/MBIT` each way (`50ms/10`); repeat it for different workers.
    #[arg(long = "link", default_value = "0/0")]
    links: Vec<String>,
    /// Jitter on each frame's delay, each way.
    #[arg(long, default_value = "0", value_parser = server::config::parse_duration)]
    jitter: Duration,
    /// Time one gradient takes [measured here].
    #[arg(long, value_parser = server::config::parse_duration)]
    step: Option<Duration>,
    /// `mlp` (784-128-10) or `cnn`.
    #[arg(long, default_value = "mlp")]
    model: String,
    #[arg(long, default_value = "sync")]
    mode: String,
    /// Sync: the quorum; async: ignored.
    #[arg(long)]
    min_workers: Option<usize>,
    /// none, f16 or int8 (the worker's default).
    #[arg(long, default_value = "int8")]
    compression: String,
    #[arg(long, default_value_t = 10)]
    eval_interval: u64,
    #[arg(long)]
    target_accuracy: Option<f64>,
    #[arg(long)]
    max_rounds: Option<u64>,
    /// Virtual time at most.
    #[arg(long, default_value = "1h", value_parser = server::config::parse_duration)]
    max_time: Duration,
    #[arg(long, default_value_t = 0.05)]
    verify_fraction: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let split = server::dataset::load_default(cli.seed)?;
    let hidden = [128];
    let choice = match cli.model.as_str() {
        "mlp" => server::config::ModelChoice::from_flags("mlp", &hidden, false)?,
        "cnn" => server::config::ModelChoice::from_flags("cnn", &hidden, false)?,
        other => bail!("--model mlp or cnn, not {other:?}"),
    };
    let net = split.network(&choice)?;
    let step = match cli.step {
        Some(step) => step,
        None => sim::measured_step(&net, &split.train)?,
    };
    let compression = match cli.compression.as_str() {
        "none" => Compression::None,
        "f16" => Compression::F16,
        "int8" => Compression::Int8,
        other => bail!("--compression none, f16 or int8, not {other:?}"),
    };
    let links = cli
        .links
        .iter()
        .map(|l| link(l, cli.jitter))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let workers: Vec<WorkerSpec> = (0..cli.workers)
        .map(|i| WorkerSpec::new(links[i % links.len()], step).with_compression(compression))
        .collect();
    let mode = match cli.mode.as_str() {
        "sync" => Settings::default().mode,
        "async" => Mode::Async {
            buffer: 1,
            max_staleness: 8,
        },
        other => bail!("--mode sync or async, not {other:?}"),
    };
    let settings = Settings {
        model_name: cli.model.clone(),
        min_workers: cli.min_workers.unwrap_or(cli.workers),
        mode,
        eval_interval: cli.eval_interval,
        max_rounds: cli.max_rounds,
        verify_fraction: cli.verify_fraction,
        seed: cli.seed,
        audit_seed: Some(cli.seed),
        ..Settings::default()
    };
    println!(
        "{}",
        serde_json::json!({
            "scenario": {
                "workers": cli.workers,
                "links": cli.links,
                "step_ms": step.as_secs_f64() * 1e3,
                "model": net.spec().to_string(),
                "parameters": net.param_count(),
                "mode": cli.mode,
                "compression": cli.compression,
                "seed": cli.seed,
            }
        })
    );
    let scenario = Scenario {
        settings,
        net,
        data: split.data(),
        workers,
        seed: cli.seed,
        until: Until {
            time: cli.max_time,
            accuracy: cli.target_accuracy,
            rounds: cli.max_rounds,
        },
        evaluation_time: Duration::ZERO,
    };
    let started = Instant::now();
    let report = sim::run(scenario);
    let mut json = serde_json::to_value(&report)?;
    json["real_seconds"] = serde_json::json!(started.elapsed().as_secs_f64());
    println!("{json}");
    Ok(())
}

/// `RTT/MBIT`: `50ms/10`; `0/0` (or `0/inf`) is loopback.
fn link(text: &str, jitter: Duration) -> anyhow::Result<Link> {
    let (rtt, mbit) = text
        .split_once('/')
        .with_context(|| format!("--link {text:?}: RTT/MBIT, like 50ms/10"))?;
    let rtt = server::config::parse_duration(rtt).map_err(anyhow::Error::msg)?;
    let mbit: f64 = mbit
        .parse()
        .with_context(|| format!("--link {text:?}: {mbit:?} is not a number"))?;
    let bandwidth = if mbit > 0.0 && mbit.is_finite() {
        mbit * 1e6 / 8.0
    } else {
        f64::INFINITY
    };
    let way = Way {
        latency: rtt / 2,
        bandwidth,
        jitter,
    };
    Ok(Link { down: way, up: way })
}

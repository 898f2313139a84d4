//! `links`: a real run beside the simulator's prediction of it.
//!
//! The real coordinator (in this process) and `--workers` real native workers (the `worker`
//! crate, tokio-tungstenite), each worker through its own delaying proxy on loopback that
//! holds every byte for half the round trip and paces each direction at the link's
//! bandwidth (`--link 0/0`: no proxy at all). Then the `sim` crate runs the same scenario:
//! same flags (`--coordinator "--local-steps auto"` adds any), seed, model and data, the
//! link as given, each step taking the time it takes here (measured, the median of 30).
//! Prints both reports as JSON: the rounds, the accuracy at the end, the time to
//! `--target-accuracy` (real: wall time from the coordinator's start), samples per second
//! after the warm-up, each worker's compute share (real: the compute time its own clock
//! measured, over its time connected), bytes per sample.
//!
//! The proxy is `slowlink`'s.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use protocol::Compression;
use sim::{Link, Scenario, Until, Way, WorkerSpec};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(name = "links")]
struct Cli {
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Every worker's link, `RTT/MBIT` each way (`50ms/10`); `0/0`: loopback, no proxy.
    #[arg(long, default_value = "0/0")]
    link: String,
    /// Rounds at most; the first `--warmup` are not timed.
    #[arg(long, default_value_t = 200)]
    rounds: u64,
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Stop when an evaluation reaches this accuracy (both runs), and report when.
    #[arg(long)]
    target_accuracy: Option<f64>,
    /// More of the coordinator's flags, as one string (`--local-steps auto`), for both runs.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    coordinator: String,
    /// Skip the simulator's run.
    #[arg(long)]
    real_only: bool,
    /// Print each update of the real run to stderr.
    #[arg(long)]
    progress: bool,
    /// Stop the real run after this long, as an operator would (the simulator's too, in
    /// virtual time).
    #[arg(long, value_parser = server::config::parse_duration)]
    max_time: Option<Duration>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

impl Cli {
    /// The coordinator's flags for both runs.
    fn flags(&self) -> Vec<String> {
        let mut flags: Vec<String> = [
            "--min-workers",
            &self.workers.to_string(),
            "--max-rounds",
            &self.rounds.to_string(),
            "--seed",
            &self.seed.to_string(),
        ]
        .map(String::from)
        .into();
        if let Some(target) = self.target_accuracy {
            flags.extend(["--target-accuracy".into(), target.to_string()]);
        }
        flags.extend(self.coordinator.split_whitespace().map(String::from));
        flags
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let way = parse_link(&cli.link)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let args = std::iter::once("coordinator".to_string()).chain(cli.flags());
    let config = server::Config::from_args(args).map_err(anyhow::Error::msg)?;
    let split = config.load_data(cli.seed)?;
    let net = split.network(&config.model)?;
    let step = sim::measured_step(&net, &split.train, config.training.batch_size as usize)?;
    let real = rt.block_on(real_run(&cli, way))?;
    println!("{real}");
    if cli.real_only {
        return Ok(());
    }
    let mut settings = config.training.clone();
    settings.audit_seed = Some(cli.seed);
    let link = Link { down: way, up: way };
    let workers = (0..cli.workers)
        .map(|_| WorkerSpec::new(link, step).with_compression(Compression::Int8))
        .collect();
    let scenario = Scenario {
        settings,
        net,
        data: split.data(),
        workers,
        seed: cli.seed,
        until: Until {
            rounds: Some(cli.rounds),
            accuracy: cli.target_accuracy,
            time: cli.max_time.unwrap_or(Until::default().time),
        },
        evaluation_time: Duration::ZERO,
        // The coordinator replays a step as fast as a worker takes one.
        recompute_step: step,
    };
    let started = Instant::now();
    let report = sim::run(scenario);
    let timed = report
        .curve
        .iter()
        .find(|point| point.round >= cli.warmup)
        .map(|point| (point.seconds, point.round));
    println!(
        "{}",
        serde_json::json!({
            "run": "simulated",
            "link": cli.link,
            "coordinator": cli.coordinator,
            "step_ms": step.as_secs_f64() * 1e3,
            "rounds": report.rounds,
            "accuracy": report.accuracy,
            "evaluated_round": report.evaluated_round,
            "seconds_to_target": report.seconds_to_target,
            "samples_per_sec": report.samples_per_sec,
            "samples_per_sec_from_warmup": timed.map(|(t, round)| {
                let per_round = report.samples as f64 / report.rounds.max(1) as f64;
                (report.rounds - round) as f64 * per_round / (report.seconds - t)
            }),
            "compute_share": report.workers.iter().map(|w| w.compute_share).collect::<Vec<_>>(),
            "bytes_per_sample": report.bytes_per_sample,
            "virtual_seconds": report.seconds,
            "real_seconds": started.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

async fn real_run(cli: &Cli, way: Way) -> anyhow::Result<serde_json::Value> {
    let workers = cli.workers.to_string();
    let mut args: Vec<String> = [
        "coordinator",
        "--exit-when-finished",
        "--no-checkpoints",
        "--log-level",
        "warn",
    ]
    .map(String::from)
    .into();
    args.extend(["--max-per-ip", &workers, "--upload-slots-per-ip", &workers].map(String::from));
    args.extend(cli.flags());
    let config = server::Config::from_args(args).map_err(anyhow::Error::msg)?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let begun = Instant::now();
    let limit = cli.max_time.unwrap_or(Duration::from_secs(30 * 24 * 3600));
    let server = server::start(listener, config, tokio::time::sleep(limit)).await?;
    let mut status = server.status.clone();
    let cancel = CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..cli.workers {
        let addr = if way == Way::LOOPBACK {
            server.addr
        } else {
            let way = slowlink::Way {
                latency: way.latency,
                bandwidth: way.bandwidth,
            };
            slowlink::proxy(server.addr, (way, way), cancel.clone()).await?
        };
        let options = worker::Options {
            url: format!("ws://{addr}/ws"),
            compression: Compression::Int8,
            ..worker::Options::default()
        };
        let cancel = cancel.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let ran = worker::run(&options, cancel).await;
            (ran, started.elapsed())
        }));
    }
    let mut started = None;
    let mut last = server.status.borrow().clone();
    loop {
        if status.changed().await.is_err() {
            break;
        }
        let round = last.round;
        last = status.borrow_and_update().clone();
        if cli.progress && last.round != round {
            eprintln!(
                "{:7.2} s round {} accuracy {:?} H̄ {:?} utilisation {:?} deadline hit {:?}",
                begun.elapsed().as_secs_f64(),
                last.round,
                last.test_accuracy,
                last.local_steps,
                last.utilisation,
                last.last_round
                    .as_ref()
                    .map(|r| (r.deadline_hit, r.answered, r.missed, r.ms)),
            );
        }
        if started.is_none() && last.round >= cli.warmup {
            started = Some((Instant::now(), last.round, last.counters.samples_seen));
        }
    }
    let wall_seconds = begun.elapsed().as_secs_f64();
    let summary = server.wait().await?;
    cancel.cancel();
    let mut shares = Vec::new();
    for task in tasks {
        if let Ok((Ok((_, stats)), connected)) = task.await {
            // What its own clock says it computed, over its time connected.
            shares.push(stats.compute_us as f64 / 1e6 / connected.as_secs_f64());
        }
    }
    let from_warmup = started.map(|(t0, _, samples)| {
        (last.counters.samples_seen - samples) as f64 / t0.elapsed().as_secs_f64()
    });
    Ok(serde_json::json!({
        "run": "real",
        "link": cli.link,
        "coordinator": cli.coordinator,
        "rounds": summary.rounds,
        "accuracy": summary.test_accuracy,
        "reached_target": summary.reached_target,
        "wall_seconds": wall_seconds,
        "samples_per_sec_from_warmup": from_warmup,
        "compute_share": shares,
        "bytes_per_sample": last.bytes_per_sample,
        "utilisation": last.utilisation,
        "local_steps": last.local_steps,
    }))
}

/// `RTT/MBIT`; `0/0` is loopback.
fn parse_link(text: &str) -> anyhow::Result<Way> {
    let (rtt, mbit) = text
        .split_once('/')
        .with_context(|| format!("--link {text:?}: RTT/MBIT, like 50ms/10"))?;
    let rtt = server::config::parse_duration(rtt).map_err(anyhow::Error::msg)?;
    let mbit: f64 = mbit.parse().context("MBIT")?;
    let limited = mbit > 0.0 && mbit.is_finite();
    match (rtt.is_zero(), limited) {
        (true, false) => Ok(Way::LOOPBACK),
        (false, false) => bail!("--link {text:?}: give the bandwidth in Mbit/s"),
        (_, true) => Ok(Way::new(rtt / 2, mbit)),
    }
}

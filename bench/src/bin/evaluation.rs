//! `evaluation`: what evaluating on the test split costs the rounds.
//!
//! The real coordinator (in this process) trains `--model` (default `cnn`) with `--workers`
//! real native workers over loopback, alternately with `--eval-interval E` and with
//! evaluation off, `--repeats` times each. For each run: updates per second over the timed
//! rounds, the longest wait between two updates, and the evaluations done. The timed rounds
//! end one before `--max-rounds`, whose evaluation (done in line, to end the run) is not
//! timed. Then the cost of
//! one evaluation, in seconds and in rounds: the time the evaluating runs took beyond the
//! others, divided by their evaluations. Prints one JSON object per run, then the summary.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
struct Cli {
    #[arg(long, default_value = "cnn")]
    model: String,
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Evaluate every this many rounds in the runs with evaluation.
    #[arg(long, default_value_t = 10)]
    eval_interval: u64,
    /// Rounds, after 20 warm-up rounds (the last one is not timed).
    #[arg(long, default_value_t = 200)]
    rounds: u64,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

const WARMUP: u64 = 20;

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Run {
    seconds: f64,
    longest_gap_ms: f64,
    evaluations: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..cli.repeats {
        for interval in [Some(cli.eval_interval), None] {
            let run = rt.block_on(train(&cli, interval))?;
            println!(
                "{}",
                serde_json::json!({
                    "model": cli.model,
                    "workers": cli.workers,
                    "eval_interval": interval,
                    "rounds": cli.rounds - 1,
                    "seconds": run.seconds,
                    "rounds_per_s": (cli.rounds - 1) as f64 / run.seconds,
                    "longest_gap_ms": run.longest_gap_ms,
                    "evaluations": run.evaluations,
                })
            );
            if interval.is_some() {
                on.push(run)
            } else {
                off.push(run)
            }
        }
    }
    let median = |runs: &[Run], f: fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (t_on, t_off) = (median(&on, |r| r.seconds), median(&off, |r| r.seconds));
    let evaluations = median(&on, |r| r.evaluations as f64);
    let per_eval_s = (t_on - t_off) / evaluations.max(1.0);
    println!(
        "{}",
        serde_json::json!({
            "summary": true,
            "rounds_per_s_with_evaluation": (cli.rounds - 1) as f64 / t_on,
            "rounds_per_s_without": (cli.rounds - 1) as f64 / t_off,
            "longest_gap_ms_with_evaluation": median(&on, |r| r.longest_gap_ms),
            "longest_gap_ms_without": median(&off, |r| r.longest_gap_ms),
            "seconds_per_evaluation": per_eval_s,
            "rounds_per_evaluation": per_eval_s * (cli.rounds - 1) as f64 / t_off,
        })
    );
    Ok(())
}

async fn train(cli: &Cli, eval_interval: Option<u64>) -> anyhow::Result<Run> {
    let total = WARMUP + cli.rounds;
    let interval = eval_interval.unwrap_or(1_000_000).to_string();
    let (workers, total_s) = (cli.workers.to_string(), total.to_string());
    let args = [
        "coordinator",
        "--exit-when-finished",
        "--no-checkpoints",
        "--log-level",
        "warn",
        "--model",
        &cli.model,
        "--min-workers",
        &workers,
        "--max-per-ip",
        &workers,
        "--upload-slots-per-ip",
        &workers,
        "--max-rounds",
        &total_s,
        "--eval-interval",
        &interval,
        // Deadlines long enough never to close a round short.
        "--round-timeout",
        "60s",
    ];
    let config = server::Config::from_args(args).map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let server = server::start(listener, config, std::future::pending()).await?;
    let mut status = server.status.clone();
    let cancel = CancellationToken::new();
    let url = format!("ws://{}/ws", server.addr);
    let tasks: Vec<_> = (0..cli.workers)
        .map(|_| {
            let options = worker::Options {
                url: url.clone(),
                ..worker::Options::default()
            };
            let cancel = cancel.clone();
            tokio::spawn(async move { worker::run(&options, cancel).await })
        })
        .collect();
    // Every published change of round, with when it was seen.
    let (mut start, mut last) = (None, Instant::now());
    let mut longest = Duration::ZERO;
    loop {
        if status.changed().await.is_err() {
            bail!("the coordinator stopped before round {total}");
        }
        let s = status.borrow_and_update().clone();
        let now = Instant::now();
        if start.is_none() && s.round >= WARMUP {
            start = Some(now);
        } else if start.is_some() && s.round > WARMUP {
            longest = longest.max(now - last);
        }
        last = now;
        if s.round + 1 >= total {
            break;
        }
    }
    let seconds = (last - start.context("warm-up")?).as_secs_f64();
    server.wait().await?;
    cancel.cancel();
    for task in tasks {
        let _ = task.await;
    }
    let evaluations = match eval_interval {
        // The timed rounds that are multiples of the interval.
        Some(e) => (WARMUP + 1..total).filter(|r| r % e == 0).count() as u64,
        None => 0,
    };
    Ok(Run {
        seconds,
        longest_gap_ms: longest.as_secs_f64() * 1e3,
        evaluations,
    })
}

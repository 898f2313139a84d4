//! `sim`: a training run in virtual time (the `sim` crate: the real coordinator core and
//! real worker cores over simulated links). Seconds of computing for hours of training.
//!
//! Each worker's link is `--link RTT/MBIT` (repeat the flag for different workers; fewer
//! than `--workers` repeat in turn; `0/0` is loopback), its speed the time one step takes
//! here (measured on this machine, the median of 30, unless `--step` gives it; `--slower`
//! makes some workers slower). Everything else is the coordinator's own flags, given as
//! they would be to it: `--coordinator "--local-steps 16 --mode async"` (its `--min-workers`
//! defaults to `--workers` here). Prints the scenario, then the report, as JSON.
//!
//! `sim --workers 4 --link 50ms/10 --max-rounds 200` is per-step sync on a home link;
//! `--coordinator "--model gpt --local-steps 16"` a language model's local phases.
//!
//! `--attackers 2 --alie 1.0` adds two colluding attackers ("A Little Is Enough", Baruch
//! et al. 2019) beside the `--workers` honest ones, each coming back under a fresh identity
//! and address after every ban (`sim::Behaviour::Alie`). `--newcomers N/min` adds honest
//! workers arriving at that rate, each staying `--stay`, for what probation costs.

use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use protocol::Compression;
use sim::{Link, Scenario, Until, WorkerSpec};

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
    /// Time one step takes [measured here].
    #[arg(long, value_parser = server::config::parse_duration)]
    step: Option<Duration>,
    /// Step time multipliers, one per worker in turn (`1,1,2,4`): workers of mixed speeds.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    slower: Vec<f64>,
    /// none, f16 or int8 (the worker's default).
    #[arg(long, default_value = "int8")]
    compression: String,
    /// The coordinator's flags (model, optimizer, mode, local steps, ...), as one string.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    coordinator: String,
    #[arg(long)]
    target_accuracy: Option<f64>,
    #[arg(long)]
    max_rounds: Option<u64>,
    /// Virtual time at most.
    #[arg(long, default_value = "1h", value_parser = server::config::parse_duration)]
    max_time: Duration,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Colluding attackers, beside the honest `--workers`.
    #[arg(long, default_value_t = 0)]
    attackers: usize,
    /// The attackers send the pool's mean minus this many standard deviations.
    #[arg(long, default_value_t = 1.0)]
    alie: f32,
    /// The attackers answer honestly this many times under each new identity and after
    /// each mismatch (they know about probation).
    #[arg(long, default_value_t = 0)]
    lie_low: u32,
    /// Honest newcomers a minute of virtual time, each a fresh identity.
    #[arg(long, default_value_t = 0.0)]
    newcomers: f64,
    /// How long each newcomer stays.
    #[arg(long, default_value = "2m", value_parser = server::config::parse_duration)]
    stay: Duration,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let links = cli
        .links
        .iter()
        .map(|l| Link::parse(l, cli.jitter).map_err(|e| anyhow::anyhow!("--link {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let flags = cli.coordinator.split_whitespace();
    let seed = cli.seed.to_string();
    // Workers behind links that are not loopback reach the coordinator from other machines:
    // it listens beyond loopback, and a GPT's defaults are those of such a run.
    let remote = links.iter().any(|l| *l != Link::LOOPBACK) && !cli.coordinator.contains("--host");
    let host: &[&str] = if remote { &["--host", "0.0.0.0"] } else { &[] };
    let args = ["coordinator", "--seed", seed.as_str()]
        .into_iter()
        .chain(host.iter().copied())
        .chain(flags);
    let coordinator = server::config::Cli::try_parse_from(args)
        .map_err(|e| anyhow::anyhow!("--coordinator: {e}"))?;
    let config = server::config::Config::try_from(coordinator)?;
    // The coordinator's own data: the embedded digits, `--data`, or a GPT's text.
    let split = config.load_data(cli.seed)?;
    let net = split.network(&config.model)?;
    let step = match cli.step {
        Some(step) => step,
        None => sim::measured_step(&net, &split.train, config.training.batch_size as usize)?,
    };
    let compression = match cli.compression.as_str() {
        "none" => Compression::None,
        "f16" => Compression::F16,
        "int8" => Compression::Int8,
        other => bail!("--compression none, f16 or int8, not {other:?}"),
    };
    if cli.slower.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        bail!("--slower: positive multipliers, like 1,1,2,4");
    }
    let mut workers: Vec<WorkerSpec> = (0..cli.workers)
        .map(|i| {
            let speed = step.mul_f64(cli.slower[i % cli.slower.len()]);
            WorkerSpec::new(links[i % links.len()], speed).with_compression(compression)
        })
        .collect();
    for i in 0..cli.attackers {
        workers.push(
            WorkerSpec::new(links[i % links.len()], step)
                .with_compression(compression)
                .behaving(sim::Behaviour::Alie(cli.alie))
                .coming_back_fresh()
                .lying_low(cli.lie_low),
        );
    }
    if cli.newcomers > 0.0 {
        let every = Duration::from_secs_f64(60.0 / cli.newcomers);
        let mut at = every;
        while at < cli.max_time {
            let i = workers.len();
            workers.push(
                WorkerSpec::new(links[i % links.len()], step)
                    .with_compression(compression)
                    .joining_at(at)
                    .with_churn(at + cli.stay, sim::Churn::Leave),
            );
            at += every;
        }
    }
    let mut settings = config.training.clone();
    if !cli.coordinator.contains("--min-workers") {
        settings.min_workers = cli.workers;
    }
    settings.max_rounds = cli.max_rounds.or(settings.max_rounds);
    settings.audit_seed = Some(cli.seed);
    println!(
        "{}",
        serde_json::json!({
            "scenario": {
                "workers": cli.workers,
                "links": cli.links,
                "step_ms": step.as_secs_f64() * 1e3,
                "slower": cli.slower,
                "model": net.spec().to_string(),
                "parameters": net.param_count(),
                "coordinator": cli.coordinator,
                "attackers": cli.attackers,
                "alie": cli.alie,
                "lie_low": cli.lie_low,
                "newcomers_per_min": cli.newcomers,
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
        // The coordinator replays a step as fast as the fastest worker takes one.
        recompute_step: step,
    };
    let started = Instant::now();
    let (report, busy) = sim::run_measured(scenario);
    let mut json = serde_json::to_value(&report)?;
    json["real_seconds"] = serde_json::json!(started.elapsed().as_secs_f64());
    // What the answers cost the coordinator, per minute of virtual time.
    json["coordinator_busy_s"] = serde_json::json!(busy.as_secs_f64());
    json["coordinator_busy_per_min_s"] =
        serde_json::json!(busy.as_secs_f64() / (report.seconds / 60.0).max(1e-9));
    println!("{json}");
    Ok(())
}

//! `crowd`: whether volunteers add up. In virtual time (the `sim` crate: the real coordinator
//! core and real worker cores, every frame through the real codec, every gradient computed
//! for real), for each crowd size N: the virtual time until an evaluation reaches
//! `--target-loss`, with every volunteer a tab at this machine's measured speed behind
//! `--link`. Beside it, in the same run, ideal data parallelism: the same N on free links,
//! exchanging every step, with no checks (the statistical ceiling of N workers with the
//! same batches: nothing recomputed, no probation).
//!
//! With `--torch PYTHON`, first the bar: PyTorch on this whole machine, timed for real on
//! the same model, corpus and split (`torch.rs`).
//!
//! Prints one JSON line per run, then a Markdown table (N, time to the loss, the speedup
//! S(N) = T(1)/T(N), its share of ideal data parallelism's speedup at that N, its speed
//! against PyTorch's, the share of time the volunteers were busy, bytes on the wire per
//! token); `--svg FILE` draws the validation loss against virtual time, one curve per N.
//! `--seed 42,43,44` runs the whole sweep at each seed (each draws its own split, initial
//! weights, batches and audits) and reports each size's median, with every seed's time
//! beside it: one seed's time to the loss is that seed's, not the crowd size's (stop 66
//! measured one tab 2.5 times apart between two seeds at the same speeds).
//! The command behind `docs/BENCHMARKS.md`'s newest crowd table and its plot:
//!
//! `crowd --workers 1,2,4,8,16,32 --max-time 600s --torch PYTHON --svg
//! docs/crowd-gpt-b3-all.svg` (stop 73: every size at the defaults, beside ideal data
//! parallelism); stop 71's: `crowd --workers 1,4,16 --seed 42,43,44 --torch PYTHON
//! --tab-step 31250000ns --replay-step 15910000ns --svg docs/crowd-gpt-b3.svg` (tabs at 3
//! windows and phases of at least 32 steps, at the step Chromium measured); stop 68's: `crowd --workers
//! 1,2,4,8,16 --torch PYTHON --svg docs/crowd-gpt-fused.svg` (tabs of the build with
//! relaxed SIMD); stop 67's three seeds at stop 66's speeds: `crowd
//! --workers 1,16 --seed 42,43,44 --tab-step 110652037ns --replay-step 58002336ns --svg
//! docs/crowd-gpt-seeds.svg`.
//!
//! A tab is `--tab-share` of one native core of this machine (measured side by side in
//! headless Chromium: 0.54-0.59 for the 0.8M GPT at stop 58, 0.46-0.47 on stop 65's
//! machine, 0.36-0.47 on stop 66's, and 0.52-0.60 at stop 68 in the build with relaxed SIMD,
//! whose multiply-adds fuse on this CPU; 0.53 at the crowd's 3 windows at stops 73 and 74;
//! docs/BENCHMARKS.md "A tab against a native core");
//! the native step is measured here (the median of 30). The coordinator replays a sampled
//! phase in a tab's float order, here a fused tab's (`model::Order::Fused`, what a tab of
//! the relaxed build on a CPU with FMA computes), measured here too: a replayed step takes
//! that long on one of its `--verify-cores`. `--mixed` makes a mixed
//! crowd: every third volunteer behind 150 ms and 5 Mbit/s, every fourth at half speed, and
//! every fifth leaving without warning while a newcomer joins, the first at `--churn-every`,
//! the next at twice that, and so on: early enough to fall before the target (stop 72's
//! mixed crowds, whose one leaver left a third of the way into `--max-time`, reached the
//! target before anyone left).

mod svg;
mod table;
mod torch;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use protocol::Compression;
use sim::{Churn, Link, Report, Scenario, Until, WorkerSpec};

#[derive(Debug, Parser)]
#[command(name = "crowd")]
struct Cli {
    /// Crowd sizes, each a run (and an ideal run beside it).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    workers: Vec<usize>,
    /// Each volunteer's link, `RTT/MBIT` each way.
    #[arg(long, default_value = "50ms/10")]
    link: String,
    /// A tab's speed as a share of one native core here (the 0.8M GPT's step, measured side
    /// by side in headless Chromium: 0.54-0.59 on 2026-11-29, 0.46-0.47 on 2026-11-30's
    /// machine, 0.36-0.47 and a median of 0.40 on 2026-12-01's, and in the build with relaxed
    /// SIMD 0.52-0.60, a median of 0.58, on 2026-12-02's, at 32 windows a step; at the
    /// crowd's 3 windows 0.54 on 2026-12-03's, where 32 gave 0.60: `cores --preset gpt
    /// --cores 1 --batch-size 3,6,32`; at 3 windows 0.53 three times in a row and then
    /// 0.51-0.54, a median of 0.53, on 2026-12-04's: `cores --preset gpt --worker tab,native
    /// --cores 1 --batch-size 3`; docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 0.53)]
    tab_share: f64,
    /// The time a tab takes a step, instead of the native step measured here over
    /// `--tab-share`: to hold runs of different flags to one speed.
    #[arg(long, value_parser = server::config::parse_duration)]
    tab_step: Option<Duration>,
    /// The time the coordinator takes to replay a tab's step, instead of the step measured
    /// here in a tab's float order: to hold runs to one replay speed.
    #[arg(long, value_parser = server::config::parse_duration)]
    replay_step: Option<Duration>,
    /// The validation loss each run trains to.
    #[arg(long, default_value_t = 2.0)]
    target_loss: f64,
    /// The coordinator's flags for the crowd (model, batch, exchange), as one string. A
    /// tab's batch is 3 windows, a quarter of PyTorch's, and its phases under `auto` at
    /// least 32 steps: the crowd's rounds are set by a phase's steps more than by its
    /// samples. At 3 windows and 32 steps one, four and sixteen tabs reached 2.0 sooner than
    /// at 6 windows and 16 steps, at as many bytes a token (docs/BENCHMARKS.md, "Three
    /// windows and phases of 32 steps"); 6 had beaten 12 the same way ("Half the batch").
    #[arg(
        long,
        default_value = "--model gpt --batch-size 3 --eval-interval 1 --min-local-steps 32",
        allow_hyphen_values = true
    )]
    coordinator: String,
    /// Updates between evaluations in the ideal runs (each update is one step there).
    #[arg(long, default_value_t = 25)]
    ideal_eval_interval: u64,
    /// Skip the ideal runs.
    #[arg(long)]
    no_ideal: bool,
    /// Only the ideal runs.
    #[arg(long, conflicts_with = "no_ideal")]
    no_crowd: bool,
    /// The compression a volunteer asks for: int2 (a tab's default: answers in three levels,
    /// weights in int8), int4 (answers in 15 levels, the default before) or int8 (both ways).
    #[arg(long, default_value = "int2", value_parser = compression)]
    compression: Compression,
    /// A mixed crowd (see above) instead of a uniform one.
    #[arg(long)]
    mixed: bool,
    /// In a mixed crowd, when the first leaver goes (and its newcomer joins), then the next
    /// at twice this, and so on.
    #[arg(long, default_value = "20s", value_parser = server::config::parse_duration)]
    churn_every: Duration,
    /// Virtual time a run may take at most.
    #[arg(long, default_value = "2h", value_parser = server::config::parse_duration)]
    max_time: Duration,
    /// Draw the curves here (SVG).
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Time PyTorch on this machine first, with this Python (torch and transformers
    /// installed): `scripts/parity/gpt_torch_train.py` on the same 0.8M GPT, corpus and split.
    #[arg(long)]
    torch: Option<PathBuf>,
    /// PyTorch's threads [default: every core here].
    #[arg(long, requires = "torch")]
    torch_threads: Option<usize>,
    /// PyTorch's steps at most: its learning rate decays over them (the script's recipe), so
    /// a lower `--target-loss` needs more (2,000 reach about 1.83).
    #[arg(long, default_value_t = 2000, requires = "torch", value_parser = clap::value_parser!(u32).range(1..))]
    torch_steps: u32,
    /// The seed of every run: it draws the split, the initial weights, the batches and the
    /// audits. Several (`42,43,44`) run the whole sweep at each and report medians.
    #[arg(
        long = "seed",
        value_delimiter = ',',
        default_value = "42",
        num_args = 1
    )]
    seeds: Vec<u64>,
}

/// One run's outcome.
struct Run {
    workers: usize,
    seed: u64,
    ideal: bool,
    report: Report,
    /// Virtual seconds until the target, if reached.
    reached: Option<f64>,
    real_seconds: f64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The coordinator's log (each round, each check), on stderr, where RUST_LOG asks for it.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    if !(cli.tab_share > 0.0 && cli.tab_share <= 4.0) {
        bail!("--tab-share: a tab's speed as a share of a native core, like 0.33");
    }
    if cli.workers.is_empty() || cli.workers.contains(&0) {
        bail!("--workers: crowd sizes of at least 1, like 1,2,4,8");
    }
    let link = Link::parse(&cli.link, Duration::ZERO).map_err(|e| anyhow::anyhow!("--link {e}"))?;
    distinct(&cli.seeds)?;
    let first_seed = cli.seeds[0];
    let crowd = config(&cli.coordinator, &cli, true, first_seed)?;
    let split = crowd.load_data(first_seed)?;
    let net = split.network(&crowd.model)?;
    let batch = crowd.training.batch_size as usize;
    // First, with nothing beside it: the bar.
    let pytorch = match &cli.torch {
        Some(python) => {
            // PyTorch keeps its recipe's batch (12: at 6 it reached 2.0 later, docs/BENCHMARKS.md
            // "Half the batch"); the crowd takes its own. Both train the same model.
            if net.param_count() != torch::PARAMETERS {
                bail!("--torch: PyTorch's script trains the 0.8M GPT; --coordinator asks for another model");
            }
            let threads = cli
                .torch_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
            let t = torch::run(python, threads, 25, cli.torch_steps, cli.target_loss)?;
            println!(
                "{}",
                serde_json::json!({
                    "pytorch": {
                        "threads": t.threads,
                        "reached_s": t.reached,
                        "steps": t.steps,
                        "loss": t.loss,
                    }
                })
            );
            Some(t)
        }
        None => None,
    };
    let native = sim::measured_step(&net, &split.train, batch)?;
    let step = cli
        .tab_step
        .unwrap_or_else(|| native.div_f64(cli.tab_share));
    let replay = match cli.replay_step {
        Some(replay) => replay,
        None => model::with_order(model::Order::Fused, || {
            sim::measured_step(&net, &split.train, batch)
        })?,
    };
    let tokens_per_sample = net.positions() as f64;
    println!(
        "{}",
        serde_json::json!({
            "model": net.spec().to_string(),
            "parameters": net.param_count(),
            "native_step_ms": native.as_secs_f64() * 1e3,
            "tab_step_ms": step.as_secs_f64() * 1e3,
            "replay_step_ms": replay.as_secs_f64() * 1e3,
            "link": cli.link,
            "coordinator": cli.coordinator,
            "target_loss": cli.target_loss,
            "mixed": cli.mixed,
            "churn_every_s": cli.mixed.then_some(cli.churn_every.as_secs_f64()),
            "compression": cli.compression.name(),
            "train_samples": split.train.len(),
            "seeds": cli.seeds,
        })
    );
    let ideal_flags = format!(
        "{} --local-steps 1 --verify-fraction 0 --probation 0 --eval-interval {}",
        without(&cli.coordinator, IDEAL_DROPS),
        cli.ideal_eval_interval
    );
    let mut runs = Vec::new();
    for &seed in &cli.seeds {
        let crowd = config(&cli.coordinator, &cli, true, seed)?;
        let ideal = config(&ideal_flags, &cli, false, seed)?;
        // The first seed's split is the one the steps were measured on.
        let drawn;
        let split = if seed == first_seed {
            &split
        } else {
            drawn = crowd.load_data(seed)?;
            &drawn
        };
        let common = Common {
            net: &net,
            split,
            replay,
            cli: &cli,
            seed,
        };
        for &n in &cli.workers {
            if !cli.no_crowd {
                let workers = volunteers(n, link, step, &cli);
                runs.push(run(n, false, &crowd, &common, workers)?);
            }
            if !cli.no_ideal {
                let free = (0..n)
                    .map(|_| {
                        WorkerSpec::new(Link::LOOPBACK, step).with_compression(Compression::None)
                    })
                    .collect();
                runs.push(run(n, true, &ideal, &common, free)?);
            }
            // Drawn after every crowd size of the first seed, the one the plot shows: a sweep
            // cut short still leaves its curves.
            if let Some(path) = cli.svg.as_ref().filter(|_| seed == first_seed) {
                std::fs::write(path, svg::svg(&runs, &cli, step))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    println!(
        "{}",
        table::table(&runs, &cli.seeds, tokens_per_sample, pytorch.as_ref())
    );
    if let Some(path) = &cli.svg {
        println!("curves: {}", path.display());
    }
    Ok(())
}

/// `--seed`'s seeds, each once: a seed twice would be the same sweep twice, counted as two.
fn distinct(seeds: &[u64]) -> anyhow::Result<()> {
    let mut seen = std::collections::HashSet::new();
    match seeds.iter().find(|&&s| !seen.insert(s)) {
        Some(seed) => bail!("--seed: {seed} twice; each seed is a sweep of its own"),
        None => Ok(()),
    }
}

/// The coordinator's configuration from `flags`, as its CLI builds it; the crowd's
/// listens beyond loopback (its volunteers are strangers), so its defaults are those of
/// such a run.
fn config(
    flags: &str,
    cli: &Cli,
    remote: bool,
    seed: u64,
) -> anyhow::Result<server::config::Config> {
    let seed = seed.to_string();
    let target = cli.target_loss.to_string();
    let host: &[&str] = if remote && !flags.contains("--host") {
        &["--host", "0.0.0.0"]
    } else {
        &[]
    };
    let args = [
        "coordinator",
        "--seed",
        &seed,
        "--target-loss",
        &target,
        "--patience",
        "0",
    ]
    .into_iter()
    .chain(host.iter().copied())
    .chain(flags.split_whitespace());
    let parsed = server::config::Cli::try_parse_from(args)
        .map_err(|e| anyhow::anyhow!("--coordinator: {e}"))?;
    Ok(server::config::Config::try_from(parsed)?)
}

/// What the ideal runs drop from the crowd's flags: the phases (each of their answers is one
/// step's gradient), the outer optimizer and its schedule (theirs is the model's own, AdamW
/// for a GPT, with its warm-up and decay over steps), the checks (they have none) and the
/// evaluation's interval (theirs counts steps, not phases).
const IDEAL_DROPS: &[&str] = &[
    "--verify-fraction",
    "--probation",
    "--verify-cores",
    "--optimizer",
    "--lr",
    "--momentum",
    "--local-steps",
    "--min-local-steps",
    "--max-local-steps",
    "--max-local-epochs",
    "--inner-optimizer",
    "--inner-lr",
    "--warmup",
    "--lr-decay-steps",
    "--min-lr",
    "--eval-interval",
];

/// `flags` without the `names` and their values.
fn without(flags: &str, names: &[&str]) -> String {
    let mut kept = Vec::new();
    let mut words = flags.split_whitespace();
    while let Some(word) = words.next() {
        if names.contains(&word) {
            words.next();
        } else if !names.iter().any(|n| word.starts_with(&format!("{n}="))) {
            kept.push(word);
        }
    }
    kept.join(" ")
}

/// `n` volunteers: tabs taking `step` a gradient behind `link`, in `--compression`; a mixed
/// crowd as the module says.
fn volunteers(n: usize, link: Link, step: Duration, cli: &Cli) -> Vec<WorkerSpec> {
    let far = Link::symmetric(Duration::from_millis(150), 5.0);
    let mut leavers = 0;
    let mut crowd = Vec::with_capacity(n);
    for i in 0..n {
        let mut v = WorkerSpec::new(link, step).with_compression(cli.compression);
        if cli.mixed {
            if i % 3 == 2 {
                v.link = far;
            }
            if i % 4 == 3 {
                v.step = step * 2;
            }
            if i % 5 == 4 {
                leavers += 1;
                let leave = cli.churn_every * leavers;
                v = v.with_churn(leave, Churn::Leave);
                let newcomer = WorkerSpec::new(v.link, v.step)
                    .with_compression(cli.compression)
                    .joining_at(leave);
                crowd.push(newcomer);
            }
        }
        crowd.push(v);
    }
    crowd
}

/// What every run of one invocation shares.
struct Common<'a> {
    net: &'a model::Network,
    split: &'a server::dataset::Split,
    /// A tab's step, replayed by the coordinator.
    replay: Duration,
    cli: &'a Cli,
    seed: u64,
}

fn run(
    n: usize,
    ideal: bool,
    config: &server::config::Config,
    common: &Common<'_>,
    workers: Vec<WorkerSpec>,
) -> anyhow::Result<Run> {
    let &Common {
        net,
        split,
        replay,
        cli,
        seed,
    } = common;
    let mut settings = config.training.clone();
    settings.min_workers = n;
    settings.audit_seed = Some(seed);
    let scenario = Scenario {
        settings,
        net: net.clone(),
        data: split.data(),
        workers,
        seed,
        until: Until {
            time: cli.max_time,
            ..Until::default()
        },
        evaluation_time: Duration::ZERO,
        // A tab's step, replayed in its order on one of this machine's cores.
        recompute_step: replay,
    };
    let started = Instant::now();
    let report = sim::run(scenario);
    let real_seconds = started.elapsed().as_secs_f64();
    let reached = report
        .loss
        .filter(|&loss| loss <= cli.target_loss)
        .map(|_| report.seconds);
    println!(
        "{}",
        serde_json::json!({
            "workers": n,
            "ideal": ideal,
            "seed": seed,
            "reached_s": reached,
            "seconds": report.seconds,
            "rounds": report.rounds,
            "loss": report.loss,
            "busy": report.mean_compute_share,
            "bytes_per_sample": report.bytes_per_sample,
            "samples": report.samples,
            "bans": report.bans,
            "verified": report.gradients_verified,
            "probation_checks": report.probation_checks,
            "probation_unchecked": report.probation_unchecked,
            "sampling_floored": report.sampling_floored,
            "sampled_aside": report.sampled_aside,
            "noise_scale": report.noise_scale,
            "deadline_extensions": report.deadline_extensions,
            "steps_a_phase": report.steps_a_phase(),
            "evaluations": report.curve.iter().map(|p| (p.round, p.seconds)).collect::<Vec<_>>(),
            "real_seconds": real_seconds,
            "bytes_up": report.workers.iter().map(|w| w.bytes_up).sum::<u64>(),
            "bytes_down": report.workers.iter().map(|w| w.bytes_down).sum::<u64>(),
        })
    );
    Ok(Run {
        workers: n,
        seed,
        ideal,
        report,
        reached,
        real_seconds,
    })
}

/// `--compression`: what a tab may ask for.
fn compression(name: &str) -> Result<Compression, String> {
    match Compression::from_name(name) {
        Some(c @ (Compression::Int8 | Compression::Int4 | Compression::Int2)) => Ok(c),
        _ => Err(format!("int8, int4 or int2, not {name:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("crowd").chain(args.iter().copied())).expect("flags")
    }

    #[test]
    fn the_ideal_runs_flags_drop_the_crowds_exchange_checks_and_evaluation() {
        let flags = "--model gpt --local-steps auto --eval-interval=1 --batch-size 12 \
                     --inner-lr 0.002 --max-local-steps=64 --lr 0.7 --verify-fraction 0.1 \
                     --probation=32 --verify-cores 4 --warmup 5 --lr-decay-steps=900";
        assert_eq!(without(flags, IDEAL_DROPS), "--model gpt --batch-size 12");
    }

    /// PyTorch's steps go with `--torch`, 2,000 unless asked, never 0.
    #[test]
    fn pytorchs_steps_default_to_its_scripts_and_need_its_python() {
        assert_eq!(cli(&["--torch", "python3"]).torch_steps, 2000);
        let more = cli(&["--torch", "python3", "--torch-steps", "4000"]);
        assert_eq!(more.torch_steps, 4000);
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("crowd").chain(args.iter().copied()))
        };
        assert!(
            parse(&["--torch-steps", "4000"]).is_err(),
            "without --torch"
        );
        assert!(parse(&["--torch", "python3", "--torch-steps", "0"]).is_err());
    }

    /// One seed by default, several comma-separated, none twice.
    #[test]
    fn seeds_are_one_by_default_and_several_on_asking_each_once() {
        assert_eq!(cli(&[]).seeds, [42]);
        assert_eq!(cli(&["--seed", "43"]).seeds, [43]);
        assert_eq!(cli(&["--seed", "42,43,44"]).seeds, [42, 43, 44]);
        assert!(distinct(&[42, 43, 44]).is_ok());
        let twice = distinct(&[42, 43, 42]).expect_err("42 twice");
        assert!(twice.to_string().contains("42 twice"), "{twice}");
    }

    #[test]
    fn a_mixed_crowd_has_far_slow_and_leaving_volunteers_and_newcomers() {
        let home = Link::symmetric(Duration::from_millis(50), 10.0);
        let step = Duration::from_millis(100);
        let uniform = volunteers(10, home, step, &cli(&[]));
        assert_eq!(uniform.len(), 10);
        assert!(uniform
            .iter()
            .all(|v| v.link == home && v.step == step && v.churn.is_empty()));
        let mixed = volunteers(10, home, step, &cli(&["--mixed", "--max-time", "30m"]));
        // Two leave, at 20 and 40 seconds whatever `--max-time`, and a newcomer joins at each.
        assert_eq!(mixed.len(), 12);
        for leave in [20, 40].map(Duration::from_secs) {
            let left = mixed
                .iter()
                .filter(|v| v.churn == [(leave, Churn::Leave)])
                .count();
            let joined = mixed.iter().filter(|v| v.joins_at == leave).count();
            assert_eq!((left, joined), (1, 1), "at {leave:?}");
        }
        let sooner = volunteers(10, home, step, &cli(&["--mixed", "--churn-every", "5s"]));
        assert!(sooner.iter().any(|v| v.joins_at == Duration::from_secs(10)));
        assert_eq!(mixed.iter().filter(|v| v.link != home).count(), 3);
        assert!(mixed.iter().any(|v| v.step == step * 2));
    }
}

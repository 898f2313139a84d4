//! `bench`: coordinator throughput with K synthetic workers, over real loopback WebSockets.
//!
//! The coordinator runs as a separate process (this binary re-executed with `serve`), so its
//! peak RSS is its own. The K workers run here, on their own tokio runtime, and speak the real
//! protocol like browsers do (client frames masked per RFC 6455, no compression). Their
//! gradient is cheap and deterministic, `g = w · 0.001 + k` for worker `k`, so the figures
//! measure coordination, not maths, and the final weights can be checked exactly against a
//! local reference: with plain SGD, every round does `w ← w − lr · (0.001 · w + mean(k))`.
//!
//! The model is the coordinator's MLP with its hidden width chosen so that the parameter
//! count is as close to `--params` as the 784-H-10 shape allows: within 398 parameters (half a
//! hidden unit of 795), so 100,180 for 100k (+0.18 %) and 1,000,120 for 1M (+0.012 %).

mod cluster;
mod procfs;

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use protocol::{
    decode_from_coordinator, encode_from_worker, encode_gradient, Compression, CoordinatorToWorker,
    Gradient, Hello, Weights, WorkerKind, WorkerToCoordinator,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

use procfs::{peak_rss_kb, CpuTimes};

const LR: f32 = 0.1;
pub(crate) const WARMUP_ROUNDS: u64 = 2;
const BATCH: u32 = 32;

#[derive(Debug, Parser)]
#[command(name = "bench")]
struct Cli {
    /// Parameters in the model (rounded to the nearest 784-H-10 MLP).
    #[arg(long, default_value_t = 100_000)]
    params: usize,
    /// Simulated workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Timed rounds, after 2 warm-up rounds.
    #[arg(long, default_value_t = 20)]
    rounds: u64,
    /// Wire compression the workers ask for: none, f16, int8, int4 or int2 (headline numbers:
    /// none).
    #[arg(long, default_value = "none")]
    compression: String,
    /// Through a cluster of this many edges and a root on a real nats-server (0: one
    /// coordinator). Needs nats-server: NATS_SERVER, or scripts/setup.sh's copy.
    #[arg(long, default_value_t = 0)]
    edges: usize,
    /// Internal: run the coordinator with these flags (used by the benchmark itself).
    #[arg(long, hide = true, num_args = 0.., allow_hyphen_values = true)]
    serve: Option<Vec<String>>,
    /// Internal: run a cluster's root with these flags.
    #[arg(long, hide = true, num_args = 0.., allow_hyphen_values = true)]
    serve_root: Option<Vec<String>>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(flags) = cli.serve {
        server::allocator::use_one_arena();
        return serve(flags);
    }
    if let Some(flags) = cli.serve_root {
        return serve_root(flags);
    }
    let hidden = ((cli.params.saturating_sub(10)) as f64 / 795.0)
        .round()
        .max(1.0) as usize;
    let params = 784 * hidden + hidden + hidden * 10 + 10;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let Some(compression) = Compression::from_name(&cli.compression) else {
        bail!(
            "--compression must be none, f16, int8, int4 or int2, not {:?}",
            cli.compression
        );
    };
    let result = if cli.edges > 0 {
        let flags = coordinator_flags(hidden, cli.workers);
        rt.block_on(cluster::run(
            hidden,
            params,
            cli.workers,
            cli.rounds,
            compression,
            cli.edges,
            &flags,
        ))?
    } else {
        rt.block_on(run(hidden, params, cli.workers, cli.rounds, compression))?
    };
    println!("{result}");
    Ok(())
}

/// The coordinator process: the real server on its own runtime.
fn serve(flags: Vec<String>) -> anyhow::Result<()> {
    // Done when training is: the bench reads the summary, and keeps no model.
    let args = ["coordinator", "--exit-when-finished", "--no-checkpoints"]
        .map(String::from)
        .into_iter()
        .chain(flags);
    let config = server::Config::from_args(args).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        println!("listening {}", listener.local_addr()?);
        server::run(listener, config, server::shutdown::signal()).await?;
        anyhow::Ok(())
    })
}

/// A cluster's root process, until its `--max-rounds`.
fn serve_root(flags: Vec<String>) -> anyhow::Result<()> {
    let args = std::iter::once("coordinator".to_string()).chain(flags);
    let config = server::Config::from_args(args).map_err(anyhow::Error::msg)?;
    let cluster = config
        .cluster
        .clone()
        .context("--serve-root needs --role root --nats")?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(server::cluster::root::run(
        config,
        cluster,
        tokio_util::sync::CancellationToken::new(),
    ))?;
    Ok(())
}

/// The coordinator's flags for `workers` synthetic workers.
fn coordinator_flags(hidden: usize, workers: usize) -> Vec<String> {
    [
        "--hidden".to_string(),
        hidden.to_string(),
        "--optimizer".into(),
        "sgd".into(),
        "--lr".into(),
        LR.to_string(),
        "--batch-size".into(),
        BATCH.to_string(),
        "--min-workers".into(),
        workers.to_string(),
        "--max-workers".into(),
        workers.max(1).to_string(),
        // Every synthetic worker dials from 127.0.0.1.
        "--max-per-ip".into(),
        workers.max(1).to_string(),
        "--upload-slots-per-ip".into(),
        workers.max(1).to_string(),
        // No evaluation and no deadline: measure coordination only.
        "--eval-interval".into(),
        "1000000000".into(),
        "--round-timeout".into(),
        "3600".into(),
        "--ping-interval".into(),
        "1000".into(),
        "--ping-timeout".into(),
        "3600".into(),
        "--log-level".into(),
        "warn".into(),
        // The synthetic gradients are nothing like real ones; the adaptive norm bound, set
        // from a real gradient, would clip them and change the checked result.
        "--max-grad-norm".into(),
        "1e30".into(),
        // The streaming mean: the reference is a mean, and O(P) memory is what is measured.
        "--aggregator".into(),
        "mean".into(),
        // Recomputation would rightly find the synthetic gradients false and drop them (a
        // newcomer's on probation too).
        "--verify-fraction".into(),
        "0".into(),
        "--probation".into(),
        "0".into(),
    ]
    .to_vec()
}

async fn run(
    hidden: usize,
    params: usize,
    workers: usize,
    rounds: u64,
    compression: Compression,
) -> anyhow::Result<serde_json::Value> {
    let total_rounds = WARMUP_ROUNDS + rounds;
    let flags = coordinator_flags(hidden, workers);
    // CROWDTRAIN_BENCH_WRAPPER runs the coordinator under a profiler, e.g.
    // "valgrind --tool=massif --massif-out-file=/tmp/massif.out" (figures are then the
    // profiler's, not the coordinator's).
    let wrapper = std::env::var("CROWDTRAIN_BENCH_WRAPPER").unwrap_or_default();
    let mut command: Vec<String> = wrapper.split_whitespace().map(str::to_owned).collect();
    command.push(std::env::current_exe()?.display().to_string());
    let mut child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .arg("--serve")
        .args(&flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the coordinator process")?;
    let pid = child.id().context("coordinator pid")?;
    let addr = listening(&mut child).await?;

    let connect_start = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|k| {
            // Worker 0 also reads both processes' CPU time when the timed rounds begin and end.
            let probe = (k == 0).then_some(pid);
            tokio::spawn(worker(addr, k, total_rounds, compression, probe))
        })
        .collect();
    let mut timelines = Vec::with_capacity(workers);
    for task in tasks {
        timelines.push(task.await??);
    }
    let connect_s = timelines
        .iter()
        .map(|t| t.joined - connect_start)
        .max()
        .unwrap_or_default()
        .as_secs_f64();
    let (elapsed, round_ms) = round_times(&timelines[0], total_rounds);
    let rounds_per_s = rounds as f64 / elapsed;
    let peak_rss_mb = peak_rss_kb(pid)? as f64 / 1024.0;
    let cpu = &timelines[0].cpu;
    let (coordinator_cpu_s, workers_cpu_s) = match cpu[..] {
        [start, end] => (
            end.coordinator - start.coordinator,
            end.workers - start.workers,
        ),
        _ => bail!("worker 0 read the CPU times {} times, not 2", cpu.len()),
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;

    let final_params = fetch_params(addr, hidden).await?;
    let (checksum_ok, checksum_max_diff) =
        matches_reference(&final_params, hidden, workers, total_rounds, compression);
    // A graceful stop (SIGTERM), so a profiler wrapping the coordinator can write its output.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    if tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .is_err()
    {
        child.kill().await.ok();
    }
    if !checksum_ok {
        bail!("final weights differ from the reference computation (max abs diff {checksum_max_diff})");
    }
    Ok(serde_json::json!({
        "system": "crowdtrain",
        "params": params,
        "workers": workers,
        "rounds_per_s": round2(rounds_per_s),
        "ingest_MBps": round2(workers as f64 * params as f64 * 4.0 * rounds_per_s / 1e6),
        "round_ms_median": round2(round_ms[round_ms.len() / 2]),
        "coordinator_peak_rss_MB": round2(peak_rss_mb),
        // CPU seconds over the timed rounds: the coordinator's, and this process's (the K
        // workers), and how busy that kept the machine's cores.
        "coordinator_cpu_s": round2(coordinator_cpu_s),
        "workers_cpu_s": round2(workers_cpu_s),
        "cpu_busy_pct": round2(100.0 * (coordinator_cpu_s + workers_cpu_s) / (elapsed * cores)),
        "connect_s": round2(connect_s),
        "checksum_ok": checksum_ok,
        "checksum_max_abs_diff": checksum_max_diff,
        "compression": compression.name(),
        "wire_bytes_per_gradient": compression.payload_len(params).unwrap_or(0) + 22,
    }))
}

/// The address a coordinator process of this binary (`--serve`) prints once it listens.
pub(crate) async fn listening(
    child: &mut tokio::process::Child,
) -> anyhow::Result<std::net::SocketAddr> {
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    loop {
        let line = lines
            .next_line()
            .await?
            .context("the coordinator exited before listening")?;
        if let Some(addr) = line.strip_prefix("listening ") {
            return Ok(addr.parse()?);
        }
    }
}

/// Seconds over the timed rounds, and each timed round's milliseconds, sorted: round r's
/// weights reach worker 0 at `arrivals[r]`, a round lasts until the next arrival.
pub(crate) fn round_times(worker_0: &Timeline, total_rounds: u64) -> (f64, Vec<f64>) {
    let timed = &worker_0.arrivals[WARMUP_ROUNDS as usize..=total_rounds as usize];
    let elapsed = (timed[timed.len() - 1] - timed[0]).as_secs_f64();
    let mut round_ms: Vec<f64> = timed
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect();
    round_ms.sort_by(f64::total_cmp);
    (elapsed, round_ms)
}

pub(crate) fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

pub(crate) struct Timeline {
    joined: Instant,
    /// When the weights of each round arrived.
    arrivals: Vec<Instant>,
    /// CPU times when the timed rounds began and ended (worker 0 only).
    cpu: Vec<CpuTimes>,
}

/// One synthetic worker: answers rounds 0..total with `w · 0.001 + k`.
pub(crate) async fn worker(
    addr: std::net::SocketAddr,
    k: usize,
    total: u64,
    compression: Compression,
    probe: Option<u32>,
) -> anyhow::Result<Timeline> {
    // Nagle off, as the native worker does: a gradient's chunks go out back to back.
    let url = format!("ws://{addr}/ws");
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
    let hello = WorkerToCoordinator::Hello(Hello {
        kind: Some(WorkerKind::Native),
        compression,
        ..Hello::default()
    });
    ws.send(Message::Binary(encode_from_worker(&hello).into()))
        .await?;
    let mut timeline = Timeline {
        joined: Instant::now(),
        arrivals: Vec::new(),
        cpu: Vec::new(),
    };
    // The weights arrive in chunks; like a real worker, it answers once all are in. On int8
    // weights after the first version, as deltas from those held (`protocol::delta`).
    let mut weights = Vec::new();
    let mut incoming = Vec::new();
    while let Some(msg) = ws.next().await {
        let Message::Binary(frame) = msg? else {
            continue;
        };
        let round = match decode_from_coordinator(&frame)? {
            CoordinatorToWorker::Welcome(_) => {
                timeline.joined = Instant::now();
                continue;
            }
            CoordinatorToWorker::Weights(w) => {
                if !gather(&mut incoming, &w) {
                    continue;
                }
                weights = std::mem::take(&mut incoming);
                w.round
            }
            CoordinatorToWorker::WeightsDelta(w) => {
                if !gather(&mut incoming, &w) {
                    continue;
                }
                weights = protocol::delta::target(&weights, &incoming)
                    .map(|target| protocol::delta::settle(&target))
                    .context("a delta of another length than the weights held")?;
                w.round
            }
            CoordinatorToWorker::Shard(_)
            | CoordinatorToWorker::Task(_)
            | CoordinatorToWorker::Challenge(_)
            | CoordinatorToWorker::Frozen { .. } => continue,
            CoordinatorToWorker::Error { code, message } => {
                bail!("worker {k}: {code:?}: {message}")
            }
        };
        timeline.arrivals.push(Instant::now());
        if let Some(pid) = probe {
            if round.0 == WARMUP_ROUNDS || round.0 == total {
                timeline.cpu.push(CpuTimes::read(pid)?);
            }
        }
        if round.0 >= total {
            return Ok(timeline);
        }
        let gradient = Gradient {
            compute_us: 0,
            parts: 1,
            round,
            samples: BATCH,
            loss: 0.0,
            grads: weights.iter().map(|p| p * 0.001 + k as f32).collect(),
        };
        for chunk in encode_gradient(&gradient, compression) {
            ws.feed(Message::Binary(chunk.into())).await?;
        }
        ws.flush().await?;
    }
    bail!("worker {k}: connection closed early")
}

/// Adds a chunk of `Weights` or `WeightsDelta` to `incoming` (cleared by a first chunk):
/// whether the message is whole.
fn gather(incoming: &mut Vec<f32>, chunk: &Weights) -> bool {
    if chunk.offset == 0 {
        incoming.clear();
    }
    incoming.extend_from_slice(&chunk.params);
    incoming.len() >= chunk.total as usize
}

/// What plain SGD on the synthetic gradient gives, computed here in the same f32 order and
/// through the same wire compression: weights and gradients pass the protocol's own encoder
/// and decoder, so a compressed run is checked as exactly as an uncompressed one.
///
/// Gradients arrive in any order, so the coordinator's float sum may differ from this one in
/// the last bits. Uncompressed that stays below 1e-4 relative. Compressed, a last-bit
/// difference can move a value across a quantization boundary: at most one quantization
/// step of the gradient per round, which moves a weight by at most `lr · step` per round
/// (int8: step = max|g| / 127 per 256 values; f16: step = |g| · 2^-10).
pub(crate) fn matches_reference(
    got: &[f32],
    hidden: usize,
    workers: usize,
    rounds: u64,
    compression: Compression,
) -> (bool, f32) {
    let through_wire = |values: &[f32], compression: Compression| {
        let mut raw = Vec::new();
        protocol::tensor::encode_payload(&mut raw, values, compression);
        protocol::tensor::decode_payload(&raw, values.len(), compression)
    };
    let mlp = model::Network::mlp(&[784, hidden, 10]).expect("valid");
    let mut w: Vec<f32> = mlp.init(42);
    let weight = BATCH as f32;
    let mut max_step = 0.0f32;
    // On int8 weights, the first version whole and the others as deltas from the last held.
    let mut held: Option<Vec<f32>> = None;
    for _ in 0..rounds {
        let seen = match &held {
            Some(held) => {
                // A run of single gradients: its deltas in int4 (`Settings::delta_default`).
                let delta =
                    protocol::delta::delta(&w, held, Compression::Int4).expect("one layout");
                protocol::delta::settle(&protocol::delta::target(held, &delta).expect("one layout"))
            }
            None => through_wire(&w, compression.for_weights()),
        };
        if compression.for_weights() == Compression::Int8 {
            held = Some(seen.clone());
        }
        let mut sum = vec![0.0f32; w.len()];
        // The coordinator's sum Σ_k samples · g_k, then / Σ samples.
        for k in 0..workers {
            let g: Vec<f32> = seen.iter().map(|p| p * 0.001 + k as f32).collect();
            let g_max = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            max_step = max_step.max(match compression {
                Compression::None => 0.0,
                Compression::F16 => g_max / 1024.0,
                Compression::Int8 | Compression::Int4 | Compression::Int2 => {
                    g_max / f32::from(compression.levels())
                }
            });
            for (s, v) in sum.iter_mut().zip(through_wire(&g, compression)) {
                *s += weight * v;
            }
        }
        let scale = 1.0 / (weight * workers as f32);
        for (p, s) in w.iter_mut().zip(&sum) {
            *p -= LR * (s * scale);
        }
    }
    let quantization = rounds as f32 * LR * max_step;
    let max_diff = got
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let ok = got.len() == w.len()
        && got
            .iter()
            .zip(&w)
            .all(|(a, b)| (a - b).abs() <= 1e-4 * b.abs().max(1.0) + quantization);
    (ok, max_diff)
}

/// The coordinator's parameters from `GET /api/params`, in layout order (the file stores
/// tensors by name).
pub(crate) async fn fetch_params(
    addr: std::net::SocketAddr,
    hidden: usize,
) -> anyhow::Result<Vec<f32>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET /api/params HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut raw)).await??;
    let body_at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no HTTP header end")?
        + 4;
    let mlp = model::Network::mlp(&[784, hidden, 10])?;
    let (params, _) = server::tensors_file::decode_params(&raw[body_at..], mlp.layout())?;
    Ok(params)
}

//! A worker's samples/s on `k` cores, through the real coordinator: a browser tab in headless
//! Chromium with `k` Web Workers (`?cores=k`), or the native worker with `--threads k`.
//! One JSON line per (preset, worker, k).
//!
//! `cargo run --release -p bench --bin cores -- --worker tab --worker native --cores 1,2`
//!
//! `cores --preset gpt --cores 1 --batch-size 3,6`: a crowd's tab against a native core at
//! the batches a crowd's tab takes, side by side.
//!
//! The coordinator runs local phases (`--local-steps`, 16 by default) so that a worker
//! computes rather than waits, and no verification or probation (it would share the
//! machine's cores with the worker). The rate is the coordinator's count of samples
//! answered (`samples_seen`) over `--seconds`, after the first answer and `--warmup`.
//!
//! `--gpu auto` (a real adapter) or `--gpu fallback` (a software one too) measures tabs on
//! the GPU path (`?gpu=`; Chromium with `--enable-unsafe-webgpu`). A GPT's phases then run
//! on the GPU, committed every `--segment-steps` (8) steps; nothing checks them here, so no
//! state is revealed. The ReLU models' phases stay on the CPU (`--segment-steps` 0 for
//! them): with a GPU the coordinator runs none for those (`--local-steps 1`), each answer
//! its round trip. A GPT (`--preset gpt,gpt-10m`) prints its tokens/s too.
//!
//! `cores --preset gpt,gpt-10m --worker tab --cores 1 --gpu auto`, then `--gpu off`: a tab's
//! GPU against its CPU, on a machine with a GPU.

use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
struct Cli {
    /// Presets to measure.
    #[arg(long, value_delimiter = ',', default_value = "mlp,cnn")]
    preset: Vec<String>,
    /// `tab` (headless Chromium; `CHROME` names the binary) and/or `native`.
    #[arg(long, value_delimiter = ',', default_value = "tab,native")]
    worker: Vec<String>,
    /// Core counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    cores: Vec<usize>,
    #[arg(long, default_value_t = 16)]
    local_steps: u32,
    /// Samples a step (the coordinator's `--batch-size`), each measured in turn: a crowd's
    /// tab takes fewer than the coordinator's default of 32, and a step's fixed costs weigh
    /// more in a smaller one.
    #[arg(long, value_delimiter = ',', default_value = "32", value_parser = clap::value_parser!(u32).range(1..))]
    batch_size: Vec<u32>,
    /// Seconds measured, after the first answer and the warm-up.
    #[arg(long, default_value_t = 15.0)]
    seconds: f64,
    #[arg(long, default_value_t = 3.0)]
    warmup: f64,
    /// Tabs compute on every core lent (`?pin=1`) instead of timing which is faster.
    #[arg(long)]
    pin: bool,
    /// Tabs compute on the GPU: `auto` (a real adapter), `fallback` (a software one too),
    /// or `off`.
    #[arg(long, default_value = "off", value_parser = ["off", "auto", "fallback"])]
    gpu: String,
}

impl Cli {
    /// Whether tabs compute on a GPU (plain gradients, no local phases).
    fn on_gpu(&self) -> bool {
        self.gpu != "off"
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    for preset in &cli.preset {
        for &batch in &cli.batch_size {
            for kind in &cli.worker {
                for &k in &cli.cores {
                    report(&cli, preset, batch, kind, k).await?;
                }
            }
        }
    }
    Ok(())
}

/// Measures one (preset, batch, worker, k) and prints its line.
async fn report(cli: &Cli, preset: &str, batch: u32, kind: &str, k: usize) -> anyhow::Result<()> {
    let (rate, tokens, on_gpu) = measure(cli, preset, batch, kind, k).await?;
    println!(
        "{}",
        serde_json::json!({
            "tokens_per_s": tokens.map(|t| (rate * t as f64).round()),
            "preset": preset,
            "worker": kind,
            "cores": k,
            "local_steps": steps_for(cli, preset),
            "batch_size": batch,
            "pinned": cli.pin && kind == "tab",
            "gpu": if kind == "tab" { cli.gpu.as_str() } else { "off" },
            // Whether its answers were the GPU's (unordered), not the CPU's
            // (a tab gives a failing or slower GPU up).
            "answers_from_gpu": on_gpu,
            "samples_per_s": rate.round(),
        })
    );
    Ok(())
}

/// The phase length: a GPU takes only a GPT's phases (checked by segments); the other
/// presets' answers on a GPU are plain gradients.
fn steps_for(cli: &Cli, preset: &str) -> u32 {
    if cli.on_gpu() && !preset.starts_with("gpt") {
        1
    } else {
        cli.local_steps
    }
}

/// Samples/s, a GPT's tokens a sample (its context), and whether the worker's last
/// answers were a GPU's.
async fn measure(
    cli: &Cli,
    preset: &str,
    batch: u32,
    kind: &str,
    k: usize,
) -> anyhow::Result<(f64, Option<usize>, bool)> {
    let steps = steps_for(cli, preset).to_string();
    let batch = batch.to_string();
    let mut args = vec![
        "coordinator",
        "--exit-when-finished",
        "--no-checkpoints",
        "--log-level",
        "warn",
        "--model",
        preset,
        "--verify-fraction",
        "0",
        "--probation",
        "0",
        "--eval-interval",
        "1000000",
    ];
    args.extend(["--local-steps", &steps, "--batch-size", &batch]);
    let config = server::Config::from_args(args.into_iter().map(String::from))
        .map_err(anyhow::Error::msg)?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let server = server::start(listener, config, std::future::pending::<()>()).await?;
    let mut status = server.status.clone();
    let cancel = CancellationToken::new();
    let profile = std::env::temp_dir().join(format!("crowdtrain-cores-{}", std::process::id()));
    let mut tab = None;
    let mut native = None;
    let pin = if cli.pin { "&pin=1" } else { "" };
    let gpu = format!("&gpu={}", cli.gpu);
    // A real GPU needs Chromium's GPU process; WebGPU in headless Chromium needs the flag.
    let chrome_gpu: &[&str] = match cli.gpu.as_str() {
        "auto" => &["--enable-unsafe-webgpu"],
        "fallback" => &["--disable-gpu", "--enable-unsafe-webgpu"],
        _ => &["--disable-gpu"],
    };
    match kind {
        "tab" => {
            let chrome = std::env::var("CHROME").unwrap_or_else(|_| "chromium".into());
            tab = Some(
                tokio::process::Command::new(&chrome)
                    .args([
                        "--headless",
                        "--no-sandbox",
                        "--no-first-run",
                        "--disable-background-networking",
                        "--disable-dev-shm-usage",
                        "--disable-background-timer-throttling",
                        "--disable-renderer-backgrounding",
                    ])
                    .args(chrome_gpu)
                    .arg(format!("--user-data-dir={}", profile.display()))
                    .arg(format!("http://{}/?cores={k}{pin}{gpu}", server.addr))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| anyhow::anyhow!("cannot start {chrome}: {e}"))?,
            );
        }
        "native" => {
            let options = worker::Options {
                url: format!("ws://{}/ws", server.addr),
                threads: k,
                ..worker::Options::default()
            };
            let cancel = cancel.clone();
            native = Some(tokio::spawn(async move {
                let _ = worker::run(&options, cancel).await;
            }));
        }
        other => anyhow::bail!("--worker {other}: tab or native"),
    }
    let seen = |s: &server::Status| s.counters.samples_seen;
    while seen(&status.borrow_and_update()) == 0 {
        tokio::time::timeout(Duration::from_secs(60), status.changed())
            .await
            .map_err(|_| anyhow::anyhow!("no answer from the {kind} worker in 60 s"))??;
    }
    tokio::time::sleep(Duration::from_secs_f64(cli.warmup)).await;
    let (from, at) = (seen(&status.borrow()), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(cli.seconds)).await;
    let (to, took) = (seen(&status.borrow()), at.elapsed());
    let on_gpu = status.borrow().worker_list.iter().any(|w| w.cores == 0);
    cancel.cancel();
    drop(tab);
    if let Some(native) = native {
        let _ = native.await;
    }
    let spec: Option<model::NetSpec> = status.borrow().model.parse().ok();
    let tokens = spec.and_then(|spec| spec.as_gpt()).map(|gpt| gpt.context);
    server.stop().await?;
    let _ = std::fs::remove_dir_all(&profile);
    Ok(((to - from) as f64 / took.as_secs_f64(), tokens, on_gpu))
}

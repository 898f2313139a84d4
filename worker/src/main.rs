//! `worker`: lend this machine to a crowdtrain coordinator.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// Join a crowdtrain coordinator and compute gradients until it stops or Ctrl-C.
#[derive(Debug, Parser)]
#[command(name = "worker", version)]
struct Cli {
    /// The coordinator's WebSocket URL; for a cluster, its edges' URLs, comma-separated:
    /// with --reconnect, a session that fails moves on to the next.
    #[arg(long, default_value = "ws://127.0.0.1:8080/ws", value_delimiter = ',')]
    url: Vec<String>,
    /// For a wss:// URL whose certificate a private CA signed: trust that CA's certificate
    /// (PEM) instead of the public web's roots.
    #[arg(long)]
    ca_cert: Option<std::path::PathBuf>,
    /// Join token, if the coordinator requires one.
    #[arg(long, env = "CROWDTRAIN_JOIN_TOKEN")]
    join_token: Option<String>,
    /// Keep reconnecting (backoff 0.5 s doubling to 10 s) when the coordinator is unreachable
    /// or closes the connection, until Ctrl-C.
    #[arg(long)]
    reconnect: bool,
    /// Wire compression for weights and gradients: none (exact f32), f16 (half the bytes),
    /// int8 (a quarter, with a scale per 256 values; costs < 0.1 accuracy points here), or
    /// int4 (answers in a seventh, a scale per 64 values; weights still come as int8), or
    /// int2, the default (answers as sign times their 64-value chunk's largest, or zero;
    /// weights as int8; docs/BENCHMARKS.md, "int2 answers").
    #[arg(long, value_enum, default_value_t = CompressionChoice::Int2)]
    compression: CompressionChoice,
    /// Cores to compute on: each batch is split into this many parts computed on as many
    /// threads, and the answer is still one worker's. 0: every core of this machine.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Log level: error, warn, info, debug or trace (RUST_LOG overrides it).
    #[arg(long, default_value = "info")]
    log_level: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CompressionChoice {
    None,
    F16,
    Int8,
    Int4,
    Int2,
}

fn main() -> ExitCode {
    let ran = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(Cli::parse())));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}

/// `err` and its causes on one line, each said once: a cause whose message the error above it
/// already quotes (`--data x.csv: line 3: ...` over `line 3: ...`) is left out.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let said = cause.to_string();
        if line.contains(&said) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&said);
    }
    line
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("worker={}", cli.log_level))
    });
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
        }
    });
    let tls = match &cli.ca_cert {
        Some(_) if !cli.url.iter().all(|u| u.starts_with("wss://")) => {
            anyhow::bail!(
                "--ca-cert only applies to wss:// URLs, not {}",
                cli.url.join(",")
            )
        }
        Some(path) => Some(worker::tls::trusting(path)?),
        None => None,
    };
    let options = worker::Options {
        tls,
        url: cli.url[0].clone(),
        join_token: cli.join_token,
        compute_delay: None,
        threads: match cli.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        },
        compression: match cli.compression {
            CompressionChoice::None => protocol::Compression::None,
            CompressionChoice::F16 => protocol::Compression::F16,
            CompressionChoice::Int8 => protocol::Compression::Int8,
            CompressionChoice::Int4 => protocol::Compression::Int4,
            CompressionChoice::Int2 => protocol::Compression::Int2,
        },
    };
    if !cli.reconnect {
        let (ended, stats) = worker::run(&options, shutdown).await?;
        tracing::info!(
            ?ended,
            gradients = stats.gradients_sent,
            samples = stats.samples_computed,
            "session ended"
        );
        return Ok(());
    }
    match worker::run_reconnecting(&options, &cli.url, shutdown).await {
        Ok(stats) => {
            tracing::info!(
                gradients = stats.gradients_sent,
                samples = stats.samples_computed,
                "stopped"
            );
            Ok(())
        }
        // The operator removed this worker, or banned it: coming back would not help.
        Err(worker::RunError::Worker(worker_core::WorkerError::Rejected { code, message })) => {
            anyhow::bail!(
                "the coordinator removed this worker ({}): {message}",
                code.name()
            )
        }
        Err(err) => Err(err.into()),
    }
}

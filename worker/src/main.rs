//! `worker`: lend this machine to a crowdtrain coordinator.

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// Join a crowdtrain coordinator and compute gradients until it stops or Ctrl-C.
#[derive(Debug, Parser)]
#[command(name = "worker", version)]
struct Cli {
    /// The coordinator's WebSocket URL.
    #[arg(long, default_value = "ws://127.0.0.1:8080/ws")]
    url: String,
    /// Join token, if the coordinator requires one.
    #[arg(long, env = "CROWDTRAIN_JOIN_TOKEN")]
    join_token: Option<String>,
    /// Log level: error, warn, info, debug or trace (RUST_LOG overrides it).
    #[arg(long, default_value = "info")]
    log_level: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
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
    let options = worker::Options {
        url: cli.url,
        join_token: cli.join_token,
    };
    let (ended, stats) = worker::run(&options, shutdown).await?;
    tracing::info!(
        ?ended,
        gradients = stats.gradients_sent,
        samples = stats.samples_computed,
        "worker finished"
    );
    Ok(())
}

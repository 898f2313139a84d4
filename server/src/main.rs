//! `coordinator`: parse flags, set up logging, bind, train until done or told to stop.

use std::process::ExitCode;

use anyhow::Context;
use server::config::{Command, LogFormat};
use server::Config;

fn main() -> ExitCode {
    server::allocator::use_one_arena();
    let ran = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
        .and_then(|runtime| runtime.block_on(run()));
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

async fn run() -> anyhow::Result<()> {
    let args = std::env::args_os().collect();
    let cli = match server::config::layers::parse(args, |name| std::env::var(name).ok()) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    if let Some(Command::Export(args)) = &cli.command {
        let exported =
            server::checkpoint::export(&args.checkpoint_dir, &args.out, args.tokenizer.as_deref())?;
        println!(
            "exported version {} ({} bytes) from {} to {}",
            exported.version,
            exported.bytes,
            exported.from.display(),
            args.out.display()
        );
        return Ok(());
    }
    if let Some(Command::Sample(args)) = &cli.command {
        let how = model::gpt::Sampling {
            tokens: args.tokens,
            temperature: args.temperature,
            top_k: args.top_k,
            seed: args.seed,
        };
        // `\n` on a command line is two characters; the prompt means a newline.
        let prompt = args.prompt.replace("\\n", "\n");
        let sampled = server::checkpoint::sample(
            &args.checkpoint_dir,
            args.data.as_deref(),
            args.tokenizer.as_ref(),
            &prompt,
            how,
        )?;
        eprintln!(
            "version {} from {}:",
            sampled.version,
            sampled.from.display()
        );
        println!("{}{}", sampled.prompt, sampled.text);
        return Ok(());
    }
    let config = match Config::try_from(cli) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(2);
        }
    };
    init_tracing(&config.log_level, config.log_format);
    if let (server::cluster::Role::Root, Some(cluster)) = (config.role, config.cluster.clone()) {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            server::shutdown::signal().await;
            stop.cancel();
        });
        let summary = server::cluster::root::run(config, cluster, shutdown).await?;
        tracing::info!(
            version = summary.version,
            closed = summary.closed,
            test_accuracy = ?summary.test_accuracy,
            "root stopped"
        );
        return Ok(());
    }
    let addr = (config.host.as_str(), config.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {}:{}", config.host, config.port))?;
    let summary = server::run(listener, config, server::shutdown::signal()).await?;
    tracing::info!(
        rounds = summary.rounds,
        test_accuracy = ?summary.test_accuracy,
        "coordinator stopped"
    );
    if let Some(error) = summary.checkpoint_error {
        anyhow::bail!("{error}");
    }
    Ok(())
}

fn init_tracing(level: &str, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "server={level},coordinator={level},tower_http=warn"
        ))
    });
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Human => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

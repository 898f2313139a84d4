//! Command-line flags (`Cli`, raw) and the validated `Config` that `run` takes.
//!
//! Everything is checked together in `Config::try_from(cli)` before anything starts, so a
//! bad combination is refused with a message instead of surfacing mid-training.

mod aggregator;
mod cli;
mod cluster;
mod duration;
mod error;
pub mod layers;
pub mod model_choice;
mod optimizer;

use std::path::PathBuf;
use std::time::Duration;

use self::aggregator::aggregator;
pub use self::cli::{
    AggregatorChoice, Cli, Command, ExportArgs, LogFormat, ModeChoice, OptimizerChoice,
};
use self::cli::{DeltaChoice, RoleChoice};
pub use self::duration::parse_duration;
pub use self::error::ConfigError;
pub use self::model_choice::ModelChoice;
use self::optimizer::optimizers;
pub use coordinator_core::Mode;
use coordinator_core::Settings;
use protocol::Compression;

use crate::deadline::RoundTimeout;
use crate::edge::admission::Origins;

/// Largest `--batch-size` accepted here; the train split's size is checked once loaded.
pub const MAX_BATCH: usize = 1 << 16;

/// WebSocket liveness: ping every `interval`; silent for `timeout` means gone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Liveness {
    pub interval: Duration,
    pub timeout: Duration,
}

/// Validated configuration: the only thing `run` accepts.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: String,
    pub port: u16,
    /// `--model`: a preset or layers from a file, shaped to the data at start.
    pub model: ModelChoice,
    /// `--data`: a CSV file, an IDX directory or an image folder (text for a GPT); `None`:
    /// embedded MNIST (Shakespeare for a GPT).
    pub data: Option<PathBuf>,
    /// `--tokenizer`: how a GPT's text becomes tokens.
    pub tokenizer: crate::dataset::TokenizerKind,
    /// `--init`: initial weights (safetensors).
    pub init: Option<PathBuf>,
    /// `--test-fraction`: the share of samples kept on the coordinator for evaluation.
    pub test_fraction: f64,
    /// What the core is given: the training flags, checked, built once (the model's name,
    /// the role, the checkpoint interval included).
    pub training: Settings,
    pub liveness: Liveness,
    /// `--admin-token`: the admin API's bearer token.
    pub admin_token: Option<String>,
    pub allowed_origins: Origins,
    pub max_per_ip: usize,
    /// Serve the page from here instead of the copy built into the binary.
    pub web_dir: Option<PathBuf>,
    /// `--max-upload-rate`, in bytes a second.
    pub upload_rate: Option<f64>,
    /// `--upload-memory`, in bytes.
    pub upload_memory: usize,
    /// `--upload-slots-per-ip` (none: half the slots).
    pub upload_slots_per_ip: Option<usize>,
    /// `--tls-cert` and `--tls-key`: serve https/wss.
    pub tls: Option<TlsFiles>,
    pub log_level: String,
    pub log_format: LogFormat,
    /// `--checkpoint-dir` and its companions (by default a run directory under `runs/`).
    pub checkpoints: Option<CheckpointConfig>,
    /// `--exit-when-finished` (always, for an edge or a root): stop once training finishes
    /// instead of serving the finished run until stopped.
    pub exit_when_finished: bool,
    /// `--role` and, for an edge or a root, its cluster.
    pub role: crate::cluster::Role,
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// `--data-part I/N` (0-based here): this edge's part of the train split.
    pub data_part: Option<(usize, usize)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    pub dir: PathBuf,
    pub every: u64,
    pub keep: usize,
    pub resume: bool,
}

/// A PEM certificate chain and its private key.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Config {
    /// The data these flags name (`--data`, a GPT's text and `--tokenizer`, the embedded
    /// default), split with `seed` as a run with that seed splits it.
    pub fn load_data(&self, seed: u64) -> Result<crate::dataset::Split, crate::dataset::DataError> {
        crate::dataset::load_for(
            &self.model,
            self.data.as_deref(),
            &self.tokenizer,
            seed,
            self.test_fraction,
        )
    }
}

/// Longest round timeout or ping timeout accepted.
const MAX_DURATION: Duration = Duration::from_secs(3600);

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    fn try_from(cli: Cli) -> Result<Self, ConfigError> {
        let hidden = cli.hidden.clone().unwrap_or_else(|| vec![128]);
        let model = ModelChoice::from_flags(&cli.model, &hidden, cli.hidden.is_some())?
            .with_gpt_flags(cli.gpt_layers, cli.gpt_heads, cli.gpt_width, cli.context)?;
        if !(cli.test_fraction > 0.0 && cli.test_fraction < 1.0) {
            return Err(ConfigError::TestFraction(cli.test_fraction));
        }
        let (stepping, local) = optimizers(&cli, model.is_gpt())?;
        training_bounds(&cli)?;
        let aggregator = aggregator(&cli)?;
        let allowed_origins = origins(&cli.allowed_origins)?;
        let half = std::thread::available_parallelism().map_or(1, |n| n.get() / 2);
        let verify_cores = cli.verify_cores.unwrap_or(half).max(1);
        if cli.max_per_ip == 0 {
            return Err(ConfigError::MaxPerIp);
        }
        if cli.join_token.as_deref() == Some("") {
            return Err(ConfigError::EmptyJoinToken);
        }
        if cli.admin_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err(ConfigError::AdminToken);
        }
        let mode = mode(&cli)?;
        let (interval, timeout) = (cli.ping_interval, cli.ping_timeout);
        if interval.is_zero() || interval >= timeout || timeout > MAX_DURATION {
            return Err(ConfigError::Ping { interval, timeout });
        }
        let liveness = Liveness { interval, timeout };
        let checkpoints = checkpoints(&cli)?;
        let (role, cluster, data_part) = cluster::from_cli(&cli, &mode)?;
        let log_level = cli.log_level.to_ascii_lowercase();
        if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
            return Err(ConfigError::LogLevel(cli.log_level));
        }
        if let Some(dir) = cli.web_dir.as_ref().filter(|d| !d.is_dir()) {
            return Err(ConfigError::WebDir(dir.clone()));
        }
        if !(1..=16).contains(&cli.replicate) {
            return Err(ConfigError::Replicate(cli.replicate));
        }
        if cli.replicate > 1 && !matches!(mode, Mode::Sync { .. }) {
            return Err(ConfigError::ReplicateNeedsSync);
        }
        let upload_rate = match cli.max_upload_rate {
            Some(mb) if !(mb > 0.0 && mb <= 1e6) => return Err(ConfigError::UploadRate(mb)),
            mb => mb.map(|mb| mb * 1e6),
        };
        if !(1..=65536).contains(&cli.upload_memory) {
            return Err(ConfigError::UploadMemory(cli.upload_memory));
        }
        let tls = match (cli.tls_cert.clone(), cli.tls_key.clone()) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            _ => return Err(ConfigError::TlsPair),
        };
        let model_name = model.name();
        let weight_deltas = match (cli.weight_deltas, cli.delta_encoding) {
            (false, Some(_)) => return Err(ConfigError::DeltaEncodingWithoutDeltas),
            (false, None) => None,
            (true, Some(DeltaChoice::Int2)) => Some(Compression::Int2),
            (true, Some(DeltaChoice::Int4)) => Some(Compression::Int4),
            (true, None) => Some(Settings::delta_default(local.is_some())),
        };
        Ok(Self {
            host: cli.host,
            port: cli.port,
            model,
            tokenizer: cli.tokenizer,
            data: cli.data.clone(),
            init: cli.init.clone(),
            test_fraction: cli.test_fraction,
            training: Settings {
                local,
                edge: role == crate::cluster::Role::Edge,
                model_name,
                optimizer: stepping.optimizer,
                lr_schedule: stepping.schedule,
                clip_norm: stepping.clip,
                batch_size: cli.batch_size,
                eval_interval: cli.eval_interval,
                seed: cli.seed,
                max_rounds: cli.max_rounds,
                target_accuracy: cli.target_accuracy,
                target_loss: cli.target_loss,
                patience: cli.patience,
                min_workers: cli.min_workers,
                mode,
                aggregator,
                verify_fraction: cli.verify_fraction,
                verify_cores,
                weight_deltas,
                phases_by_noise: cli.phases_by_noise,
                probation: cli.probation,
                new_identities_per_address: cli.new_identities_per_address,
                new_identities_per_network: cli.new_identities_per_network,
                ban_after: cli.ban_after,
                max_grad_norm: cli.max_grad_norm,
                join_token: cli.join_token,
                max_workers: cli.max_workers,
                replicate: cli.replicate,
                checkpoint_every: checkpoints.as_ref().map(|c| c.every),
                audit_seed: None,
            },
            liveness,
            admin_token: cli.admin_token,
            allowed_origins,
            max_per_ip: cli.max_per_ip,
            web_dir: cli.web_dir,
            upload_rate,
            upload_memory: cli.upload_memory << 20,
            upload_slots_per_ip: cli.upload_slots_per_ip.map(|n| n as usize),
            tls,
            log_level,
            log_format: cli.log_format,
            checkpoints,
            exit_when_finished: cli.exit_when_finished || cli.role != RoleChoice::Single,
            role,
            cluster,
            data_part,
        })
    }
}

/// `--checkpoint-dir` and the flags that need it (defaults recognised by value). Without
/// it, a single coordinator keeps its run in a new directory under `runs/` (a finished run
/// keeps its model); an edge (whose root keeps the state) and a root (which keeps it in
/// NATS) take none, as with `--no-checkpoints`.
fn checkpoints(cli: &Cli) -> Result<Option<CheckpointConfig>, ConfigError> {
    let companion = match () {
        () if cli.checkpoint_every != 100 => Some("--checkpoint-every"),
        () if cli.keep_checkpoints != 3 => Some("--keep-checkpoints"),
        () => None,
    };
    if cli.no_checkpoints {
        return match (&cli.checkpoint_dir, cli.resume, companion) {
            (Some(_), _, _) => Err(ConfigError::NoCheckpoints("--checkpoint-dir")),
            (None, true, _) => Err(ConfigError::NoCheckpoints("--resume")),
            (None, false, Some(flag)) => Err(ConfigError::NoCheckpoints(flag)),
            (None, false, None) => Ok(None),
        };
    }
    let dir = match (cli.checkpoint_dir.clone(), cli.role) {
        (Some(dir), _) => dir,
        // A new run each time: `--resume` names the run it continues.
        (None, _) if cli.resume => return Err(ConfigError::NeedsCheckpointDir("--resume")),
        (None, RoleChoice::Single) => run_dir(&cli.model, std::time::SystemTime::now()),
        (None, _) => {
            return match companion {
                Some(flag) => Err(ConfigError::NeedsCheckpointDir(flag)),
                None => Ok(None),
            }
        }
    };
    if cli.checkpoint_every == 0 {
        return Err(ConfigError::CheckpointEvery);
    }
    if !(1..=1000).contains(&cli.keep_checkpoints) {
        return Err(ConfigError::KeepCheckpoints(cli.keep_checkpoints));
    }
    Ok(Some(CheckpointConfig {
        dir,
        every: cli.checkpoint_every,
        keep: cli.keep_checkpoints,
        resume: cli.resume,
    }))
}

/// `runs/<model>-<start time, UTC>/`, with `-2`, `-3`… if two runs start in the same second.
/// A model file's run is named after the file.
fn run_dir(model: &str, now: std::time::SystemTime) -> PathBuf {
    let name = std::path::Path::new(model)
        .file_stem()
        .map_or_else(|| model.to_string(), |s| s.to_string_lossy().into_owned());
    // 2026-11-27T20:39:48Z → 20261127-203948
    let stamp: String = humantime::format_rfc3339_seconds(now)
        .to_string()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let base = format!("{name}-{}-{}", &stamp[..8], &stamp[8..]);
    let runs = PathBuf::from("runs");
    (1..)
        .map(|n| match n {
            1 => runs.join(&base),
            n => runs.join(format!("{base}-{n}")),
        })
        .find(|dir| !dir.exists())
        .expect("an unused name")
}

/// `--allowed-origin`s.
fn origins(raw: &[String]) -> Result<Origins, ConfigError> {
    if raw.iter().any(|o| o == "*") {
        return Ok(Origins::Any);
    }
    for o in raw {
        let ok = o.split_once("://").is_some_and(|(scheme, host)| {
            matches!(scheme, "http" | "https")
                && !host.is_empty()
                && !host.trim_end_matches('/').contains('/')
        });
        if !ok {
            return Err(ConfigError::AllowedOrigin(o.clone()));
        }
    }
    Ok(Origins::Own(raw.to_vec()))
}

/// Checks the mode's flags together. Flags of another mode are refused rather than silently
/// ignored (defaults are recognised by value, as clap does not say what was typed).
fn mode(cli: &Cli) -> Result<Mode, ConfigError> {
    let sync_flags = cli.round_timeout != "auto" || cli.miss_limit != 3;
    let async_flags = cli.buffer != 1 || cli.max_staleness != 8;
    match cli.mode {
        ModeChoice::Sync => {
            if async_flags {
                return Err(ConfigError::FlagForOtherMode {
                    flag: "--buffer/--max-staleness",
                    mode: "async",
                });
            }
            let timeout = match cli.round_timeout.as_str() {
                "auto" => RoundTimeout::Auto,
                raw => match parse_duration(raw) {
                    Ok(d) if !d.is_zero() && d <= MAX_DURATION => RoundTimeout::Fixed(d),
                    _ => return Err(ConfigError::RoundTimeout(raw.to_string())),
                },
            };
            if cli.miss_limit == 0 {
                return Err(ConfigError::MissLimit);
            }
            Ok(Mode::Sync {
                timeout,
                miss_limit: cli.miss_limit,
            })
        }
        ModeChoice::Async | ModeChoice::Hogwild if sync_flags => {
            Err(ConfigError::FlagForOtherMode {
                flag: "--round-timeout/--miss-limit",
                mode: "sync",
            })
        }
        ModeChoice::Async => {
            if !(1..=10_000).contains(&cli.buffer) {
                return Err(ConfigError::Buffer(cli.buffer));
            }
            Ok(Mode::Async {
                buffer: cli.buffer,
                max_staleness: cli.max_staleness,
            })
        }
        ModeChoice::Hogwild if async_flags => Err(ConfigError::FlagForOtherMode {
            flag: "--buffer/--max-staleness",
            mode: "async",
        }),
        ModeChoice::Hogwild => Ok(Mode::Hogwild),
    }
}

impl Config {
    /// Parses and validates flags as the binary would, without the environment (handy in
    /// tests and tools).
    pub fn from_args<I, T>(args: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::from_layers(args, |_| None)
    }

    /// The same with `env` as the environment (`CROWDTRAIN_*`) and any `--config` file.
    pub fn from_layers<I, T>(args: I, env: impl Fn(&str) -> Option<String>) -> Result<Self, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args = args.into_iter().map(Into::into).collect();
        let cli = layers::parse(args, env).map_err(|e| e.to_string())?;
        Self::try_from(cli).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests;

/// The training flags' bounds: each out of range is refused, naming the flag.
fn training_bounds(cli: &Cli) -> Result<(), ConfigError> {
    if cli.batch_size == 0 || cli.batch_size as usize > MAX_BATCH {
        return Err(ConfigError::BatchSize {
            got: cli.batch_size,
            max: MAX_BATCH,
        });
    }
    if cli.eval_interval == 0 {
        return Err(ConfigError::EvalInterval);
    }
    if cli.max_rounds == Some(0) {
        return Err(ConfigError::MaxRounds);
    }
    if let Some(t) = cli.target_loss.filter(|t| !(t.is_finite() && *t > 0.0)) {
        return Err(ConfigError::TargetLoss(t));
    }
    if let Some(t) = cli.target_accuracy {
        if !(t > 0.0 && t <= 1.0) {
            return Err(ConfigError::TargetAccuracy(t));
        }
    }
    if cli.min_workers == 0 {
        return Err(ConfigError::MinWorkers);
    }
    if cli.min_workers > cli.max_workers {
        return Err(ConfigError::MinAboveMax {
            min: cli.min_workers,
            max: cli.max_workers,
        });
    }
    if let Some(n) = cli.max_grad_norm.filter(|n| !(*n > 0.0 && *n <= 1e30)) {
        return Err(ConfigError::MaxGradNorm(n));
    }
    if !(0.0..=1.0).contains(&cli.verify_fraction) {
        return Err(ConfigError::VerifyFraction(cli.verify_fraction));
    }
    if cli.verify_cores.is_some_and(|n| !(1..=1024).contains(&n)) {
        return Err(ConfigError::VerifyCores);
    }
    if cli.ban_after == 0 {
        return Err(ConfigError::BanAfter);
    }
    if cli.new_identities_per_address == 0 || cli.new_identities_per_network == 0 {
        return Err(ConfigError::NewIdentities);
    }
    Ok(())
}

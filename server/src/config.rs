//! Command-line flags (`Cli`, raw) and the validated `Config` that `run` takes.
//!
//! Everything is checked together in `Config::try_from(cli)` before anything starts, so a
//! bad combination is refused with a message instead of surfacing mid-training.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use model::OptimizerKind;
use thiserror::Error;

use crate::deadline::RoundTimeout;

/// Samples in the default dataset's train split; the rest (2,000) is the test split.
pub const TRAIN_SAMPLES: usize = 8000;

/// Train a model together: the crowdtrain coordinator (rank-0 parameter server).
///
/// Serves the volunteer page at http://HOST:PORT/, accepts workers on ws://HOST:PORT/ws and
/// trains an MLP on the embedded MNIST digits (10,000 samples: 8,000 train, 2,000 test).
#[derive(Debug, Clone, Parser)]
#[command(name = "coordinator", version)]
pub struct Cli {
    /// Address to listen on. Use 0.0.0.0 to accept workers from other machines.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// Hidden layer widths, comma-separated (input 784 and output 10 are fixed by the data).
    #[arg(long, value_delimiter = ',', default_value = "128")]
    pub hidden: Vec<usize>,

    /// Optimizer the coordinator applies to the averaged gradient.
    #[arg(long, value_enum, default_value_t = OptimizerChoice::Adam)]
    pub optimizer: OptimizerChoice,

    /// Learning rate [default: 0.001 for adam, 0.1 for sgd, 0.05 for momentum].
    #[arg(long)]
    pub lr: Option<f32>,

    /// Momentum coefficient; only with --optimizer momentum [default: 0.9].
    #[arg(long)]
    pub momentum: Option<f32>,

    /// Samples per gradient, per worker and round.
    #[arg(long, default_value_t = 32)]
    pub batch_size: u32,

    /// Evaluate on the test split every N rounds.
    #[arg(long, default_value_t = 10)]
    pub eval_interval: u64,

    /// Seed for the initial weights and the train/test split.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,

    /// Stop (exit 0) after this many rounds.
    #[arg(long)]
    pub max_rounds: Option<u64>,

    /// Stop (exit 0) as soon as an evaluation reaches this test accuracy (0-1).
    #[arg(long)]
    pub target_accuracy: Option<f64>,

    /// Training mode: sync (rounds with a barrier, deadline and quorum), async (apply
    /// gradients as they arrive, staleness-bounded) or hogwild (apply at once, no checks).
    #[arg(long, value_enum, default_value_t = ModeChoice::Sync)]
    pub mode: ModeChoice,

    /// Sync: open a round only with at least this many workers, and close it at its deadline
    /// only with at least this many answers (the quorum).
    #[arg(long, default_value_t = 1)]
    pub min_workers: usize,

    /// Sync: seconds a round waits for stragglers, or `auto` (1.5 × the 90th percentile of
    /// recent answer times, clamped to 0.25-60 s).
    #[arg(long, default_value = "auto")]
    pub round_timeout: String,

    /// Sync: a worker that misses this many deadlines in a row leaves the quorum until it
    /// answers again.
    #[arg(long, default_value_t = 3)]
    pub miss_limit: u32,

    /// Async: apply an update every B gradients (FedBuff-style buffer).
    #[arg(long, default_value_t = 1)]
    pub buffer: usize,

    /// Async: reject gradients computed on weights more than S versions old; fresher stale
    /// ones are down-weighted by 1 / (1 + staleness).
    #[arg(long, default_value_t = 8)]
    pub max_staleness: u64,

    /// Seconds between WebSocket pings to each worker.
    #[arg(long, default_value_t = 5.0)]
    pub ping_interval: f64,

    /// Seconds without any frame (pong or data) after which a worker is considered gone.
    #[arg(long, default_value_t = 20.0)]
    pub ping_timeout: f64,

    /// Require workers to present this token in Hello.
    #[arg(long, env = "CROWDTRAIN_JOIN_TOKEN")]
    pub join_token: Option<String>,

    /// Refuse workers beyond this many connected at once.
    #[arg(long, default_value_t = 10_000)]
    pub max_workers: usize,

    /// Directory with the volunteer page and the built wasm package (web/pkg).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../web"))]
    pub web_dir: PathBuf,

    /// Log level: error, warn, info, debug or trace (RUST_LOG overrides it).
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeChoice {
    Sync,
    Async,
    Hogwild,
}

/// How gradients become updates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Rounds with a barrier, a deadline and a quorum.
    Sync {
        timeout: RoundTimeout,
        miss_limit: u32,
    },
    /// Apply each buffer of `buffer` gradients as it fills; reject staleness above the bound.
    Async { buffer: usize, max_staleness: u64 },
    /// Apply every gradient at once, whatever weights it was computed on.
    Hogwild,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sync { .. } => "sync",
            Self::Async { .. } => "async",
            Self::Hogwild => "hogwild",
        }
    }
}

/// WebSocket liveness: ping every `interval`; silent for `timeout` means gone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Liveness {
    pub interval: Duration,
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptimizerChoice {
    Sgd,
    Momentum,
    Adam,
}

/// Validated configuration: the only thing `run` accepts.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: String,
    pub port: u16,
    /// Every layer width, input first (e.g. `[784, 128, 10]`).
    pub layers: Vec<usize>,
    pub optimizer: OptimizerKind,
    pub batch_size: u32,
    pub eval_interval: u64,
    pub seed: u64,
    pub max_rounds: Option<u64>,
    pub target_accuracy: Option<f64>,
    pub min_workers: usize,
    pub mode: Mode,
    pub liveness: Liveness,
    pub join_token: Option<String>,
    pub max_workers: usize,
    pub web_dir: PathBuf,
    pub log_level: String,
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error("--hidden: every width must be between 1 and {max}, got {got}")]
    HiddenWidth { got: usize, max: usize },
    #[error("--hidden: at most {max} hidden layers, got {got}")]
    TooManyLayers { got: usize, max: usize },
    #[error("--lr must be a finite number in (0, 10], got {0}")]
    LearningRate(f32),
    #[error("--momentum only applies to --optimizer momentum (got --optimizer {0})")]
    MomentumWithoutMomentumOptimizer(&'static str),
    #[error("--momentum must be in [0, 1), got {0}")]
    Momentum(f32),
    #[error("--batch-size must be between 1 and {max} (the train split), got {got}")]
    BatchSize { got: u32, max: usize },
    #[error("--eval-interval must be at least 1")]
    EvalInterval,
    #[error("--max-rounds must be at least 1")]
    MaxRounds,
    #[error("--target-accuracy must be in (0, 1], got {0}")]
    TargetAccuracy(f64),
    #[error("--min-workers must be at least 1")]
    MinWorkers,
    #[error(
        "--min-workers ({min}) is larger than --max-workers ({max}): no round could ever start"
    )]
    MinAboveMax { min: usize, max: usize },
    #[error("--round-timeout must be `auto` or seconds in (0, 3600], got {0:?}")]
    RoundTimeout(String),
    #[error("--miss-limit must be at least 1")]
    MissLimit,
    #[error("--buffer must be between 1 and 10000, got {0}")]
    Buffer(usize),
    #[error("{flag} only applies to --mode {mode}")]
    FlagForOtherMode {
        flag: &'static str,
        mode: &'static str,
    },
    #[error("--ping-interval and --ping-timeout must be positive seconds with the interval shorter than the timeout, got {interval} and {timeout}")]
    Ping { interval: f64, timeout: f64 },
    #[error("--join-token must not be empty")]
    EmptyJoinToken,
    #[error("--log-level must be one of error, warn, info, debug, trace; got {0:?}")]
    LogLevel(String),
    #[error("--web-dir {0:?} is not a directory")]
    WebDir(PathBuf),
}

/// Widest hidden layer accepted: keeps one model's weights far below the frame limit.
const MAX_HIDDEN_WIDTH: usize = 4096;
const MAX_HIDDEN_LAYERS: usize = 8;

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    fn try_from(cli: Cli) -> Result<Self, ConfigError> {
        if cli.hidden.len() > MAX_HIDDEN_LAYERS {
            return Err(ConfigError::TooManyLayers {
                got: cli.hidden.len(),
                max: MAX_HIDDEN_LAYERS,
            });
        }
        if let Some(&bad) = cli.hidden.iter().find(|&&w| w == 0 || w > MAX_HIDDEN_WIDTH) {
            return Err(ConfigError::HiddenWidth {
                got: bad,
                max: MAX_HIDDEN_WIDTH,
            });
        }
        let (default_lr, name) = match cli.optimizer {
            OptimizerChoice::Sgd => (0.1, "sgd"),
            OptimizerChoice::Momentum => (0.05, "momentum"),
            OptimizerChoice::Adam => (0.001, "adam"),
        };
        let lr = cli.lr.unwrap_or(default_lr);
        if !(lr.is_finite() && lr > 0.0 && lr <= 10.0) {
            return Err(ConfigError::LearningRate(lr));
        }
        if cli.momentum.is_some() && cli.optimizer != OptimizerChoice::Momentum {
            return Err(ConfigError::MomentumWithoutMomentumOptimizer(name));
        }
        let optimizer = match cli.optimizer {
            OptimizerChoice::Sgd => OptimizerKind::Sgd { lr },
            OptimizerChoice::Momentum => {
                let momentum = cli.momentum.unwrap_or(0.9);
                if !(0.0..1.0).contains(&momentum) {
                    return Err(ConfigError::Momentum(momentum));
                }
                OptimizerKind::Momentum { lr, momentum }
            }
            OptimizerChoice::Adam => OptimizerKind::Adam {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        };
        if cli.batch_size == 0 || cli.batch_size as usize > TRAIN_SAMPLES {
            return Err(ConfigError::BatchSize {
                got: cli.batch_size,
                max: TRAIN_SAMPLES,
            });
        }
        if cli.eval_interval == 0 {
            return Err(ConfigError::EvalInterval);
        }
        if cli.max_rounds == Some(0) {
            return Err(ConfigError::MaxRounds);
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
        if cli.join_token.as_deref() == Some("") {
            return Err(ConfigError::EmptyJoinToken);
        }
        let mode = mode(&cli)?;
        let (interval, timeout) = (cli.ping_interval, cli.ping_timeout);
        if !(interval.is_finite()
            && timeout.is_finite()
            && interval > 0.0
            && interval < timeout
            && timeout <= 3600.0)
        {
            return Err(ConfigError::Ping { interval, timeout });
        }
        let liveness = Liveness {
            interval: Duration::from_secs_f64(interval),
            timeout: Duration::from_secs_f64(timeout),
        };
        let log_level = cli.log_level.to_ascii_lowercase();
        if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
            return Err(ConfigError::LogLevel(cli.log_level));
        }
        if !cli.web_dir.is_dir() {
            return Err(ConfigError::WebDir(cli.web_dir));
        }
        let mut layers = vec![crate::dataset::FEATURES];
        layers.extend(&cli.hidden);
        layers.push(crate::dataset::CLASSES);
        Ok(Self {
            host: cli.host,
            port: cli.port,
            layers,
            optimizer,
            batch_size: cli.batch_size,
            eval_interval: cli.eval_interval,
            seed: cli.seed,
            max_rounds: cli.max_rounds,
            target_accuracy: cli.target_accuracy,
            min_workers: cli.min_workers,
            mode,
            liveness,
            join_token: cli.join_token,
            max_workers: cli.max_workers,
            web_dir: cli.web_dir,
            log_level,
        })
    }
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
                raw => match raw.parse::<f64>() {
                    Ok(secs) if secs > 0.0 && secs <= 3600.0 => {
                        RoundTimeout::Fixed(Duration::from_secs_f64(secs))
                    }
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
    /// Parses and validates flags as the binary would (handy in tests and tools).
    pub fn from_args<I, T>(args: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        Self::try_from(cli).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        Config::from_args(std::iter::once("coordinator").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = parse(&[]).expect("defaults are valid");
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 8080));
        assert_eq!(c.layers, [784, 128, 10]);
        assert!(matches!(c.optimizer, OptimizerKind::Adam { lr, .. } if lr == 0.001));
        assert_eq!((c.batch_size, c.eval_interval, c.min_workers), (32, 10, 1));
        assert_eq!(
            c.mode,
            Mode::Sync {
                timeout: RoundTimeout::Auto,
                miss_limit: 3
            }
        );
        assert_eq!(c.liveness.timeout, Duration::from_secs(20));
    }

    #[test]
    fn modes_take_their_own_flags() {
        let c = parse(&["--round-timeout", "0.5", "--miss-limit", "2"]).expect("valid");
        let timeout = RoundTimeout::Fixed(Duration::from_millis(500));
        assert_eq!(
            c.mode,
            Mode::Sync {
                timeout,
                miss_limit: 2
            }
        );
        let c =
            parse(&["--mode", "async", "--buffer", "4", "--max-staleness", "3"]).expect("valid");
        assert_eq!(
            c.mode,
            Mode::Async {
                buffer: 4,
                max_staleness: 3
            }
        );
        assert_eq!(
            parse(&["--mode", "hogwild"]).expect("valid").mode,
            Mode::Hogwild
        );
    }

    #[test]
    fn flags_are_applied() {
        let c = parse(&[
            "--hidden",
            "64,32",
            "--optimizer",
            "momentum",
            "--momentum",
            "0.5",
            "--lr",
            "0.2",
            "--max-rounds",
            "7",
            "--target-accuracy",
            "0.9",
            "--port",
            "0",
        ])
        .expect("valid");
        assert_eq!(c.layers, [784, 64, 32, 10]);
        assert_eq!(
            c.optimizer,
            OptimizerKind::Momentum {
                lr: 0.2,
                momentum: 0.5
            }
        );
        assert_eq!(
            (c.max_rounds, c.target_accuracy, c.port),
            (Some(7), Some(0.9), 0)
        );
    }

    #[test]
    fn bad_combinations_are_refused_with_a_clear_message() {
        let cases: &[(&[&str], &str)] = &[
            (&["--hidden", "0"], "--hidden"),
            (&["--hidden", "1,2,3,4,5,6,7,8,9"], "at most 8"),
            (&["--lr", "0"], "--lr"),
            (&["--lr", "NaN"], "--lr"),
            (
                &["--momentum", "0.9"],
                "only applies to --optimizer momentum",
            ),
            (&["--optimizer", "momentum", "--momentum", "1.0"], "[0, 1)"),
            (&["--batch-size", "0"], "--batch-size"),
            (&["--batch-size", "9000"], "--batch-size"),
            (&["--eval-interval", "0"], "--eval-interval"),
            (&["--max-rounds", "0"], "--max-rounds"),
            (&["--target-accuracy", "1.5"], "--target-accuracy"),
            (&["--min-workers", "0"], "--min-workers"),
            (
                &["--min-workers", "5", "--max-workers", "2"],
                "no round could ever start",
            ),
            (&["--join-token", ""], "--join-token"),
            (&["--log-level", "loud"], "--log-level"),
            (&["--web-dir", "/definitely/not/here"], "--web-dir"),
            (&["--optimizer", "rmsprop"], "invalid value 'rmsprop'"),
            (&["--round-timeout", "soon"], "--round-timeout"),
            (&["--round-timeout", "0"], "--round-timeout"),
            (&["--miss-limit", "0"], "--miss-limit"),
            (&["--buffer", "4"], "only applies to --mode async"),
            (&["--mode", "async", "--buffer", "0"], "--buffer"),
            (
                &["--mode", "async", "--round-timeout", "2"],
                "only applies to --mode sync",
            ),
            (
                &["--mode", "hogwild", "--max-staleness", "2"],
                "only applies to --mode async",
            ),
            (&["--ping-interval", "30"], "--ping-interval"),
        ];
        for (args, needle) in cases {
            let err = parse(args).expect_err(&format!("{args:?} must be refused"));
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }
}

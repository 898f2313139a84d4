//! Why a command line is refused: one variant per rule, each naming the flag.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error("{0}")]
    Cluster(String),
    #[error("--hidden: every width must be between 1 and {max}, got {got}")]
    HiddenWidth { got: usize, max: usize },
    #[error("--hidden: at most {max} hidden layers, got {got}")]
    TooManyLayers { got: usize, max: usize },
    #[error("--hidden only applies to --model mlp")]
    HiddenWithoutMlp,
    #[error("the gpt: {0}")]
    Gpt(String),
    #[error("--model {path}: {reason}")]
    ModelFile { path: PathBuf, reason: String },
    #[error("--test-fraction must be in (0, 1), got {0}")]
    TestFraction(f64),
    #[error("--lr must be a finite number in (0, 10], got {0}")]
    LearningRate(f32),
    #[error("--momentum only applies to --optimizer momentum or nesterov (got --optimizer {0})")]
    MomentumWithoutMomentumOptimizer(&'static str),
    #[error("--weight-decay only applies to --optimizer adamw or --inner-optimizer adamw (got --optimizer {0})")]
    DecayWithoutAdamW(&'static str),
    #[error("--weight-decay must be in [0, 1) and below 1 / --lr, got {0}")]
    WeightDecay(f32),
    #[error("--clip applies to the coordinator's step on each gradient, not with --local-steps (a phase's inner steps follow --inner-optimizer)")]
    ClipWithLocalSteps,
    #[error("--min-lr must be a finite number in [0, --lr], got {0}")]
    MinLr(f32),
    #[error("--lr-decay-steps ({decay}) must be above --warmup ({warmup})")]
    DecayBeforeWarmup { decay: u64, warmup: u64 },
    #[error("--target-loss must be a finite number above 0, got {0}")]
    TargetLoss(f64),
    #[error("--clip must be a finite number above 0, got {0}")]
    Clip(f32),
    #[error("--momentum must be in [0, 1), got {0}")]
    Momentum(f32),
    #[error("--local-steps must be a whole number from 1 to 100000, or auto (and --max-local-steps from 1 to 100000); got {0}")]
    LocalSteps(String),
    #[error("--max-local-epochs must be a positive number, got {0}")]
    LocalEpochs(f64),
    #[error("--min-local-steps must be from 1 to --max-local-steps ({max}), got {min}")]
    MinLocalSteps { min: u32, max: u32 },
    #[error("--min-local-steps, --max-local-steps and --max-local-epochs only apply to --local-steps auto")]
    MaxLocalStepsWithoutAuto,
    #[error("--min-local-steps, --max-local-steps, --max-local-epochs, --inner-optimizer and --inner-lr only apply with --local-steps")]
    InnerWithoutLocalSteps,
    #[error("with --local-steps 1 every answer is one batch's gradient, for --optimizer to apply: --inner-optimizer and --inner-lr do not apply")]
    InnerWithOneStep,
    #[error("--delta-encoding only applies with --weight-deltas true")]
    DeltaEncodingWithoutDeltas,
    #[error("--inner-lr must be a finite number in (0, 10], got {0}")]
    InnerLearningRate(f32),
    #[error("--batch-size must be between 1 and {max}, got {got}")]
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
    #[error("--round-timeout must be `auto` or a duration in (0, 1h] (2s, 500ms, or seconds), got {0:?}")]
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
    #[error("--ping-interval and --ping-timeout must be positive, at most 1h, with the interval shorter than the timeout; got {interval:?} and {timeout:?}")]
    Ping {
        interval: Duration,
        timeout: Duration,
    },
    #[error("--trim must be in [0, 0.5), got {0}")]
    Trim(f32),
    #[error("--trim only applies to --aggregator mean-around-median, trimmed-mean or multi-krum")]
    TrimWithoutTrimmedMean,
    #[error("--replicate must be between 1 and 16, got {0}")]
    Replicate(usize),
    #[error("--replicate only applies to --mode sync (async answers are on different weights)")]
    ReplicateNeedsSync,
    #[error("--max-upload-rate must be a number of MB a second in (0, 1e6], got {0}")]
    UploadRate(f64),
    #[error("--tls-cert and --tls-key go together: give both, or neither for plain http")]
    TlsPair,
    #[error("--clip-radius only applies to --aggregator centered-clip")]
    ClipRadiusWithoutCenteredClip,
    #[error("--clip-radius must be a number in (0, 1e30], got {0}")]
    ClipRadius(f64),
    #[error("--aggregator-memory must be between 1 and 65536 MiB, got {0}")]
    AggregatorMemory(usize),
    #[error("--upload-memory must be between 1 and 65536 MiB, got {0}")]
    UploadMemory(usize),
    #[error("--max-grad-norm must be a number in (0, 1e30], got {0}")]
    MaxGradNorm(f64),
    #[error(
        "--allowed-origin must be * or scheme://host[:port] with scheme http or https, got {0:?}"
    )]
    AllowedOrigin(String),
    #[error("--verify-fraction must be in [0, 1], got {0}")]
    VerifyFraction(f64),
    #[error("--verify-cores must be between 1 and 1024")]
    VerifyCores,
    #[error("--worker-momentum must be in [0, 1), got {0}")]
    WorkerMomentum(f32),
    #[error("--ban-after must be at least 1")]
    BanAfter,
    #[error(
        "--new-identities-per-address and --new-identities-per-network must be at least 1 \
         (no new worker could join)"
    )]
    NewIdentities,
    #[error("--max-per-ip must be at least 1")]
    MaxPerIp,
    #[error("--join-token must not be empty")]
    EmptyJoinToken,
    #[error("--admin-token must be at least 16 characters: it guards pause, stop and the weights")]
    AdminToken,
    #[error("--log-level must be one of error, warn, info, debug, trace; got {0:?}")]
    LogLevel(String),
    #[error("--web-dir {0:?} is not a directory")]
    WebDir(PathBuf),
    #[error("{0} needs --checkpoint-dir")]
    NeedsCheckpointDir(&'static str),
    #[error("{0} asks for checkpoints, which --no-checkpoints turns off")]
    NoCheckpoints(&'static str),
    #[error("--checkpoint-every must be at least 1")]
    CheckpointEvery,
    #[error("--keep-checkpoints must be between 1 and 1000, got {0}")]
    KeepCheckpoints(usize),
}

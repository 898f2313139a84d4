//! The command line as typed: every flag, its default and its help text.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// Train a model together: the crowdtrain coordinator (rank-0 parameter server).
///
/// Serves the volunteer page at http://HOST:PORT/, accepts workers on ws://HOST:PORT/ws and
/// trains an MLP on the embedded MNIST digits (10,000 samples: 8,000 train, 2,000 test).
#[derive(Debug, Clone, Parser)]
#[command(name = "coordinator", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Without a command: train.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Read settings from this TOML file: `flag-name = value` for any flag. Flags override
    /// the environment (CROWDTRAIN_FLAG_NAME), which overrides the file [env: CROWDTRAIN_CONFIG].
    #[arg(long)]
    pub config: Option<PathBuf>,

    /// Address to listen on. Use 0.0.0.0 to accept workers from other machines (a gpt then
    /// takes local phases by default: --local-steps).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// The model: `mlp`, `cnn`, `gpt` (a language model: nanoGPT's CPU configuration,
    /// 4 layers, 4 heads, width 128, context 64), `gpt-10m` (its `shakespeare_char` one:
    /// 6, 6, 384, 256), or a TOML / JSON file of layers. Input shape and classes (a GPT's
    /// vocabulary) come from the data.
    #[arg(long, default_value = "mlp", value_name = "PRESET|FILE")]
    pub model: String,

    /// A GPT's transformer blocks [default: the preset's].
    #[arg(long, value_name = "N")]
    pub gpt_layers: Option<usize>,

    /// A GPT's attention heads per block; they divide the width [default: the preset's].
    #[arg(long, value_name = "N")]
    pub gpt_heads: Option<usize>,

    /// A GPT's width (the residual stream's) [default: the preset's].
    #[arg(long, value_name = "N")]
    pub gpt_width: Option<usize>,

    /// A GPT's context: the tokens each sample reads [default: the preset's].
    #[arg(long, value_name = "N")]
    pub context: Option<usize>,

    /// How a GPT's text becomes tokens: `char` (one per distinct character of the corpus),
    /// `byte` (256), or the path of a Hugging Face `tokenizer.json` (a BPE as GPT-2's; the
    /// coordinator tokenises, workers only see ids).
    #[arg(long, default_value = "char", value_name = "char|byte|FILE")]
    pub tokenizer: crate::dataset::TokenizerKind,

    /// Hidden layer widths of `--model mlp`, comma-separated [default: 128].
    #[arg(long, value_delimiter = ',')]
    pub hidden: Option<Vec<usize>>,

    /// Training data: a .csv file (header, an integer `label` column, numeric features), a
    /// directory with an IDX pair (MNIST layout, optionally .gz), or a directory of class
    /// folders of PNG/JPEG images; for a GPT, a .txt file or a folder of them. Default:
    /// the 10,000 MNIST digits built in (a GPT: eight Shakespeare tragedies).
    #[arg(long, value_name = "PATH")]
    pub data: Option<PathBuf>,

    /// Start from these weights (a safetensors file with the model's tensor names and
    /// shapes, e.g. from /api/params or `coordinator export`) instead of a random init.
    /// A checkpoint given by --resume wins over it.
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,

    /// Share of the samples kept on the coordinator as the (seeded) test split.
    #[arg(long, default_value_t = 0.2)]
    pub test_fraction: f64,

    /// Optimizer the coordinator applies to the combined gradient (with --local-steps, to
    /// the combined pseudo-gradient: the outer optimizer) [default: adam; adamw for a gpt;
    /// with --local-steps, nesterov in sync mode and sgd at lr 1 (averaging) otherwise].
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerChoice>,

    /// Learning rate [default: 0.001 for adam, 0.1 for sgd (1 as the outer optimizer of
    /// async local steps), 0.05 for momentum, 0.7 for nesterov].
    #[arg(long)]
    pub lr: Option<f32>,

    /// Momentum coefficient; only with --optimizer momentum or nesterov [default: 0.9].
    #[arg(long)]
    pub momentum: Option<f32>,

    /// AdamW's decoupled weight decay, on matrices only (not biases, norms or embeddings);
    /// only with --optimizer adamw or --inner-optimizer adamw [default: 0.1].
    #[arg(long)]
    pub weight_decay: Option<f32>,

    /// Linear learning-rate warm-up over this many steps, then cosine decay (nanoGPT's
    /// schedule); with --local-steps, over this many outer steps, after which the outer
    /// rate holds unless --lr-decay-steps is given [default: 100 for a gpt's per-step
    /// exchange, none otherwise].
    #[arg(long)]
    pub warmup: Option<u64>,

    /// The cosine decay reaches --min-lr at this step [default: --max-rounds; without it,
    /// or with --local-steps, no decay after the warm-up].
    #[arg(long)]
    pub lr_decay_steps: Option<u64>,

    /// The learning rate's floor after the decay [default: --lr / 10].
    #[arg(long)]
    pub min_lr: Option<f32>,

    /// Clip the combined gradient's global L2 norm to this before the step; not with
    /// --local-steps [default: 1 for a gpt, none otherwise].
    #[arg(long)]
    pub clip: Option<f32>,

    /// Each worker takes this many inner steps on consecutive batches before it answers,
    /// with the pseudo-gradient (the weights it got minus the weights it ended with), or
    /// `auto`: each worker's own number, so that its link takes at most about 10 % of its
    /// time, and in sync mode as many as end with the round (the typical worker's phase,
    /// or the slowest one's floor) [default: one step, answered with its gradient; `auto` for a gpt whose --host
    /// is not loopback, unless --warmup, --lr-decay-steps, --min-lr or --clip is given].
    #[arg(long)]
    pub local_steps: Option<String>,

    /// With --local-steps auto: the most steps a phase may take [default: 4096].
    #[arg(long)]
    pub max_local_steps: Option<u32>,

    /// With --local-steps auto: the fewest steps a phase may take [default: 16 for adam and
    /// adamw, whose moments start fresh each phase; 1 otherwise].
    #[arg(long)]
    pub min_local_steps: Option<u32>,

    /// With --local-steps auto: the most passes a phase may make over the worker's own
    /// shard; longer phases drift towards the shard's samples [default: 1].
    #[arg(long)]
    pub max_local_epochs: Option<f64>,

    /// With --local-steps auto in sync mode: once the gradient noise scale is measured, a
    /// phase is at most √(B_noise·c / (B_step·s)) steps, shorter where the crowd's answers
    /// already average many noise scales; false: the link alone sizes it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub phases_by_noise: bool,

    /// With --local-steps: the workers' optimizer for the inner steps, fresh each phase
    /// [default: sgd; adamw for a gpt].
    #[arg(long, value_enum)]
    pub inner_optimizer: Option<InnerChoice>,

    /// With --local-steps: the inner learning rate [default: 0.1 for sgd, 0.05 for
    /// momentum, 0.001 for adam and adamw].
    #[arg(long)]
    pub inner_lr: Option<f32>,

    /// With --local-steps: a GPU may take a phase in its own order, committing to its state
    /// every this many steps (a ReLU model's with its near-ties' branches logged), and is
    /// checked by segments; 0 keeps every phase in the coordinator's order [default: 8].
    #[arg(long)]
    pub segment_steps: Option<u32>,

    /// Samples per gradient, per worker and round.
    #[arg(long, default_value_t = 32)]
    pub batch_size: u32,

    /// Evaluate on the test split every N rounds.
    #[arg(long, default_value_t = 10)]
    pub eval_interval: u64,

    /// Seed for the initial weights and the train/test split.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,

    /// Finish after this many rounds (then serve the finished run, or exit 0 with
    /// --exit-when-finished).
    #[arg(long)]
    pub max_rounds: Option<u64>,

    /// Finish as soon as an evaluation reaches this test accuracy (0-1).
    #[arg(long)]
    pub target_accuracy: Option<f64>,

    /// Finish as soon as an evaluation's validation loss is at most this (a
    /// language model's mean cross-entropy per token, in nats).
    #[arg(long)]
    pub target_loss: Option<f64>,

    /// Finish, keeping the best weights, after N evaluations in a row whose validation
    /// loss is not 0.1 % below the best (0: never).
    #[arg(long, default_value_t = coordinator_core::plateau::PATIENCE)]
    pub patience: u32,

    /// Training mode: sync (rounds with a barrier, deadline and quorum), async (apply
    /// gradients as they arrive, staleness-bounded) or hogwild (apply at once, no checks).
    #[arg(long, value_enum, default_value_t = ModeChoice::Sync)]
    pub mode: ModeChoice,

    /// Sync: open a round only with at least this many workers, and close it at its deadline
    /// only with at least this many answers (the quorum).
    #[arg(long, default_value_t = 1)]
    pub min_workers: usize,

    /// Sync: how long a round waits for stragglers (2s, 500ms, or seconds), or `auto`
    /// (1.5 × the 90th percentile of recent answer times, clamped to 250ms-60s).
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

    /// Time between WebSocket pings to each worker (5s, 500ms, or seconds).
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    pub ping_interval: Duration,

    /// Silence (no pong, no data) after which a worker is considered gone.
    #[arg(long, default_value = "20s", value_parser = super::parse_duration)]
    pub ping_timeout: Duration,

    /// How a round's gradients are combined: centered-clip (clip each gradient's distance
    /// from the last result; O(parameters) memory), mean-around-median (per coordinate, drop
    /// the values farthest from the median), trimmed-mean (drop the largest and smallest),
    /// median, multi-krum (average the gradients nearest their neighbours), or mean (exact,
    /// not robust).
    #[arg(long, value_enum, default_value_t = AggregatorChoice::CenteredClip)]
    pub aggregator: AggregatorChoice,

    /// mean-around-median and trimmed-mean: the fraction of gradients dropped (from each end,
    /// for trimmed-mean) of every coordinate; multi-krum: the fraction assumed hostile, whose
    /// worst-scored gradients are dropped [default: 0.2, so one in five].
    #[arg(long)]
    pub trim: Option<f32>,

    /// centered-clip: the radius τ each gradient's distance from the last result is clipped
    /// to [default: adaptive, twice the median of the last 64 distances].
    #[arg(long)]
    pub clip_radius: Option<f64>,

    /// Memory a round may use to keep its gradients for mean-around-median, trimmed-mean,
    /// median or multi-krum, in MiB; a round that would need more uses the mean.
    #[arg(long, default_value_t = 512)]
    pub aggregator_memory: usize,

    /// Combine each worker's momentum β·m + (1 − β)·g instead of its answers (Karimireddy
    /// et al. 2021): attacks that hide in one round's noise add up where the rule sees them.
    /// Kept by the coordinator (4 bytes per parameter per worker, within
    /// --aggregator-memory); 0: off.
    #[arg(long, default_value_t = 0.0)]
    pub worker_momentum: f32,

    /// Bound on one gradient's L2 norm: longer ones are scaled down to it before they are
    /// combined [default: adaptive, 4 × the median of recent gradients' norms].
    #[arg(long)]
    pub max_grad_norm: Option<f64>,

    /// Fraction of gradients the coordinator recomputes itself and compares (sync mode). A
    /// mismatch drops the gradient and is a strike against its worker.
    #[arg(long, default_value_t = 0.05)]
    pub verify_fraction: f64,

    /// Recomputations (--verify-fraction, --probation, --replicate's disputes) run at most
    /// this many at once, each on a core of its own, off the task that serves the workers;
    /// more wait for a core [default: half this machine's cores, at least 1].
    #[arg(long)]
    pub verify_cores: Option<usize>,

    /// Send a worker on int8, int4 or int2 the next weights as their difference from the
    /// version it holds, in --delta-encoding (0.31 or 0.56 bytes a value against int8's
    /// 1.02); false: whole, in int8, every time.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub weight_deltas: bool,

    /// The deltas' encoding: int2 (three levels of each 64 values' largest) or int4 (15)
    /// [default: int2 with --local-steps, int4 without].
    #[arg(long, value_enum)]
    pub delta_encoding: Option<DeltaChoice>,

    /// Sync: give each shard to groups of R workers of the same compression, which compute
    /// the same batch each round and must agree (BOINC-style redundancy); a disagreement is
    /// settled by the coordinator recomputing the batch. Costs R× the volunteers' compute.
    #[arg(long, default_value_t = 1)]
    pub replicate: usize,

    /// Ban a worker (its identity and address) after this many strikes, and an address
    /// after this many sessions closed for bad input. Loopback is never banned by address.
    #[arg(long, default_value_t = 3)]
    pub ban_after: u32,

    /// A new worker identity is on probation: every one of its answers is recomputed before
    /// it counts, until this many steps of its work were accepted (a local phase counts its
    /// steps); then P / n of them after n, down to --verify-fraction. A mismatch puts it
    /// back on probation. 0: no probation.
    #[arg(long, default_value_t = coordinator_core::settings::PROBATION)]
    pub probation: u32,

    /// New worker identities an address may be issued per hour (a reload keeps its
    /// identity; a new tab or a banned worker coming back does not). Raise it for a lab
    /// behind one NAT. Loopback is not limited.
    #[arg(long, default_value_t = coordinator_core::settings::NEW_IDENTITIES_PER_ADDRESS)]
    pub new_identities_per_address: u32,

    /// New worker identities a network (an IPv4 /24, an IPv6 /48) may be issued per hour.
    #[arg(long, default_value_t = coordinator_core::settings::NEW_IDENTITIES_PER_NETWORK)]
    pub new_identities_per_network: u32,

    /// Enable the admin API (pause, resume, learning rate, checkpoint, kick, ban, stop, PUT
    /// /api/params) for requests bearing this token.
    #[arg(long)]
    pub admin_token: Option<String>,

    /// Require workers to present this token in Hello.
    #[arg(long, env = "CROWDTRAIN_JOIN_TOKEN")]
    pub join_token: Option<String>,

    /// Also accept WebSockets from pages at this origin (`scheme://host:port`); repeatable.
    /// `*` accepts any. The coordinator's own origin is always accepted.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,

    /// Refuse a WebSocket from an address that already has this many open.
    #[arg(long, default_value_t = 64)]
    pub max_per_ip: usize,

    /// Refuse workers beyond this many connected at once.
    #[arg(long, default_value_t = 10_000)]
    pub max_workers: usize,

    /// Serve the volunteer page from this directory instead of the copy built into the
    /// binary (for editing the page; it must hold the built wasm package in pkg/).
    #[arg(long)]
    pub web_dir: Option<PathBuf>,

    /// Bytes one connection may send, in MB a second; beyond it the coordinator stops
    /// reading from it until its budget refills (TCP slows the sender) [default: unlimited].
    #[arg(long)]
    pub max_upload_rate: Option<f64>,

    /// Memory for gradients being received, in MiB: that many gradients' worth (at least 2)
    /// arrive at once, and a worker whose gradient finds no room waits, unread, until some is
    /// free. Raise it when many workers on slow links send a large model.
    #[arg(long, default_value_t = crate::edge::upload::slots::DEFAULT_UPLOAD_MEMORY_MIB)]
    pub upload_memory: usize,

    /// Upload slots one address may hold at once [default: half of them, rounded up]. Raise
    /// it when many honest workers share one address (a lab behind NAT, or all on localhost).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub upload_slots_per_ip: Option<u32>,

    /// Serve https and wss with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,

    /// The certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,

    /// Log level: error, warn, info, debug or trace (RUST_LOG overrides it).
    #[arg(long, default_value = "info")]
    pub log_level: String,

    /// Log lines for people (human) or for log shippers (json: one object a line).
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,

    /// Take checkpoints in this directory (created if needed): every --checkpoint-every
    /// updates, when training finishes, and on stopping [default: a new run directory,
    /// runs/<model>-<start time>/, for --role single].
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,

    /// Updates between checkpoints (rounds in sync mode, updates in async and hogwild).
    #[arg(long, default_value_t = 100)]
    pub checkpoint_every: u64,

    /// Checkpoints kept; older ones are removed once a newer one is written.
    #[arg(long, default_value_t = 3)]
    pub keep_checkpoints: usize,

    /// Continue from the newest valid checkpoint in --checkpoint-dir (a corrupt newest one is
    /// passed over with a warning; none valid is an error).
    #[arg(long)]
    pub resume: bool,

    /// Take no checkpoints: the model lives only in memory, and is lost when the coordinator
    /// stops.
    #[arg(long)]
    pub no_checkpoints: bool,

    /// Exit when training finishes (a plateau, --target-loss, --target-accuracy,
    /// --max-rounds), for scripts and tests. Without it the coordinator keeps serving the
    /// dashboard, /api/status, /api/params and the page until Ctrl-C; a page opened then
    /// says the run is finished. An edge and a root always exit.
    #[arg(long)]
    pub exit_when_finished: bool,

    /// This process's part in a cluster (docs/CLUSTER.md): `single` (one coordinator, no
    /// NATS), `edge` (takes volunteers; a root applies its rounds) or `root` (combines the
    /// edges' rounds and owns the optimizer; takes no volunteers).
    #[arg(long, value_enum, default_value_t = RoleChoice::Single)]
    pub role: RoleChoice,

    /// The cluster's NATS server, with JetStream on (e.g. nats://127.0.0.1:4222). Needed by
    /// --role edge and root.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,

    /// The run's name in NATS subjects and buckets (letters, digits, - and _): one NATS
    /// server can hold several runs.
    #[arg(long, default_value = "crowdtrain")]
    pub run: String,

    /// This edge's or root's name in the cluster's leases [default: its role, host and a
    /// random suffix].
    #[arg(long)]
    pub node_name: Option<String>,

    /// --role edge: train on part I of N of the train split (1-based), so that each of a
    /// run's N edges trains on its own part [default: all of it].
    #[arg(long, value_name = "I/N")]
    pub data_part: Option<String>,

    /// --role root: close a round this long after its first partial, without the live
    /// edges that have not sent theirs.
    #[arg(long, default_value = "30s")]
    pub edge_timeout: String,

    /// --role root: partials a round needs before it closes, as --min-workers for a
    /// coordinator's rounds (an edge with no workers sends none).
    #[arg(long, default_value_t = 1)]
    pub min_edges: usize,

    /// --role root: store the weights and the optimizer's state in the Object Store every N
    /// versions (and at the end): a root that takes over resumes from there, so a crash
    /// loses at most N versions.
    #[arg(long, default_value_t = 10)]
    pub store_every: u64,

    /// --role edge: the WebSocket URL volunteers reach this edge at (ws:// or wss://), told
    /// to the other edges and their tabs [default: ws://HOST:PORT/ws as bound].
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoleChoice {
    Single,
    Edge,
    Root,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Write the newest valid checkpoint's parameters to a safetensors file.
    Export(ExportArgs),
    /// Continue a prompt with the newest valid checkpoint of a GPT.
    Sample(SampleArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct SampleArgs {
    /// The directory the coordinator checkpointed into.
    #[arg(long)]
    pub checkpoint_dir: PathBuf,
    /// The text to continue [default: a newline].
    #[arg(long, default_value = "\n")]
    pub prompt: String,
    /// Tokens to add.
    #[arg(long, default_value_t = 500)]
    pub tokens: usize,
    /// Below 1 sharper, above 1 flatter; 0 always takes the most likely token.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Draw among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 200)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// The run's corpus, to rebuild its tokeniser, for a checkpoint that does not keep it
    /// [default: the embedded Shakespeare].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The run's tokeniser, for a checkpoint that does not keep it: `char`, `byte`, or its
    /// `tokenizer.json` [default: the checkpoint's; with --data, char].
    #[arg(long, value_name = "char|byte|FILE")]
    pub tokenizer: Option<crate::dataset::TokenizerKind>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// The directory the coordinator checkpointed into.
    #[arg(long)]
    pub checkpoint_dir: PathBuf,
    /// Where to write the parameters (safetensors, one tensor per layer).
    #[arg(long)]
    pub out: PathBuf,
    /// A GPT's: the run's `tokenizer.json`, copied beside the model (checked against its
    /// vocabulary) so that `transformers` loads both from the directory [default: the one
    /// the checkpoint keeps, if the run had one].
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeltaChoice {
    Int2,
    Int4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptimizerChoice {
    Sgd,
    Momentum,
    Nesterov,
    Adam,
    Adamw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InnerChoice {
    Sgd,
    Momentum,
    Adam,
    Adamw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AggregatorChoice {
    CenteredClip,
    MeanAroundMedian,
    Mean,
    TrimmedMean,
    Median,
    MultiKrum,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeChoice {
    Sync,
    Async,
    Hogwild,
}

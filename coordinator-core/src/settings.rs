//! What a run is told at its start: the training settings the coordinator's state machine
//! needs, already validated (the server turns its flags into these; tests and the
//! simulator write them directly).

use model::{LrSchedule, OptimizerKind};
use protocol::Compression;

use crate::aggregate::AggregatorKind;
use crate::local::Local;
use crate::schedule::deadline::RoundTimeout;

/// `--probation`'s default: clean answers in a row before a new identity's answers are
/// only sampled (docs/BENCHMARKS.md#probation: what it costs the coordinator).
pub const PROBATION: u32 = 10;
/// `--new-identities-per-address`'s default, per hour.
pub const NEW_IDENTITIES_PER_ADDRESS: u32 = 10;
/// `--new-identities-per-network`'s default, per hour.
pub const NEW_IDENTITIES_PER_NETWORK: u32 = 40;

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

/// The run's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The model's name as the status shows it (`mlp`, `cnn`, a file's).
    pub model_name: String,
    pub optimizer: OptimizerKind,
    /// `--warmup`, `--lr-decay-steps`, `--min-lr`: the coordinator's step follows it.
    pub lr_schedule: Option<LrSchedule>,
    /// `--clip`: the update's global L2 norm is clipped to this before the optimizer step.
    pub clip_norm: Option<f32>,
    pub batch_size: u32,
    pub eval_interval: u64,
    /// Initial weights and the recomputation sampler's fallback.
    pub seed: u64,
    pub max_rounds: Option<u64>,
    pub target_accuracy: Option<f64>,
    /// Stop when an evaluation's loss is at most this.
    pub target_loss: Option<f64>,
    /// `--patience`: evaluations without improving before the run finishes on its best
    /// weights (0: never).
    pub patience: u32,
    pub min_workers: usize,
    pub mode: Mode,
    pub aggregator: AggregatorKind,
    pub verify_fraction: f64,
    /// `--verify-cores`: recomputations run at once, off the coordinator's task.
    pub verify_cores: usize,
    /// A new identity's answers are all recomputed until this many in a row have passed
    /// (0: none are; trust is not earned).
    pub probation: u32,
    /// New identities per hour an address may be issued (loopback: any).
    pub new_identities_per_address: u32,
    /// New identities per hour a network (IPv4 /24, IPv6 /64) may be issued.
    pub new_identities_per_network: u32,
    pub ban_after: u32,
    /// `None`: adaptive.
    pub max_grad_norm: Option<f64>,
    pub join_token: Option<String>,
    pub max_workers: usize,
    /// Workers per shard.
    pub replicate: usize,
    /// A checkpoint copy every this many updates; `None`: checkpoints are off.
    pub checkpoint_every: Option<u64>,
    /// The recomputation sampler's seed. `None` (the server's): from the operating system,
    /// so no worker can predict which answers are recomputed; a simulation that must repeat
    /// itself exactly gives one.
    pub audit_seed: Option<u64>,
    /// `--local-steps`: each answer is a local phase of several inner steps, and
    /// `optimizer` is the outer optimizer. `None`: each answer is one batch's gradient.
    pub local: Option<Local>,
    /// `--role edge`: a root applies the updates (`remote.rs`); sync mode only.
    pub edge: bool,
    /// `--weight-deltas` and `--delta-encoding`: a worker on int8 weights that holds the
    /// version before is sent the next as a delta in this encoding (`broadcast.rs`): `int2`
    /// by default with local phases, `int4` without ([`Settings::delta_default`]). `None`:
    /// every version whole.
    pub weight_deltas: Option<Compression>,
    /// `--phases-by-noise`: under `--local-steps auto`, the noise scale bounds a phase
    /// (`local.rs`).
    pub phases_by_noise: bool,
}

impl Settings {
    /// The encoding a worker that asked for `asked` answers in, as `Welcome` confirms it:
    /// what it asked for, but `int4` for `int2` where each answer is one batch's gradient.
    /// Three levels were measured on local phases, whose answers a crowd averages (the crowd
    /// bench: about as many rounds for a fifth fewer bytes); on single gradients they cost
    /// the default MLP half a point against int4 (docs/BENCHMARKS.md, "int2 answers").
    pub fn answer_encoding(&self, asked: Compression) -> Compression {
        match (asked, &self.local) {
            (Compression::Int2, None) => Compression::Int4,
            _ => asked,
        }
    }

    /// The deltas' encoding unless the operator names one: `int2` for a run of local
    /// phases, `int4` for one of single gradients, as answers go. Three levels with the
    /// chain's error feedback cost sixteen tabs of the 0.8M GPT one or two rounds in 45 and
    /// took 0.17 s off each 1.70 s round: 2.0 1.06-1.08 times sooner (four and eight tabs
    /// 1.05-1.18, one and two 2-4 % later), a quarter fewer bytes a token
    /// (docs/BENCHMARKS.md, "int2 deltas").
    pub fn delta_default(local: bool) -> Compression {
        if local {
            Compression::Int2
        } else {
            Compression::Int4
        }
    }
}

impl Default for Settings {
    /// The coordinator's defaults (as `coordinator` with no flags).
    fn default() -> Self {
        Self {
            model_name: "mlp".into(),
            optimizer: OptimizerKind::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            lr_schedule: None,
            clip_norm: None,
            batch_size: 32,
            eval_interval: 10,
            seed: 42,
            max_rounds: None,
            target_accuracy: None,
            target_loss: None,
            patience: crate::plateau::PATIENCE,
            min_workers: 1,
            mode: Mode::Sync {
                timeout: RoundTimeout::Auto,
                miss_limit: 3,
            },
            aggregator: AggregatorKind::default(),
            verify_fraction: 0.05,
            verify_cores: 1,
            probation: PROBATION,
            new_identities_per_address: NEW_IDENTITIES_PER_ADDRESS,
            new_identities_per_network: NEW_IDENTITIES_PER_NETWORK,
            ban_after: 3,
            max_grad_norm: None,
            join_token: None,
            max_workers: 10_000,
            replicate: 1,
            checkpoint_every: None,
            audit_seed: None,
            local: None,
            edge: false,
            weight_deltas: Some(Compression::Int4),
            phases_by_noise: true,
        }
    }
}

//! The messages, one enum per direction. Byte layout lives in [`crate::codec`].

use crate::commit::{Challenge, Commitments, RevealChunk};
use crate::ids::{Round, WorkerId};
use crate::tensor::Compression;
use model::OptimizerKind;

/// Everything a worker may send.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerToCoordinator {
    Hello(Hello),
    /// One chunk of a gradient (see [`crate::chunk`]).
    Gradient(GradientChunk),
    /// The hashes of a GPU phase's states, sent just before its answer (version 10).
    Commitments(Commitments),
    /// One chunk of a state a `Challenge` asked for (version 10).
    Reveal(RevealChunk),
}

/// Everything the coordinator may send.
#[derive(Debug, Clone, PartialEq)]
pub enum CoordinatorToWorker {
    Welcome(Welcome),
    Shard(Shard),
    /// What the answer to the next `Weights` is computed on: sent to one worker just before
    /// the `Weights` it goes with (whose frames are shared by every worker).
    Task(Task),
    /// One chunk of the weights (see [`crate::chunk`]).
    Weights(Weights),
    /// One chunk of the weights of `round` as their difference from `round - 1`, which the
    /// worker holds (version 12, [`crate::delta`]): in place of `Weights`, after the same
    /// `Task`.
    WeightsDelta(Weights),
    /// One chunk of the model's frozen tensors' values, in layout order: sent once before
    /// the `Weights` that need them (and again if the operator replaces them), so `Weights`
    /// carry the trained tensors only.
    Frozen {
        total: u32,
        offset: u32,
        params: Vec<f32>,
    },
    /// Some states of a committed phase to reveal (version 10).
    Challenge(Challenge),
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// Where a worker runs; the coordinator reports it and may treat kinds differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerKind {
    Browser,
    Native,
}

/// First frame of every session. The protocol version is in the frame header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Hello {
    pub kind: Option<WorkerKind>,
    /// Admission token, if the coordinator requires one.
    pub join_token: Option<String>,
    /// Token from an earlier `Welcome`, to resume the same identity after a reconnect.
    pub resume_token: Option<String>,
    /// How this worker wants weights and gradients on the wire.
    pub compression: Compression,
    /// Its products fuse each multiply and add (one rounding): a tab whose relaxed SIMD's
    /// `f32x4.relaxed_madd` fuses on its CPU (version 14). The coordinator replays its work
    /// in that order (`model::Order::Fused`).
    pub fused: bool,
}

/// The model a worker must build, in the canonical text form of `model::NetSpec` (e.g.
/// `input 1x28x28; conv2d 16 k5 s1 p0; relu; ...; dense 10`), and that text's FNV-1a
/// fingerprint, which the worker recomputes from its own rendering of the parsed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    pub text: String,
    pub fingerprint: u64,
}

/// Answer to `Hello`: who the worker is and what it needs to compute gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct Welcome {
    pub worker_id: WorkerId,
    /// Present it in a later `Hello` to keep this identity.
    pub resume_token: String,
    pub model: ModelSpec,
    /// Samples per gradient (the worker's minibatch size).
    pub batch_size: u32,
    /// The tensor compression this worker's `Weights` and `Gradient`s use.
    pub compression: Compression,
}

/// The worker's part of the training data. Sent before the first `Weights` a worker must
/// answer, and again whenever the coordinator re-balances the shards.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// Position of the first sample in the coordinator's (shuffled) train split.
    pub first_index: u32,
    /// Channels, height and width of one sample (`[n, 1, 1]` for `n` plain features).
    pub shape: [u32; 3],
    /// One class label per sample.
    pub labels: Vec<u8>,
    /// `labels.len() × c × h × w` values, sample-major, in the dataset's element type.
    pub values: ShardValues,
    /// The model's input is `(value - mean) / std`, with one entry for all features or one
    /// per feature.
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

/// A shard's values in the dataset's own element type.
#[derive(Debug, Clone, PartialEq)]
pub enum ShardValues {
    /// Pixel intensities (image datasets).
    U8(Vec<u8>),
    /// Numeric features (CSV datasets).
    F32(Vec<f32>),
}

impl ShardValues {
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::F32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The work a pull asks for, decided by the coordinator so that it can recompute the answer
/// (`--verify-fraction`) without knowing anything the worker kept: the gradient on the
/// weights of `round` over the batch of index `batch` of the worker's shard, or, with
/// `local`, a local phase of several steps starting there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Task {
    /// The round of the `Weights` that follow.
    pub round: Round,
    /// The batch index: the samples at shard positions `(batch · batch_size + i) mod len`,
    /// and the dropout seed. A local phase's step `k` uses batch `batch + k`.
    pub batch: u64,
    /// `None`: answer with the gradient of that one batch. `Some`: take the phase's steps
    /// and answer with the pseudo-gradient, the weights received minus the weights after.
    pub local: Option<LocalPhase>,
}

/// A local phase (`--local-steps`): `steps` inner steps of `optimizer`, which starts each
/// phase afresh, so the phase is a function of the weights, the batches and these settings
/// alone, and the coordinator can replay it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalPhase {
    pub steps: u32,
    pub optimizer: OptimizerKind,
    /// 0: computed in the coordinator's order, replayed whole. `k > 0`: a worker that
    /// computes in an order nobody can replay (a GPU) may take the phase so, committing to
    /// its state every `k` steps (`Commitments`), and is checked by segments (version 10).
    pub segment: u32,
}

/// The most steps one local phase may ask for.
pub const MAX_LOCAL_STEPS: u32 = 100_000;

/// A chunk of weights version `round` (without the frozen tensors, if the model has any):
/// `params` are values `offset..offset + params.len()` of `total`. Once the last chunk is in,
/// the recipient answers with a `Gradient` for that round if it is a participant (it holds
/// a shard).
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    pub round: Round,
    pub total: u32,
    pub offset: u32,
    pub params: Vec<f32>,
}

impl Weights {
    /// All the weights as one piece (for tests and in-process use; the wire carries chunks).
    pub fn whole(round: Round, params: Vec<f32>) -> Self {
        let total = u32::try_from(params.len()).expect("at most 4 Gi values");
        Self {
            round,
            total,
            offset: 0,
            params,
        }
    }
}

/// `Gradient::parts` of an answer computed in no order the coordinator can reproduce (a
/// GPU's sums): verified within rounding, not replayed bit for bit.
pub const UNORDERED: u8 = 0;

/// A worker's contribution: the mean gradient over `samples` samples of its shard, computed
/// on the weights of `round`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradient {
    pub round: Round,
    pub samples: u32,
    /// Mean training loss over those samples (reported, not trusted).
    pub loss: f32,
    /// Microseconds the worker spent computing it (reported, not trusted: it only sizes
    /// that worker's own local phases, `--local-steps auto`, and its compute share).
    pub compute_us: u32,
    /// How many parts the worker split each batch into, one per core (`model::Part`): the
    /// verifier recomputes in as many, so that an answer from several cores is replayed bit
    /// for bit. 1: the whole batch at once. [`UNORDERED`]: the whole batch in an order the
    /// coordinator cannot replay (a tab's GPU), checked within rounding (version 8).
    pub parts: u8,
    pub grads: Vec<f32>,
}

/// One chunk of a `Gradient`: `grads` are values `offset..offset + grads.len()` of `total`.
/// Every chunk of one gradient repeats its round, sample count, loss and compute time.
#[derive(Debug, Clone, PartialEq)]
pub struct GradientChunk {
    pub round: Round,
    pub samples: u32,
    pub loss: f32,
    pub compute_us: u32,
    pub parts: u8,
    pub total: u32,
    pub offset: u32,
    pub grads: Vec<f32>,
}

/// Why the coordinator refused something. Fatal codes are followed by a close frame;
/// non-fatal ones only drop the offending gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The frame did not decode.
    Malformed,
    /// The frame's protocol version is not ours.
    VersionMismatch,
    /// A valid message at the wrong time or of the wrong kind (e.g. a text frame, a gradient
    /// before `Hello`, a second `Hello`).
    UnexpectedMessage,
    /// A gradient whose length is not the model's parameter count, or a sample count that
    /// is zero or larger than the batch.
    ShapeMismatch,
    /// A gradient or loss containing NaN or infinity.
    NonFinite,
    /// A gradient for a round that is not open (non-fatal: dropped).
    RoundNotOpen,
    /// A gradient from a worker that is not a participant of the open round (non-fatal).
    NotParticipant,
    /// A second gradient for the same round (non-fatal: dropped).
    Duplicate,
    /// The worker did not keep up with the frames sent to it.
    TooSlow,
    /// The coordinator is shutting down.
    ShuttingDown,
    /// The join token was missing or wrong.
    Unauthorized,
    /// The coordinator already has as many workers as it accepts.
    Full,
    /// A gradient for a round that already closed (non-fatal: dropped and counted).
    Late,
    /// Async mode: a gradient computed on weights more than `--max-staleness` versions old
    /// (non-fatal: dropped and counted).
    Stale,
    /// Another connection resumed this worker's identity with its token.
    Replaced,
    /// The coordinator recomputed this gradient and got a different one (non-fatal: dropped,
    /// and a strike against the worker).
    Mismatch,
    /// The worker (its identity or its address) is banned for the rest of the run.
    Banned,
    /// The connection sent control frames (Ping, Pong) faster than the limit.
    RateLimited,
    /// The operator removed this worker (it is not banned, but should not come back by
    /// itself).
    Kicked,
    /// Training is over (`--max-rounds`, a target, `--patience`, the operator's stop): the
    /// worker should stop, not reconnect. An older worker reads it as `Other(20)`, fatal.
    Finished,
    /// A code this version does not know.
    Other(u16),
}

impl ErrorCode {
    pub fn to_u16(self) -> u16 {
        match self {
            Self::Malformed => 1,
            Self::VersionMismatch => 2,
            Self::UnexpectedMessage => 3,
            Self::ShapeMismatch => 4,
            Self::NonFinite => 5,
            Self::RoundNotOpen => 6,
            Self::NotParticipant => 7,
            Self::Duplicate => 8,
            Self::TooSlow => 9,
            Self::ShuttingDown => 10,
            Self::Unauthorized => 11,
            Self::Full => 12,
            Self::Late => 13,
            Self::Stale => 14,
            Self::Replaced => 15,
            Self::Mismatch => 16,
            Self::Banned => 17,
            Self::RateLimited => 18,
            Self::Kicked => 19,
            Self::Finished => 20,
            Self::Other(code) => code,
        }
    }

    pub fn from_u16(code: u16) -> Self {
        match code {
            1 => Self::Malformed,
            2 => Self::VersionMismatch,
            3 => Self::UnexpectedMessage,
            4 => Self::ShapeMismatch,
            5 => Self::NonFinite,
            6 => Self::RoundNotOpen,
            7 => Self::NotParticipant,
            8 => Self::Duplicate,
            9 => Self::TooSlow,
            10 => Self::ShuttingDown,
            11 => Self::Unauthorized,
            12 => Self::Full,
            13 => Self::Late,
            14 => Self::Stale,
            15 => Self::Replaced,
            16 => Self::Mismatch,
            17 => Self::Banned,
            18 => Self::RateLimited,
            19 => Self::Kicked,
            20 => Self::Finished,
            other => Self::Other(other),
        }
    }

    /// The code's name as the status and the log show it (`late`, `mismatch`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::VersionMismatch => "version_mismatch",
            Self::UnexpectedMessage => "unexpected_message",
            Self::ShapeMismatch => "shape_mismatch",
            Self::NonFinite => "non_finite",
            Self::RoundNotOpen => "round_not_open",
            Self::NotParticipant => "not_participant",
            Self::Duplicate => "duplicate",
            Self::TooSlow => "too_slow",
            Self::ShuttingDown => "shutting_down",
            Self::Unauthorized => "unauthorized",
            Self::Full => "full",
            Self::Late => "late",
            Self::Stale => "stale",
            Self::Replaced => "replaced",
            Self::Mismatch => "mismatch",
            Self::Banned => "banned",
            Self::RateLimited => "rate_limited",
            Self::Kicked => "kicked",
            Self::Finished => "finished",
            Self::Other(_) => "other",
        }
    }

    /// Whether the coordinator closes the session after sending this code.
    pub fn is_fatal(self) -> bool {
        !matches!(
            self,
            Self::RoundNotOpen
                | Self::NotParticipant
                | Self::Duplicate
                | Self::Late
                | Self::Stale
                | Self::Mismatch
        )
    }
}

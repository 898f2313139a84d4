//! What goes in and out of the [`Coordinator`](crate::Coordinator): sessions, the frames
//! for them, and what the driver is asked to do. No channels, no clock: the driver owns the
//! sockets, the tasks and the time, and moves these.

use std::sync::Arc;

use bytes::Bytes;
use model::Evaluation;
use protocol::WorkerId;

use crate::checkpoint::Snapshot;
use crate::checks::recompute::RecomputeJob;
use crate::evaluation::EvalJob;
use crate::refusal::Refusal;

/// One message's frames: a tensor message is many chunk frames. Encoded once and shared by
/// every connection that sends it (cloning is a reference count, not a copy).
pub type Frames = Arc<[Bytes]>;

/// What a session is told to do with its socket.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// Send these binary frames, in order.
    Frames(Frames),
    /// A pull: this worker's `Task` frame, then the weights' frames (shared by everyone).
    Pull { task: Bytes, weights: Frames },
    /// Send this refusal as an error frame, then close the session.
    Close(Refusal),
}

impl Outbound {
    /// A message of one frame.
    pub fn frame(frame: impl Into<Bytes>) -> Self {
        Self::Frames(Arc::from([frame.into()]))
    }

    /// The frames to send, in order (none for `Close`).
    pub fn frames(&self) -> impl Iterator<Item = &Bytes> {
        let (first, rest): (Option<&Bytes>, &[Bytes]) = match self {
            Self::Frames(frames) => (None, frames),
            Self::Pull { task, weights } => (Some(task), weights),
            Self::Close(_) => (None, &[]),
        };
        first.into_iter().chain(rest)
    }

    /// Bytes on the wire (frame payloads).
    pub fn len(&self) -> usize {
        self.frames().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One connection of a worker. A worker resuming its identity gets a new session; what
/// comes from the old one is ignored from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

/// A worker let in: what its session needs to check its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    pub worker: WorkerId,
    pub session: SessionId,
    pub param_count: usize,
    pub batch_size: u32,
}

/// What the coordinator asks of its driver, in order ([`Coordinator::poll_output`](crate::Coordinator::poll_output)).
#[derive(Debug)]
pub enum Output {
    /// Queue `message` to `worker`'s session `session`. A driver that cannot (the session
    /// stopped reading, or is gone) says so with
    /// [`Coordinator::unreachable`](crate::Coordinator::unreachable).
    Send {
        worker: WorkerId,
        session: SessionId,
        message: Outbound,
    },
    /// Score these weights on the test split, off the coordinator's thread, and hand the
    /// result back with [`Coordinator::evaluated`](crate::Coordinator::evaluated).
    Evaluate(EvalJob),
    /// Recompute this answer, off the coordinator's thread, and hand the verdict back with
    /// [`Coordinator::recomputed`](crate::Coordinator::recomputed). The coordinator never
    /// asks for more at once than its `--verify-cores`.
    Recompute(RecomputeJob),
    /// A checkpoint is due: write this copy.
    Checkpoint(Box<Snapshot>),
    /// For `/metrics`' histograms.
    Observe(Observation),
    /// Training is over (`--max-rounds`, `--target-accuracy`, the operator's stop).
    Stop(Outcome),
    /// `--role edge`: send this round's partial to the root; its next version comes back
    /// through [`Coordinator::adopt`](crate::Coordinator::adopt).
    Partial(crate::remote::Partial),
}

/// A duration worth a histogram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observation {
    /// From a round's opening to its update (sync), or between updates (async), in seconds.
    Round(f64),
    /// From weights sent to a worker to its gradient arriving, in seconds.
    GradientLatency(f64),
}

/// The latest weights, for `/api/params`.
#[derive(Debug, Clone)]
pub struct WeightsSnapshot {
    pub round: u64,
    /// The uncompressed `Weights` chunk frames of all the parameters.
    pub frames: Frames,
}

impl WeightsSnapshot {
    /// The parameters as little-endian f32 bytes: each chunk's values start at
    /// `codec::WEIGHTS_DATA_OFFSET`.
    pub fn param_bytes(&self) -> Vec<u8> {
        fn data(f: &Bytes) -> &[u8] {
            &f[protocol::codec::WEIGHTS_DATA_OFFSET.min(f.len())..]
        }
        let mut out = Vec::with_capacity(self.frames.iter().map(|f| data(f).len()).sum());
        for frame in self.frames.iter() {
            out.extend_from_slice(data(frame));
        }
        out
    }
}

/// How training ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub rounds: u64,
    pub evaluation: Option<Evaluation>,
    pub reached_target: bool,
    /// `--patience` evaluations went by without improving: the run finished on its best
    /// weights (`evaluation` is theirs).
    pub plateaued: bool,
    /// The checkpoint taken on stopping failed (training itself ended normally; the newest
    /// checkpoint on disk is older). Filled in by the driver that writes it.
    pub checkpoint_error: Option<String>,
}

//! What goes in and out of the [`Coordinator`](crate::Coordinator): sessions, the frames
//! for them, and what the driver is asked to do. No channels, no clock: the driver owns the
//! sockets, the tasks and the time, and moves these.

use bytes::Bytes;
use model::Evaluation;
use protocol::WorkerId;

use crate::checks::job::RecomputeJob;
use crate::evaluation::EvalJob;
use crate::partial::Partial;
pub use crate::session::{Frames, Outbound, SessionId};
use crate::snapshot::Snapshot;

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
    Partial(Partial),
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

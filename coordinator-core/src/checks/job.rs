//! What runs off the coordinator's task: a [`RecomputeJob`] (everything one check needs,
//! owned or shared, so it can run anywhere), the [`Recomputed`] verdict it comes back with,
//! and the answer [`Held`] meanwhile. The budget of cores they run within is
//! `recompute.rs`'s; a challenged phase's replay is `segment.rs`'s.

use std::ops::Range;
use std::sync::Arc;

use model::{Dataset, Network, Order};
use protocol::{Compression, Gradient, WorkerId};

use super::segment::{Branches, Revealed};
use super::verdict::Refuted;
use super::verify::{verify, Claim};
use crate::registry::Pull;
use crate::session::SessionId;

/// One answer to recompute: everything it needs, owned or shared, so it can run anywhere.
#[derive(Debug)]
pub struct RecomputeJob {
    pub id: u64,
    pub(crate) net: Network,
    pub(crate) train: Arc<Dataset>,
    pub(crate) weights: Arc<[f32]>,
    pub(crate) gradient: Arc<Gradient>,
    pub(crate) shard: Range<usize>,
    pub(crate) batch_index: u64,
    pub(crate) batch_size: usize,
    pub(crate) compression: Compression,
    pub(crate) local: Option<protocol::LocalPhase>,
    pub(crate) order: Order,
    /// A committed phase (a GPU's): the segments to replay from its revealed states,
    /// instead of the whole phase.
    pub(crate) segments: Option<Revealed>,
}

/// What a [`RecomputeJob`] came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Recomputed {
    pub id: u64,
    /// `Ok(Ok(()))`: it matches; `Ok(Err(_))`: it does not; `Err(_)`: it could not be
    /// recomputed (the answer is not held against its worker).
    pub verdict: Result<Result<(), Refuted>, String>,
    /// Seconds of a core the recomputation took, as the job measured them.
    pub seconds: f64,
    /// A ReLU model's segments: the branches their logs named, and those forced.
    pub branches: Branches,
    /// A committed phase's segments replayed (0: a whole answer recomputed).
    pub segments: u32,
}

impl RecomputeJob {
    /// The steps it replays: a local phase's, else one gradient.
    pub fn steps(&self) -> u32 {
        match (&self.segments, self.local) {
            (Some(revealed), _) => revealed.steps(),
            (None, local) => local.map_or(1, |l| l.steps),
        }
    }

    /// Recomputes and compares (seconds for a GPT phase: run it off the coordinator's task).
    /// A panic inside becomes an error, so the coordinator always hears back.
    pub fn run(self) -> Recomputed {
        let started = std::time::Instant::now();
        let claim = Claim {
            weights: &self.weights,
            shard: self.shard.clone(),
            batch_index: self.batch_index,
            batch_size: self.batch_size,
            compression: self.compression,
            grads: &self.gradient.grads,
            local: self.local,
            order: self.order,
            parts: usize::from(self.gradient.parts),
        };
        let mut branches = Branches::default();
        let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match (&self.segments, self.local) {
                (Some(revealed), Some(local)) => {
                    let batches = super::verify::Batches {
                        shard: self.shard.clone(),
                        first: self.batch_index,
                        size: self.batch_size,
                        parts: 1,
                    };
                    revealed.check(
                        &self.net,
                        &self.train,
                        &batches,
                        local,
                        &claim,
                        &mut branches,
                    )
                }
                _ => verify(&self.net, &self.train, &claim)
                    .map(|v| v.map_err(|m| Refuted::Mismatch(m.to_string()))),
            }
        }));
        let verdict = match verdict {
            Ok(Ok(verdict)) => Ok(verdict),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("the recomputation panicked".to_owned()),
        };
        Recomputed {
            id: self.id,
            verdict,
            seconds: started.elapsed().as_secs_f64(),
            branches,
            segments: self.segments.as_ref().map_or(0, |r| r.segments()),
        }
    }
}

/// What becomes of an answer once its recomputation matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// A sampled or probation audit: on to its replicas, then the schedule.
    Check,
    /// A disputed replica: straight to the schedule.
    Admit,
    /// A trusted worker's sampled local phase, which went on at once: the verdict only
    /// judges its worker.
    Judge,
    /// A trusted worker's sampled local phase whose replay would wait behind others while
    /// another trusted participant carries its sync round (within `machine.rs`'s bounds):
    /// excused from the round at once rather than holding it; the verdict only judges
    /// its worker.
    Aside,
    /// A newcomer's phase that had to wait for a core in a sync round: excused from its
    /// round at once, so that the round does not wait the replays queued before it; the
    /// verdict only judges its worker, and a match counts its steps towards the end of its
    /// probation (`machine.rs`).
    Vouch,
}

/// An answer waiting for its verdict.
#[derive(Debug)]
pub(crate) struct Held {
    pub worker: WorkerId,
    pub session: SessionId,
    pub gradient: Arc<Gradient>,
    pub norm: f64,
    pub pull: Pull,
    pub then: Then,
}

/// What the coordinator needs to build a job (the rest comes from the held answer).
pub(crate) struct Inputs<'a> {
    pub net: &'a Network,
    pub train: &'a Arc<Dataset>,
    pub weights: Arc<[f32]>,
    pub compression: Compression,
    pub batch_size: usize,
    pub order: Order,
    /// A committed phase's revealed states: its segments are replayed instead.
    pub segments: Option<Revealed>,
}

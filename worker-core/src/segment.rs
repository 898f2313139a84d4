//! A committed phase's next segment, taken whole by a transport that keeps the weights and
//! the inner optimizer on its device through it (a tab's GPU): the steps up to the next
//! commitment, their batches, and the state they start from. The state they end at and
//! their losses come back in one piece ([`WorkerCore::complete_segment`]); the phase adopts
//! them (`LocalPhase::adopt`), commits to that state and answers as after steps taken one
//! at a time. The coordinator's check is the same either way: it replays the segment from
//! the worker's committed start.

use std::ops::Range;

use model::{batch_positions, batch_seed, LocalPhase, Network, OptimizerKind};
use ndarray::Array2;
use protocol::Round;

use crate::pending::Of;
use crate::{WorkerCore, WorkerError};

/// The steps from the phase's state now to its next commitment.
#[derive(Debug)]
pub struct Segment<'a> {
    pub net: &'a Network,
    /// Which phase it is part of (its round and first batch): a transport that still
    /// holds the state the last segment of the same phase ended at need not load it again.
    pub phase: (Round, u64),
    /// The inner optimizer, fresh at the phase's start.
    pub optimizer: OptimizerKind,
    /// The tensors it decays (AdamW's mask), as ranges of the weights.
    pub decayed: Vec<Range<usize>>,
    /// Each step's batch: its rows, labels and dropout seed.
    pub batches: Vec<(Array2<f32>, Vec<u8>, u64)>,
    local: &'a LocalPhase,
}

impl<'a> Segment<'a> {
    /// The steps of `local` (a phase of `phase`, on `net`, with `optimizer`) from where it
    /// stands, on `batches`: what [`WorkerCore::segment`] offers, and a test's own.
    pub fn new(
        net: &'a Network,
        phase: (Round, u64),
        optimizer: OptimizerKind,
        batches: Vec<(Array2<f32>, Vec<u8>, u64)>,
        local: &'a LocalPhase,
    ) -> Self {
        Self {
            net,
            phase,
            optimizer,
            decayed: net.decayed_trained(),
            batches,
            local,
        }
    }

    /// Steps of the phase taken before it.
    pub fn taken(&self) -> u64 {
        u64::from(self.local.taken())
    }

    /// Steps taken before it, and the state they ended at (`LocalPhase::flat_state`: the
    /// weights, then the optimizer's tensors in order).
    pub fn start(&self) -> (u64, Vec<f32>) {
        self.local.flat_state()
    }
}

impl WorkerCore {
    /// The segment the transport may take whole instead of the step [`WorkerCore::job`]
    /// offers: only in a committed phase (a GPU's, checked by segments) of a model without
    /// frozen tensors or branches. Hand its end to [`WorkerCore::complete_segment`]; or compute the
    /// step as usual.
    pub fn segment(&self) -> Option<Segment<'_>> {
        let (taken, end) = self.segment_steps()?;
        let joined = self.joined.as_ref()?;
        let phase = self.phase.as_ref()?;
        let local = &phase.phase;
        let shard = &phase.shard;
        let batches = (u64::from(taken)..u64::from(end))
            .map(|step| {
                let batch = phase.first + step;
                let (x, labels) =
                    shard.batch(batch_positions(shard.len(), batch, joined.batch_size));
                (x, labels, batch_seed(batch, phase.first_index))
            })
            .collect();
        Some(Segment::new(
            &joined.net,
            (phase.round, phase.first),
            phase.optimizer,
            batches,
            local,
        ))
    }

    /// The steps a segment would span (taken, and the next commitment's), if one is
    /// offered: a committed phase whose next step is due, of a model without frozen
    /// tensors or branches to log (a ReLU model's steps are taken one at a time, each
    /// logged: [`WorkerCore::logs_branches`]).
    fn segment_steps(&self) -> Option<(u32, u32)> {
        let phase = self.phase.as_ref()?;
        let committing = phase.committing.as_ref()?;
        let net = &self.joined.as_ref()?.net;
        let whole = net.frozen().is_empty() && !net.has_branches();
        if !whole || !matches!(self.pending.as_ref()?.of, Of::Step) {
            return None;
        }
        let taken = phase.phase.taken();
        Some((taken, committing.next_boundary(taken, phase.phase.steps())))
    }

    /// Takes the end of [`WorkerCore::segment`]: each step's loss, and the state after the
    /// last (`LocalPhase::flat_state`'s layout); returns the frames to send if that ended
    /// the phase. A state that does not fit (another step count or length, not finite, a
    /// negative `v`) is refused and changes nothing: the transport may compute the steps
    /// one at a time instead.
    pub fn complete_segment(
        &mut self,
        losses: &[f32],
        state: &[f32],
    ) -> Result<Vec<Vec<u8>>, WorkerError> {
        let Some((step, end)) = self.segment_steps() else {
            return Err(WorkerError::Protocol("no segment under way"));
        };
        let steps = (end - step) as usize;
        let phase = self.phase.as_mut().expect("a segment's phase");
        let batch = self.joined.as_ref().map_or(0, |j| j.batch_size);
        let samples = steps as u64 * batch.min(phase.shard.len()) as u64;
        if losses.len() != steps {
            return Err(model::ModelError::BadState(format!(
                "{} losses for a segment of {steps} steps",
                losses.len()
            ))
            .into());
        }
        phase
            .phase
            .adopt(losses, u64::from(step) + steps as u64, state)?;
        let pending = self.pending.take().expect("a segment's step");
        let compute_us = self.clock.elapsed(pending.started, 1);
        self.stats.samples_computed += samples;
        self.stats.last_loss = losses.last().copied();
        let answer = self.stepped(steps as u32, samples, compute_us, 0);
        Ok(self.frames(answer))
    }
}

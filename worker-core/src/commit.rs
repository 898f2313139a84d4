//! A GPU's local phase, committed: every `segment` steps the worker hashes its state
//! (weights, then the inner optimizer's tensors) and keeps it, sends the hashes before its
//! answer, and reveals the states a `Challenge` names (`protocol::commit`).
//!
//! The states of the last committed phase are kept until the next one finishes: a
//! challenge comes after the answer, often while the next phase is under way. A phase of
//! `H` steps keeps `H / segment` states of 12 bytes a parameter with Adam (9.7 MB each for
//! the 0.8M GPT).

use model::{Branch, LocalPhase};
use protocol::{encode_reveal, log_values, state_hash, Challenge, Commitments, Round, LOG_WORDS};

use crate::WorkerCore;

/// A committed phase under way: its states so far, hashed.
#[derive(Debug)]
pub(crate) struct Committing {
    segment: u32,
    hashes: Vec<[u8; 32]>,
    states: Vec<Vec<f32>>,
    /// The near-tie branches of the segment under way (a ReLU model's), step by step.
    log: Vec<[u32; LOG_WORDS]>,
}

/// The last committed phase's states, for its round.
#[derive(Debug)]
pub(crate) struct Revealable {
    round: Round,
    states: Vec<Vec<f32>>,
}

impl Committing {
    pub(crate) fn new(segment: u32) -> Self {
        Self {
            segment: segment.max(1),
            hashes: Vec::new(),
            states: Vec::new(),
            log: Vec::new(),
        }
    }

    /// Logs the branches the forward pass of the phase's next step (after `taken`) took.
    pub(crate) fn log(&mut self, taken: u32, branches: &[Branch]) {
        let step = taken % self.segment;
        self.log.extend(
            branches
                .iter()
                .map(|b| [step, b.layer, b.row, b.col, b.taken]),
        );
    }

    /// The step count of the next boundary after `taken` steps of a phase of `steps`.
    pub(crate) fn next_boundary(&self, taken: u32, steps: u32) -> u32 {
        ((taken / self.segment + 1) * self.segment).min(steps)
    }

    /// After each step: at a boundary (every `segment` steps, and the phase's last) the
    /// state, followed by its segment's log, is hashed and kept.
    pub(crate) fn after_step(&mut self, phase: &LocalPhase) {
        if !phase.taken().is_multiple_of(self.segment) && !phase.is_done() {
            return;
        }
        let (step, mut state) = phase.flat_state();
        state.extend(log_values(&std::mem::take(&mut self.log)));
        self.hashes.push(state_hash(step, &state));
        self.states.push(state);
    }

    pub(crate) fn finish(self, round: Round) -> (Commitments, Revealable) {
        let commitments = Commitments {
            round,
            hashes: self.hashes,
        };
        let revealable = Revealable {
            round,
            states: self.states,
        };
        (commitments, revealable)
    }
}

impl WorkerCore {
    /// The frames answering `challenge`: each state it names, in its order. Nothing if this
    /// worker no longer holds that phase's states (a newer phase finished since, or it
    /// reconnected): the coordinator then gives the answer up, without a strike.
    pub fn reveal(&self, challenge: &Challenge) -> Vec<Vec<u8>> {
        let Some(kept) = self
            .revealable
            .as_ref()
            .filter(|r| r.round == challenge.round)
        else {
            return Vec::new();
        };
        let mut frames = Vec::new();
        for &b in &challenge.boundaries {
            let Some(state) = (b as usize).checked_sub(1).and_then(|i| kept.states.get(i)) else {
                return Vec::new();
            };
            frames.extend(encode_reveal(challenge.round, b, state));
        }
        frames
    }
}

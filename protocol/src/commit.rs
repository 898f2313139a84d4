//! A GPU's local phase, committed and revealed (version 10): the worker hashes its state
//! every `segment` steps and sends the hashes before its answer ([`Commitments`]); the
//! coordinator may then ask for some of those states ([`Challenge`]), which the worker
//! sends in chunks ([`RevealChunk`]) and the coordinator checks against their hashes
//! before replaying the segments between them (`docs/DESIGN.md`, "A GPU's local phase,
//! checked").
//!
//! A state is flat: the weights (the model's full layout), then each of the inner
//! optimizer's tensors in its own order (Adam's `m`, then `v`), all `f32`; its step count
//! is the boundary's (`boundary · segment`, the phase's last step for the last). A model
//! with ReLUs or max-pools (version 11) appends the log of the near-tie branches its
//! segment's forward passes took ([`log_values`]), so the hash covers the log too.

use sha2::{Digest, Sha256};

use crate::ids::Round;

/// The hashes of a phase's states, one a boundary: `hashes[b - 1]` is the state's after
/// boundary `b`'s steps (boundary 0, the phase's start, is the coordinator's own weights
/// and a fresh optimizer, and is not hashed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commitments {
    pub round: Round,
    pub hashes: Vec<[u8; 32]>,
}

/// The boundaries whose states the coordinator wants, for the answer to `round`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub round: Round,
    /// Ascending, each from 1 to the phase's boundaries.
    pub boundaries: Vec<u32>,
}

/// The most boundaries one challenge may name (a phase has at most
/// [`crate::MAX_LOCAL_STEPS`]; a challenge names a few).
pub const MAX_CHALLENGED: usize = 64;

/// One chunk of a revealed state: `values` are `offset..offset + values.len()` of `total`,
/// raw `f32` (a hash is of the exact bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct RevealChunk {
    pub round: Round,
    pub boundary: u32,
    pub total: u32,
    pub offset: u32,
    pub values: Vec<f32>,
}

/// The hash a state is committed with: SHA-256 of a domain tag, its step count and its
/// values' little-endian bytes.
pub fn state_hash(step: u64, values: &[f32]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"crowdtrain state v1");
    hasher.update(step.to_le_bytes());
    // In blocks, so as not to copy a whole state's bytes at once.
    let mut block = [0u8; 4096];
    for chunk in values.chunks(block.len() / 4) {
        for (b, v) in block.chunks_exact_mut(4).zip(chunk) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        hasher.update(&block[..chunk.len() * 4]);
    }
    hasher.finalize().into()
}

/// Words of one logged branch: its step within the segment, then the branch's layer, row,
/// column and the branch taken (`model::Branch`).
pub const LOG_WORDS: usize = 5;

/// A segment's log as it follows the state: each word's bits as one `f32` value (a state's
/// values travel and are hashed as raw bits).
pub fn log_values(log: &[[u32; LOG_WORDS]]) -> Vec<f32> {
    log.iter().flatten().map(|&w| f32::from_bits(w)).collect()
}

/// The log that [`log_values`] wrote; `None` if `values` is not whole entries.
pub fn log_words(values: &[f32]) -> Option<Vec<[u32; LOG_WORDS]>> {
    if !values.len().is_multiple_of(LOG_WORDS) {
        return None;
    }
    Some(
        values
            .chunks_exact(LOG_WORDS)
            .map(|c| std::array::from_fn(|i| c[i].to_bits()))
            .collect(),
    )
}

/// The step count of the state at `boundary` in a phase of `steps` steps cut every
/// `segment`.
pub fn boundary_step(boundary: u32, segment: u32, steps: u32) -> u64 {
    u64::from(boundary.saturating_mul(segment).min(steps))
}

/// How many boundaries (hashed states) a phase of `steps` steps cut every `segment` has.
pub fn boundaries(steps: u32, segment: u32) -> u32 {
    if segment == 0 {
        return 0;
    }
    steps.div_ceil(segment)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_log_travels_as_the_bits_of_values() {
        // Words whose bits are NaNs and subnormals as f32 come back the same.
        let log = [[0, 7, u32::MAX, 0x7fc0_0001, 1], [3, 1, 2, 3, 0xff80_0000]];
        let values = super::log_values(&log);
        assert_eq!(values.len(), 10);
        assert_eq!(super::log_words(&values).expect("whole"), log);
        assert_eq!(super::log_words(&values[..9]), None);
    }

    use super::*;

    #[test]
    fn a_hash_is_of_the_step_and_every_bit_of_the_values() {
        let values: Vec<f32> = (0..5000).map(|i| i as f32 * 0.25).collect();
        let h = state_hash(8, &values);
        assert_eq!(h, state_hash(8, &values));
        assert_ne!(h, state_hash(9, &values));
        let mut flipped = values.clone();
        flipped[4321] = f32::from_bits(flipped[4321].to_bits() ^ 1);
        assert_ne!(h, state_hash(8, &flipped));
        assert_ne!(h, state_hash(8, &values[..4999]));
    }

    #[test]
    fn boundaries_cover_the_phase_and_the_last_is_its_end() {
        assert_eq!(boundaries(64, 8), 8);
        assert_eq!(boundaries(10, 4), 3);
        assert_eq!(boundary_step(3, 4, 10), 10);
        assert_eq!(boundary_step(2, 4, 10), 8);
        assert_eq!(boundaries(10, 0), 0);
    }
}

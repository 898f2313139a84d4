//! The broadcast as deltas (version 12). A worker whose weights go as `int8` (it asked for
//! `int8`, `int4` or `int2`) holds the weights it last decoded. The next version can come as
//! its difference from them, in one of [`DELTA_ENCODINGS`] (the run's choice: `int4`, 0.5625
//! bytes a value, or `int2`, 0.3125, against `int8`'s 1.016), in `WeightsDelta` chunks; the
//! worker decodes each chunk in the encoding it names, adds the delta to what it holds
//! ([`target`]) and keeps that sum as `int8` would carry it ([`settle`]).
//!
//! The coordinator runs the same two functions on the same values, so it knows every
//! worker's weights bit for bit and replays answers on them. The key frames of a version
//! (what a newcomer, or a worker that missed a version, is sent) are the `int8` encoding of
//! the very same target, so whoever holds a version holds the same values, however they
//! came by them. What the delta rounds off is still in the next version's difference (the
//! difference is always taken from what the workers hold): the error does not build up.

use crate::tensor::{decode_payload, encode_payload, Compression};

/// The encodings a `WeightsDelta`'s values may come in: `int4` (15 levels of each 64 values'
/// largest) or `int2` (three).
pub const DELTA_ENCODINGS: [Compression; 2] = [Compression::Int4, Compression::Int2];

/// The encoding of the weights a chain of deltas keeps (and of its key frames).
pub const HELD_ENCODING: Compression = Compression::Int8;

/// Where a delta takes the weights held: `held + delta`, value by value (the key frames of
/// the version encode exactly this). `None` if the lengths differ.
pub fn target(held: &[f32], delta: &[f32]) -> Option<Vec<f32>> {
    (held.len() == delta.len()).then(|| held.iter().zip(delta).map(|(h, d)| h + d).collect())
}

/// The weights held after a version whose target is `target`: the target through `int8`, as
/// its key frames decode.
pub fn settle(target: &[f32]) -> Vec<f32> {
    let mut raw = Vec::new();
    encode_payload(&mut raw, target, HELD_ENCODING);
    decode_payload(&raw, target.len(), HELD_ENCODING)
}

/// The delta the coordinator sends, as the worker decodes it: `weights - held` through
/// `encoding` (one of [`DELTA_ENCODINGS`]). `None` if the lengths differ.
pub fn delta(weights: &[f32], held: &[f32], encoding: Compression) -> Option<Vec<f32>> {
    if weights.len() != held.len() {
        return None;
    }
    let difference: Vec<f32> = weights.iter().zip(held).map(|(w, h)| w - h).collect();
    let mut raw = Vec::new();
    encode_payload(&mut raw, &difference, encoding);
    Some(decode_payload(&raw, difference.len(), encoding))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slowly moving set of weights followed by a chain of deltas in each encoding: what
    /// is held stays within an `int8` step (and a delta's step of the last change) of the
    /// weights, never drifting, and a key of the same target decodes to the same values.
    #[test]
    fn a_chain_of_deltas_follows_the_weights_without_drift() {
        let n = 1000;
        for encoding in DELTA_ENCODINGS {
            let mut weights: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 60.0)
                .collect();
            let mut held = settle(&weights);
            for version in 1..200u32 {
                for (i, w) in weights.iter_mut().enumerate() {
                    *w += 1e-3 * (((i as u32 * 7 + version * 13) % 17) as f32 - 8.0) / 8.0;
                }
                let d = delta(&weights, &held, encoding).expect("same length");
                let t = target(&held, &d).expect("same length");
                held = settle(&t);
                let mut key = Vec::new();
                encode_payload(&mut key, &t, HELD_ENCODING);
                assert_eq!(
                    decode_payload(&key, n, HELD_ENCODING),
                    held,
                    "a key is the same weights"
                );
                for chunk in 0..n / 256 {
                    let range = chunk * 256..(chunk * 256 + 256).min(n);
                    let top = weights[range.clone()]
                        .iter()
                        .fold(0f32, |m, w| m.max(w.abs()));
                    for i in range {
                        // Half an int8 step of the target's chunk, plus half a delta's step
                        // of what was held's distance: the last half int8 step and a change
                        // of at most 2e-3 (what each delta leaves is in the next).
                        let step = top * 1.01 / 254.0;
                        let levels = f32::from(encoding.levels());
                        let bound = step + (step + 2e-3) / (2.0 * levels) + 1e-6;
                        assert!(
                            (held[i] - weights[i]).abs() <= bound,
                            "{encoding:?} {version} {i}"
                        );
                    }
                }
            }
            assert_eq!(delta(&weights, &held[1..], encoding), None);
            assert_eq!(target(&held, &weights[1..]), None);
        }
    }
}

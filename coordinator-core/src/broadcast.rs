//! The weights as the workers on `int8` weights hold them (protocol version 12,
//! [`protocol::delta`]): a chain of versions, each its predecessor plus a delta in the run's
//! delta encoding (`int4`, or `int2` for local phases), settled through `int8`. A worker that
//! holds version `v - 1` of the chain is sent version `v` as that delta (0.5625 or 0.3125
//! bytes a value); any other (a newcomer, one that missed a
//! version) is sent the version's key frames, the `int8` encoding of the same target (1.016
//! bytes a value), and then holds the same values. What a worker holds is what its answer
//! is replayed on.
//!
//! A chain is unbroken while versions follow each other by an update (`Trainer::apply`, or
//! an edge's adoption of the root's next version); restored or replaced weights (a
//! checkpoint, the operator's, a new root's older version) start a new one, so a delta is
//! never added to weights of another chain. With deltas off, every
//! version starts a chain: its key is the `int8` of the weights, as before version 12.

use std::sync::Arc;

use bytes::Bytes;
use protocol::{delta, encode_weights, encode_weights_delta, Compression, Round};

use crate::io::Frames;

/// The version of a chain a connection holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    chain: u64,
    version: u64,
}

/// One version of the chain.
#[derive(Debug)]
struct Link {
    version: u64,
    /// The trained tensors as every worker holding this version holds them.
    held: Arc<[f32]>,
    /// The `Weights` frames: the target in `int8`.
    key: Frames,
    /// The `WeightsDelta` frames from the version before, when the chain went on.
    delta: Option<Frames>,
}

#[derive(Debug)]
pub(crate) struct Chain {
    /// The encoding versions go on from the one before in, as deltas (`--weight-deltas`,
    /// `--delta-encoding`); `None`: every version whole.
    deltas: Option<Compression>,
    /// Bumped whenever a version does not follow the last by an update.
    chain: u64,
    /// The latest version made; the one before it is gone once the next is made.
    last: Option<Link>,
}

impl Chain {
    pub(crate) fn new(deltas: Option<Compression>) -> Self {
        Self {
            deltas,
            chain: 0,
            last: None,
        }
    }

    /// The weights no longer follow the last version by an update: the next version starts
    /// a chain of its own.
    pub(crate) fn reset(&mut self) {
        self.chain += 1;
        self.last = None;
    }

    /// Version `version`, its trained tensors being `trained` (called only if it is not
    /// made yet), made from the last version if that is the one before.
    fn link(&mut self, version: u64, trained: impl FnOnce() -> Vec<f32>) -> &Link {
        if self.last.as_ref().is_some_and(|l| l.version == version) {
            return self.last.as_ref().expect("just checked");
        }
        let weights = trained();
        let previous = self
            .last
            .take()
            .filter(|l| l.version.checked_add(1) == Some(version))
            .zip(self.deltas);
        // Each encoded once: what is held is what the frames decode to.
        let link = match previous {
            Some((previous, encoding)) => {
                let difference: Vec<f32> = weights
                    .iter()
                    .zip(previous.held.iter())
                    .map(|(w, h)| w - h)
                    .collect();
                let delta = frames(encode_weights_delta(Round(version), &difference, encoding));
                let sent = decoded(&delta);
                let target = delta::target(&previous.held, &sent).expect("one layout");
                let key = frames(encode_weights(
                    Round(version),
                    &target,
                    delta::HELD_ENCODING,
                ));
                Link {
                    version,
                    held: decoded(&key).into(),
                    key,
                    delta: Some(delta),
                }
            }
            // The first version, or not the next one: a version number only grows within
            // a chain, so nobody holds the version before this one in it.
            None => {
                let key = frames(encode_weights(
                    Round(version),
                    &weights,
                    delta::HELD_ENCODING,
                ));
                Link {
                    version,
                    held: decoded(&key).into(),
                    key,
                    delta: None,
                }
            }
        };
        self.last.insert(link)
    }

    /// The frames that bring a connection holding `holds` to `version`: its delta if it
    /// holds the version before in this chain, else its key; and what it holds then.
    pub(crate) fn frames_for(
        &mut self,
        version: u64,
        trained: impl FnOnce() -> Vec<f32>,
        holds: Option<Held>,
    ) -> (Frames, Held) {
        let chain = self.chain;
        let link = self.link(version, trained);
        let before = version
            .checked_sub(1)
            .map(|version| Held { chain, version });
        let frames = match &link.delta {
            Some(delta) if holds.is_some() && holds == before => delta.clone(),
            _ => link.key.clone(),
        };
        (frames, Held { chain, version })
    }

    /// The trained tensors of `version` as the workers holding it hold them.
    pub(crate) fn held(&mut self, version: u64, trained: impl FnOnce() -> Vec<f32>) -> Arc<[f32]> {
        Arc::clone(&self.link(version, trained).held)
    }
}

fn frames(encoded: Vec<Vec<u8>>) -> Frames {
    encoded.into_iter().map(Bytes::from).collect()
}

/// The values of a `Weights` or `WeightsDelta` message's frames, as a worker decodes them.
fn decoded(frames: &Frames) -> Vec<f32> {
    let mut values = Vec::new();
    for frame in frames.iter() {
        match protocol::decode_from_coordinator(frame) {
            Ok(
                protocol::CoordinatorToWorker::Weights(w)
                | protocol::CoordinatorToWorker::WeightsDelta(w),
            ) => values.extend(w.params),
            other => unreachable!("frames encoded here: {other:?}"),
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use protocol::{decode_from_coordinator, CoordinatorToWorker};

    use super::*;

    /// A message's chunks put back together: whether it was a delta, and its values.
    fn decoded(frames: &Frames) -> (bool, Vec<f32>) {
        let mut out = (false, Vec::new());
        for frame in frames.iter() {
            match decode_from_coordinator(frame).expect("a frame") {
                CoordinatorToWorker::Weights(w) => out.1.extend(w.params),
                CoordinatorToWorker::WeightsDelta(w) => {
                    out.0 = true;
                    out.1.extend(w.params);
                }
                other => panic!("{other:?}"),
            }
        }
        out
    }

    fn weights(version: u64) -> Vec<f32> {
        (0..1000)
            .map(|i| {
                ((i * 31 % 97) as f32 - 48.0) / 50.0
                    + version as f32 * 1e-3 * ((i % 7) as f32 - 3.0)
            })
            .collect()
    }

    /// A worker that follows the chain (a delta each version, applied as a worker does) and
    /// a newcomer at each version (the key) hold what the chain says, bit for bit, in either
    /// delta encoding; the delta is the smaller message.
    #[test]
    fn deltas_and_keys_bring_every_worker_to_the_same_weights() {
        for encoding in delta::DELTA_ENCODINGS {
            follow_the_chain(encoding);
        }
    }

    fn follow_the_chain(encoding: Compression) {
        let mut chain = Chain::new(Some(encoding));
        let (frames, mut holds) = chain.frames_for(0, || weights(0), None);
        let (is_delta, mut follower) = decoded(&frames);
        assert!(!is_delta, "the first version goes whole");
        assert_eq!(follower, *chain.held(0, || unreachable!("made")));
        for version in 1..20 {
            let (frames, now) = chain.frames_for(version, || weights(version), Some(holds));
            let (is_delta, delta) = decoded(&frames);
            assert!(is_delta, "version {version}");
            let mut raw = Vec::new();
            protocol::tensor::encode_payload(&mut raw, &delta, encoding);
            assert_eq!(
                protocol::tensor::decode_payload(&raw, delta.len(), encoding),
                delta,
                "{encoding:?}: the delta is on its encoding's levels"
            );
            follower = delta::settle(&delta::target(&follower, &delta).expect("one layout"));
            let held = chain.held(version, || unreachable!("made"));
            assert_eq!(follower, *held, "version {version}");
            let (key, newcomer) = chain.frames_for(version, || unreachable!("made"), None);
            assert_eq!(
                (false, follower.clone()),
                decoded(&key),
                "version {version}"
            );
            assert_eq!(newcomer, now);
            let bytes = |f: &Frames| f.iter().map(Bytes::len).sum::<usize>();
            let tenths = if encoding == Compression::Int2 { 4 } else { 6 };
            assert!(bytes(&frames) * 10 < bytes(&key) * tenths, "{encoding:?}");
            holds = now;
        }
        // Within an int8 step and a delta's step of the weights: the deltas do not drift.
        let last = weights(19);
        let held = chain.held(19, || unreachable!("made"));
        let error = last
            .iter()
            .zip(held.iter())
            .map(|(w, h)| (w - h).abs())
            .fold(0f32, f32::max);
        assert!(error < 1.0 / 127.0, "{encoding:?}: {error}");
    }

    /// A connection that missed a version, or holds a version of a chain since broken, or
    /// nothing, is sent the key; with deltas off every version is the `int8` of the weights.
    #[test]
    fn only_the_version_before_in_the_same_chain_takes_a_delta() {
        let mut chain = Chain::new(Some(Compression::Int2));
        let (_, at_0) = chain.frames_for(0, || weights(0), None);
        let (_, at_1) = chain.frames_for(1, || weights(1), Some(at_0));
        let (frames, _) = chain.frames_for(2, || weights(2), Some(at_0));
        assert!(!decoded(&frames).0, "a version missed: the key");
        chain.reset();
        let (frames, at_2) = chain.frames_for(2, || weights(2), Some(at_1));
        assert!(!decoded(&frames).0, "restored weights start a chain");
        assert_eq!(
            *chain.held(2, || unreachable!("made")),
            delta::settle(&weights(2))[..]
        );
        chain.reset();
        let (frames, _) = chain.frames_for(3, || weights(3), Some(at_2));
        assert!(
            !decoded(&frames).0,
            "a version of a broken chain takes no delta"
        );
        // A version skipped by everyone: the next is a key.
        let (frames, _) = chain.frames_for(5, || weights(5), None);
        assert!(!decoded(&frames).0);

        let mut off = Chain::new(None);
        let (_, held) = off.frames_for(0, || weights(0), None);
        let (frames, _) = off.frames_for(1, || weights(1), Some(held));
        assert_eq!(decoded(&frames), (false, delta::settle(&weights(1))));
    }
}

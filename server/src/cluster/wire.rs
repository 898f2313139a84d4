//! What crosses NATS between edges and the root, byte for byte (docs/CLUSTER.md).
//!
//! - A **partial** travels on the run's partials subject in chunks of at most
//!   [`CHUNK_VALUES`] values (512 KiB, under the server's default 1 MiB payload limit): each
//!   chunk carries the edge's name, the round, its place, and the partial's totals, so the
//!   root reassembles it without any other state. All little-endian.
//! - **Weights**: each new version travels on the run's weights subject, in chunks like a
//!   partial's, tagged with the root's epoch (its lease's revision: a root that took over
//!   may go back to an older version) and the version.
//! - A **version** as the Object Store keeps it: the weights (all parameters) and the
//!   optimizer's state, the root's checkpoint.
//!
//! Decoding checks every length against the bytes there are: a broken or hostile message is
//! an error, never a panic.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use coordinator_core::remote::Partial;
use model::OptimizerState;

/// Values per partial chunk.
pub const CHUNK_VALUES: usize = 128 * 1024;
const PARTIAL_MAGIC: &[u8; 4] = b"CTP1";
const VERSION_MAGIC: &[u8; 4] = b"CTV1";
const WEIGHTS_MAGIC: &[u8; 4] = b"CTW1";
/// Longest edge name.
pub const MAX_NAME: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not a crowdtrain {0} (wrong magic)")]
    Magic(&'static str),
    #[error("truncated {0}")]
    Truncated(&'static str),
    #[error("{0}")]
    Invalid(String),
}

/// Reads little-endian fields off a byte slice, failing on truncation.
struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() < n {
            return Err(WireError::Truncated(self.what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn f64(&mut self) -> Result<f64, WireError> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn floats(&mut self, n: usize) -> Result<Vec<f32>, WireError> {
        let bytes = self.take(n.checked_mul(4).ok_or(WireError::Truncated(self.what))?)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4")))
            .collect())
    }
    fn name(&mut self) -> Result<String, WireError> {
        let len = usize::from(self.u16()?);
        if len > MAX_NAME {
            return Err(WireError::Invalid(format!("a name of {len} bytes")));
        }
        String::from_utf8(self.take(len)?.to_vec())
            .map_err(|_| WireError::Invalid("a name that is not UTF-8".into()))
    }
}

fn put_floats(out: &mut BytesMut, values: &[f32]) {
    for v in values {
        out.put_f32_le(*v);
    }
}

fn put_name(out: &mut BytesMut, name: &str) {
    let name = &name.as_bytes()[..name.len().min(MAX_NAME)];
    out.put_u16_le(name.len() as u16);
    out.put_slice(name);
}

/// One chunk of an edge's partial.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub edge: String,
    pub round: u64,
    pub offset: usize,
    pub total: usize,
    pub samples: u64,
    pub answered: usize,
    pub mean_loss: f64,
    pub values: Vec<f32>,
}

/// `values` in chunks of at most [`CHUNK_VALUES`], with their offsets (one empty chunk for
/// no values: a message still says what it is).
fn chunks(values: &[f32]) -> impl Iterator<Item = (usize, &[f32])> {
    let count = values.len().div_ceil(CHUNK_VALUES).max(1);
    (0..count).map(move |k| {
        let offset = k * CHUNK_VALUES;
        (
            offset,
            &values[offset.min(values.len())..(offset + CHUNK_VALUES).min(values.len())],
        )
    })
}

/// `partial` from `edge`, as the messages to publish.
pub fn encode_partial(edge: &str, partial: &Partial) -> Vec<Bytes> {
    let total = partial.gradient.len();
    let mut out = Vec::new();
    for (offset, values) in chunks(&partial.gradient) {
        let mut b = BytesMut::with_capacity(64 + edge.len() + 4 * values.len());
        b.put_slice(PARTIAL_MAGIC);
        put_name(&mut b, edge);
        b.put_u64_le(partial.round);
        b.put_u32_le(offset as u32);
        b.put_u32_le(total as u32);
        b.put_u64_le(partial.samples);
        b.put_u32_le(partial.answered as u32);
        b.put_f64_le(partial.mean_loss);
        b.put_u32_le(values.len() as u32);
        put_floats(&mut b, values);
        out.push(b.freeze());
    }
    out
}

pub fn decode_chunk(bytes: &[u8]) -> Result<Chunk, WireError> {
    let mut r = Reader {
        bytes,
        what: "partial",
    };
    if r.take(4)? != PARTIAL_MAGIC {
        return Err(WireError::Magic("partial"));
    }
    let edge = r.name()?;
    let round = r.u64()?;
    let offset = r.u32()? as usize;
    let total = r.u32()? as usize;
    let samples = r.u64()?;
    let answered = r.u32()? as usize;
    let mean_loss = r.f64()?;
    let len = r.u32()? as usize;
    if len > CHUNK_VALUES || offset.checked_add(len).is_none_or(|end| end > total) {
        return Err(WireError::Invalid(format!(
            "a chunk of {len} values at {offset} of {total}"
        )));
    }
    let values = r.floats(len)?;
    Ok(Chunk {
        edge,
        round,
        offset,
        total,
        samples,
        answered,
        mean_loss,
        values,
    })
}

/// Reassembles partials from their chunks, for one round at a time and only of the
/// expected length: memory is at most one partial per edge.
#[derive(Debug)]
pub struct Assembler {
    len: usize,
    round: u64,
    /// By edge: the partial so far, and the chunks arrived (offset → values), so that a
    /// chunk sent twice (an edge resends its partial until the next version) counts once.
    open: BTreeMap<String, (Partial, BTreeMap<usize, usize>)>,
}

impl Assembler {
    pub fn new(len: usize, round: u64) -> Self {
        Self {
            len,
            round,
            open: BTreeMap::new(),
        }
    }

    /// From now on, chunks of `round` only.
    pub fn round(&mut self, round: u64) {
        if round != self.round {
            self.round = round;
            self.open.clear();
        }
    }

    /// Takes a chunk; returns the edge and its partial once every value has arrived.
    pub fn add(&mut self, chunk: Chunk) -> Result<Option<(String, Partial)>, WireError> {
        if chunk.round != self.round {
            return Err(WireError::Invalid(format!(
                "a chunk of round {} while the root is at round {}",
                chunk.round, self.round
            )));
        }
        if chunk.total != self.len {
            return Err(WireError::Invalid(format!(
                "a partial of {} values; the model trains {}",
                chunk.total, self.len
            )));
        }
        let len = self.len;
        let entry = self.open.entry(chunk.edge.clone()).or_insert_with(|| {
            (
                Partial {
                    round: chunk.round,
                    gradient: vec![0.0; len],
                    samples: chunk.samples,
                    mean_loss: chunk.mean_loss,
                    answered: chunk.answered,
                },
                BTreeMap::new(),
            )
        });
        let (partial, arrived) = entry;
        if (partial.samples, partial.answered) != (chunk.samples, chunk.answered) {
            // A newer send of the same round's partial: start it again.
            *partial = Partial {
                samples: chunk.samples,
                answered: chunk.answered,
                mean_loss: chunk.mean_loss,
                ..partial.clone()
            };
            arrived.clear();
        }
        partial.gradient[chunk.offset..chunk.offset + chunk.values.len()]
            .copy_from_slice(&chunk.values);
        arrived.insert(chunk.offset, chunk.values.len());
        if arrived.values().sum::<usize>() < len {
            return Ok(None);
        }
        let (partial, _) = self.open.remove(&chunk.edge).expect("present");
        Ok(Some((chunk.edge, partial)))
    }
}

/// One chunk of a version's weights.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightsChunk {
    pub epoch: u64,
    pub version: u64,
    pub offset: usize,
    pub total: usize,
    pub values: Vec<f32>,
}

/// Version `version` of root epoch `epoch`, as the messages to publish.
pub fn encode_weights(epoch: u64, version: u64, params: &[f32]) -> Vec<Bytes> {
    let total = params.len();
    let mut out = Vec::new();
    for (offset, values) in chunks(params) {
        let mut b = BytesMut::with_capacity(32 + 4 * values.len());
        b.put_slice(WEIGHTS_MAGIC);
        b.put_u64_le(epoch);
        b.put_u64_le(version);
        b.put_u32_le(offset as u32);
        b.put_u32_le(total as u32);
        b.put_u32_le(values.len() as u32);
        put_floats(&mut b, values);
        out.push(b.freeze());
    }
    out
}

pub fn decode_weights_chunk(bytes: &[u8]) -> Result<WeightsChunk, WireError> {
    let mut r = Reader {
        bytes,
        what: "weights",
    };
    if r.take(4)? != WEIGHTS_MAGIC {
        return Err(WireError::Magic("weights"));
    }
    let epoch = r.u64()?;
    let version = r.u64()?;
    let offset = r.u32()? as usize;
    let total = r.u32()? as usize;
    let len = r.u32()? as usize;
    if len > CHUNK_VALUES || offset.checked_add(len).is_none_or(|end| end > total) {
        return Err(WireError::Invalid(format!(
            "a chunk of {len} values at {offset} of {total}"
        )));
    }
    Ok(WeightsChunk {
        epoch,
        version,
        offset,
        total,
        values: r.floats(len)?,
    })
}

/// A version being reassembled: (epoch, version), its values, the chunks arrived.
type OpenWeights = ((u64, u64), Vec<f32>, BTreeMap<usize, usize>);

/// Reassembles the root's weights, one version at a time (the newest chunk's): memory is
/// one copy of the parameters.
#[derive(Debug)]
pub struct WeightsAssembler {
    len: usize,
    open: Option<OpenWeights>,
}

impl WeightsAssembler {
    pub fn new(len: usize) -> Self {
        Self { len, open: None }
    }

    /// Takes a chunk; returns (epoch, version, weights) once every value has arrived.
    pub fn add(&mut self, chunk: WeightsChunk) -> Result<Option<(u64, u64, Vec<f32>)>, WireError> {
        if chunk.total != self.len {
            return Err(WireError::Invalid(format!(
                "weights of {} values; the model has {}",
                chunk.total, self.len
            )));
        }
        let key = (chunk.epoch, chunk.version);
        if self.open.as_ref().is_none_or(|(k, _, _)| *k != key) {
            self.open = Some((key, vec![0.0; self.len], BTreeMap::new()));
        }
        let (_, values, arrived) = self.open.as_mut().expect("set above");
        values[chunk.offset..chunk.offset + chunk.values.len()].copy_from_slice(&chunk.values);
        arrived.insert(chunk.offset, chunk.values.len());
        if arrived.values().sum::<usize>() < self.len {
            return Ok(None);
        }
        let ((epoch, version), values, _) = self.open.take().expect("set above");
        Ok(Some((epoch, version, values)))
    }
}

/// A version of the weights, as the Object Store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub version: u64,
    pub params: Vec<f32>,
    pub optimizer: OptimizerState,
}

pub fn encode_version(v: &Version) -> Vec<u8> {
    let tensors: usize = v.optimizer.tensors.iter().map(|(_, t)| t.len()).sum();
    let mut b = BytesMut::with_capacity(32 + 4 * (v.params.len() + tensors));
    b.put_slice(VERSION_MAGIC);
    b.put_u64_le(v.version);
    b.put_u64_le(v.optimizer.step);
    b.put_u32_le(v.params.len() as u32);
    put_floats(&mut b, &v.params);
    b.put_u32_le(v.optimizer.tensors.len() as u32);
    for (name, values) in &v.optimizer.tensors {
        put_name(&mut b, name);
        b.put_u32_le(values.len() as u32);
        put_floats(&mut b, values);
    }
    b.to_vec()
}

pub fn decode_version(bytes: &[u8]) -> Result<Version, WireError> {
    let mut r = Reader {
        bytes,
        what: "version",
    };
    if r.take(4)? != VERSION_MAGIC {
        return Err(WireError::Magic("version"));
    }
    let version = r.u64()?;
    let step = r.u64()?;
    let n = r.u32()? as usize;
    let params = r.floats(n)?;
    let count = r.u32()? as usize;
    let mut tensors = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name = r.name()?;
        let len = r.u32()? as usize;
        tensors.push((name, r.floats(len)?));
    }
    if !r.bytes.is_empty() {
        return Err(WireError::Invalid(format!(
            "{} bytes after the version",
            r.bytes.len()
        )));
    }
    Ok(Version {
        version,
        params,
        optimizer: OptimizerState { step, tensors },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partial(len: usize, round: u64) -> Partial {
        Partial {
            round,
            gradient: (0..len).map(|i| i as f32 * 0.5).collect(),
            samples: 96,
            mean_loss: 1.25,
            answered: 3,
        }
    }

    #[test]
    fn a_partial_crosses_in_chunks_and_comes_back_whole() {
        let len = 2 * CHUNK_VALUES + 17;
        let p = partial(len, 4);
        let chunks = encode_partial("edge-a", &p);
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| c.len() < 1024 * 1024), "under 1 MiB");
        let mut a = Assembler::new(len, 4);
        // In any order, and a chunk sent twice counts once.
        assert_eq!(a.add(decode_chunk(&chunks[2]).expect("ok")), Ok(None));
        assert_eq!(a.add(decode_chunk(&chunks[0]).expect("ok")), Ok(None));
        assert_eq!(a.add(decode_chunk(&chunks[0]).expect("ok")), Ok(None));
        assert_eq!(a.add(decode_chunk(&chunks[2]).expect("ok")), Ok(None));
        let (edge, got) = a
            .add(decode_chunk(&chunks[1]).expect("ok"))
            .expect("ok")
            .expect("whole");
        assert_eq!((edge.as_str(), got), ("edge-a", p));
    }

    #[test]
    fn chunks_of_another_round_or_length_and_broken_bytes_are_errors() {
        let p = partial(10, 4);
        let chunk = encode_partial("e", &p).remove(0);
        let mut a = Assembler::new(10, 5);
        assert!(a.add(decode_chunk(&chunk).expect("ok")).is_err(), "stale");
        let mut a = Assembler::new(11, 4);
        assert!(a.add(decode_chunk(&chunk).expect("ok")).is_err(), "length");
        for cut in 0..chunk.len() {
            assert!(decode_chunk(&chunk[..cut]).is_err(), "truncated at {cut}");
        }
        let mut lying = chunk.to_vec();
        // The chunk's length field (after magic, name, round, offset, total, samples,
        // answered, loss) claims more values than its total.
        let at = 4 + 2 + 1 + 8 + 4 + 4 + 8 + 4 + 8;
        lying[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(decode_chunk(&lying).is_err());
        assert_eq!(decode_chunk(b"nope"), Err(WireError::Magic("partial")));
    }

    #[test]
    fn weights_cross_in_chunks_and_a_newer_version_replaces_an_unfinished_one() {
        let len = CHUNK_VALUES + 5;
        let old: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let new: Vec<f32> = (0..len).map(|i| -(i as f32)).collect();
        let (old_chunks, new_chunks) = (encode_weights(2, 7, &old), encode_weights(3, 4, &new));
        let mut a = WeightsAssembler::new(len);
        assert_eq!(
            a.add(decode_weights_chunk(&old_chunks[0]).expect("ok")),
            Ok(None)
        );
        // A new root's epoch (an older version): it replaces the unfinished one.
        assert_eq!(
            a.add(decode_weights_chunk(&new_chunks[1]).expect("ok")),
            Ok(None)
        );
        assert_eq!(
            a.add(decode_weights_chunk(&new_chunks[1]).expect("ok")),
            Ok(None)
        );
        assert_eq!(
            a.add(decode_weights_chunk(&new_chunks[0]).expect("ok")),
            Ok(Some((3, 4, new)))
        );
        assert!(a
            .add(decode_weights_chunk(&encode_weights(3, 5, &[1.0])[0]).expect("ok"))
            .is_err());
        for cut in 0..old_chunks[1].len() {
            assert!(
                decode_weights_chunk(&old_chunks[1][..cut]).is_err(),
                "truncated at {cut}"
            );
        }
    }

    #[test]
    fn a_version_round_trips_and_truncation_is_an_error() {
        let v = Version {
            version: 12,
            params: vec![1.0, -2.5, 3.25],
            optimizer: OptimizerState {
                step: 12,
                tensors: vec![("m".into(), vec![0.5; 3]), ("v".into(), vec![0.25; 3])],
            },
        };
        let bytes = encode_version(&v);
        assert_eq!(decode_version(&bytes), Ok(v));
        for cut in 0..bytes.len() {
            assert!(decode_version(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
    }
}

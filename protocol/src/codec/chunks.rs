//! Tensor messages as chunk frames (see [`crate::chunk`]): encoding a whole tensor into its
//! chunks, and reading one chunk's position and values.

use super::wire::{Reader, Writer};
use super::{
    DecodeError, HEADER_LEN, MAGIC, TAG_FROZEN, TAG_GRADIENT, TAG_WEIGHTS, TAG_WEIGHTS_DELTA,
};
use crate::chunk::{chunks, ChunkPos, CHUNK_VALUES};
use crate::ids::Round;
use crate::message::Gradient;
use crate::tensor::{decode_payload_append, Compression};

/// Encodes a whole `Gradient` as its chunk frames, its tensor compressed as `c` (what a
/// worker that negotiated a compression sends).
pub fn encode_gradient(g: &Gradient, c: Compression) -> Vec<Vec<u8>> {
    let total = total_u32(g.grads.len());
    chunks(g.grads.len())
        .map(|r| {
            let pos = (total, r.start as u32);
            gradient_chunk(
                g.round,
                (g.samples, g.loss, g.compute_us, g.parts),
                pos,
                &g.grads[r],
                c,
            )
        })
        .collect()
}

pub(super) fn gradient_chunk(
    round: Round,
    (samples, loss, compute_us, parts): (u32, f32, u32, u8),
    pos: (u32, u32),
    values: &[f32],
    c: Compression,
) -> Vec<u8> {
    let mut w = Writer::new(TAG_GRADIENT, 34 + values.len() * 4);
    w.u64(round.0);
    w.u32(samples);
    w.f32(loss);
    w.u32(compute_us);
    w.u8(parts);
    w.chunk(pos, values, c);
    w.buf
}

/// The bytes of all the chunk frames [`encode_gradient`] makes for `values` in `c`, without
/// encoding them (`None` if they do not fit the format). `int2`'s payload is counted from
/// the values as a receiver decoded them: a bit for each, and a sign bit for each that is
/// not 0.
pub fn gradient_wire_len(values: &[f32], c: Compression) -> Option<usize> {
    // Per chunk: header, round (8), samples (4), loss (4), compute time (4), parts (1),
    // total (4), offset (4), tensor: compression (1), count (4), [payload length (4),]
    // payload.
    let fields = HEADER_LEN + 8 + 4 + 4 + 4 + 1 + 4 + 4 + 1 + 4 + if c.is_sized() { 0 } else { 4 };
    let frames = values.len().div_ceil(CHUNK_VALUES).max(1);
    let payload = if c.is_sized() {
        c.payload_len(values.len())?
    } else {
        crate::tensor::int2_packed_len(values)
    };
    frames.checked_mul(fields)?.checked_add(payload)
}

fn total_u32(len: usize) -> u32 {
    u32::try_from(len).expect("a tensor of over 4 Gi values cannot be encoded")
}

/// Encodes the frozen tensors' values as `Frozen` chunk frames in `c`.
pub fn encode_frozen(params: &[f32], c: Compression) -> Vec<Vec<u8>> {
    let total = total_u32(params.len());
    chunks(params.len())
        .map(|r| frozen_chunk((total, r.start as u32), &params[r], c))
        .collect()
}

pub(super) fn frozen_chunk(pos: (u32, u32), values: &[f32], c: Compression) -> Vec<u8> {
    let mut w = Writer::new(TAG_FROZEN, 13 + values.len() * 4);
    w.chunk(pos, values, c);
    w.buf
}

/// Encodes weights version `round` as `Weights` chunk frames straight from a parameter
/// slice, so the coordinator encodes once per round (and compression), and every connection
/// sends the same frames.
pub fn encode_weights(round: Round, params: &[f32], c: Compression) -> Vec<Vec<u8>> {
    round_frames(TAG_WEIGHTS, round, params, c)
}

pub(super) fn weights_chunk(
    round: Round,
    pos: (u32, u32),
    values: &[f32],
    c: Compression,
) -> Vec<u8> {
    round_chunk(TAG_WEIGHTS, round, pos, values, c)
}

/// Encodes version `round` as `WeightsDelta` chunk frames of `delta`, its difference from
/// version `round - 1` as the recipient holds it (see [`crate::delta`]), in `c`.
pub fn encode_weights_delta(round: Round, delta: &[f32], c: Compression) -> Vec<Vec<u8>> {
    round_frames(TAG_WEIGHTS_DELTA, round, delta, c)
}

/// A tensor of version `round` as the chunk frames of the message `tag`.
fn round_frames(tag: u8, round: Round, values: &[f32], c: Compression) -> Vec<Vec<u8>> {
    let total = total_u32(values.len());
    chunks(values.len())
        .map(|r| round_chunk(tag, round, (total, r.start as u32), &values[r], c))
        .collect()
}

pub(super) fn weights_delta_chunk(
    round: Round,
    pos: (u32, u32),
    values: &[f32],
    c: Compression,
) -> Vec<u8> {
    round_chunk(TAG_WEIGHTS_DELTA, round, pos, values, c)
}

fn round_chunk(tag: u8, round: Round, pos: (u32, u32), values: &[f32], c: Compression) -> Vec<u8> {
    let mut w = Writer::new(tag, 21 + values.len() * 4);
    w.u64(round.0);
    w.chunk(pos, values, c);
    w.buf
}

/// Whether an encoded frame is the first chunk of a `Weights` message (by its header and
/// offset, without decoding it).
pub fn is_weights_start(frame: &[u8]) -> bool {
    frame.len() >= WEIGHTS_DATA_OFFSET
        && frame.starts_with(&MAGIC)
        && frame[HEADER_LEN - 1] == TAG_WEIGHTS
        && frame[HEADER_LEN + 12..HEADER_LEN + 16] == [0; 4]
}

/// Offset of the first parameter byte inside an uncompressed (`f32`) `Weights` chunk frame:
/// header, round, total, offset, encoding, count.
pub const WEIGHTS_DATA_OFFSET: usize = HEADER_LEN + 8 + 4 + 4 + 1 + 4;

/// A gradient chunk whose values are still the frame's bytes: [`Self::decode_append`] writes
/// them where the receiver wants them, with no intermediate buffer.
#[derive(Debug, Clone, Copy)]
pub struct RawGradientChunk<'a> {
    pub round: Round,
    pub samples: u32,
    pub loss: f32,
    pub compute_us: u32,
    pub parts: u8,
    pub pos: ChunkPos,
    pub compression: Compression,
    pub(super) payload: &'a [u8],
}

impl RawGradientChunk<'_> {
    /// Decodes the values onto the end of `out`, in one pass with nothing zeroed first.
    pub fn decode_append(&self, out: &mut Vec<f32>) {
        let count = self.pos.count as usize;
        decode_payload_append(self.payload, count, out, self.compression);
    }
}

/// A chunk's position, checked: at most [`CHUNK_VALUES`] values, inside its tensor.
pub(super) fn chunk_pos(total: u32, offset: u32, count: usize) -> Result<ChunkPos, DecodeError> {
    if count > CHUNK_VALUES {
        return Err(DecodeError::InvalidValue {
            field: "chunk count",
            value: count as u64,
        });
    }
    let count = count as u32;
    if u64::from(offset) + u64::from(count) > u64::from(total) {
        return Err(DecodeError::InvalidValue {
            field: "chunk offset",
            value: offset.into(),
        });
    }
    Ok(ChunkPos {
        total,
        offset,
        count,
    })
}

/// A chunk's values, checked by [`chunk_pos`].
pub(super) fn chunk_values(r: &mut Reader<'_>) -> Result<(u32, u32, Vec<f32>), DecodeError> {
    let (total, offset) = (r.u32()?, r.u32()?);
    let values = r.tensor()?;
    chunk_pos(total, offset, values.len())?;
    Ok((total, offset, values))
}

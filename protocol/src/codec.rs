//! Binary encoding of the messages.
//!
//! Every frame is `magic "CT" | version u16 | tag u8 | payload`, all integers little-endian.
//! Tensors are an encoding byte (`f32`, `f16` or `int8`, see [`crate::tensor`]), a `u32`
//! element count and the payload; strings and byte blobs are length-prefixed. `docs/PROTOCOL.md` has the full table.
//!
//! Decoding never trusts a length field: every length is checked against the bytes actually
//! left in the frame *before* anything is allocated, so a lying header costs nothing, and
//! memory use is bounded by the frame size (which the transport caps).

use thiserror::Error;

use model::OptimizerKind;

use crate::commit::{Challenge, Commitments, RevealChunk, MAX_CHALLENGED};
use crate::ids::{Round, WorkerId};
use crate::message::{
    CoordinatorToWorker, ErrorCode, GradientChunk, Hello, LocalPhase, ModelSpec, Shard,
    ShardValues, Task, Weights, Welcome, WorkerKind, WorkerToCoordinator, MAX_LOCAL_STEPS,
};
use crate::tensor::Compression;
use crate::PROTOCOL_VERSION;

mod chunks;
mod wire;

use chunks::{
    chunk_pos, chunk_values, frozen_chunk, gradient_chunk, weights_chunk, weights_delta_chunk,
};
pub use chunks::{
    encode_frozen, encode_gradient, encode_weights, encode_weights_delta, gradient_wire_len,
    is_weights_start, RawGradientChunk, WEIGHTS_DATA_OFFSET,
};

use wire::{Reader, Writer};

pub(crate) const MAGIC: [u8; 2] = *b"CT";
/// Bytes before the payload: magic, version, tag.
pub const HEADER_LEN: usize = 5;

const TAG_HELLO: u8 = 0x01;
const TAG_GRADIENT: u8 = 0x02;
const TAG_COMMITMENTS: u8 = 0x03;
const TAG_REVEAL: u8 = 0x04;
const TAG_WELCOME: u8 = 0x81;
const TAG_SHARD: u8 = 0x82;
const TAG_WEIGHTS: u8 = 0x83;
const TAG_ERROR: u8 = 0x84;
const TAG_FROZEN: u8 = 0x85;
const TAG_TASK: u8 = 0x86;
const TAG_CHALLENGE: u8 = 0x87;
const TAG_WEIGHTS_DELTA: u8 = 0x88;

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("frame too short: needed {needed} more bytes at offset {offset}")]
    Truncated { offset: usize, needed: usize },
    #[error("not a crowdtrain frame (bad magic bytes)")]
    BadMagic,
    #[error("protocol version {got} is not supported (this side speaks {expected})")]
    VersionMismatch { got: u16, expected: u16 },
    #[error("unknown message tag {0:#04x} for this direction")]
    UnknownTag(u8),
    #[error("invalid value {value} for field {field}")]
    InvalidValue { field: &'static str, value: u64 },
    #[error("field {0} is not valid UTF-8")]
    InvalidUtf8(&'static str),
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
}

impl DecodeError {
    /// The wire error code to answer this failure with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::VersionMismatch { .. } => ErrorCode::VersionMismatch,
            _ => ErrorCode::Malformed,
        }
    }
}

// ---------------------------------------------------------------- encoding

/// Encodes a message sent by a worker.
pub fn encode_from_worker(msg: &WorkerToCoordinator) -> Vec<u8> {
    match msg {
        WorkerToCoordinator::Hello(h) => {
            let mut w = Writer::new(TAG_HELLO, 16);
            w.u8(match h.kind {
                None => 0,
                Some(WorkerKind::Browser) => 1,
                Some(WorkerKind::Native) => 2,
            });
            w.opt_str(h.join_token.as_deref());
            w.opt_str(h.resume_token.as_deref());
            w.u8(h.compression.to_u8());
            w.u8(h.fused.into());
            w.buf
        }
        WorkerToCoordinator::Gradient(g) => {
            let pos = (g.total, g.offset);
            let head = (g.samples, g.loss, g.compute_us, g.parts);
            gradient_chunk(g.round, head, pos, &g.grads, Compression::None)
        }
        WorkerToCoordinator::Commitments(c) => {
            let mut w = Writer::new(TAG_COMMITMENTS, 12 + 32 * c.hashes.len());
            w.u64(c.round.0);
            w.u32(u32::try_from(c.hashes.len()).expect("at most MAX_LOCAL_STEPS hashes"));
            for h in &c.hashes {
                w.raw(h);
            }
            w.buf
        }
        WorkerToCoordinator::Reveal(c) => {
            let mut w = Writer::new(TAG_REVEAL, 32 + 4 * c.values.len());
            w.u64(c.round.0);
            w.u32(c.boundary);
            w.chunk((c.total, c.offset), &c.values, Compression::None);
            w.buf
        }
    }
}

/// A revealed state's chunk frames (raw `f32`: its hash is of the exact values).
pub fn encode_reveal(round: Round, boundary: u32, values: &[f32]) -> Vec<Vec<u8>> {
    let total = u32::try_from(values.len()).expect("a state of at most 4 Gi values");
    crate::chunk::chunks(values.len())
        .map(|r| {
            encode_from_worker(&WorkerToCoordinator::Reveal(RevealChunk {
                round,
                boundary,
                total,
                offset: r.start as u32,
                values: values[r].to_vec(),
            }))
        })
        .collect()
}

/// Encodes a message sent by the coordinator.
pub fn encode_from_coordinator(msg: &CoordinatorToWorker) -> Vec<u8> {
    match msg {
        CoordinatorToWorker::Welcome(m) => {
            let hint = 32 + m.resume_token.len() + m.model.text.len();
            let mut w = Writer::new(TAG_WELCOME, hint);
            w.u32(m.worker_id.0);
            w.str(&m.resume_token);
            w.str(&m.model.text);
            w.u64(m.model.fingerprint);
            w.u32(m.batch_size);
            w.u8(m.compression.to_u8());
            w.buf
        }
        CoordinatorToWorker::Shard(s) => {
            let values = s.values.len()
                * if matches!(s.values, ShardValues::U8(_)) {
                    1
                } else {
                    4
                };
            let mut w = Writer::new(TAG_SHARD, 40 + s.labels.len() + values);
            w.u32(s.first_index);
            for d in s.shape {
                w.u32(d);
            }
            w.bytes(&s.labels);
            match &s.values {
                ShardValues::U8(v) => {
                    w.u8(0);
                    w.bytes(v);
                }
                ShardValues::F32(v) => {
                    w.u8(1);
                    w.tensor(v, Compression::None);
                }
            }
            w.tensor(&s.mean, Compression::None);
            w.tensor(&s.std, Compression::None);
            w.buf
        }
        CoordinatorToWorker::Task(t) => {
            let mut w = Writer::new(TAG_TASK, 40);
            w.u64(t.round.0);
            w.u64(t.batch);
            match t.local {
                None => w.u8(0),
                Some(phase) => {
                    w.u8(1);
                    w.u32(phase.steps);
                    let (kind, values) = match phase.optimizer {
                        OptimizerKind::Sgd { lr } => (0, [lr, 0.0, 0.0, 0.0]),
                        OptimizerKind::Momentum { lr, momentum } => (1, [lr, momentum, 0.0, 0.0]),
                        OptimizerKind::Nesterov { lr, momentum } => (4, [lr, momentum, 0.0, 0.0]),
                        OptimizerKind::Adam {
                            lr,
                            beta1,
                            beta2,
                            eps,
                        } => (2, [lr, beta1, beta2, eps]),
                        OptimizerKind::AdamW {
                            lr,
                            beta1,
                            beta2,
                            eps,
                            ..
                        } => (3, [lr, beta1, beta2, eps]),
                    };
                    w.u8(kind);
                    for v in values {
                        w.f32(v);
                    }
                    if let OptimizerKind::AdamW { weight_decay, .. } = phase.optimizer {
                        w.f32(weight_decay);
                    }
                    w.u32(phase.segment);
                }
            }
            w.buf
        }
        CoordinatorToWorker::Challenge(c) => {
            let mut w = Writer::new(TAG_CHALLENGE, 12 + 4 * c.boundaries.len());
            w.u64(c.round.0);
            w.u32(u32::try_from(c.boundaries.len()).expect("a few boundaries"));
            for &b in &c.boundaries {
                w.u32(b);
            }
            w.buf
        }
        CoordinatorToWorker::Weights(m) => {
            weights_chunk(m.round, (m.total, m.offset), &m.params, Compression::None)
        }
        CoordinatorToWorker::WeightsDelta(m) => {
            weights_delta_chunk(m.round, (m.total, m.offset), &m.params, Compression::None)
        }
        CoordinatorToWorker::Frozen {
            total,
            offset,
            params,
        } => frozen_chunk((*total, *offset), params, Compression::None),
        CoordinatorToWorker::Error { code, message } => {
            let mut w = Writer::new(TAG_ERROR, 4 + message.len());
            w.u16(code.to_u16());
            w.str(message);
            w.buf
        }
    }
}

// ---------------------------------------------------------------- decoding

/// Checks magic and version and returns the tag and a reader positioned on the payload.
fn header(frame: &[u8]) -> Result<(u8, Reader<'_>), DecodeError> {
    let mut r = Reader::new(frame);
    if r.array::<2>()? != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = r.u16()?;
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::VersionMismatch {
            got: version,
            expected: PROTOCOL_VERSION,
        });
    }
    let tag = r.u8()?;
    Ok((tag, r))
}

/// A frame from a worker, its gradient chunk not yet decoded.
#[derive(Debug)]
pub enum WorkerFrame<'a> {
    Hello(Hello),
    Gradient(RawGradientChunk<'a>),
    Commitments(Commitments),
    Reveal(RevealChunk),
}

/// Decodes a frame received from a worker, leaving a gradient chunk's values in the frame.
pub fn decode_worker_frame(frame: &[u8]) -> Result<WorkerFrame<'_>, DecodeError> {
    let (tag, mut r) = header(frame)?;
    let msg = match tag {
        TAG_HELLO => {
            let kind = match r.u8()? {
                0 => None,
                1 => Some(WorkerKind::Browser),
                2 => Some(WorkerKind::Native),
                v => {
                    return Err(DecodeError::InvalidValue {
                        field: "kind",
                        value: v.into(),
                    })
                }
            };
            WorkerFrame::Hello(Hello {
                kind,
                join_token: r.opt_str("join_token")?,
                resume_token: r.opt_str("resume_token")?,
                compression: r.compression("compression")?,
                fused: match r.u8()? {
                    0 => false,
                    1 => true,
                    v => {
                        return Err(DecodeError::InvalidValue {
                            field: "fused",
                            value: v.into(),
                        })
                    }
                },
            })
        }
        TAG_GRADIENT => {
            let (round, samples, loss) = (Round(r.u64()?), r.u32()?, r.f32()?);
            let compute_us = r.u32()?;
            let parts = r.u8()?;
            let (total, offset) = (r.u32()?, r.u32()?);
            let (compression, count, payload) = r.raw_tensor()?;
            WorkerFrame::Gradient(RawGradientChunk {
                round,
                samples,
                loss,
                compute_us,
                parts,
                pos: chunk_pos(total, offset, count)?,
                compression,
                payload,
            })
        }
        TAG_COMMITMENTS => {
            let round = Round(r.u64()?);
            let (count, raw) = r.counted(32)?;
            if count > MAX_LOCAL_STEPS as usize {
                return Err(DecodeError::InvalidValue {
                    field: "commitments.count",
                    value: count as u64,
                });
            }
            let hashes = raw
                .chunks_exact(32)
                .map(|h| h.try_into().expect("32 bytes"))
                .collect();
            WorkerFrame::Commitments(Commitments { round, hashes })
        }
        TAG_REVEAL => {
            let (round, boundary) = (Round(r.u64()?), r.u32()?);
            let (total, offset) = (r.u32()?, r.u32()?);
            let (compression, count, payload) = r.raw_tensor()?;
            if compression != Compression::None {
                return Err(DecodeError::InvalidValue {
                    field: "reveal encoding",
                    value: u64::from(compression.to_u8()),
                });
            }
            chunk_pos(total, offset, count)?;
            let mut values = Vec::with_capacity(count);
            crate::tensor::decode_payload_append(payload, count, &mut values, compression);
            WorkerFrame::Reveal(RevealChunk {
                round,
                boundary,
                total,
                offset,
                values,
            })
        }
        other => return Err(DecodeError::UnknownTag(other)),
    };
    r.finish()?;
    Ok(msg)
}

/// Decodes a frame received from a worker.
pub fn decode_from_worker(frame: &[u8]) -> Result<WorkerToCoordinator, DecodeError> {
    Ok(match decode_worker_frame(frame)? {
        WorkerFrame::Hello(hello) => WorkerToCoordinator::Hello(hello),
        WorkerFrame::Gradient(raw) => {
            let mut grads = Vec::new();
            raw.decode_append(&mut grads);
            WorkerToCoordinator::Gradient(GradientChunk {
                round: raw.round,
                samples: raw.samples,
                loss: raw.loss,
                compute_us: raw.compute_us,
                parts: raw.parts,
                total: raw.pos.total,
                offset: raw.pos.offset,
                grads,
            })
        }
        WorkerFrame::Commitments(c) => WorkerToCoordinator::Commitments(c),
        WorkerFrame::Reveal(c) => WorkerToCoordinator::Reveal(c),
    })
}

/// Decodes a frame received from the coordinator.
pub fn decode_from_coordinator(frame: &[u8]) -> Result<CoordinatorToWorker, DecodeError> {
    let (tag, mut r) = header(frame)?;
    let msg = match tag {
        TAG_WELCOME => {
            let worker_id = WorkerId(r.u32()?);
            let resume_token = r.str("resume_token")?;
            let model = ModelSpec {
                text: r.str("model")?,
                fingerprint: r.u64()?,
            };
            CoordinatorToWorker::Welcome(Welcome {
                worker_id,
                resume_token,
                model,
                batch_size: r.u32()?,
                compression: r.compression("compression")?,
            })
        }
        TAG_SHARD => {
            let first_index = r.u32()?;
            let shape = [r.u32()?, r.u32()?, r.u32()?];
            let labels = r.bytes()?;
            let values = match r.u8()? {
                0 => ShardValues::U8(r.bytes()?),
                1 => ShardValues::F32(r.tensor()?),
                v => {
                    return Err(DecodeError::InvalidValue {
                        field: "values.type",
                        value: v.into(),
                    })
                }
            };
            let features = shape.iter().map(|&d| u128::from(d)).product::<u128>();
            if labels.len() as u128 * features != values.len() as u128 {
                return Err(DecodeError::InvalidValue {
                    field: "values.len",
                    value: values.len() as u64,
                });
            }
            let (mean, std) = (r.tensor()?, r.tensor()?);
            if mean.len() != std.len() {
                return Err(DecodeError::InvalidValue {
                    field: "std.len",
                    value: std.len() as u64,
                });
            }
            CoordinatorToWorker::Shard(Shard {
                first_index,
                shape,
                labels,
                values,
                mean,
                std,
            })
        }
        TAG_TASK => CoordinatorToWorker::Task(Task {
            round: Round(r.u64()?),
            batch: r.u64()?,
            local: local_phase(&mut r)?,
        }),
        TAG_WEIGHTS => {
            let round = Round(r.u64()?);
            let (total, offset, params) = chunk_values(&mut r)?;
            CoordinatorToWorker::Weights(Weights {
                round,
                total,
                offset,
                params,
            })
        }
        TAG_WEIGHTS_DELTA => {
            let round = Round(r.u64()?);
            let (total, offset, params) = chunk_values(&mut r)?;
            CoordinatorToWorker::WeightsDelta(Weights {
                round,
                total,
                offset,
                params,
            })
        }
        TAG_FROZEN => {
            let (total, offset, params) = chunk_values(&mut r)?;
            CoordinatorToWorker::Frozen {
                total,
                offset,
                params,
            }
        }
        TAG_CHALLENGE => {
            let round = Round(r.u64()?);
            let (count, raw) = r.counted(4)?;
            if count > MAX_CHALLENGED {
                return Err(DecodeError::InvalidValue {
                    field: "challenge.count",
                    value: count as u64,
                });
            }
            let boundaries: Vec<u32> = raw
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect();
            if boundaries.windows(2).any(|w| w[0] >= w[1]) || boundaries.first() == Some(&0) {
                return Err(DecodeError::InvalidValue {
                    field: "challenge.boundaries",
                    value: count as u64,
                });
            }
            CoordinatorToWorker::Challenge(Challenge { round, boundaries })
        }
        TAG_ERROR => CoordinatorToWorker::Error {
            code: ErrorCode::from_u16(r.u16()?),
            message: r.str("message")?,
        },
        other => return Err(DecodeError::UnknownTag(other)),
    };
    r.finish()?;
    Ok(msg)
}

/// A `Task`'s local phase, checked: 1 to [`MAX_LOCAL_STEPS`] steps, a known optimizer, a
/// finite positive learning rate, momenta in `[0, 1)` and a positive epsilon.
fn local_phase(r: &mut Reader<'_>) -> Result<Option<LocalPhase>, DecodeError> {
    let invalid = |field: &'static str, value: u64| DecodeError::InvalidValue { field, value };
    match r.u8()? {
        0 => return Ok(None),
        1 => {}
        v => return Err(invalid("task.local", v.into())),
    }
    let steps = r.u32()?;
    if !(1..=MAX_LOCAL_STEPS).contains(&steps) {
        return Err(invalid("task.steps", steps.into()));
    }
    let kind = r.u8()?;
    let [lr, a, b, eps] = [r.f32()?, r.f32()?, r.f32()?, r.f32()?];
    let bits = |v: f32| u64::from(v.to_bits());
    if !(lr.is_finite() && lr > 0.0) {
        return Err(invalid("task.inner_lr", bits(lr)));
    }
    for (field, m) in [("task.momentum", a), ("task.beta2", b)] {
        if !(0.0..1.0).contains(&m) {
            return Err(invalid(field, bits(m)));
        }
    }
    let optimizer = match kind {
        0 => OptimizerKind::Sgd { lr },
        1 => OptimizerKind::Momentum { lr, momentum: a },
        4 => OptimizerKind::Nesterov { lr, momentum: a },
        2 if eps.is_finite() && eps > 0.0 => OptimizerKind::Adam {
            lr,
            beta1: a,
            beta2: b,
            eps,
        },
        3 if eps.is_finite() && eps > 0.0 => {
            let weight_decay = r.f32()?;
            if !((0.0..1.0).contains(&weight_decay) && lr * weight_decay < 1.0) {
                return Err(invalid("task.weight_decay", bits(weight_decay)));
            }
            OptimizerKind::AdamW {
                lr,
                beta1: a,
                beta2: b,
                eps,
                weight_decay,
            }
        }
        2 | 3 => return Err(invalid("task.eps", bits(eps))),
        v => return Err(invalid("task.inner_optimizer", v.into())),
    };
    let segment = r.u32()?;
    if segment > steps {
        return Err(invalid("task.segment", segment.into()));
    }
    Ok(Some(LocalPhase {
        steps,
        optimizer,
        segment,
    }))
}

#[cfg(test)]
mod tests;

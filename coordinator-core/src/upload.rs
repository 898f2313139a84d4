//! A gradient arriving in chunks: each chunk is checked and decoded straight from its frame
//! into the gradient's place, so a connection holds one partial gradient and one 64 KiB
//! frame, never a whole gradient's worth of bytes as well.
//!
//! Everything is checked before the coordinator sees anything: the first chunk's sample count
//! and loss, every chunk's round, order and size, every value's finiteness (as it is decoded,
//! so the error names the value). A gradient refused at chunk n leaves nothing behind: its
//! partial lives here, in the session, and is dropped with it. The coordinator only ever gets
//! whole, valid gradients, with their norm.
//!
//! The room for the values can be given ([`Upload::grant`]): the server gives each gradient
//! a buffer from its upload slots, which bound how many gradients it receives at once.

use protocol::chunk::{Assembly, ChunkError};
use protocol::{ErrorCode, Gradient, RawGradientChunk, Round};

use crate::checks::clip::sum_squares_and_finite;
use crate::io::Joined;
use crate::refusal::Refusal;

/// The gradient under way on one connection.
#[derive(Debug, Default)]
pub struct Upload {
    assembly: Assembly,
    head: Option<Head>,
    grads: Vec<f32>,
    /// Of the values so far, for the norm.
    sum_squares: f64,
    /// Where the next gradient's values go: given by [`Upload::grant`] before its first
    /// chunk (else allocated).
    buffer: Option<Vec<f32>>,
}

/// What every chunk of one gradient repeats.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Head {
    round: Round,
    samples: u32,
    loss_bits: u32,
    compute_us: u32,
    parts: u8,
}

/// What one chunk completed.
#[derive(Debug)]
pub enum Progress {
    /// More chunks are due.
    More,
    /// The last chunk: the whole gradient and its L2 norm.
    Done(Gradient, f64),
}

impl Upload {
    /// A gradient is half received.
    pub fn in_progress(&self) -> bool {
        self.head.is_some()
    }

    /// The next gradient is decoded into `buffer` (cleared; one gradient's room is reserved).
    pub fn grant(&mut self, buffer: Vec<f32>) {
        self.buffer = Some(buffer);
    }

    /// Takes one chunk. A refusal ends the session, so the partial is simply dropped.
    pub fn take(
        &mut self,
        chunk: &RawGradientChunk<'_>,
        joined: &Joined,
    ) -> Result<Progress, Refusal> {
        let head = Head {
            round: chunk.round,
            samples: chunk.samples,
            loss_bits: chunk.loss.to_bits(),
            compute_us: chunk.compute_us,
            parts: chunk.parts,
        };
        match self.head {
            None => {
                check_head(&head, chunk.loss, joined)?;
                self.head = Some(head);
                self.sum_squares = 0.0;
            }
            Some(first) if first != head => {
                return Err(Refusal::new(
                    ErrorCode::Malformed,
                    format!(
                        "a chunk of round {} with {} samples inside a gradient of round {} with {}: every chunk repeats its gradient's header",
                        chunk.round.0, chunk.samples, first.round.0, first.samples
                    ),
                ));
            }
            Some(_) => {}
        }
        let last = self
            .assembly
            .accept(chunk.pos, joined.param_count)
            .map_err(|err| chunk_refusal(&err, joined))?;
        if chunk.pos.offset == 0 {
            // Room for the whole gradient, filled chunk by chunk (nothing zeroed first).
            self.grads = self
                .buffer
                .take()
                .unwrap_or_else(|| Vec::with_capacity(joined.param_count));
            self.grads.clear();
            self.grads.reserve_exact(joined.param_count);
        }
        // In order: this chunk's values go right after the previous chunk's.
        let start = self.grads.len();
        chunk.decode_append(&mut self.grads);
        self.sum_squares += check_values(&self.grads[start..], start)?;
        if !last {
            return Ok(Progress::More);
        }
        let head = self.head.take().expect("set by the first chunk");
        let gradient = Gradient {
            compute_us: head.compute_us,
            parts: head.parts,
            round: head.round,
            samples: head.samples,
            loss: f32::from_bits(head.loss_bits),
            grads: std::mem::take(&mut self.grads),
        };
        Ok(Progress::Done(gradient, self.sum_squares.sqrt()))
    }
}

/// The sample count is the worker's batch or less; the batch was split into no more parts
/// than [`model::Part::most`] allows its samples (a phase's are all its steps': its
/// recomputation splits each step's batch by the same rule, so a claim never makes it finer
/// than that), or computed unordered ([`protocol::UNORDERED`], a GPU); the reported loss is
/// a number.
fn check_head(head: &Head, loss: f32, joined: &Joined) -> Result<(), Refusal> {
    let samples = head.samples;
    if samples == 0 || samples > joined.batch_size {
        return Err(Refusal::new(
            ErrorCode::ShapeMismatch,
            format!(
                "sample count {samples} is outside 1..={} (the batch size)",
                joined.batch_size
            ),
        ));
    }
    let most = model::Part::most(samples as usize);
    if usize::from(head.parts) > most {
        return Err(Refusal::new(
            ErrorCode::Malformed,
            format!(
                "the batch was split into {} parts: it can be 1..={most} (one a core, at least {} samples a part, at most {}), or 0 (unordered, a GPU)",
                head.parts,
                model::MIN_PART_ROWS,
                model::MAX_PARTS
            ),
        ));
    }
    if !loss.is_finite() {
        return Err(Refusal::new(
            ErrorCode::NonFinite,
            format!("loss is {loss}"),
        ));
    }
    Ok(())
}

/// Every value is finite; returns their sum of squares. `first` is the index of `values[0]`
/// in the gradient, for the message.
fn check_values(values: &[f32], first: usize) -> Result<f64, Refusal> {
    let (sum, finite) = sum_squares_and_finite(values);
    if finite {
        return Ok(sum);
    }
    let i = values.iter().position(|v| !v.is_finite()).unwrap_or(0);
    Err(Refusal::new(
        ErrorCode::NonFinite,
        format!("gradient value {} is {}", first + i, values[i]),
    ))
}

fn chunk_refusal(err: &ChunkError, joined: &Joined) -> Refusal {
    match *err {
        ChunkError::Total { got, .. } => Refusal::new(
            ErrorCode::ShapeMismatch,
            format!(
                "gradient has {got} values, the model has {} parameters",
                joined.param_count
            ),
        ),
        ChunkError::Order { .. } | ChunkError::Empty { .. } => {
            Refusal::new(ErrorCode::Malformed, format!("gradient chunks: {err}"))
        }
    }
}

#[cfg(test)]
mod tests;

//! Tensors travel in chunks of at most [`CHUNK_VALUES`] values, one WebSocket message each,
//! so neither side ever buffers a whole model's worth of bytes per connection.
//!
//! A tensor message of `total` values is the chunks at offsets `0, CHUNK_VALUES,
//! 2·CHUNK_VALUES, …`, in that order (senders fill every chunk but the last); the chunk whose
//! `offset + count` reaches `total` closes it. [`Assembly`] checks the order on the
//! receiving side: each chunk starts where the previous one ended, and none is empty.

use std::ops::Range;

/// Values per chunk: 64 KiB of `f32`. A multiple of the int8 and int4 blocks (256, 64), so
/// a chunked tensor quantizes exactly as the whole tensor would.
pub const CHUNK_VALUES: usize = 16_384;

/// The value ranges of a tensor of `total` values, one per chunk (one empty range for an
/// empty tensor, so every message has a closing chunk).
pub fn chunks(total: usize) -> impl Iterator<Item = Range<usize>> {
    let n = total.div_ceil(CHUNK_VALUES).max(1);
    (0..n).map(move |i| i * CHUNK_VALUES..((i + 1) * CHUNK_VALUES).min(total))
}

/// Where a chunk sits in its tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPos {
    pub total: u32,
    pub offset: u32,
    pub count: u32,
}

impl ChunkPos {
    /// This chunk closes its tensor.
    pub fn is_last(&self) -> bool {
        u64::from(self.offset) + u64::from(self.count) == u64::from(self.total)
    }
}

/// A chunk out of order, of the wrong size or for a tensor of the wrong size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("a tensor of {got} values, but {expected} were expected")]
    Total { got: u32, expected: usize },
    #[error("a chunk at value {got}, but the next one starts at value {expected}")]
    Order { got: u32, expected: usize },
    #[error("an empty chunk at value {offset} of {total}")]
    Empty { offset: u32, total: u32 },
}

/// The receiving side of one chunked tensor: which chunk must come next.
#[derive(Debug, Clone, Default)]
pub struct Assembly {
    /// The next expected offset; `None` between tensors.
    next: Option<usize>,
}

impl Assembly {
    /// Whether a tensor is half received.
    pub fn in_progress(&self) -> bool {
        self.next.is_some()
    }

    /// Checks that `pos` is the next chunk of a tensor of `expected` values and moves on.
    /// Returns whether it closes the tensor. An offset of 0 while a tensor is in progress is
    /// out of order (the sender abandoned a message half sent).
    pub fn accept(&mut self, pos: ChunkPos, expected: usize) -> Result<bool, ChunkError> {
        if pos.total as usize != expected {
            return Err(ChunkError::Total {
                got: pos.total,
                expected,
            });
        }
        let next = self.next.unwrap_or(0);
        if pos.offset as usize != next {
            return Err(ChunkError::Order {
                got: pos.offset,
                expected: next,
            });
        }
        if pos.count == 0 && pos.total != 0 {
            return Err(ChunkError::Empty {
                offset: pos.offset,
                total: pos.total,
            });
        }
        let last = pos.is_last();
        self.next = (!last).then_some(next + pos.count as usize);
        Ok(last)
    }

    /// Forgets a half-received tensor.
    pub fn reset(&mut self) {
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(total: u32, offset: u32, count: u32) -> ChunkPos {
        ChunkPos {
            total,
            offset,
            count,
        }
    }

    #[test]
    fn chunks_cover_the_tensor_in_order() {
        let c: Vec<_> = chunks(2 * CHUNK_VALUES + 5).collect();
        assert_eq!(
            c,
            vec![
                0..CHUNK_VALUES,
                CHUNK_VALUES..2 * CHUNK_VALUES,
                2 * CHUNK_VALUES..2 * CHUNK_VALUES + 5
            ]
        );
        assert_eq!(chunks(3).collect::<Vec<_>>(), vec![0..3]);
        assert_eq!(chunks(0).collect::<Vec<_>>(), vec![0..0]);
    }

    #[test]
    fn assembly_takes_chunks_in_order_and_refuses_the_rest() {
        let n = CHUNK_VALUES as u32;
        let total = 2 * n + 1;
        let mut a = Assembly::default();
        assert_eq!(a.accept(pos(total, 0, n), total as usize), Ok(false));
        assert!(a.in_progress());
        assert_eq!(
            a.accept(pos(total, 0, n), total as usize),
            Err(ChunkError::Order {
                got: 0,
                expected: CHUNK_VALUES
            })
        );
        assert_eq!(a.accept(pos(total, n, n), total as usize), Ok(false));
        assert!(matches!(
            a.accept(pos(total, 2 * n, 0), total as usize),
            Err(ChunkError::Empty { .. })
        ));
        assert_eq!(a.accept(pos(total, 2 * n, 1), total as usize), Ok(true));
        assert!(!a.in_progress());
        assert!(matches!(
            Assembly::default().accept(pos(7, 0, 7), 8),
            Err(ChunkError::Total { got: 7, .. })
        ));
        // A whole tensor in one piece (in-process use) is one chunk that closes it.
        assert_eq!(
            Assembly::default().accept(pos(total, 0, total), total as usize),
            Ok(true)
        );
        assert_eq!(Assembly::default().accept(pos(0, 0, 0), 0), Ok(true));
    }
}

//! A tensor arriving in chunks (`Weights`, `Frozen`): checked in order, gathered until its
//! last chunk is in.

use protocol::chunk::Assembly;
use protocol::{ChunkPos, Round};

use crate::WorkerError;

/// A tensor arriving in chunks.
#[derive(Debug, Default)]
pub(crate) struct Incoming {
    pub(crate) assembly: Assembly,
    round: Round,
    values: Vec<f32>,
}

impl Incoming {
    /// Takes one chunk of a tensor of `expected` values; returns the whole tensor once its
    /// last chunk is in.
    pub(crate) fn take(
        &mut self,
        round: Round,
        (total, offset): (u32, u32),
        values: Vec<f32>,
        expected: usize,
    ) -> Result<Option<Vec<f32>>, WorkerError> {
        if self.assembly.in_progress() && round != self.round {
            return Err(WorkerError::Protocol(
                "a chunk of another round in the middle of a message",
            ));
        }
        let pos = ChunkPos {
            total,
            offset,
            count: u32::try_from(values.len())
                .map_err(|_| WorkerError::Protocol("a chunk over 4 Gi values"))?,
        };
        let last = self.assembly.accept(pos, expected)?;
        if offset == 0 {
            // Every message starts here: its first chunk sets round and room.
            self.round = round;
            self.values.clear();
            if last {
                return Ok(Some(values));
            }
            self.values.reserve_exact(expected);
        }
        self.values.extend_from_slice(&values);
        Ok(last.then(|| std::mem::take(&mut self.values)))
    }
}

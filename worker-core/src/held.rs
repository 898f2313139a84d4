//! The weights a worker on `int8` weights holds, for the next version to come as a delta
//! from them (`WeightsDelta`, protocol version 12, [`protocol::delta`]).

use protocol::{delta, Round};

use crate::WorkerError;

/// The trained tensors of the last version received, as decoded (and settled through `int8`
/// after a delta): exactly what the coordinator computes for every worker that holds it.
#[derive(Debug, Default)]
pub(crate) struct Held(Option<(Round, Vec<f32>)>);

impl Held {
    /// A version that came whole (`Weights`): held as it is.
    pub(crate) fn keep(&mut self, round: Round, values: &[f32]) {
        match &mut self.0 {
            Some((r, held)) if held.len() == values.len() => {
                *r = round;
                held.copy_from_slice(values);
            }
            _ => self.0 = Some((round, values.to_vec())),
        }
    }

    /// Version `round` from its delta on the version before it, which must be the one held:
    /// the new weights, now held.
    pub(crate) fn advance(&mut self, round: Round, delta: &[f32]) -> Result<Vec<f32>, WorkerError> {
        let Some((r, held)) = self
            .0
            .as_mut()
            .filter(|(r, _)| r.0.checked_add(1) == Some(round.0))
        else {
            return Err(WorkerError::Protocol(
                "WeightsDelta from weights this worker does not hold",
            ));
        };
        let target = delta::target(held, delta).ok_or(WorkerError::Protocol(
            "WeightsDelta of another length than the weights held",
        ))?;
        *held = delta::settle(&target);
        *r = round;
        Ok(held.clone())
    }
}

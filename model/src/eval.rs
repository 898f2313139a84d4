//! Test-set evaluation.

use crate::data::Dataset;
use crate::error::ModelError;
use crate::network::Network;

/// Evaluation is done in chunks so memory stays bounded for any test-set size: at most
/// this many samples a chunk,
const EVAL_CHUNK: usize = 500;
/// and at most this many positions a chunk for a language model, whose activations grow with
/// its context (a chunk of the 10.7M model's 256-token windows: 8 windows, one block's
/// activations at a time, about 70 MB).
const EVAL_POSITIONS: usize = 2048;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Fraction of samples whose argmax prediction is the label (a GPT: of positions whose
    /// most likely token is the next one).
    pub accuracy: f64,
    /// Mean cross-entropy (a GPT: per token, in nats).
    pub loss: f64,
}

pub fn evaluate(net: &Network, params: &[f32], data: &Dataset) -> Result<Evaluation, ModelError> {
    if data.is_empty() {
        return Err(ModelError::EmptyBatch);
    }
    let (mut loss, mut correct) = (0.0f64, 0usize);
    let chunk = EVAL_CHUNK.min((EVAL_POSITIONS / net.positions()).max(1));
    for start in (0..data.len()).step_by(chunk) {
        let (x, labels) = data.batch(start..(start + chunk).min(data.len()));
        let (l, c) = net.loss_sum_and_correct(params, x.view(), &labels)?;
        loss += f64::from(l);
        correct += c;
    }
    let n = data.len() as f64;
    Ok(Evaluation {
        accuracy: correct as f64 / (n * net.positions() as f64),
        loss: loss / n,
    })
}

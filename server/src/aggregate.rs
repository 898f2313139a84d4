//! How a round turns the gradients it received into one update: a strategy the round owns,
//! so robust aggregators (median, trimmed mean, ...) can be added without touching the round
//! or session code.

use model::GradientSum;

pub trait Aggregator: Send + std::fmt::Debug {
    /// Adds one worker's mean gradient over `samples` samples with weight `weight` (the
    /// sample count, down-weighted in async mode for staleness).
    fn add(&mut self, grads: &[f32], samples: u32, weight: f32);
    /// Gradients added since the last `take`.
    fn contributions(&self) -> usize;
    /// Samples behind them.
    fn samples(&self) -> u64;
    /// The combined gradient, resetting for the next round; `None` if nothing was added.
    fn take(&mut self) -> Option<Vec<f32>>;
}

/// Which aggregator to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AggregatorKind {
    /// `Σ w_k g_k / Σ w_k`, streaming, O(parameters) memory.
    #[default]
    WeightedMean,
}

impl AggregatorKind {
    pub fn build(self, param_count: usize) -> Box<dyn Aggregator> {
        match self {
            Self::WeightedMean => Box::new(WeightedMean(GradientSum::new(param_count))),
        }
    }
}

#[derive(Debug)]
pub struct WeightedMean(GradientSum);

impl Aggregator for WeightedMean {
    fn add(&mut self, grads: &[f32], samples: u32, weight: f32) {
        self.0.accumulate_weighted(grads, samples, weight);
    }
    fn contributions(&self) -> usize {
        self.0.contributions()
    }
    fn samples(&self) -> u64 {
        self.0.samples()
    }
    fn take(&mut self) -> Option<Vec<f32>> {
        self.0.take_mean()
    }
}

//! The exact weighted mean, streaming: O(P) memory whatever the number of gradients.

use model::GradientSum;

use super::Aggregator;

#[derive(Debug)]
pub struct WeightedMean(GradientSum);

impl WeightedMean {
    pub fn new(param_count: usize) -> Self {
        Self(GradientSum::new(param_count))
    }
}

impl Aggregator for WeightedMean {
    fn begin(&mut self, _expected: usize) {}
    fn add(&mut self, grads: &[f32], samples: u32, weight: f32, scale: f32) {
        self.0.accumulate_scaled(grads, samples, weight, scale);
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

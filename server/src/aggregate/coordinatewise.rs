//! Coordinate-wise robust rules: trimmed mean and median. They keep the round's gradients
//! (already scaled by the norm bound) and combine each coordinate on its own, so one hostile
//! worker's values are dropped wherever they are extreme, and bounded by honest values
//! wherever they are not.
//!
//! Every gradient counts equally: in a round every worker computed one assigned batch.

use super::{Aggregator, Rule};

#[derive(Debug)]
pub struct CoordinateWise {
    rule: Rule,
    len: usize,
    kept: Vec<Vec<f32>>,
    samples: u64,
}

impl CoordinateWise {
    pub fn new(rule: Rule, len: usize, expected: usize) -> Self {
        Self {
            rule,
            len,
            kept: Vec::with_capacity(expected),
            samples: 0,
        }
    }
}

impl Aggregator for CoordinateWise {
    fn add(&mut self, grads: &[f32], samples: u32, _weight: f32, scale: f32) {
        assert_eq!(grads.len(), self.len, "gradient length");
        let scaled = if scale == 1.0 {
            grads.to_vec()
        } else {
            // In f64: an attacker's 3e38 times a tiny scale stays exact.
            let scale = f64::from(scale);
            grads
                .iter()
                .map(|&g| (f64::from(g) * scale) as f32)
                .collect()
        };
        self.kept.push(scaled);
        self.samples += u64::from(samples);
    }

    fn contributions(&self) -> usize {
        self.kept.len()
    }

    fn samples(&self) -> u64 {
        self.samples
    }

    fn take(&mut self) -> Option<Vec<f32>> {
        self.samples = 0;
        let kept = std::mem::take(&mut self.kept);
        let drop = self.rule.trimmed(kept.len());
        match self.rule {
            Rule::MeanAroundMedian { .. } => model::robust::mean_around_median(&kept, drop),
            _ => model::robust::trimmed_mean(&kept, drop),
        }
    }
}

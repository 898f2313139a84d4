//! Rules that need the whole round at once: the coordinate-wise ones (trimmed mean, median,
//! mean around the median) and Multi-Krum. They keep the round's gradients (already scaled
//! by the norm bound), 4·P bytes each.
//!
//! Memory stays bounded whatever K is: a round that would drop nothing (`⌊trim·K⌋ = 0`), or
//! whose gradients would take more than `--aggregator-memory`, streams the weighted mean
//! instead; a round that outgrows the budget while open (workers admitted at an extension)
//! folds what it kept into the stream.

use model::GradientSum;

use super::{Aggregator, Rule};

#[derive(Debug)]
pub struct Kept {
    rule: Rule,
    len: usize,
    /// Bytes the kept gradients may take.
    memory: usize,
    /// This round keeps its gradients (else it streams).
    keeping: bool,
    kept: Vec<Vec<f32>>,
    weights: Vec<f32>,
    stream: GradientSum,
    samples: u64,
}

impl Kept {
    pub fn new(rule: Rule, len: usize, memory: usize) -> Self {
        Self {
            rule,
            len,
            memory,
            keeping: false,
            kept: Vec::new(),
            weights: Vec::new(),
            stream: GradientSum::new(len),
            samples: 0,
        }
    }

    fn fits(&self, count: usize) -> bool {
        count.saturating_mul(self.len).saturating_mul(4) <= self.memory
    }

    /// Moves what was kept into the stream: the round is now the weighted mean.
    fn fold(&mut self) {
        for (g, w) in self.kept.drain(..).zip(self.weights.drain(..)) {
            self.stream.accumulate_scaled(&g, 0, w, 1.0);
        }
        self.keeping = false;
    }
}

impl Aggregator for Kept {
    fn begin(&mut self, expected: usize) {
        self.keeping = self.rule.dropped(expected) > 0 && self.fits(expected);
        if self.keeping {
            self.kept.reserve(expected);
        }
    }

    fn add(&mut self, grads: &[f32], samples: u32, weight: f32, scale: f32) {
        assert_eq!(grads.len(), self.len, "gradient length");
        self.samples += u64::from(samples);
        if self.keeping && !self.fits(self.kept.len() + 1) {
            self.fold();
        }
        if !self.keeping {
            self.stream.accumulate_scaled(grads, 0, weight, scale);
            return;
        }
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
        self.weights.push(weight);
    }

    fn contributions(&self) -> usize {
        self.kept.len() + self.stream.contributions()
    }

    fn samples(&self) -> u64 {
        self.samples
    }

    fn take(&mut self) -> Option<Vec<f32>> {
        self.samples = 0;
        let kept = std::mem::take(&mut self.kept);
        let weights = std::mem::take(&mut self.weights);
        if kept.is_empty() {
            return self.stream.take_mean();
        }
        // Every kept gradient counts equally in the coordinate-wise rules: in a round every
        // worker computed one assigned batch. Multi-Krum averages its selection by weight.
        let drop = self.rule.dropped(kept.len());
        match self.rule {
            Rule::MeanAroundMedian { .. } => model::robust::mean_around_median(&kept, drop),
            Rule::MultiKrum { .. } => {
                model::robust::multi_krum(&kept, &weights, drop).map(|(mean, _)| mean)
            }
            _ => model::robust::trimmed_mean(&kept, drop),
        }
    }
}

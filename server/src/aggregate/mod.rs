//! How gradients become one update: a strategy each round (or async buffer) owns, chosen by
//! `--aggregator`. Every strategy sees gradients already bounded by the norm bound.
//!
//! | rule | memory per round | time per round | when |
//! |---|---|---|---|
//! | `mean` | O(P), streaming | O(K·P) | honest swarms; exact SGD (the equivalence test) |
//! | `mean-around-median` (default) | O(K·P) | O(K·P·log K) | untrusted volunteers: per coordinate, the mean of the values nearest the median, dropping `⌊trim·K⌋` |
//! | `trimmed-mean` | O(K·P) | O(K·P·log K) | drops the `⌊trim·K⌋` largest and smallest values of each coordinate (also honest ones at the other end) |
//! | `median` | O(K·P) | O(K·P·log K) | a large hostile minority (up to half), at some cost in noise |
//!
//! The coordinate-wise rules keep the round's K gradients (4·K·P bytes). When nothing would
//! be trimmed (`⌊trim·K⌋ = 0`, e.g. fewer than 5 gradients at 0.2) or the round would need
//! more than `--aggregator-memory`, the round streams the mean instead, so memory stays
//! bounded whatever K is.

mod coordinatewise;

use model::GradientSum;

pub use self::coordinatewise::CoordinateWise;

pub trait Aggregator: Send + std::fmt::Debug {
    /// Adds one worker's mean gradient over `samples` samples with weight `weight` (the
    /// sample count, down-weighted in async mode for staleness), multiplied by `scale` (1, or
    /// less when the norm bound clipped it).
    fn add(&mut self, grads: &[f32], samples: u32, weight: f32, scale: f32);
    /// Gradients added since the last `take`.
    fn contributions(&self) -> usize;
    /// Samples behind them.
    fn samples(&self) -> u64;
    /// The combined gradient, resetting for the next round; `None` if nothing was added.
    fn take(&mut self) -> Option<Vec<f32>>;
}

/// `--aggregator`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// `Σ w_k g_k / Σ w_k`.
    Mean,
    /// Per coordinate, the mean of what remains after dropping the `⌊trim·K⌋` largest and
    /// smallest values.
    TrimmedMean { trim: f32 },
    /// Per coordinate, the median.
    Median,
    /// Per coordinate, the mean of the values nearest the median, dropping `⌊trim·K⌋`.
    MeanAroundMedian { trim: f32 },
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::TrimmedMean { .. } => "trimmed-mean",
            Self::Median => "median",
            Self::MeanAroundMedian { .. } => "mean-around-median",
        }
    }

    /// Values dropped from each end of a coordinate among `k`.
    pub fn trimmed(self, k: usize) -> usize {
        match self {
            Self::Mean => 0,
            Self::TrimmedMean { trim } => {
                ((f64::from(trim) * k as f64) as usize).min(k.saturating_sub(1) / 2)
            }
            Self::Median => k.saturating_sub(1) / 2,
            Self::MeanAroundMedian { trim } => {
                ((f64::from(trim) * k as f64) as usize).min(k.saturating_sub(1) / 2)
            }
        }
    }
}

/// Which aggregator to build, and the memory a round may use for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AggregatorKind {
    pub rule: Rule,
    /// Bytes a round's kept gradients may take.
    pub memory: usize,
}

/// `--aggregator-memory` default: 512 MiB.
pub const DEFAULT_MEMORY: usize = 512 << 20;

impl Default for AggregatorKind {
    fn default() -> Self {
        Self {
            rule: Rule::MeanAroundMedian { trim: 0.2 },
            memory: DEFAULT_MEMORY,
        }
    }
}

impl AggregatorKind {
    pub fn mean() -> Self {
        Self {
            rule: Rule::Mean,
            ..Self::default()
        }
    }

    /// An aggregator for about `expected` gradients of `param_count` values.
    pub fn build(self, param_count: usize, expected: usize) -> Box<dyn Aggregator> {
        let fits = expected.saturating_mul(param_count).saturating_mul(4) <= self.memory;
        if self.rule.trimmed(expected) == 0 || !fits {
            return Box::new(WeightedMean(GradientSum::new(param_count)));
        }
        Box::new(CoordinateWise::new(self.rule, param_count, expected))
    }
}

#[derive(Debug)]
pub struct WeightedMean(GradientSum);

impl Aggregator for WeightedMean {
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

#[cfg(test)]
mod tests;

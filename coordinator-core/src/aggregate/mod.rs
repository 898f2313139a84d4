//! How gradients become one update: chosen by `--aggregator`, built once per run and owned
//! by the schedule (each round, or the async buffer, `begin`s and `take`s it). Every rule sees
//! gradients already bounded by the norm bound. K gradients of P values a round:
//!
//! The default is `centered-clip`. The coordinate-wise rules drop values by where they fall,
//! and a coordinate's honest values are often skewed (a few hard examples in one batch make
//! its long tail): dropping the far end takes the hard examples' signal out of every round.
//! `bench/aggregators.sh` measures each rule's cost to honest runs against `mean`
//! (`docs/BENCHMARKS.md`, "What the default costs an honest run").
//!
//! | rule | memory per round | time per round | when |
//! |---|---|---|---|
//! | `mean` | O(P), streaming | O(K·P) | honest swarms; exact SGD (the equivalence test) |
//! | `mean-around-median` | 4·K·P bytes | O(K·P·log K) | per coordinate, the mean of the values nearest the median, dropping `⌊trim·K⌋`; biased where honest values are skewed (it drops their long tail): 1.2-2.5 points of accuracy on the default MLP at 5-9 honest workers |
//! | `trimmed-mean` | 4·K·P bytes | O(K·P·log K) | drops the `⌊trim·K⌋` largest and smallest values of each coordinate (also honest ones at the other end) |
//! | `median` | 4·K·P bytes | O(K·P·log K) | a large hostile minority (up to half), at some cost in noise |
//! | `multi-krum` | 4·K·P bytes + 8·K² | O(K²·P) | colluding attackers who stay inside each coordinate's honest range but far from the honest cloud as a whole; averages the `K − f` gradients nearest their neighbours, `f = ⌊trim·K⌋` |
//! | `centered-clip` (default) | 12·P bytes, streaming | O(K·P) | untrusted volunteers, any model size (memory independent of K); a hostile gradient moves the result by at most `τ/K`; honest runs within 0.1 points of `mean` (the default MLP, 3-9 workers) |
//!
//! Any rule may combine each worker's momentum instead of its answers (`--worker-momentum`,
//! [`momentum`]): what a rule that only sees one round cannot tell from noise, momentum
//! adds up.
//!
//! The rules that keep the round's gradients stream the mean instead when nothing would be
//! dropped (`⌊trim·K⌋ = 0`, e.g. fewer than 5 gradients at 0.2) or the round would need more
//! than `--aggregator-memory`, so memory stays bounded whatever K is.

mod centered;
mod kept;
mod mean;
pub mod momentum;

pub use self::centered::CenteredClip;
pub use self::kept::Kept;
pub use self::mean::WeightedMean;
pub use self::momentum::Momenta;

pub trait Aggregator: Send + std::fmt::Debug {
    /// A round (or async buffer) of about `expected` gradients begins.
    fn begin(&mut self, expected: usize);
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
    /// The `K − f` gradients with the lowest Krum scores, averaged; `f = ⌊hostile·K⌋`.
    MultiKrum { hostile: f32 },
    /// `v + mean(clip(g − v, τ))` around the previous result `v`; `τ` adaptive if `None`.
    CenteredClip { radius: Option<f64> },
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::TrimmedMean { .. } => "trimmed-mean",
            Self::Median => "median",
            Self::MeanAroundMedian { .. } => "mean-around-median",
            Self::MultiKrum { .. } => "multi-krum",
            Self::CenteredClip { .. } => "centered-clip",
        }
    }

    /// Gradients dropped among `k`: from each end of every coordinate for the coordinate-wise
    /// rules, whole gradients for Multi-Krum (at most `(k − 3) / 2`, Krum's bound).
    pub fn dropped(self, k: usize) -> usize {
        match self {
            Self::Mean | Self::CenteredClip { .. } => 0,
            Self::MultiKrum { hostile } => {
                ((f64::from(hostile) * k as f64) as usize).min(k.saturating_sub(3) / 2)
            }
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
    /// Bytes a round's kept gradients may take (and, apart, the workers' momenta).
    pub memory: usize,
    /// `--worker-momentum β`: each worker's answers are blended into its momentum, which
    /// the rule combines; 0: off.
    pub momentum: f32,
}

/// `--aggregator-memory` default: 512 MiB.
pub const DEFAULT_MEMORY: usize = 512 << 20;

impl Default for AggregatorKind {
    fn default() -> Self {
        Self {
            rule: Rule::CenteredClip { radius: None },
            memory: DEFAULT_MEMORY,
            momentum: 0.0,
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

    /// The run's aggregator for gradients of `param_count` values.
    pub fn build(self, param_count: usize) -> Box<dyn Aggregator> {
        match self.rule {
            Rule::Mean => Box::new(WeightedMean::new(param_count)),
            Rule::CenteredClip { radius } => Box::new(CenteredClip::new(param_count, radius)),
            _ => Box::new(Kept::new(self.rule, param_count, self.memory)),
        }
    }
}

#[cfg(test)]
mod tests;

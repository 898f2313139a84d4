//! The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch
//! Training", appendix A.1): how many samples a step can take before more stop helping.
//!
//! Each update combines K answers. Answer k covers `n_k` samples (its batch times its
//! phase's steps) and is `g_k`; the true gradient is `G` and the per-sample noise has trace
//! `S`. Weighted by `n_k`, with `N = Σ n_k` and `n̄ = N / K`:
//!
//! - `small = Σ n_k |g_k|² / N`, whose expectation is `|G|² + S / n̄`;
//! - `big = |Σ n_k g_k / N|²`, whose expectation is `|G|² + S / N`.
//!
//! So `|G|² ≈ (N·big − n̄·small) / (N − n̄)` and `S ≈ (small − big) / (1/n̄ − 1/N)`, and
//! `B_noise = S / |G|²`, in samples. One update's estimates are noisy; as the paper does,
//! each is averaged over updates (an exponential mean) before the ratio is taken.
//!
//! A local phase's answer is scaled by `H̄ / H_k` (`local.rs`): its signal is `H̄·G` and
//! its noise `H̄²·S / n_k`, so the same formulas hold with `n_k = batch × H_k`, and the
//! `H̄²` cancels in the ratio. With AdamW inside, the estimate is of the preconditioned
//! noise scale; int8 on the wire and clipping add a little to `S`.
//!
//! Against it stands the crowd's batch: the samples one update takes, `N = Σ n_k` (with
//! local phases, every answer's batch times its steps: the update is one step of the outer
//! optimizer, and its direction is estimated from all of them). Steps to a loss grow as
//! `1 + B_noise / B` (the paper's eq. 2.11): where the crowd's batch is well past the noise
//! scale, more volunteers barely shorten the run, and the model is too small for its crowd.
//! (Until 2026-11-28 the batch set against it was the samples of one inner step,
//! `Σ batch_k`: the same without phases, but H times too small with them, which read a
//! crowd of two tabs as far from its limit when it was already past it.)

use serde::Serialize;

/// One update's spread, gathered answer by answer (`O(P)` memory: the weighted sum).
#[derive(Debug, Default)]
pub struct Spread {
    sum: Vec<f32>,
    /// `Σ n_k |g_k|²`.
    squares: f64,
    /// `N = Σ n_k`.
    samples: u64,
    answers: usize,
}

/// What one update says of the noise: its two batch sizes and their squared norms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// `n̄` and `N`.
    pub small_batch: f64,
    pub big_batch: f64,
    /// `small` and `big`.
    pub small: f64,
    pub big: f64,
}

impl Reading {
    /// `|G|²`, unbiased.
    pub fn signal(&self) -> f64 {
        (self.big_batch * self.big - self.small_batch * self.small)
            / (self.big_batch - self.small_batch)
    }

    /// `S`, unbiased.
    pub fn noise(&self) -> f64 {
        (self.small - self.big) / (1.0 / self.small_batch - 1.0 / self.big_batch)
    }
}

impl Spread {
    /// Adds an answer covering `samples` samples (`batch × steps`), its values `grads`
    /// times `scale`.
    pub fn add(&mut self, grads: &[f32], scale: f32, samples: u64) {
        if samples == 0 || !scale.is_finite() {
            return;
        }
        if self.answers == 0 {
            self.sum = vec![0.0; grads.len()];
        }
        // The session checked every answer's shape against the model's.
        debug_assert_eq!(self.sum.len(), grads.len());
        let n = samples as f64;
        let w = (n * f64::from(scale)) as f32;
        let mut square = 0.0f64;
        for (s, &g) in self.sum.iter_mut().zip(grads) {
            *s += w * g;
            square += f64::from(g) * f64::from(g);
        }
        self.squares += n * f64::from(scale) * f64::from(scale) * square;
        self.samples += samples;
        self.answers += 1;
    }

    /// The update's reading, emptying it for the next; `None` with fewer than two answers
    /// (one batch size cannot tell noise from signal).
    pub fn take(&mut self) -> Option<Reading> {
        let spread = std::mem::take(self);
        if spread.answers < 2 {
            return None;
        }
        let big_batch = spread.samples as f64;
        let big = spread
            .sum
            .iter()
            .map(|&s| {
                let mean = f64::from(s) / big_batch;
                mean * mean
            })
            .sum::<f64>();
        let reading = Reading {
            small_batch: big_batch / spread.answers as f64,
            big_batch,
            small: spread.squares / big_batch,
            big,
        };
        (reading.small.is_finite() && reading.big.is_finite()).then_some(reading)
    }
}

/// The run's estimate: both halves averaged over updates, then divided.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NoiseScale {
    signal: f64,
    noise: f64,
    /// The samples an update takes, `N`, averaged as the halves are.
    batch: f64,
    readings: u64,
}

/// How much each reading weighs in the running means: about the last 20 updates.
const WEIGHT: f64 = 0.05;

/// What `/api/status` shows under `noise_scale`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NoiseReport {
    /// `B_noise` in samples; `None` while the signal's estimate is not positive (the
    /// noise drowns it: any batch helps).
    pub samples: Option<f64>,
    /// The crowd's batch: the samples one update takes (each answer's batch times its
    /// phase's steps, summed), averaged over the same updates as `samples`.
    pub crowd_batch: f64,
    /// How many times fewer steps the run would need with twice the crowd (at most 2):
    /// `(1 + B_noise/B) / (1 + B_noise/2B)`. Near 1, more volunteers barely help.
    pub doubling_gain: Option<f64>,
    /// Updates behind the estimate.
    pub readings: u64,
}

impl NoiseScale {
    pub fn observe(&mut self, reading: &Reading) {
        let (signal, noise) = (reading.signal(), reading.noise());
        if !(signal.is_finite() && noise.is_finite()) {
            return;
        }
        // The first reading starts the means; debiasing as Adam does would weigh it the same.
        let w = if self.readings == 0 { 1.0 } else { WEIGHT };
        self.signal += w * (signal - self.signal);
        self.noise += w * (noise - self.noise);
        self.batch += w * (reading.big_batch - self.batch);
        self.readings += 1;
    }

    pub fn report(&self) -> Option<NoiseReport> {
        if self.readings == 0 {
            return None;
        }
        let samples = (self.signal > 0.0).then(|| self.noise.max(0.0) / self.signal);
        let batch = self.batch;
        Some(NoiseReport {
            samples,
            crowd_batch: batch,
            doubling_gain: samples
                .filter(|_| batch > 0.0)
                .map(|b| (1.0 + b / batch) / (1.0 + b / (2.0 * batch))),
            readings: self.readings,
        })
    }
}

#[cfg(test)]
mod tests;

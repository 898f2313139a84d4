//! Streaming, sample-weighted gradient averaging.
//!
//! The coordinator adds each worker's gradient as it arrives into one running sum, so memory
//! is O(parameters) whatever the number of workers: never a list of every gradient.

/// Running `Σ w_k · g_k` and `Σ w_k`, where `w_k` is normally the sample count (async mode
/// down-weights stale gradients, so weights may be fractional).
#[derive(Debug, Clone)]
pub struct GradientSum {
    sum: Vec<f32>,
    samples: u64,
    weight: f64,
    contributions: usize,
}

impl GradientSum {
    pub fn new(len: usize) -> Self {
        Self {
            sum: vec![0.0; len],
            samples: 0,
            weight: 0.0,
            contributions: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.sum.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sum.is_empty()
    }

    /// Total samples behind the gradients accumulated so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Number of gradients accumulated so far.
    pub fn contributions(&self) -> usize {
        self.contributions
    }

    /// Adds a mean gradient computed over `samples` samples, weighted by that count.
    ///
    /// # Panics
    /// If `grads` has the wrong length: callers validate shapes first (the coordinator
    /// rejects such gradients before they get here).
    pub fn accumulate(&mut self, grads: &[f32], samples: u32) {
        self.accumulate_weighted(grads, samples, samples as f32);
    }

    /// Adds a mean gradient over `samples` samples with an explicit weight.
    pub fn accumulate_weighted(&mut self, grads: &[f32], samples: u32, weight: f32) {
        self.accumulate_scaled(grads, samples, weight, 1.0);
    }

    /// Adds `scale · grads` with weight `weight`: the sum grows by `weight · scale · g`, the
    /// total weight by `weight` alone, so a clipped gradient (scale < 1) counts as one
    /// contribution of reduced length, not as a lighter one.
    ///
    /// A scale too small for f32 products (an attacker's 3e38 clipped to an honest norm)
    /// is applied in f64, so the result is exact to f32 rounding instead of subnormal noise.
    pub fn accumulate_scaled(&mut self, grads: &[f32], samples: u32, weight: f32, scale: f32) {
        assert_eq!(grads.len(), self.sum.len(), "gradient length");
        let factor = weight * scale;
        if factor.is_normal() || factor == 0.0 {
            // A plain zip loop over equal-length slices: the compiler vectorises it.
            for (s, &g) in self.sum.iter_mut().zip(grads) {
                *s += factor * g;
            }
        } else {
            let factor = f64::from(weight) * f64::from(scale);
            for (s, &g) in self.sum.iter_mut().zip(grads) {
                *s += (factor * f64::from(g)) as f32;
            }
        }
        self.samples += u64::from(samples);
        self.weight += f64::from(weight);
        self.contributions += 1;
    }

    /// The weighted mean of everything accumulated, leaving the sum empty for the next
    /// round. `None` if nothing (or only zero samples) was accumulated.
    pub fn take_mean(&mut self) -> Option<Vec<f32>> {
        self.samples = 0;
        self.contributions = 0;
        let weight = std::mem::take(&mut self.weight);
        let len = self.sum.len();
        let mut mean = std::mem::replace(&mut self.sum, vec![0.0; len]);
        if weight <= 0.0 {
            return None;
        }
        let inv = (1.0 / weight) as f32;
        for v in &mut mean {
            *v *= inv;
        }
        Some(mean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The naive reference: keep every gradient, then Σ n_k g_k / Σ n_k in f64.
    fn naive_weighted_mean(grads: &[Vec<f32>], samples: &[u32]) -> Vec<f64> {
        let total: f64 = samples.iter().map(|&n| f64::from(n)).sum();
        (0..grads[0].len())
            .map(|i| {
                grads
                    .iter()
                    .zip(samples)
                    .map(|(g, &n)| f64::from(g[i]) * f64::from(n))
                    .sum::<f64>()
                    / total
            })
            .collect()
    }

    #[test]
    fn equals_the_naive_weighted_mean_for_1_2_3_and_7_workers() {
        let mut rng = SplitMix64::new(7);
        for n in [1usize, 2, 3, 7] {
            let len = 1000;
            let grads: Vec<Vec<f32>> = (0..n)
                .map(|_| {
                    (0..len)
                        .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
                        .collect()
                })
                .collect();
            // Deliberately unequal sample counts.
            let samples: Vec<u32> = (0..n)
                .map(|k| 1 + 13 * k as u32 + (k as u32 % 2) * 50)
                .collect();
            let mut sum = GradientSum::new(len);
            for (g, &s) in grads.iter().zip(&samples) {
                sum.accumulate(g, s);
            }
            assert_eq!(sum.contributions(), n);
            assert_eq!(
                sum.samples(),
                samples.iter().map(|&s| u64::from(s)).sum::<u64>()
            );
            let mean = sum.take_mean().expect("non-empty");
            let reference = naive_weighted_mean(&grads, &samples);
            let worst = mean
                .iter()
                .zip(&reference)
                .map(|(a, b)| (f64::from(*a) - b).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-6, "n = {n}: max abs diff {worst}");
        }
    }

    #[test]
    fn explicit_weights_divide_by_the_weight_not_the_samples() {
        let mut sum = GradientSum::new(1);
        sum.accumulate_weighted(&[4.0], 10, 1.0);
        sum.accumulate_weighted(&[1.0], 10, 3.0);
        assert_eq!(sum.samples(), 20);
        assert_eq!(sum.take_mean(), Some(vec![1.75])); // (4·1 + 1·3) / 4
    }

    #[test]
    fn a_scaled_gradient_keeps_its_weight_and_tiny_scales_are_exact() {
        let mut sum = GradientSum::new(2);
        sum.accumulate_scaled(&[4.0, -8.0], 32, 32.0, 0.5);
        sum.accumulate_scaled(&[0.0, 0.0], 32, 32.0, 1.0);
        // (32·0.5·g + 0) / 64
        assert_eq!(sum.take_mean(), Some(vec![1.0, -2.0]));
        // An attacker's 3e38 scaled to length ~1: 3e38 · 1e-38 · 32 = 96, then / 32.
        sum.accumulate_scaled(&[3e38, -3e38], 32, 32.0, 1e-38 / 3.0);
        let mean = sum.take_mean().expect("one contribution");
        for (got, want) in mean.iter().zip([1.0f32, -1.0]) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn take_mean_resets_and_empty_is_none() {
        let mut sum = GradientSum::new(2);
        assert_eq!(sum.take_mean(), None);
        sum.accumulate(&[2.0, 4.0], 2);
        assert_eq!(sum.take_mean(), Some(vec![2.0, 4.0]));
        assert_eq!(sum.samples(), 0);
        sum.accumulate(&[1.0, 1.0], 1);
        assert_eq!(sum.take_mean(), Some(vec![1.0, 1.0]));
    }
}

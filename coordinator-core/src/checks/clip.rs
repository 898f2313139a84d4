//! The bound on a single gradient's L2 norm: no one gradient can move the model further than
//! an honest one would.
//!
//! Each session computes its gradient's norm in f64 (which cannot overflow for finite f32
//! values), in the same pass that checks finiteness. Here the coordinator turns the norm into
//! a scale: 1 for a gradient within the bound, `bound / norm` beyond it. The aggregator
//! multiplies by that scale as it accumulates, so clipping costs no extra pass.
//!
//! The bound is `--max-grad-norm` when set. Otherwise it adapts: [`MULTIPLIER`] × the median
//! of the last [`WINDOW`] norms that were within the bound. A median cannot be moved by a
//! minority of hostile workers, and only unclipped norms enter the window, so a hostile
//! majority of one round cannot ratchet it up either. Until [`WARMUP`] norms were seen it is
//! [`MULTIPLIER`] × a reference the coordinator computes itself: the norm of its own gradient
//! on a batch of the train split at the weights training starts from (the random
//! initialisation, `--init`'s, or a checkpoint's).

use std::collections::VecDeque;

/// How far above the typical honest norm a gradient may go before it is scaled down. Honest
/// batches of the default model vary by well under 2× around the median.
pub const MULTIPLIER: f64 = 4.0;
/// Recent unclipped norms the median is taken over.
pub const WINDOW: usize = 64;
/// Norms seen before the median replaces the coordinator's own reference.
pub const WARMUP: usize = 8;

#[derive(Debug, Clone)]
pub struct NormBound {
    manual: Option<f64>,
    reference: f64,
    recent: VecDeque<f64>,
    bound: f64,
}

/// What the bound did to one gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clip {
    /// Multiply the gradient by this (1 within the bound).
    pub scale: f32,
    /// The gradient was scaled down.
    pub clipped: bool,
}

impl NormBound {
    /// `manual`: `--max-grad-norm`. `reference`: the coordinator's own gradient norm.
    pub fn new(manual: Option<f64>, reference: f64) -> Self {
        let mut bound = Self {
            manual,
            reference,
            recent: VecDeque::with_capacity(WINDOW),
            bound: 0.0,
        };
        bound.bound = bound.compute();
        bound
    }

    /// The current bound.
    pub fn bound(&self) -> f64 {
        self.bound
    }

    /// A new reference (the coordinator's own gradient norm at weights it was given:
    /// `--init`, a checkpoint), for the warm-up.
    pub fn set_reference(&mut self, reference: f64) {
        self.reference = reference;
        self.bound = self.compute();
    }

    /// The norms it learned from, oldest first (for a checkpoint).
    pub fn history(&self) -> Vec<f64> {
        self.recent.iter().copied().collect()
    }

    /// Continues from a checkpoint's history (the newest [`WINDOW`] finite ones).
    pub fn restore(&mut self, history: &[f64]) {
        let finite: Vec<f64> = history.iter().copied().filter(|n| n.is_finite()).collect();
        self.recent = finite[finite.len().saturating_sub(WINDOW)..]
            .iter()
            .copied()
            .collect();
        self.bound = self.compute();
    }

    /// The scale for a gradient of this norm. A non-finite norm (impossible from a
    /// validated session) scales to zero.
    pub fn clip(&self, norm: f64) -> Clip {
        if !norm.is_finite() {
            return Clip {
                scale: 0.0,
                clipped: true,
            };
        }
        if norm <= self.bound {
            return Clip {
                scale: 1.0,
                clipped: false,
            };
        }
        Clip {
            scale: (self.bound / norm) as f32,
            clipped: true,
        }
    }

    /// Learns from a gradient that was accepted into a round within the bound. Refused ones
    /// (late, not a participant) and clipped ones teach it nothing.
    pub fn learn(&mut self, norm: f64) {
        if !(norm.is_finite() && norm <= self.bound) {
            return;
        }
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(norm);
        self.bound = self.compute();
    }

    fn compute(&self) -> f64 {
        if let Some(manual) = self.manual {
            return manual;
        }
        if self.recent.len() < WARMUP {
            return MULTIPLIER * self.reference;
        }
        let mut sorted: Vec<f64> = self.recent.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        MULTIPLIER * sorted[sorted.len() / 2]
    }
}

/// The L2 norm of `values` in f64, and whether every value is finite, in one pass. Eight
/// independent partial sums let the compiler vectorise it; a single running sum would wait on
/// each addition.
pub fn norm_and_finite(values: &[f32]) -> (f64, bool) {
    let (sum, finite) = sum_squares_and_finite(values);
    (sum.sqrt(), finite)
}

/// The sum of squares, in f64 (so finite values cannot overflow it), and whether every
/// value is finite: a gradient's norm, one chunk at a time.
pub fn sum_squares_and_finite(values: &[f32]) -> (f64, bool) {
    const LANES: usize = 8;
    let mut sums = [0.0f64; LANES];
    let mut finite = true;
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (s, &v) in sums.iter_mut().zip(chunk) {
            finite &= v.is_finite();
            let v = f64::from(v);
            *s += v * v;
        }
    }
    for (s, &v) in sums.iter_mut().zip(rest) {
        finite &= v.is_finite();
        let v = f64::from(v);
        *s += v * v;
    }
    (sums.iter().sum::<f64>(), finite)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_starts_from_the_reference_then_follows_the_median_of_unclipped_norms() {
        let mut b = NormBound::new(None, 2.0);
        assert_eq!(b.bound(), 8.0, "warm-up: 4 × the coordinator's own norm");
        // A hostile first gradient is clipped to the bound, and does not enter the window.
        let clip = b.clip(8e40);
        assert!(clip.clipped && (f64::from(clip.scale) * 8e40 - 8.0).abs() < 1e-3);
        for norm in [1.0, 3.0, 1.0, 3.0, 1.0, 3.0, 1.0] {
            assert_eq!(
                b.clip(norm),
                Clip {
                    scale: 1.0,
                    clipped: false
                }
            );
        }
        assert_eq!(b.bound(), 8.0, "seven norms: still warming up");
        b.learn(2.0);
        // Eight norms, sorted 1 1 1 1 2 3 3 3: the median is the 5th, 2.
        assert_eq!(b.bound(), 8.0);
        for _ in 0..WINDOW {
            b.learn(0.5);
        }
        assert_eq!(b.bound(), 2.0, "it follows honest norms down");
        assert!(b.clip(3.0).clipped);
        b.learn(3.0);
        assert_eq!(b.bound(), 2.0, "a clipped norm does not move it");
    }

    #[test]
    fn a_manual_bound_is_fixed_and_a_non_finite_norm_counts_for_nothing() {
        let mut b = NormBound::new(Some(5.0), 100.0);
        assert_eq!(b.bound(), 5.0);
        for _ in 0..100 {
            b.learn(1.0);
        }
        assert_eq!(b.bound(), 5.0);
        assert_eq!(b.clip(10.0).scale, 0.5);
        assert_eq!(
            b.clip(f64::INFINITY),
            Clip {
                scale: 0.0,
                clipped: true
            }
        );
    }

    #[test]
    fn norms_are_exact_in_f64_where_f32_would_overflow() {
        assert_eq!(norm_and_finite(&[3.0, 4.0]), (5.0, true));
        let (norm, finite) = norm_and_finite(&[3e38, 3e38]);
        assert!(finite && (norm / (3e38 * 2f64.sqrt()) - 1.0).abs() < 1e-6);
        assert!(!norm_and_finite(&[1.0, f32::NAN]).1);
        assert!(!norm_and_finite(&[f32::INFINITY]).1);
    }
}

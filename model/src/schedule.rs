//! The learning rate's schedule and gradient clipping, as nanoGPT trains: a linear warm-up,
//! then a cosine decay to a floor; the gradient's global L2 norm clipped before the step.
//! Both are functions of the step alone, so a run resumed from a checkpoint (whose version
//! is the step count) continues on the same curve.

/// Linear warm-up over `warmup` steps, then cosine decay from the base rate to `min_lr` at
/// step `decay_steps`, flat after it (nanoGPT's `get_lr`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub warmup: u64,
    pub decay_steps: u64,
    pub min_lr: f32,
}

impl LrSchedule {
    /// The rate for step `step` (counted from 0) of a run whose base rate is `lr`.
    pub fn lr_at(&self, lr: f32, step: u64) -> f32 {
        if step < self.warmup {
            return (f64::from(lr) * (step + 1) as f64 / (self.warmup + 1) as f64) as f32;
        }
        if step >= self.decay_steps || self.decay_steps <= self.warmup {
            return self.min_lr;
        }
        let ratio = (step - self.warmup) as f64 / (self.decay_steps - self.warmup) as f64;
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
        let (lr, min) = (f64::from(lr), f64::from(self.min_lr));
        (min + coeff * (lr - min)) as f32
    }
}

/// Scales `grads` so that their global L2 norm is at most `max` (PyTorch's
/// `clip_grad_norm_`: the factor is `max / (norm + 1e-6)`, applied only when below 1).
/// Returns the norm before clipping.
pub fn clip_global_norm(grads: &mut [f32], max: f32) -> f64 {
    let norm = grads
        .iter()
        .map(|&g| f64::from(g) * f64::from(g))
        .sum::<f64>()
        .sqrt();
    let factor = f64::from(max) / (norm + 1e-6);
    if factor < 1.0 {
        let factor = factor as f32;
        for g in grads.iter_mut() {
            *g *= factor;
        }
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nanoGPT's `get_lr` written out for its CPU config (lr 1e-3, min 1e-4, warm-up 100,
    /// decay over 2,000 steps).
    #[test]
    fn the_schedule_is_nanogpts() {
        let s = LrSchedule {
            warmup: 100,
            decay_steps: 2000,
            min_lr: 1e-4,
        };
        let want = |it: u64| -> f64 {
            if it < 100 {
                return 1e-3 * (it + 1) as f64 / 101.0;
            }
            if it > 2000 {
                return 1e-4;
            }
            let r = (it - 100) as f64 / 1900.0;
            1e-4 + 0.5 * (1.0 + (std::f64::consts::PI * r).cos()) * (1e-3 - 1e-4)
        };
        for it in [0, 1, 50, 99, 100, 101, 500, 1050, 1999, 2000, 2001, 10_000] {
            let got = f64::from(s.lr_at(1e-3, it));
            assert!(
                (got - want(it)).abs() < 1e-9,
                "step {it}: {got} vs {}",
                want(it)
            );
        }
        // The curve is continuous where warm-up ends and, after it, never below the floor.
        assert!((s.lr_at(1e-3, 99) - s.lr_at(1e-3, 100)).abs() < 2e-5);
        assert!((100..3000).all(|it| s.lr_at(1e-3, it) >= 1e-4 * 0.999_999));
    }

    #[test]
    fn clipping_scales_only_a_long_gradient() {
        let mut g = vec![3.0, 4.0];
        assert_eq!(clip_global_norm(&mut g, 10.0), 5.0);
        assert_eq!(g, [3.0, 4.0]);
        assert_eq!(clip_global_norm(&mut g, 1.0), 5.0);
        let norm = (g[0] * g[0] + g[1] * g[1]).sqrt();
        assert!((norm - 1.0).abs() < 1e-6, "{norm}");
        assert!((g[0] / g[1] - 0.75).abs() < 1e-6);
    }
}

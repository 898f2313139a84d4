//! Optimizers, run by the coordinator on the averaged gradient.
//!
//! Each works in place on the flat parameter vector. None of them does weight decay or
//! gradient clipping; the coordinator validates gradients (finite, right shape) first.

/// Which optimizer, with its hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    Sgd {
        lr: f32,
    },
    Momentum {
        lr: f32,
        momentum: f32,
    },
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
    },
}

impl OptimizerKind {
    /// The learning rate.
    pub fn lr(self) -> f32 {
        match self {
            Self::Sgd { lr } | Self::Momentum { lr, .. } | Self::Adam { lr, .. } => lr,
        }
    }

    /// The same optimizer with another learning rate.
    #[must_use]
    pub fn with_lr(self, lr: f32) -> Self {
        match self {
            Self::Sgd { .. } => Self::Sgd { lr },
            Self::Momentum { momentum, .. } => Self::Momentum { lr, momentum },
            Self::Adam {
                beta1, beta2, eps, ..
            } => Self::Adam {
                lr,
                beta1,
                beta2,
                eps,
            },
        }
    }

    /// Builds the optimizer for `len` parameters.
    pub fn build(self, len: usize) -> Box<dyn Optimizer + Send> {
        match self {
            Self::Sgd { lr } => Box::new(Sgd { lr }),
            Self::Momentum { lr, momentum } => Box::new(Momentum::new(lr, momentum, len)),
            Self::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => Box::new(Adam::new(lr, beta1, beta2, eps, len)),
        }
    }
}

pub trait Optimizer: std::fmt::Debug {
    /// Applies one update to `params` from the (averaged) gradient `grads`.
    fn step(&mut self, params: &mut [f32], grads: &[f32]);
    /// Whether [`Optimizer::step`] with `grads` would leave every parameter (and the
    /// optimizer's own state) finite. Changes nothing: a coordinator asks before stepping,
    /// so a step that would break the model is never taken.
    fn would_stay_finite(&self, params: &[f32], grads: &[f32]) -> bool;
    /// Everything a later [`Optimizer::restore`] needs to continue bit for bit: the step
    /// count and the named state tensors (none for SGD, `velocity` for momentum, `m` and `v`
    /// for Adam).
    fn state(&self) -> OptimizerState;
    /// Continues from a saved [`OptimizerState`]. Refuses, changing nothing, a state with
    /// other tensors, other lengths or non-finite values.
    fn restore(&mut self, state: OptimizerState) -> Result<(), StateError>;
    /// Changes the learning rate from the next step on.
    fn set_lr(&mut self, lr: f32);
}

/// An optimizer's state, as a checkpoint keeps it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OptimizerState {
    /// Steps taken (Adam's bias correction depends on it).
    pub step: u64,
    pub tensors: Vec<(String, Vec<f32>)>,
}

/// A saved optimizer state does not fit this optimizer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("optimizer state: {0}")]
pub struct StateError(String);

impl OptimizerState {
    /// Takes the tensors named `names`, in that order, each `len` long and finite; nothing
    /// else may be there.
    fn take(self, names: &[&str], len: usize) -> Result<(u64, Vec<Vec<f32>>), StateError> {
        let got: Vec<&str> = self.tensors.iter().map(|(n, _)| n.as_str()).collect();
        if got != names {
            return Err(StateError(format!(
                "expected tensors {names:?}, found {got:?}"
            )));
        }
        let mut out = Vec::with_capacity(names.len());
        for (name, values) in self.tensors {
            if values.len() != len {
                return Err(StateError(format!(
                    "{name} has {} values, the model {len}",
                    values.len()
                )));
            }
            if values.iter().any(|v| !v.is_finite()) {
                return Err(StateError(format!("{name} holds a non-finite value")));
            }
            out.push(values);
        }
        Ok((self.step, out))
    }
}

/// Plain SGD: `p -= lr · g`.
#[derive(Debug, Clone)]
pub struct Sgd {
    pub lr: f32,
}

impl Optimizer for Sgd {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        for (p, &g) in params.iter_mut().zip(grads) {
            *p -= self.lr * g;
        }
    }

    fn would_stay_finite(&self, params: &[f32], grads: &[f32]) -> bool {
        params
            .iter()
            .zip(grads)
            .all(|(&p, &g)| (p - self.lr * g).is_finite())
    }

    fn state(&self) -> OptimizerState {
        OptimizerState::default()
    }

    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }

    fn restore(&mut self, state: OptimizerState) -> Result<(), StateError> {
        state.take(&[], 0).map(drop)
    }
}

/// SGD with (heavy-ball) momentum: `v = μ·v + g; p -= lr · v`.
#[derive(Debug, Clone)]
pub struct Momentum {
    pub lr: f32,
    pub momentum: f32,
    velocity: Vec<f32>,
}

impl Momentum {
    pub fn new(lr: f32, momentum: f32, len: usize) -> Self {
        Self {
            lr,
            momentum,
            velocity: vec![0.0; len],
        }
    }
}

impl Optimizer for Momentum {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        for ((p, v), &g) in params.iter_mut().zip(&mut self.velocity).zip(grads) {
            *v = self.momentum * *v + g;
            *p -= self.lr * *v;
        }
    }

    fn would_stay_finite(&self, params: &[f32], grads: &[f32]) -> bool {
        params
            .iter()
            .zip(&self.velocity)
            .zip(grads)
            .all(|((&p, &v), &g)| {
                let v = self.momentum * v + g;
                v.is_finite() && (p - self.lr * v).is_finite()
            })
    }

    fn state(&self) -> OptimizerState {
        OptimizerState {
            step: 0,
            tensors: vec![("velocity".into(), self.velocity.clone())],
        }
    }

    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }

    fn restore(&mut self, state: OptimizerState) -> Result<(), StateError> {
        let (_, mut tensors) = state.take(&["velocity"], self.velocity.len())?;
        self.velocity = tensors.remove(0);
        Ok(())
    }
}

/// Adam (Kingma & Ba, 2015) with bias correction.
#[derive(Debug, Clone)]
pub struct Adam {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
}

impl Adam {
    pub fn new(lr: f32, beta1: f32, beta2: f32, eps: f32, len: usize) -> Self {
        Self {
            lr,
            beta1,
            beta2,
            eps,
            m: vec![0.0; len],
            v: vec![0.0; len],
            t: 0,
        }
    }
}

impl Optimizer for Adam {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        self.t = self.t.saturating_add(1);
        let c1 = 1.0 - self.beta1.powi(self.t);
        let c2 = 1.0 - self.beta2.powi(self.t);
        let step = self.lr / c1;
        let (b1, b2) = (self.beta1, self.beta2);
        for (((p, m), v), &g) in params
            .iter_mut()
            .zip(&mut self.m)
            .zip(&mut self.v)
            .zip(grads)
        {
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *p -= step * *m / ((*v / c2).sqrt() + self.eps);
        }
    }

    fn would_stay_finite(&self, params: &[f32], grads: &[f32]) -> bool {
        let t = self.t.saturating_add(1);
        let (c1, c2) = (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t));
        let step = self.lr / c1;
        let (b1, b2) = (self.beta1, self.beta2);
        params
            .iter()
            .zip(&self.m)
            .zip(&self.v)
            .zip(grads)
            .all(|(((&p, &m), &v), &g)| {
                let m = b1 * m + (1.0 - b1) * g;
                let v = b2 * v + (1.0 - b2) * g * g;
                m.is_finite()
                    && v.is_finite()
                    && (p - step * m / ((v / c2).sqrt() + self.eps)).is_finite()
            })
    }

    fn state(&self) -> OptimizerState {
        OptimizerState {
            step: u64::try_from(self.t).unwrap_or(0),
            tensors: vec![("m".into(), self.m.clone()), ("v".into(), self.v.clone())],
        }
    }

    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }

    fn restore(&mut self, state: OptimizerState) -> Result<(), StateError> {
        let t = i32::try_from(state.step)
            .map_err(|_| StateError(format!("step {} is out of range", state.step)))?;
        let (_, tensors) = state.take(&["m", "v"], self.m.len())?;
        if tensors[1].iter().any(|&v| v < 0.0) {
            return Err(StateError(
                "v (squared gradients) holds a negative value".into(),
            ));
        }
        let [m, v]: [Vec<f32>; 2] = tensors.try_into().expect("two names, two tensors");
        (self.m, self.v, self.t) = (m, v, t);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgd_and_momentum_match_their_formulas() {
        let mut p = vec![1.0, -2.0];
        Sgd { lr: 0.5 }.step(&mut p, &[2.0, 2.0]);
        assert_eq!(p, [0.0, -3.0]);

        let mut m = Momentum::new(0.1, 0.9, 1);
        let mut p = vec![0.0];
        m.step(&mut p, &[1.0]); // v = 1
        m.step(&mut p, &[1.0]); // v = 1.9
        assert!((p[0] - -(0.1 + 0.19)).abs() < 1e-7);
    }

    #[test]
    fn adam_first_step_moves_each_weight_by_lr() {
        // With bias correction, the first Adam step is lr · sign(g) (up to eps).
        let mut adam = Adam::new(0.01, 0.9, 0.999, 1e-8, 3);
        let mut p = vec![0.0, 0.0, 5.0];
        adam.step(&mut p, &[3.0, -0.001, 0.0]);
        assert!((p[0] - -0.01).abs() < 1e-6);
        assert!((p[1] - 0.01).abs() < 1e-5);
        assert_eq!(p[2], 5.0);
    }

    #[test]
    fn a_step_that_would_overflow_is_seen_before_it_is_taken() {
        for kind in [
            OptimizerKind::Sgd { lr: 0.1 },
            OptimizerKind::Momentum {
                lr: 0.1,
                momentum: 0.9,
            },
            OptimizerKind::Adam {
                lr: 0.1,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        ] {
            let opt = kind.build(2);
            let params = [1.0f32, -1.0];
            assert!(opt.would_stay_finite(&params, &[0.5, 0.5]), "{kind:?}");
            // 3e38 squared overflows Adam's second moment; times lr it still fits SGD, so
            // push SGD over with parameters already near the top of f32.
            assert!(
                !opt.would_stay_finite(&[f32::MAX, 0.0], &[-3e38, 0.0]),
                "{kind:?}"
            );
            assert!(
                !opt.would_stay_finite(&params, &[f32::NAN, 0.0]),
                "{kind:?}"
            );
        }
        let adam = OptimizerKind::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
        .build(1);
        assert!(!adam.would_stay_finite(&[0.0], &[3e38]), "g² overflows v");
    }

    /// One of each optimizer, with rates that minimise a small quadratic.
    fn kinds() -> [OptimizerKind; 3] {
        [
            OptimizerKind::Sgd { lr: 0.1 },
            OptimizerKind::Momentum {
                lr: 0.05,
                momentum: 0.9,
            },
            OptimizerKind::Adam {
                lr: 0.05,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        ]
    }

    /// Stepping, saving, restoring into a fresh optimizer and stepping on gives exactly the
    /// parameters of never stopping; a state of another shape is refused.
    #[test]
    fn a_restored_optimizer_continues_bit_for_bit() {
        for kind in kinds() {
            let grad = |p: &[f32], i: usize| -> Vec<f32> {
                p.iter().map(|v| v * (1.0 + i as f32 * 0.1) - 0.3).collect()
            };
            let (mut straight, mut p) = (kind.build(3), vec![3.0f32, -4.0, 0.5]);
            let mut stopped = kind.build(3);
            let mut q = p.clone();
            for i in 0..5 {
                let g = grad(&p, i);
                straight.step(&mut p, &g);
                let g = grad(&q, i);
                stopped.step(&mut q, &g);
            }
            let mut resumed = kind.build(3);
            resumed.restore(stopped.state()).expect("same optimizer");
            for i in 5..12 {
                let g = grad(&p, i);
                straight.step(&mut p, &g);
                let g = grad(&q, i);
                resumed.step(&mut q, &g);
            }
            assert_eq!(
                p.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                q.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{kind:?}"
            );
            if kind != (OptimizerKind::Sgd { lr: 0.1 }) {
                let err = kind.build(4).restore(straight.state()).expect_err("length");
                assert!(
                    err.to_string().contains("has 3 values, the model 4"),
                    "{err}"
                );
            }
        }
        let adam = OptimizerKind::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        let momentum = OptimizerKind::Momentum {
            lr: 0.1,
            momentum: 0.9,
        };
        let err = adam
            .build(2)
            .restore(momentum.build(2).state())
            .expect_err("another optimizer");
        assert!(
            err.to_string().contains("expected tensors [\"m\", \"v\"]"),
            "{err}"
        );
        let mut nan = adam.build(2).state();
        nan.tensors[0].1[1] = f32::NAN;
        assert!(adam.build(2).restore(nan).is_err());
    }

    #[test]
    fn every_optimizer_minimises_a_quadratic() {
        for kind in kinds() {
            let mut opt = kind.build(2);
            let mut p = vec![3.0f32, -4.0];
            for _ in 0..500 {
                let g = p.clone(); // gradient of |p|²/2
                opt.step(&mut p, &g);
            }
            assert!(p.iter().all(|v| v.abs() < 1e-2), "{kind:?}: {p:?}");
        }
    }
}

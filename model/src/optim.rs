//! Optimizers, run by the coordinator on the averaged gradient.
//!
//! Each works in place on the flat parameter vector. AdamW alone decays weights, and only
//! those its mask names; clipping and the learning rate's schedule are the trainer's
//! (`schedule.rs`). The coordinator validates gradients (finite, right shape) first.

use std::ops::Range;

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
    /// Nesterov momentum, as DiLoCo's outer optimizer (lr 0.7, momentum 0.9 there).
    Nesterov {
        lr: f32,
        momentum: f32,
    },
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
    },
    /// Adam with decoupled weight decay (Loshchilov & Hutter; PyTorch's `AdamW`): each step
    /// first shrinks the decayed weights by `lr · weight_decay`, then takes Adam's step.
    /// Which weights decay is the model's to say ([`crate::Network::decayed`]): as nanoGPT
    /// and GPT-2, matrices decay, and biases and LayerNorm's gains do not.
    AdamW {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
    },
}

impl OptimizerKind {
    /// The learning rate.
    pub fn lr(self) -> f32 {
        match self {
            Self::Sgd { lr }
            | Self::Momentum { lr, .. }
            | Self::Nesterov { lr, .. }
            | Self::Adam { lr, .. }
            | Self::AdamW { lr, .. } => lr,
        }
    }

    /// The same optimizer with another learning rate.
    #[must_use]
    pub fn with_lr(self, lr: f32) -> Self {
        match self {
            Self::Sgd { .. } => Self::Sgd { lr },
            Self::Momentum { momentum, .. } => Self::Momentum { lr, momentum },
            Self::Nesterov { momentum, .. } => Self::Nesterov { lr, momentum },
            Self::Adam {
                beta1, beta2, eps, ..
            } => Self::Adam {
                lr,
                beta1,
                beta2,
                eps,
            },
            Self::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            } => Self::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            },
        }
    }

    /// Builds the optimizer for `len` parameters, every one of them decayed by AdamW.
    pub fn build(self, len: usize) -> Box<dyn Optimizer + Send> {
        self.build_masked(len, std::iter::once(0..len).collect())
    }

    /// Builds the optimizer for `len` parameters; AdamW decays those in `decayed` only
    /// (the others ignore it).
    pub fn build_masked(self, len: usize, decayed: Vec<Range<usize>>) -> Box<dyn Optimizer + Send> {
        match self {
            Self::Sgd { lr } => Box::new(Sgd { lr }),
            Self::Momentum { lr, momentum } => Box::new(Momentum::new(lr, momentum, len)),
            Self::Nesterov { lr, momentum } => Box::new(Nesterov(Momentum::new(lr, momentum, len))),
            Self::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => Box::new(Adam::new(lr, beta1, beta2, eps, len)),
            Self::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => Box::new(AdamW {
                adam: Adam::new(lr, beta1, beta2, eps, len),
                weight_decay,
                decayed,
            }),
        }
    }
}

pub trait Optimizer: std::fmt::Debug {
    /// Applies one update to `params` from the (averaged) gradient `grads`.
    fn step(&mut self, params: &mut [f32], grads: &[f32]);
    /// Whether [`Optimizer::step`] with `grads` would leave every parameter (and the
    /// optimizer's own state) finite. Changes nothing: a coordinator asks before stepping,
    /// so a step that would break the model is never taken. It runs over every parameter
    /// each round, so implementations fold with `&` rather than stop at the first failure:
    /// a loop without an exit is one the compiler vectorises.
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
    /// Its tensors' values one after the other, in its order, onto `out` (what a revealed
    /// state carries after the weights).
    pub fn flatten_into(&self, out: &mut Vec<f32>) {
        for (_, values) in &self.tensors {
            out.extend_from_slice(values);
        }
    }

    /// A state of `step` steps with `like`'s tensors (names and lengths), read in order
    /// from `values`; `None` unless `values` holds exactly that many.
    pub fn unflatten(like: &Self, step: u64, values: &[f32]) -> Option<Self> {
        let needed: usize = like.tensors.iter().map(|(_, t)| t.len()).sum();
        if values.len() != needed {
            return None;
        }
        let mut rest = values;
        let tensors = like
            .tensors
            .iter()
            .map(|(name, t)| {
                let (these, after) = rest.split_at(t.len());
                rest = after;
                (name.clone(), these.to_vec())
            })
            .collect();
        Some(Self { step, tensors })
    }

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
            .fold(true, |ok, (&p, &g)| ok & (p - self.lr * g).is_finite())
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
            .fold(true, |ok, ((&p, &v), &g)| {
                let v = self.momentum * v + g;
                ok & v.is_finite() & (p - self.lr * v).is_finite()
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

/// Nesterov momentum (PyTorch's `SGD(nesterov=True)`): `v = μ·v + g; p -= lr · (g + μ·v)`.
/// Its state is momentum's (`velocity`).
#[derive(Debug, Clone)]
pub struct Nesterov(pub Momentum);

impl Optimizer for Nesterov {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        let Momentum {
            lr,
            momentum,
            velocity,
        } = &mut self.0;
        for ((p, v), &g) in params.iter_mut().zip(velocity.iter_mut()).zip(grads) {
            *v = *momentum * *v + g;
            *p -= *lr * (g + *momentum * *v);
        }
    }

    fn would_stay_finite(&self, params: &[f32], grads: &[f32]) -> bool {
        let m = &self.0;
        params
            .iter()
            .zip(&m.velocity)
            .zip(grads)
            .fold(true, |ok, ((&p, &v), &g)| {
                let v = m.momentum * v + g;
                ok & v.is_finite() & (p - m.lr * (g + m.momentum * v)).is_finite()
            })
    }

    fn state(&self) -> OptimizerState {
        self.0.state()
    }

    fn set_lr(&mut self, lr: f32) {
        self.0.lr = lr;
    }

    fn restore(&mut self, state: OptimizerState) -> Result<(), StateError> {
        self.0.restore(state)
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
            .fold(true, |ok, (((&p, &m), &v), &g)| {
                let m = b1 * m + (1.0 - b1) * g;
                let v = b2 * v + (1.0 - b2) * g * g;
                ok & m.is_finite()
                    & v.is_finite()
                    & (p - step * m / ((v / c2).sqrt() + self.eps)).is_finite()
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

/// AdamW: Adam, with the weights in `decayed` first multiplied by `1 - lr · weight_decay`
/// each step. Its state is Adam's (`m`, `v` and the step).
#[derive(Debug, Clone)]
pub struct AdamW {
    pub adam: Adam,
    pub weight_decay: f32,
    decayed: Vec<Range<usize>>,
}

impl Optimizer for AdamW {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        let keep = 1.0 - self.adam.lr * self.weight_decay;
        for range in &self.decayed {
            for p in &mut params[range.clone()] {
                *p *= keep;
            }
        }
        self.adam.step(params, grads);
    }

    /// Decay only shrinks a weight (`lr · weight_decay` is below 1), so Adam's own check
    /// on the weights before it is the stricter one.
    fn would_stay_finite(&self, params: &[f32], grads: &[f32]) -> bool {
        self.adam.would_stay_finite(params, grads)
    }

    fn state(&self) -> OptimizerState {
        self.adam.state()
    }

    fn restore(&mut self, state: OptimizerState) -> Result<(), StateError> {
        self.adam.restore(state)
    }

    fn set_lr(&mut self, lr: f32) {
        self.adam.lr = lr;
    }
}

#[cfg(test)]
#[path = "optim_tests.rs"]
mod tests;

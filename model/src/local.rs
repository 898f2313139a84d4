//! A local phase (`--local-steps`): several inner optimizer steps on consecutive batches,
//! taken by a worker from the weights it was sent, and answered with the pseudo-gradient,
//! the weights it started from minus the weights it ended with (DiLoCo's outer gradient).
//!
//! The inner optimizer starts afresh each phase, so a phase is a function of its start
//! weights, its batches and its settings alone: the coordinator replays it exactly to verify
//! an answer (`--verify-fraction`), and a worker that reconnects loses nothing but the phase
//! it was in. Worker and coordinator run this same code, one step at a time, so a browser
//! tab can pause, or yield to its page, between two steps.

use ndarray::ArrayView2;

use crate::optim::{Optimizer, OptimizerKind, OptimizerState};
use crate::{ModelError, Network};

/// A phase under way: the trained tensors as they are now, and the inner optimizer.
#[derive(Debug)]
pub struct LocalPhase {
    start: Vec<f32>,
    trained: Vec<f32>,
    /// The frozen tensors' values (empty without frozen layers).
    frozen: Vec<f32>,
    optimizer: Box<dyn Optimizer + Send>,
    steps: u32,
    taken: u32,
    loss_sum: f64,
}

/// What a finished phase answers with.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseResult {
    /// `start − end` over the trained tensors, in layout order (what `Gradient` carries).
    pub delta: Vec<f32>,
    /// The mean of the steps' training losses.
    pub mean_loss: f32,
}

impl LocalPhase {
    /// A phase of `steps` steps of `optimizer` (fresh state) from the full weights `start`.
    pub fn new(net: &Network, start: &[f32], optimizer: OptimizerKind, steps: u32) -> Self {
        let trained = net.trained_part(start);
        let frozen = net.frozen_part(start);
        Self {
            optimizer: optimizer.build_masked(trained.len(), net.decayed_trained()),
            start: trained.clone(),
            trained,
            frozen,
            steps,
            taken: 0,
            loss_sum: 0.0,
        }
    }

    /// Steps taken so far; the next one uses batch `first + taken()`.
    pub fn taken(&self) -> u32 {
        self.taken
    }

    pub fn steps(&self) -> u32 {
        self.steps
    }

    pub fn is_done(&self) -> bool {
        self.taken >= self.steps
    }

    /// One inner step on the batch `x`, `labels` with dropout seed `seed`; returns its loss.
    pub fn step(
        &mut self,
        net: &Network,
        x: ArrayView2<'_, f32>,
        labels: &[u8],
        seed: u64,
    ) -> Result<f32, ModelError> {
        self.step_parts(net, x, labels, seed, 1)
    }

    /// The same step with the batch's gradient computed in `parts` parts
    /// ([`Network::loss_and_grad_parts`]): what a worker that computed it on that many cores
    /// took.
    pub fn step_parts(
        &mut self,
        net: &Network,
        x: ArrayView2<'_, f32>,
        labels: &[u8],
        seed: u64,
        parts: usize,
    ) -> Result<f32, ModelError> {
        let (loss, grads) = net.loss_and_grad_parts(&self.weights(net), x, labels, seed, parts)?;
        self.apply(net, loss, &grads);
        Ok(loss)
    }

    /// The full weights the next step computes its gradient at.
    pub fn weights(&self, net: &Network) -> std::borrow::Cow<'_, [f32]> {
        if self.frozen.is_empty() {
            std::borrow::Cow::Borrowed(&self.trained)
        } else {
            std::borrow::Cow::Owned(net.join(&self.trained, &self.frozen))
        }
    }

    /// Its state as one flat vector: the trained tensors, then the inner optimizer's (in
    /// its order), and the steps taken: what a GPU's phase commits to and reveals
    /// (`protocol::commit`).
    pub fn flat_state(&self) -> (u64, Vec<f32>) {
        let state = self.optimizer.state();
        let mut flat = Vec::with_capacity(self.trained.len() * (1 + state.tensors.len()));
        flat.extend_from_slice(&self.trained);
        state.flatten_into(&mut flat);
        (u64::from(self.taken), flat)
    }

    /// Takes the next steps as computed elsewhere, weights and optimizer together (a tab's
    /// GPU keeps both through a segment): `losses` a step each, and the state they ended
    /// at in [`LocalPhase::flat_state`]'s layout. Refused, leaving the phase as it was,
    /// unless it is that many steps on, as long, finite, and a state the optimizer takes
    /// (Adam's `v` not negative).
    pub fn adopt(&mut self, losses: &[f32], step: u64, state: &[f32]) -> Result<(), ModelError> {
        let taken = u64::from(self.taken) + losses.len() as u64;
        if step != taken || taken > u64::from(self.steps) {
            return Err(ModelError::BadState(format!(
                "{} steps on from step {} is step {taken} (of {}), not {step}",
                losses.len(),
                self.taken,
                self.steps
            )));
        }
        let len = self.trained.len();
        let expected = len
            + self
                .optimizer
                .state()
                .tensors
                .iter()
                .map(|(_, t)| t.len())
                .sum::<usize>();
        if state.len() != expected {
            return Err(ModelError::ShapeMismatch {
                what: "a phase's state",
                expected,
                got: state.len(),
            });
        }
        let (trained, rest) = state.split_at(len);
        if !trained.iter().chain(losses).all(|v| v.is_finite()) {
            return Err(ModelError::BadState(
                "a weight or a loss is not finite".into(),
            ));
        }
        let optimizer = OptimizerState::unflatten(&self.optimizer.state(), step, rest)
            .expect("the length is checked");
        self.optimizer
            .restore(optimizer)
            .map_err(|e| ModelError::BadState(e.to_string()))?;
        self.trained.copy_from_slice(trained);
        self.taken = u32::try_from(taken).expect("at most `steps`");
        self.loss_sum += losses.iter().map(|&l| f64::from(l)).sum::<f64>();
        Ok(())
    }

    /// Takes the next step with the gradient (full layout) and loss computed at
    /// [`LocalPhase::weights`], wherever they were computed.
    pub fn apply(&mut self, net: &Network, loss: f32, grads: &[f32]) {
        if net.frozen().is_empty() {
            self.optimizer.step(&mut self.trained, grads);
        } else {
            self.optimizer
                .step(&mut self.trained, &net.trained_part(grads));
        }
        self.taken += 1;
        self.loss_sum += f64::from(loss);
    }

    /// The pseudo-gradient, once every step is taken (or after fewer, for a phase cut
    /// short: it is then the phase so far).
    pub fn finish(self) -> PhaseResult {
        let delta = self
            .start
            .iter()
            .zip(&self.trained)
            .map(|(s, e)| s - e)
            .collect();
        PhaseResult {
            delta,
            mean_loss: (self.loss_sum / f64::from(self.taken.max(1))) as f32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::OptimizerKind;

    const ADAMW: OptimizerKind = OptimizerKind::AdamW {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };

    fn data(net: &Network, n: usize, seed: u64) -> (ndarray::Array2<f32>, Vec<u8>) {
        let mut rng = crate::SplitMix64::new(seed);
        let x =
            ndarray::Array2::from_shape_fn((n, net.inputs()), |_| (rng.next_f64() - 0.5) as f32);
        let labels = (0..n).map(|i| (i % net.classes()) as u8).collect();
        (x, labels)
    }

    /// H steps of SGD in a phase are H steps of the SGD optimizer on the same batches, bit
    /// for bit, and the answer is the start minus the end.
    #[test]
    fn a_phase_of_sgd_is_plain_sgd_and_answers_start_minus_end() {
        let net = Network::mlp(&[6, 5, 3]).expect("mlp");
        let start: Vec<f32> = net.init(7);
        let kind = OptimizerKind::Sgd { lr: 0.1 };
        let mut phase = LocalPhase::new(&net, &start, kind, 4);
        let mut plain = start.clone();
        let mut sgd = kind.build(plain.len());
        for k in 0..4u64 {
            let (x, labels) = data(&net, 8, k);
            phase.step(&net, x.view(), &labels, k).expect("step");
            let (_, g) = net
                .loss_and_grad(&plain, x.view(), &labels, k)
                .expect("grad");
            sgd.step(&mut plain, &g);
        }
        assert!(phase.is_done());
        let result = phase.finish();
        for ((d, s), p) in result.delta.iter().zip(&start).zip(&plain) {
            assert_eq!(*d, s - p);
        }
        assert!(result.mean_loss.is_finite() && result.mean_loss > 0.0);
    }

    /// A phase of AdamW is AdamW on the same batches with the model's decay mask (its
    /// matrices, not its biases), bit for bit.
    #[test]
    fn a_phase_of_adamw_decays_the_matrices_only() {
        let net = Network::mlp(&[6, 5, 3]).expect("mlp");
        let start: Vec<f32> = net.init(7);
        let kind = ADAMW;
        let mut phase = LocalPhase::new(&net, &start, kind, 3);
        let mut plain = start.clone();
        let mut adamw = kind.build_masked(plain.len(), net.decayed());
        for k in 0..3u64 {
            let (x, labels) = data(&net, 8, k);
            phase.step(&net, x.view(), &labels, k).expect("step");
            let (_, g) = net
                .loss_and_grad(&plain, x.view(), &labels, k)
                .expect("grad");
            adamw.step(&mut plain, &g);
        }
        let delta = phase.finish().delta;
        let want: Vec<f32> = start.iter().zip(&plain).map(|(s, e)| s - e).collect();
        assert_eq!(
            delta.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // The mask itself: every weight matrix, no bias.
        let decayed = net.decayed_trained();
        let layout = net.layout().tensors();
        let matrices: Vec<_> = layout
            .iter()
            .filter(|t| t.shape.len() >= 2)
            .map(|t| t.range())
            .collect();
        assert_eq!(decayed, matrices);
        assert!(
            layout.iter().any(|t| t.shape.len() == 1),
            "the mlp has biases"
        );
    }

    /// Steps taken elsewhere and adopted (their end state and losses) leave a phase where
    /// taking them here does, bit for bit; a state that is not that many steps on, of
    /// another length, not finite or with a negative `v`, is refused and changes nothing.
    #[test]
    fn a_phase_adopts_steps_taken_elsewhere() {
        let net = Network::mlp(&[6, 5, 3]).expect("mlp");
        let start: Vec<f32> = net.init(7);
        let kind = ADAMW;
        let mut here = LocalPhase::new(&net, &start, kind, 4);
        let mut elsewhere = LocalPhase::new(&net, &start, kind, 4);
        let mut adopting = LocalPhase::new(&net, &start, kind, 4);
        let mut losses = Vec::new();
        for k in 0..3u64 {
            let (x, labels) = data(&net, 8, k);
            here.step(&net, x.view(), &labels, k).expect("step");
            losses.push(elsewhere.step(&net, x.view(), &labels, k).expect("step"));
        }
        let (step, state) = elsewhere.flat_state();
        let before = adopting.flat_state();
        let mut negative = state.clone();
        *negative.last_mut().expect("v") = -1.0;
        let mut infinite = state.clone();
        infinite[0] = f32::INFINITY;
        for (losses, step, state) in [
            (&losses[..2], step, &state),
            (&losses[..], step + 1, &state),
            (&losses[..], step, &state[1..].to_vec()),
            (&losses[..], step, &negative),
            (&losses[..], step, &infinite),
        ] {
            assert!(adopting.adopt(losses, step, state).is_err());
            assert_eq!(adopting.flat_state(), before, "refused, nothing changed");
        }
        adopting.adopt(&losses, step, &state).expect("adopts");
        assert_eq!(adopting.flat_state(), here.flat_state());
        // The last step, here, from the adopted state.
        let (x, labels) = data(&net, 8, 3);
        here.step(&net, x.view(), &labels, 3).expect("step");
        adopting.step(&net, x.view(), &labels, 3).expect("step");
        assert!(adopting.is_done());
        assert_eq!(adopting.finish(), here.finish());
    }
}

//! A model built from a [`NetSpec`]: its parameter layout, initialisation, forward pass and
//! gradient, the same code on the coordinator, the native worker and in the browser.
//!
//! [`Network`] is one interface (forward, loss and gradient, parts of a batch, the decay
//! mask, the trained and frozen ranges) over a body, one arm per kind of model: a chain of
//! layers (`chain.rs`) or a GPT (`crate::gpt`). A new kind of model is a new file and an
//! arm of [`Body`] (and of [`NetSpec`]).
//!
//! Parameters are named by the position of their layer among the layers that have any:
//! `l{k}.weight` and `l{k}.bias` (so the default MLP's names are those of earlier releases).
//! Dense weights are `[in, out]`; convolution weights `[filters, channels, k, k]`.

use std::ops::Range;

use ndarray::{Array2, ArrayView2, CowArray, Ix2};

use crate::error::ModelError;
use crate::gpt::Gpt;
use crate::loss::cross_entropy_sum_and_correct;
use crate::params::ParamLayout;
use crate::rng::SplitMix64;
use crate::scalar::Scalar;
use crate::spec::{NetSpec, Shape, SpecError};

use self::chain::Chain;

#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    spec: NetSpec,
    layout: ParamLayout,
    /// Flat ranges of the trained parameters (layers not frozen) and of the frozen ones.
    trainable: Vec<Range<usize>>,
    frozen: Vec<Range<usize>>,
    trainable_count: usize,
    body: Body,
}

/// What computes the model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    Chain(Chain),
    Gpt(Box<Gpt>),
}

/// Most parameters a model may have (256 MiB of f32): a spec beyond it is refused before
/// anything is allocated, on the coordinator and on a worker that receives it.
pub const MAX_PARAMS: usize = 64 << 20;

/// The seed of the dropout masks for the batch starting at train sample `first_sample` in
/// round `round`: the worker and a verifier derive the same one.
pub fn batch_seed(round: u64, first_sample: usize) -> u64 {
    SplitMix64::new(round.rotate_left(32) ^ first_sample as u64).next_u64()
}

impl Network {
    /// Checks the spec against `classes` outputs and lays out its parameters.
    pub fn new(spec: NetSpec, classes: usize) -> Result<Self, ModelError> {
        let outputs = spec.shapes(classes)?;
        let chain = match &spec {
            NetSpec::Gpt(gpt) => return Self::gpt(*gpt, spec),
            NetSpec::Chain(chain) => chain,
        };
        let laid = Chain::lay_out(chain, outputs)?;
        let trainable_count = laid.trainable.iter().map(ExactSizeIterator::len).sum();
        Ok(Self {
            spec,
            layout: laid.layout,
            trainable: laid.trainable,
            frozen: laid.frozen,
            trainable_count,
            body: Body::Chain(laid.chain),
        })
    }

    fn gpt(gpt: crate::gpt::GptSpec, spec: NetSpec) -> Result<Self, ModelError> {
        let too_large = |params| SpecError::TooLarge {
            params,
            max: MAX_PARAMS,
        };
        let params = gpt.param_count().ok_or(too_large(usize::MAX))?;
        if params > MAX_PARAMS {
            return Err(too_large(params).into());
        }
        let body = Gpt::new(gpt).map_err(|reason| SpecError::Parse {
            text: spec.to_string(),
            reason,
        })?;
        Ok(Self {
            layout: body.layout().clone(),
            trainable: std::iter::once(0..params).collect(),
            frozen: Vec::new(),
            trainable_count: params,
            spec,
            body: Body::Gpt(Box::new(body)),
        })
    }

    /// The chain of layers this network is, if it is one.
    pub(crate) fn chain(&self) -> Option<&Chain> {
        match &self.body {
            Body::Chain(chain) => Some(chain),
            Body::Gpt(_) => None,
        }
    }

    /// The GPT this network is, if it is one.
    pub fn as_gpt(&self) -> Option<&Gpt> {
        match &self.body {
            Body::Gpt(gpt) => Some(gpt),
            Body::Chain(_) => None,
        }
    }

    /// Whether an answer computed in an order nobody replays (a GPU's) is checked within
    /// this model's rounding envelope ([`Network::loss_grad_envelope`]: a chain's near-ties);
    /// otherwise (a GPT, which has no near-ties) tensor by tensor.
    pub fn has_envelope(&self) -> bool {
        matches!(self.body, Body::Chain(_))
    }

    /// A language model's continuation of `prompt` (token ids), drawn as `how` says.
    /// `None`: this model writes no text.
    pub fn generate(
        &self,
        params: &[f32],
        prompt: &[usize],
        how: crate::gpt::Sampling,
    ) -> Option<Result<Vec<usize>, ModelError>> {
        match &self.body {
            Body::Gpt(gpt) => Some(gpt.generate(params, prompt, how)),
            Body::Chain(_) => None,
        }
    }

    /// Predictions per sample: a GPT's context (one at each position), else 1.
    pub fn positions(&self) -> usize {
        self.as_gpt().map_or(1, |g| g.spec().context)
    }

    /// A ReLU MLP on flat input with these widths, input first (`[784, 128, 10]`).
    pub fn mlp(sizes: &[usize]) -> Result<Self, ModelError> {
        match sizes {
            [input, hidden @ .., classes] => Self::new(
                NetSpec::mlp(Shape::flat(*input), hidden, *classes),
                *classes,
            ),
            _ => Err(crate::spec::SpecError::Empty.into()),
        }
    }

    pub fn spec(&self) -> &NetSpec {
        &self.spec
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    pub fn param_count(&self) -> usize {
        self.layout.total()
    }

    /// Features per input sample.
    pub fn inputs(&self) -> usize {
        self.spec.input().len()
    }

    pub fn classes(&self) -> usize {
        match &self.body {
            Body::Chain(chain) => chain.classes(),
            Body::Gpt(gpt) => gpt.spec().vocab,
        }
    }

    /// Flat ranges of the parameters that are trained (those of layers not frozen).
    pub fn trainable(&self) -> &[Range<usize>] {
        &self.trainable
    }

    /// Flat ranges of the frozen parameters (the complement of [`Network::trainable`]).
    pub fn frozen(&self) -> &[Range<usize>] {
        &self.frozen
    }

    /// Flat ranges of the parameters AdamW decays: the trained matrices and kernels (as
    /// GPT-2 and nanoGPT: tensors of two dimensions or more), never biases, LayerNorm's
    /// gains, or a frozen layer's weights (which must stay as they are).
    pub fn decayed(&self) -> Vec<Range<usize>> {
        self.layout
            .tensors()
            .iter()
            .filter(|t| match &self.body {
                Body::Gpt(_) => Gpt::decays(&t.name),
                Body::Chain(_) => t.shape.len() >= 2,
            })
            .map(|t| t.range())
            .filter(|r| {
                self.trainable
                    .iter()
                    .any(|t| t.start <= r.start && r.end <= t.end)
            })
            .collect()
    }

    /// [`Network::decayed`] in the trained tensors' own coordinates (what a local phase
    /// steps: the trained part of the parameters, in layout order).
    pub fn decayed_trained(&self) -> Vec<Range<usize>> {
        let mut offset = 0;
        let mut out = Vec::new();
        let decayed = self.decayed();
        for t in &self.trainable {
            for r in decayed
                .iter()
                .filter(|r| t.start <= r.start && r.end <= t.end)
            {
                out.push(offset + r.start - t.start..offset + r.end - t.start);
            }
            offset += t.len();
        }
        out
    }

    /// How many parameters are trained: the length of a gradient on the wire.
    pub fn trainable_count(&self) -> usize {
        self.trainable_count
    }

    /// The trained parts of a full-length gradient, in layout order (what a worker sends).
    /// Without frozen layers, the vector itself, not a copy.
    pub fn compact<T: Copy>(&self, full: Vec<T>) -> Vec<T> {
        if self.frozen.is_empty() {
            return full;
        }
        self.trained_part(&full)
    }

    /// The trained parameters of `full`, in layout order (what `Weights` carry).
    pub fn trained_part<T: Copy>(&self, full: &[T]) -> Vec<T> {
        gather(&self.trainable, full)
    }

    /// The frozen parameters of `full`, in layout order (what `Frozen` carries).
    pub fn frozen_part<T: Copy>(&self, full: &[T]) -> Vec<T> {
        gather(&self.frozen, full)
    }

    /// A full-length gradient from its trained parts, zero for frozen layers.
    pub fn expand(&self, compact: &[f32]) -> Vec<f32> {
        self.join(
            compact,
            &vec![0.0; self.param_count() - self.trainable_count],
        )
    }

    /// Full parameters from the trained and the frozen parts, each in layout order (their
    /// lengths must be `trainable_count()` and the rest).
    pub fn join(&self, trained: &[f32], frozen: &[f32]) -> Vec<f32> {
        let mut full = vec![0.0; self.param_count()];
        for (ranges, mut from) in [(&self.trainable, trained), (&self.frozen, frozen)] {
            for r in ranges.iter().cloned() {
                let (head, rest) = from.split_at(r.len());
                full[r].copy_from_slice(head);
                from = rest;
            }
        }
        full
    }

    /// He-uniform weights (`U(±sqrt(6 / fan_in))`, suited to ReLU) and zero biases (a GPT:
    /// GPT-2's own, [`Gpt::init`]). The same seed gives the same weights on every platform.
    pub fn init<T: Scalar>(&self, seed: u64) -> Vec<T> {
        match &self.body {
            Body::Chain(chain) => chain.init(seed),
            Body::Gpt(gpt) => gpt.init(seed),
        }
    }

    fn check<T: Scalar>(&self, params: &[T], x: &ArrayView2<'_, T>) -> Result<(), ModelError> {
        if params.len() != self.param_count() {
            return Err(ModelError::ShapeMismatch {
                what: "parameters",
                expected: self.param_count(),
                got: params.len(),
            });
        }
        if x.ncols() != self.inputs() {
            return Err(ModelError::ShapeMismatch {
                what: "input features",
                expected: self.inputs(),
                got: x.ncols(),
            });
        }
        if x.nrows() == 0 {
            return Err(ModelError::EmptyBatch);
        }
        Ok(())
    }

    /// Logits for a batch `x` of shape `[n, inputs]` (evaluation: dropout off); a GPT's are
    /// `[n · context, vocab]`, one row per position.
    pub fn forward<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
    ) -> Result<Array2<T>, ModelError> {
        self.check(params, &x)?;
        match &self.body {
            Body::Chain(chain) => {
                let x = standard(x);
                let mut outs = chain.forward_all(params, x.view(), None, Part::whole(x.nrows()));
                Ok(outs.pop().expect("at least one layer"))
            }
            Body::Gpt(gpt) => Ok(gpt.forward(params, x, true)?.logits),
        }
    }

    /// Mean cross-entropy over the batch and its gradient with respect to every parameter,
    /// flat, in the parameter layout (zero for frozen layers; [`Network::compact`] keeps
    /// the trained ones). `seed` draws the dropout
    /// masks (see [`batch_seed`]).
    pub fn loss_and_grad<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
        seed: u64,
    ) -> Result<(T, Vec<T>), ModelError> {
        self.part_loss_and_grad(params, x, labels, seed, Part::whole(x.nrows()))
    }

    /// Summed cross-entropy and number of correct predictions over a batch (a GPT: each
    /// window's mean over its positions, summed, and the correct positions).
    pub fn loss_sum_and_correct<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
    ) -> Result<(T, usize), ModelError> {
        if let Body::Gpt(gpt) = &self.body {
            self.check(params, &x)?;
            let acts = gpt.forward_inference(params, x, true)?;
            let (sum, correct) = gpt.loss_sum_and_correct(&acts);
            let positions = T::from_usize(gpt.spec().context).ok_or(ModelError::EmptyBatch)?;
            return Ok((sum / positions, correct));
        }
        let logits = self.forward(params, x)?;
        cross_entropy_sum_and_correct(logits.view(), labels)
    }
}

/// The values of `full` in `ranges`, concatenated.
fn gather<T: Copy>(ranges: &[Range<usize>], full: &[T]) -> Vec<T> {
    let mut out = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum());
    for r in ranges {
        out.extend_from_slice(&full[r.clone()]);
    }
    out
}

/// Which backward pass [`Network::backward_all`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// The gradient.
    Gradient,
    /// The same sums over magnitudes: `|∂loss/∂logits|` down through `|weights|` and
    /// `|activations|` wherever a layer multiplies and sums, through the forward pass's own
    /// ReLU masks and max-pool routes elsewhere (every value ≥ 0): what bounds the rounding
    /// of each value of the gradient (`ties.rs`).
    Magnitude,
}

/// `x` in row-major layout (the layers read samples as contiguous rows).
pub(crate) fn standard<'a, T: Scalar>(x: ArrayView2<'a, T>) -> CowArray<'a, T, Ix2> {
    if x.is_standard_layout() {
        CowArray::from(x)
    } else {
        CowArray::from(x.as_standard_layout().into_owned())
    }
}

mod branches;
mod chain;
mod parts;
mod stages;
mod ties;

pub use self::branches::{Branch, Forced, Refusal, FORCE_MARGIN, MAX_BRANCHES};
pub use self::parts::{add_parts, Part, MAX_PARTS, MIN_PART_ROWS};
pub use self::stages::Stage;
pub use self::ties::Envelope;

#[cfg(test)]
mod tests;

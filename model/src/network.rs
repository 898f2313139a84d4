//! A model built from a [`NetSpec`]: its parameter layout, initialisation, forward pass and
//! gradient, the same code on the coordinator, the native worker and in the browser.
//!
//! Parameters are named by the position of their layer among the layers that have any:
//! `l{k}.weight` and `l{k}.bias` (so the default MLP's names are those of earlier releases).
//! Dense weights are `[in, out]`; convolution weights `[filters, channels, k, k]`.

use std::ops::Range;

use ndarray::{Array2, ArrayView2, CowArray, Ix2};

use crate::error::ModelError;
use crate::gpt::Gpt;
use crate::layers::{self, Ctx};
use crate::loss::{cross_entropy_sum_and_correct, softmax_cross_entropy_of};
use crate::params::ParamLayout;
use crate::rng::SplitMix64;
use crate::scalar::Scalar;
use crate::spec::{Layer, NetSpec, Shape, SpecError};

#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    spec: NetSpec,
    /// Each layer's input shape, then the output of the last.
    shapes: Vec<Shape>,
    layout: ParamLayout,
    /// For each layer with parameters, the index of its weight tensor in the layout.
    weights: Vec<Option<usize>>,
    /// Flat ranges of the trained parameters (layers not frozen) and of the frozen ones.
    trainable: Vec<Range<usize>>,
    frozen: Vec<Range<usize>>,
    trainable_count: usize,
    /// A GPT's body, which computes the whole model (its spec's one layer).
    gpt: Option<Box<Gpt>>,
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
        if let Some(gpt) = spec.as_gpt() {
            return Self::gpt(spec, gpt);
        }
        if let Some(index) = spec
            .layers
            .iter()
            .position(|l| matches!(l.layer, Layer::Gpt(_)))
        {
            return Err(SpecError::Layer {
                index,
                layer: "gpt".into(),
                input: spec.input.to_string(),
                reason: "a gpt is a whole model: it must be the only layer".into(),
            }
            .into());
        }
        let mut shapes = vec![spec.input];
        shapes.extend(outputs);
        // Each layer's weight shape, and the total counted without overflow before anything
        // of that size exists.
        let mut total = Some(0usize);
        let mut weight_shapes = Vec::with_capacity(spec.layers.len());
        for (i, l) in spec.layers.iter().enumerate() {
            let (inp, out) = (shapes[i], shapes[i + 1]);
            let shape = match l.layer {
                Layer::Dense { units } => Some(vec![inp.len(), units]),
                Layer::Conv2d {
                    filters, kernel, ..
                } => Some(vec![filters, inp.c, kernel, kernel]),
                _ => None,
            };
            if let Some(shape) = &shape {
                let weight = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
                total = total
                    .zip(weight)
                    .and_then(|(t, w)| t.checked_add(w)?.checked_add(out.c));
            }
            weight_shapes.push(shape);
        }
        match total {
            Some(params) if params <= MAX_PARAMS => {}
            params => {
                return Err(crate::spec::SpecError::TooLarge {
                    params: params.unwrap_or(usize::MAX),
                    max: MAX_PARAMS,
                }
                .into())
            }
        }
        let mut layout = ParamLayout::default();
        let mut weights = Vec::with_capacity(spec.layers.len());
        let (mut trainable, mut frozen) = (Vec::new(), Vec::new());
        for (i, (l, shape)) in spec.layers.iter().zip(weight_shapes).enumerate() {
            let Some(shape) = shape else {
                weights.push(None);
                continue;
            };
            let k = weights.iter().flatten().count();
            let start = layout.total();
            weights.push(Some(layout.tensors().len()));
            layout.push(format!("l{k}.weight"), shape);
            layout.push(format!("l{k}.bias"), vec![shapes[i + 1].c]);
            let range = start..layout.total();
            match l.frozen {
                false => trainable.push(range),
                true => frozen.push(range),
            }
        }
        let trainable_count = trainable.iter().map(ExactSizeIterator::len).sum();
        Ok(Self {
            spec,
            shapes,
            layout,
            weights,
            trainable,
            frozen,
            trainable_count,
            gpt: None,
        })
    }

    fn gpt(spec: NetSpec, gpt: crate::gpt::GptSpec) -> Result<Self, ModelError> {
        let too_large = |params| SpecError::TooLarge {
            params,
            max: MAX_PARAMS,
        };
        let params = gpt.param_count().ok_or(too_large(usize::MAX))?;
        if params > MAX_PARAMS {
            return Err(too_large(params).into());
        }
        if spec.layers[0].frozen {
            return Err(SpecError::Parse {
                text: spec.to_string(),
                reason: "a frozen gpt has nothing to train".into(),
            }
            .into());
        }
        let body = Gpt::new(gpt).map_err(|reason| SpecError::Parse {
            text: spec.to_string(),
            reason,
        })?;
        let shapes = vec![spec.input, Shape::flat(gpt.vocab)];
        Ok(Self {
            layout: body.layout().clone(),
            weights: vec![None],
            trainable: std::iter::once(0..params).collect(),
            frozen: Vec::new(),
            trainable_count: params,
            spec,
            shapes,
            gpt: Some(Box::new(body)),
        })
    }

    /// The GPT this network is, if it is one.
    pub fn as_gpt(&self) -> Option<&Gpt> {
        self.gpt.as_deref()
    }

    /// Predictions per sample: a GPT's context (one at each position), else 1.
    pub fn positions(&self) -> usize {
        self.gpt.as_ref().map_or(1, |g| g.spec().context)
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
        self.spec.input.len()
    }

    pub fn classes(&self) -> usize {
        self.shapes[self.shapes.len() - 1].len()
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
            .filter(|t| match &self.gpt {
                Some(_) => Gpt::decays(&t.name),
                None => t.shape.len() >= 2,
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
        if let Some(gpt) = &self.gpt {
            return gpt.init(seed);
        }
        let mut rng = SplitMix64::new(seed);
        let mut params = vec![T::zero(); self.param_count()];
        for &w in self.weights.iter().flatten() {
            let spec = &self.layout.tensors()[w];
            let fan_in: usize = match spec.shape[..] {
                [n_in, _] => n_in,
                _ => spec.shape[1..].iter().product(),
            };
            let bound = (6.0 / fan_in as f64).sqrt();
            for p in &mut params[spec.range()] {
                *p = T::from_f64((rng.next_f64() * 2.0 - 1.0) * bound).unwrap_or_else(T::zero);
            }
        }
        params
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

    fn ctx(&self, index: usize, seed: Option<u64>, row0: usize) -> Ctx {
        Ctx {
            input: self.shapes[index],
            output: self.shapes[index + 1],
            index,
            seed,
            row0,
        }
    }

    /// The slice of `params` holding layer `index`'s weight and bias (empty if none).
    fn layer_range(&self, index: usize) -> std::ops::Range<usize> {
        match self.weights[index] {
            Some(w) => {
                let t = self.layout.tensors();
                t[w].offset..t[w + 1].range().end
            }
            None => 0..0,
        }
    }

    /// Every layer's output (the last is the logits), for the rows of `x` that are `part`
    /// of a batch (its dropout masks).
    fn forward_all<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        seed: Option<u64>,
        part: Part,
    ) -> Vec<Array2<T>> {
        self.forward_with(params, x, seed, part, |_, _| {})
    }

    /// [`Network::forward_all`], handing `before(i, input)` each layer's input (after the
    /// first) before layer `i` reads it: where a replay forces a logged branch
    /// (`branches.rs`).
    fn forward_with<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        seed: Option<u64>,
        part: Part,
        mut before: impl FnMut(usize, &mut Array2<T>),
    ) -> Vec<Array2<T>> {
        let mut outs: Vec<Array2<T>> = Vec::with_capacity(self.spec.layers.len());
        for (i, l) in self.spec.layers.iter().enumerate() {
            if let Some(input) = outs.last_mut() {
                before(i, input);
            }
            let p = &params[self.layer_range(i)];
            let y = match outs.last() {
                None => layers::forward(&l.layer, &self.ctx(i, seed, part.start), p, x.view()),
                Some(prev) => {
                    layers::forward(&l.layer, &self.ctx(i, seed, part.start), p, prev.view())
                }
            };
            outs.push(y);
        }
        outs
    }

    /// Logits for a batch `x` of shape `[n, inputs]` (evaluation: dropout off); a GPT's are
    /// `[n · context, vocab]`, one row per position.
    pub fn forward<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
    ) -> Result<Array2<T>, ModelError> {
        self.check(params, &x)?;
        if let Some(gpt) = &self.gpt {
            return Ok(gpt.forward(params, x, true)?.logits);
        }
        let x = standard(x);
        Ok(self
            .forward_all(params, x.view(), None, Part::whole(x.nrows()))
            .pop()
            .expect("at least one layer"))
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

    /// The backward pass over a forward pass's outputs `outs` (as [`Network::forward_all`]
    /// gave them for the standardised `x`, `part` of a batch): the loss and the full-layout
    /// gradient of the batch's mean over these rows, or its magnitudes (see [`Pass`]).
    #[allow(clippy::too_many_arguments)]
    fn backward_all<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        outs: &[Array2<T>],
        labels: &[u8],
        seed: u64,
        part: Part,
        pass: Pass,
    ) -> Result<(T, Vec<T>), ModelError> {
        let mut grads = Vec::new();
        let loss = self.backward_into(params, x, outs, labels, (seed, part), pass, &mut grads)?;
        Ok((loss, grads))
    }

    /// [`Network::backward_all`] into `grads` (its memory reused: a worker computing batch
    /// after batch allocates the gradient once).
    #[allow(clippy::too_many_arguments)]
    fn backward_into<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        outs: &[Array2<T>],
        labels: &[u8],
        (seed, part): (u64, Part),
        pass: Pass,
        grads: &mut Vec<T>,
    ) -> Result<T, ModelError> {
        let last = outs.len() - 1;
        let (loss, mut dy) = softmax_cross_entropy_of(outs[last].view(), labels, part.batch)?;
        let magnitude = pass == Pass::Magnitude;
        let abs: Option<Vec<T>> = magnitude.then(|| {
            dy.mapv_inplace(T::abs);
            params.iter().map(|p| p.abs()).collect()
        });
        let params = abs.as_deref().unwrap_or(params);
        // Every trained layer's backward overwrites its whole range (products with beta 0,
        // biases assigned): only a new buffer and the frozen ranges need zeroes, so a
        // reused buffer is not cleared (400 KB a batch for the `mlp` preset).
        if grads.len() != self.param_count() {
            grads.clear();
            grads.resize(self.param_count(), T::zero());
        }
        for range in &self.frozen {
            grads[range.clone()].fill(T::zero());
        }
        // Layers before the first trained or dx-needing one need no backward at all.
        let first_needed = (0..self.spec.layers.len())
            .find(|&i| self.weights[i].is_some() && !self.spec.layers[i].frozen)
            .unwrap_or(last + 1);
        for i in (first_needed..=last).rev() {
            let l = &self.spec.layers[i];
            let range = self.layer_range(i);
            let mut input = if i == 0 { x.view() } else { outs[i - 1].view() };
            let trained = (!l.frozen && !range.is_empty()).then(|| &mut grads[range.clone()]);
            let need_dx = i > first_needed;
            let sums = matches!(l.layer, Layer::Dense { .. } | Layer::Conv2d { .. });
            let abs_input = (magnitude && sums).then(|| input.mapv(T::abs));
            if let Some(a) = &abs_input {
                input = a.view();
            }
            let dx = match l.layer {
                // GELU's slope may be negative: its magnitude.
                Layer::Gelu if magnitude && need_dx => {
                    Some(layers::activation::backward(dy, input, |v: T| {
                        layers::activation::gelu_slope(v).abs()
                    }))
                }
                _ => layers::backward(
                    &l.layer,
                    &self.ctx(i, Some(seed), part.start),
                    &params[range.clone()],
                    input,
                    outs[i].view(),
                    dy,
                    trained,
                    need_dx,
                ),
            };
            match dx {
                Some(dx) => dy = dx,
                None => break,
            }
        }
        Ok(loss)
    }

    /// Summed cross-entropy and number of correct predictions over a batch (a GPT: each
    /// window's mean over its positions, summed, and the correct positions).
    pub fn loss_sum_and_correct<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
    ) -> Result<(T, usize), ModelError> {
        if let Some(gpt) = &self.gpt {
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
enum Pass {
    /// The gradient.
    Gradient,
    /// The same sums over magnitudes: `|∂loss/∂logits|` down through `|weights|` and
    /// `|activations|` wherever a layer multiplies and sums, through the forward pass's own
    /// ReLU masks and max-pool routes elsewhere (every value ≥ 0): what bounds the rounding
    /// of each value of the gradient (`ties.rs`).
    Magnitude,
}

/// `x` in row-major layout (the layers read samples as contiguous rows).
fn standard<'a, T: Scalar>(x: ArrayView2<'a, T>) -> CowArray<'a, T, Ix2> {
    if x.is_standard_layout() {
        CowArray::from(x)
    } else {
        CowArray::from(x.as_standard_layout().into_owned())
    }
}

mod branches;
mod parts;
mod stages;
mod ties;

pub use self::branches::{Branch, Forced, Refusal, FORCE_MARGIN, MAX_BRANCHES};
pub use self::parts::{add_parts, Part, MAX_PARTS, MIN_PART_ROWS};
pub use self::stages::Stage;
pub use self::ties::Envelope;

#[cfg(test)]
mod tests;

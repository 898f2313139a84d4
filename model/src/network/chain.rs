//! A chain of layers ([`ChainSpec`]), one after the other: its parameter layout, He
//! initialisation, forward pass (each layer's output kept) and backward pass. One of
//! [`Network`](super::Network)'s bodies; the layers' maths are `crate::layers`'.

use std::ops::Range;

use ndarray::{Array2, ArrayView2};

use super::{Part, Pass, MAX_PARAMS};
use crate::error::ModelError;
use crate::layers::{self, Ctx};
use crate::loss::softmax_cross_entropy_of;
use crate::params::ParamLayout;
use crate::rng::SplitMix64;
use crate::scalar::Scalar;
use crate::spec::{ChainSpec, Layer, LayerSpec, Shape, SpecError};

/// A chain's layers and what they need at run time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chain {
    pub(crate) layers: Vec<LayerSpec>,
    /// Each layer's input shape, then the output of the last.
    pub(crate) shapes: Vec<Shape>,
    /// Each layer's weight and bias in the full layout (empty without parameters).
    pub(crate) ranges: Vec<Range<usize>>,
    /// For each layer with parameters, the index of its weight tensor in the layout.
    weights: Vec<Option<usize>>,
    layout: ParamLayout,
    frozen: Vec<Range<usize>>,
    params: usize,
}

/// What a chain lays out: its parameters, and which are trained and frozen.
pub(crate) struct Laid {
    pub chain: Chain,
    pub layout: ParamLayout,
    pub trainable: Vec<Range<usize>>,
    pub frozen: Vec<Range<usize>>,
}

impl Chain {
    /// Lays out `spec`'s parameters (`outputs`: each layer's output shape, as
    /// `NetSpec::shapes` checked them): `l{k}.weight` and `l{k}.bias` for the `k`-th layer
    /// that has any. Refused beyond [`MAX_PARAMS`], counted before anything is allocated.
    pub fn lay_out(spec: &ChainSpec, outputs: Vec<Shape>) -> Result<Laid, ModelError> {
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
                return Err(SpecError::TooLarge {
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
        let ranges = weights
            .iter()
            .map(|w| match *w {
                Some(w) => {
                    let t = layout.tensors();
                    t[w].offset..t[w + 1].range().end
                }
                None => 0..0,
            })
            .collect();
        let chain = Self {
            layers: spec.layers.clone(),
            shapes,
            ranges,
            weights,
            layout: layout.clone(),
            frozen: frozen.clone(),
            params: layout.total(),
        };
        Ok(Laid {
            chain,
            layout,
            trainable,
            frozen,
        })
    }

    /// He-uniform weights (`U(±sqrt(6 / fan_in))`, suited to ReLU) and zero biases. The
    /// same seed gives the same weights on every platform.
    pub fn init<T: Scalar>(&self, seed: u64) -> Vec<T> {
        let mut rng = SplitMix64::new(seed);
        let mut params = vec![T::zero(); self.params];
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

    /// The classes: the last layer's outputs.
    pub fn classes(&self) -> usize {
        self.shapes[self.shapes.len() - 1].len()
    }

    pub(crate) fn ctx(&self, index: usize, seed: Option<u64>, row0: usize) -> Ctx {
        Ctx {
            input: self.shapes[index],
            output: self.shapes[index + 1],
            index,
            seed,
            row0,
        }
    }

    /// Every layer's output (the last is the logits), for the rows of `x` that are `part`
    /// of a batch (its dropout masks).
    pub(crate) fn forward_all<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        seed: Option<u64>,
        part: Part,
    ) -> Vec<Array2<T>> {
        self.forward_with(params, x, seed, part, |_, _| {})
    }

    /// [`Chain::forward_all`], handing `before(i, input)` each layer's input (after the
    /// first) before layer `i` reads it: where a replay forces a logged branch
    /// (`branches.rs`).
    pub(crate) fn forward_with<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        seed: Option<u64>,
        part: Part,
        mut before: impl FnMut(usize, &mut Array2<T>),
    ) -> Vec<Array2<T>> {
        let mut outs: Vec<Array2<T>> = Vec::with_capacity(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            if let Some(input) = outs.last_mut() {
                before(i, input);
            }
            let p = &params[self.ranges[i].clone()];
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

    /// The backward pass over a forward pass's outputs `outs` (as [`Chain::forward_all`]
    /// gave them for the standardised `x`, `part` of a batch): the loss and the full-layout
    /// gradient of the batch's mean over these rows, or its magnitudes (see [`Pass`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_all<T: Scalar>(
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

    /// [`Chain::backward_all`] into `grads` (its memory reused: a worker computing batch
    /// after batch allocates the gradient once).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_into<T: Scalar>(
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
        if grads.len() != self.params {
            grads.clear();
            grads.resize(self.params, T::zero());
        }
        for range in &self.frozen {
            grads[range.clone()].fill(T::zero());
        }
        // Layers before the first trained or dx-needing one need no backward at all.
        let first_needed = (0..self.layers.len())
            .find(|&i| self.weights[i].is_some() && !self.layers[i].frozen)
            .unwrap_or(last + 1);
        for i in (first_needed..=last).rev() {
            let l = &self.layers[i];
            let range = self.ranges[i].clone();
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
}

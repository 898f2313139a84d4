//! Forward and backward of each layer type, one file per layer.
//!
//! Activations travel as `[batch, features]` matrices, each row one sample laid out
//! channel-major (`c, h, w`), so dense layers, convolutions and pools share one form.
//! Backward receives the layer's input and output from the forward pass, the gradient of
//! the loss with respect to the output, and returns the gradient with respect to the input
//! (only when a layer before needs it), writing parameter gradients into `grads`.

pub(crate) mod activation;
pub(crate) mod avg_pool;
pub(crate) mod conv2d;
pub(crate) mod dense;
pub(crate) mod dropout;
pub(crate) mod max_pool;

use ndarray::{Array2, ArrayView2};

use crate::scalar::Scalar;
use crate::spec::{Layer, Shape};

/// What a layer needs besides its data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx {
    pub input: Shape,
    pub output: Shape,
    /// Position of the layer in the model (dropout masks differ per layer).
    pub index: usize,
    /// The batch's seed while training; `None` when evaluating (dropout is then off).
    pub seed: Option<u64>,
    /// The first row's place in the whole batch (a part of it: `Part`), where its dropout
    /// masks start among the batch's draws.
    pub row0: usize,
}

pub(crate) fn forward<T: Scalar>(
    layer: &Layer,
    ctx: &Ctx,
    params: &[T],
    x: ArrayView2<'_, T>,
) -> Array2<T> {
    match *layer {
        Layer::Dense { .. } => dense::forward(ctx, params, x),
        Layer::Conv2d {
            kernel,
            stride,
            padding,
            ..
        } => conv2d::forward(
            ctx,
            conv2d::Geometry::new(kernel, stride, padding),
            params,
            x,
        ),
        Layer::MaxPool { size, stride } => max_pool::forward(ctx, size, stride, x),
        Layer::AvgPool { size, stride } => avg_pool::forward(ctx, size, stride, x),
        Layer::Flatten => x.to_owned(),
        Layer::Relu => x.mapv(activation::relu),
        Layer::Tanh => x.mapv(T::tanh_portable),
        Layer::Gelu => x.mapv(activation::gelu),
        Layer::Dropout { p } => dropout::forward(ctx, p, x),
    }
}

/// `grads` is `Some` (the layer's slice of the gradient vector) for a trained layer with
/// parameters; `need_dx` is false for the first layer, whose input is the data.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Scalar>(
    layer: &Layer,
    ctx: &Ctx,
    params: &[T],
    x: ArrayView2<'_, T>,
    y: ArrayView2<'_, T>,
    dy: Array2<T>,
    grads: Option<&mut [T]>,
    need_dx: bool,
) -> Option<Array2<T>> {
    match *layer {
        Layer::Dense { .. } => dense::backward(ctx, params, x, dy.view(), grads, need_dx),
        Layer::Conv2d {
            kernel,
            stride,
            padding,
            ..
        } => conv2d::backward(
            ctx,
            conv2d::Geometry::new(kernel, stride, padding),
            params,
            x,
            dy.view(),
            grads,
            need_dx,
        ),
        _ if !need_dx => None,
        Layer::MaxPool { size, stride } => Some(max_pool::backward(ctx, size, stride, x, dy)),
        Layer::AvgPool { size, stride } => Some(avg_pool::backward(ctx, size, stride, dy)),
        Layer::Flatten => Some(dy),
        Layer::Relu => Some(activation::backward(dy, x, activation::relu_slope)),
        Layer::Tanh => Some(activation::backward(dy, y, |t: T| T::one() - t * t)),
        Layer::Gelu => Some(activation::backward(dy, x, activation::gelu_slope)),
        Layer::Dropout { p } => Some(dropout::backward(ctx, p, dy)),
    }
}

/// The value at `(c, y, x)` of one sample's channel-major row.
#[inline]
pub(crate) fn at(shape: Shape, c: usize, y: usize, x: usize) -> usize {
    (c * shape.h + y) * shape.w + x
}

/// For every output of a per-channel pool with windows every `stride`: its index in a
/// sample's output row, and the index of its window's top-left value in the input row.
pub(crate) fn windows(ctx: &Ctx, stride: usize, mut f: impl FnMut(usize, usize)) {
    let (inp, out) = (ctx.input, ctx.output);
    for c in 0..out.c {
        for oy in 0..out.h {
            for ox in 0..out.w {
                f(at(out, c, oy, ox), at(inp, c, oy * stride, ox * stride));
            }
        }
    }
}

/// The input indices of the `size × size` window whose top-left value is at `corner`, row by row.
pub(crate) fn window(input: Shape, size: usize, corner: usize) -> impl Iterator<Item = usize> {
    (0..size).flat_map(move |ky| (0..size).map(move |kx| corner + ky * input.w + kx))
}

//! Max-pooling over `size × size` windows every `stride`, per channel. Backward routes each
//! output's gradient to the first maximum of its window.

use ndarray::{Array2, ArrayView2};

use super::{at, Ctx};
use crate::scalar::Scalar;

/// Index (within the sample's row) of the first maximum of window `(c, oy, ox)`.
fn argmax<T: Scalar>(
    ctx: &Ctx,
    row: &[T],
    size: usize,
    stride: usize,
    c: usize,
    oy: usize,
    ox: usize,
) -> usize {
    let mut best = at(ctx.input, c, oy * stride, ox * stride);
    for ky in 0..size {
        for kx in 0..size {
            let i = at(ctx.input, c, oy * stride + ky, ox * stride + kx);
            if row[i] > row[best] {
                best = i;
            }
        }
    }
    best
}

pub(crate) fn forward<T: Scalar>(
    ctx: &Ctx,
    size: usize,
    stride: usize,
    x: ArrayView2<'_, T>,
) -> Array2<T> {
    let out = ctx.output;
    let mut y = Array2::zeros((x.nrows(), out.len()));
    for (row, mut y_row) in x.rows().into_iter().zip(y.rows_mut()) {
        let row = row.to_slice().expect("activations are contiguous rows");
        for c in 0..out.c {
            for oy in 0..out.h {
                for ox in 0..out.w {
                    y_row[at(out, c, oy, ox)] = row[argmax(ctx, row, size, stride, c, oy, ox)];
                }
            }
        }
    }
    y
}

pub(crate) fn backward<T: Scalar>(
    ctx: &Ctx,
    size: usize,
    stride: usize,
    x: ArrayView2<'_, T>,
    dy: Array2<T>,
) -> Array2<T> {
    let out = ctx.output;
    let mut dx = Array2::zeros((x.nrows(), ctx.input.len()));
    for ((row, dy_row), mut dx_row) in x.rows().into_iter().zip(dy.rows()).zip(dx.rows_mut()) {
        let row = row.to_slice().expect("activations are contiguous rows");
        for c in 0..out.c {
            for oy in 0..out.h {
                for ox in 0..out.w {
                    dx_row[argmax(ctx, row, size, stride, c, oy, ox)] += dy_row[at(out, c, oy, ox)];
                }
            }
        }
    }
    dx
}

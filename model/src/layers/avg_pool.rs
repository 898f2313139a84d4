//! Average-pooling over `size × size` windows every `stride`, per channel.

use ndarray::{Array2, ArrayView2};

use super::{at, Ctx};
use crate::scalar::Scalar;

pub(crate) fn forward<T: Scalar>(
    ctx: &Ctx,
    size: usize,
    stride: usize,
    x: ArrayView2<'_, T>,
) -> Array2<T> {
    let (inp, out) = (ctx.input, ctx.output);
    let area = T::from_usize(size * size).unwrap_or_else(T::one);
    let mut y = Array2::zeros((x.nrows(), out.len()));
    for (row, mut y_row) in x.rows().into_iter().zip(y.rows_mut()) {
        for c in 0..out.c {
            for oy in 0..out.h {
                for ox in 0..out.w {
                    let mut sum = T::zero();
                    for ky in 0..size {
                        for kx in 0..size {
                            sum += row[at(inp, c, oy * stride + ky, ox * stride + kx)];
                        }
                    }
                    y_row[at(out, c, oy, ox)] = sum / area;
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
    dy: Array2<T>,
) -> Array2<T> {
    let (inp, out) = (ctx.input, ctx.output);
    let area = T::from_usize(size * size).unwrap_or_else(T::one);
    let mut dx = Array2::zeros((dy.nrows(), inp.len()));
    for (dy_row, mut dx_row) in dy.rows().into_iter().zip(dx.rows_mut()) {
        for c in 0..out.c {
            for oy in 0..out.h {
                for ox in 0..out.w {
                    let share = dy_row[at(out, c, oy, ox)] / area;
                    for ky in 0..size {
                        for kx in 0..size {
                            dx_row[at(inp, c, oy * stride + ky, ox * stride + kx)] += share;
                        }
                    }
                }
            }
        }
    }
    dx
}

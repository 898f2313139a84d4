//! Average-pooling over `size × size` windows every `stride`, per channel.

use ndarray::{Array2, ArrayView2};

use super::{window, windows, Ctx};
use crate::scalar::Scalar;

pub(crate) fn forward<T: Scalar>(
    ctx: &Ctx,
    size: usize,
    stride: usize,
    x: ArrayView2<'_, T>,
) -> Array2<T> {
    let area = T::from_usize(size * size).unwrap_or_else(T::one);
    let mut y = Array2::zeros((x.nrows(), ctx.output.len()));
    for (row, mut y_row) in x.rows().into_iter().zip(y.rows_mut()) {
        windows(ctx, stride, |out, corner| {
            let sum = window(ctx.input, size, corner).fold(T::zero(), |s, i| s + row[i]);
            y_row[out] = sum / area;
        });
    }
    y
}

pub(crate) fn backward<T: Scalar>(
    ctx: &Ctx,
    size: usize,
    stride: usize,
    dy: Array2<T>,
) -> Array2<T> {
    let area = T::from_usize(size * size).unwrap_or_else(T::one);
    let mut dx = Array2::zeros((dy.nrows(), ctx.input.len()));
    for (dy_row, mut dx_row) in dy.rows().into_iter().zip(dx.rows_mut()) {
        windows(ctx, stride, |out, corner| {
            let share = dy_row[out] / area;
            window(ctx.input, size, corner).for_each(|i| dx_row[i] += share);
        });
    }
    dx
}

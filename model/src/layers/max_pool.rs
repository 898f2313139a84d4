//! Max-pooling over `size × size` windows every `stride`, per channel. Backward routes each
//! output's gradient to the first maximum of its window.

use ndarray::{Array2, ArrayView2};

use super::{window, windows, Ctx};
use crate::scalar::Scalar;

/// Index (within the sample's row) of the first maximum of the window at `corner`.
fn argmax<T: Scalar>(ctx: &Ctx, row: &[T], size: usize, corner: usize) -> usize {
    window(ctx.input, size, corner)
        .fold(corner, |best, i| if row[i] > row[best] { i } else { best })
}

pub(crate) fn forward<T: Scalar>(
    ctx: &Ctx,
    size: usize,
    stride: usize,
    x: ArrayView2<'_, T>,
) -> Array2<T> {
    let mut y = Array2::zeros((x.nrows(), ctx.output.len()));
    for (row, mut y_row) in x.rows().into_iter().zip(y.rows_mut()) {
        let row = row.to_slice().expect("activations are contiguous rows");
        windows(ctx, stride, |out, corner| {
            y_row[out] = row[argmax(ctx, row, size, corner)]
        });
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
    let mut dx = Array2::zeros((x.nrows(), ctx.input.len()));
    for ((row, dy_row), mut dx_row) in x.rows().into_iter().zip(dy.rows()).zip(dx.rows_mut()) {
        let row = row.to_slice().expect("activations are contiguous rows");
        windows(ctx, stride, |out, corner| {
            dx_row[argmax(ctx, row, size, corner)] += dy_row[out];
        });
    }
    dx
}

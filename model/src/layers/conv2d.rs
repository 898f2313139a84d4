//! 2-D convolution by im2col: each output position's receptive field becomes one column of
//! a `[C·k·k, batch·positions]` matrix, so the layer is one matrix product on the same
//! `matrixmultiply` path as the dense layers. Weights `[filters, C, k, k]` (PyTorch's
//! order), then bias `[filters]`.

use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis};

use super::Ctx;
use crate::scalar::Scalar;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    kernel: usize,
    stride: usize,
    padding: usize,
}

impl Geometry {
    pub(crate) fn new(kernel: usize, stride: usize, padding: usize) -> Self {
        Self {
            kernel,
            stride,
            padding,
        }
    }

    /// For output coordinate `o` and kernel offset `k`, the input coordinate, if inside.
    #[inline]
    fn source(&self, o: usize, k: usize, size: usize) -> Option<usize> {
        (o * self.stride + k)
            .checked_sub(self.padding)
            .filter(|&i| i < size)
    }

    /// Calls `f(cols_index, x_index)` for every in-bounds element of the im2col matrix
    /// (`[C·k·k, n·positions]`, row-major) and where it comes from in `x` (`[n, C·H·W]`),
    /// in the matrix's memory order.
    fn walk(&self, ctx: &Ctx, n: usize, mut f: impl FnMut(usize, usize)) {
        let (inp, out, k) = (ctx.input, ctx.output, self.kernel);
        let (positions, sample) = (out.h * out.w, inp.len());
        for c in 0..inp.c {
            for ky in 0..k {
                for kx in 0..k {
                    let row = ((c * k + ky) * k + kx) * n * positions;
                    for s in 0..n {
                        let col = row + s * positions;
                        for oy in 0..out.h {
                            let Some(iy) = self.source(oy, ky, inp.h) else {
                                continue;
                            };
                            let base = s * sample + (c * inp.h + iy) * inp.w;
                            for ox in 0..out.w {
                                if let Some(ix) = self.source(ox, kx, inp.w) {
                                    f(col + oy * out.w + ox, base + ix);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn fan_in(&self, ctx: &Ctx) -> usize {
        ctx.input.c * self.kernel * self.kernel
    }

    fn im2col<T: Scalar>(&self, ctx: &Ctx, x: &[T], n: usize) -> Array2<T> {
        let positions = ctx.output.h * ctx.output.w;
        let mut cols = vec![T::zero(); self.fan_in(ctx) * n * positions];
        self.walk(ctx, n, |to, from| cols[to] = x[from]);
        Array2::from_shape_vec((self.fan_in(ctx), n * positions), cols).expect("sized above")
    }

    fn split<'a, T>(&self, ctx: &Ctx, params: &'a [T]) -> (ArrayView2<'a, T>, ArrayView1<'a, T>) {
        let (filters, fan_in) = (ctx.output.c, self.fan_in(ctx));
        let (w, b) = params.split_at(filters * fan_in);
        (
            ArrayView2::from_shape((filters, fan_in), w).expect("layout matches the layer"),
            ArrayView1::from(&b[..filters]),
        )
    }
}

fn contiguous<T: Scalar>(x: ArrayView2<'_, T>) -> std::borrow::Cow<'_, [T]> {
    match x.to_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(x.iter().copied().collect()),
    }
}

pub(crate) fn forward<T: Scalar>(
    ctx: &Ctx,
    g: Geometry,
    params: &[T],
    x: ArrayView2<'_, T>,
) -> Array2<T> {
    let n = x.nrows();
    let (filters, positions) = (ctx.output.c, ctx.output.h * ctx.output.w);
    let cols = g.im2col(ctx, &contiguous(x), n);
    let (w, b) = g.split(ctx, params);
    // [filters, n·positions], then reordered to one row per sample.
    let mut z = Array2::zeros((filters, n * positions));
    general_mat_mul(T::one(), &w, &cols, T::zero(), &mut z);
    let mut y = Array2::zeros((n, filters * positions));
    for (f, z_row) in z.axis_iter(Axis(0)).enumerate() {
        for (s, mut y_row) in y.rows_mut().into_iter().enumerate() {
            let from = &z_row.as_slice().expect("row-major")[s * positions..(s + 1) * positions];
            let to =
                &mut y_row.as_slice_mut().expect("row-major")[f * positions..(f + 1) * positions];
            for (t, &v) in to.iter_mut().zip(from) {
                *t = v + b[f];
            }
        }
    }
    y
}

pub(crate) fn backward<T: Scalar>(
    ctx: &Ctx,
    g: Geometry,
    params: &[T],
    x: ArrayView2<'_, T>,
    dy: ArrayView2<'_, T>,
    grads: Option<&mut [T]>,
    need_dx: bool,
) -> Option<Array2<T>> {
    let n = x.nrows();
    let (filters, positions) = (ctx.output.c, ctx.output.h * ctx.output.w);
    // dy as [filters, n·positions], the layout of the forward product.
    let mut dz = Array2::zeros((filters, n * positions));
    for (s, dy_row) in dy.rows().into_iter().enumerate() {
        for f in 0..filters {
            for p in 0..positions {
                dz[(f, s * positions + p)] = dy_row[f * positions + p];
            }
        }
    }
    let (w, _) = g.split(ctx, params);
    if let Some(grads) = grads {
        let cols = g.im2col(ctx, &contiguous(x), n);
        let (w_grad, b_grad) = grads.split_at_mut(filters * g.fan_in(ctx));
        let mut dw = ArrayViewMut2::from_shape((filters, g.fan_in(ctx)), w_grad).expect("layout");
        general_mat_mul(T::one(), &dz, &cols.t(), T::zero(), &mut dw);
        for (f, row) in dz.axis_iter(Axis(0)).enumerate() {
            b_grad[f] = row.sum();
        }
    }
    if !need_dx {
        return None;
    }
    let mut dcols = Array2::zeros((g.fan_in(ctx), n * positions));
    general_mat_mul(T::one(), &w.t(), &dz, T::zero(), &mut dcols);
    let dcols = dcols.as_slice().expect("row-major");
    let mut dx = vec![T::zero(); n * ctx.input.len()];
    g.walk(ctx, n, |from, to| dx[to] += dcols[from]);
    Some(Array2::from_shape_vec((n, ctx.input.len()), dx).expect("sized above"))
}

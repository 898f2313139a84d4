//! 2-D convolution by im2col: each output position's receptive field becomes one column of
//! a `[C·k·k, batch·positions]` matrix, so the layer is one matrix product on the same
//! `matrixmultiply` path as the dense layers. Weights `[filters, C, k, k]` (PyTorch's
//! order), then bias `[filters]`.

use ndarray::{Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis};

use super::Ctx;
use crate::gemm::gemm;
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

    /// The output coordinates `o` whose input coordinate `o·stride + k - padding` lies in
    /// `0..size`, as a range (empty if none).
    #[inline]
    fn valid(&self, k: usize, size: usize, outputs: usize) -> std::ops::Range<usize> {
        let (s, p) = (self.stride, self.padding);
        // o·s + k >= p  and  o·s + k - p < size
        let lo = p.saturating_sub(k).div_ceil(s);
        let hi = (size + p).saturating_sub(k).div_ceil(s).min(outputs);
        lo..hi.max(lo)
    }

    /// Calls `f(cols_run_start, x_start, len)` for every run of the im2col matrix
    /// (`[C·k·k, n·positions]`, row-major) that copies from `x` (`[n, C·H·W]`): `len`
    /// consecutive columns taking every `stride`-th input value of one input row.
    fn runs(&self, ctx: &Ctx, n: usize, mut f: impl FnMut(usize, usize, usize)) {
        let (inp, out, k) = (ctx.input, ctx.output, self.kernel);
        let (positions, sample) = (out.h * out.w, inp.len());
        for c in 0..inp.c {
            for ky in 0..k {
                let rows = self.valid(ky, inp.h, out.h);
                for kx in 0..k {
                    let cols = self.valid(kx, inp.w, out.w);
                    if cols.is_empty() {
                        continue;
                    }
                    let row = ((c * k + ky) * k + kx) * n * positions;
                    for s in 0..n {
                        for oy in rows.clone() {
                            let iy = oy * self.stride + ky - self.padding;
                            let ix = cols.start * self.stride + kx - self.padding;
                            f(
                                row + s * positions + oy * out.w + cols.start,
                                s * sample + (c * inp.h + iy) * inp.w + ix,
                                cols.len(),
                            );
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
        let stride = self.stride;
        self.runs(ctx, n, |to, from, len| {
            let dst = &mut cols[to..to + len];
            if stride == 1 {
                dst.copy_from_slice(&x[from..from + len]);
            } else {
                for (d, v) in dst.iter_mut().zip(x[from..].iter().step_by(stride)) {
                    *d = *v;
                }
            }
        });
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
    gemm(T::one(), &w, &cols, T::zero(), &mut z.view_mut());
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
    let dy = dy.as_standard_layout();
    let dy = dy.as_slice().expect("standard layout");
    let mut dz = vec![T::zero(); filters * n * positions];
    for f in 0..filters {
        for s in 0..n {
            let from = s * filters * positions + f * positions;
            let to = (f * n + s) * positions;
            dz[to..to + positions].copy_from_slice(&dy[from..from + positions]);
        }
    }
    let dz = Array2::from_shape_vec((filters, n * positions), dz).expect("sized above");
    let (w, _) = g.split(ctx, params);
    if let Some(grads) = grads {
        let cols = g.im2col(ctx, &contiguous(x), n);
        let (w_grad, b_grad) = grads.split_at_mut(filters * g.fan_in(ctx));
        let mut dw = ArrayViewMut2::from_shape((filters, g.fan_in(ctx)), w_grad).expect("layout");
        gemm(T::one(), &dz, &cols.t(), T::zero(), &mut dw);
        for (f, row) in dz.axis_iter(Axis(0)).enumerate() {
            b_grad[f] = row.sum();
        }
    }
    if !need_dx {
        return None;
    }
    let mut dcols = Array2::zeros((g.fan_in(ctx), n * positions));
    gemm(T::one(), &w.t(), &dz, T::zero(), &mut dcols.view_mut());
    let dcols = dcols.as_slice().expect("row-major");
    let mut dx = vec![T::zero(); n * ctx.input.len()];
    let stride = g.stride;
    g.runs(ctx, n, |from, to, len| {
        for (i, v) in dcols[from..from + len].iter().enumerate() {
            dx[to + i * stride] += *v;
        }
    });
    Some(Array2::from_shape_vec((n, ctx.input.len()), dx).expect("sized above"))
}

//! Fully connected layer: `y = x · W + b`, `W` of shape `[in, out]` then `b` of `[out]`.

use ndarray::{Array2, ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2, Axis};

use super::Ctx;
use crate::gemm::gemm;
use crate::scalar::Scalar;

fn split<'a, T>(ctx: &Ctx, params: &'a [T]) -> (ArrayView2<'a, T>, ArrayView1<'a, T>) {
    let (n_in, n_out) = (ctx.input.len(), ctx.output.len());
    let (w, b) = params.split_at(n_in * n_out);
    (
        ArrayView2::from_shape((n_in, n_out), w).expect("layout matches the layer"),
        ArrayView1::from(&b[..n_out]),
    )
}

pub(crate) fn forward<T: Scalar>(ctx: &Ctx, params: &[T], x: ArrayView2<'_, T>) -> Array2<T> {
    let (w, b) = split(ctx, params);
    let mut z = Array2::zeros((x.nrows(), ctx.output.len()));
    z += &b;
    gemm(T::one(), &x, &w, T::one(), &mut z.view_mut());
    z
}

pub(crate) fn backward<T: Scalar>(
    ctx: &Ctx,
    params: &[T],
    x: ArrayView2<'_, T>,
    dy: ArrayView2<'_, T>,
    grads: Option<&mut [T]>,
    need_dx: bool,
) -> Option<Array2<T>> {
    let (n_in, n_out) = (ctx.input.len(), ctx.output.len());
    if let Some(grads) = grads {
        let (w_grad, b_grad) = grads.split_at_mut(n_in * n_out);
        let mut dw = ArrayViewMut2::from_shape((n_in, n_out), w_grad).expect("layout");
        gemm(T::one(), &x.t(), &dy, T::zero(), &mut dw);
        ArrayViewMut1::from(&mut b_grad[..n_out]).assign(&dy.sum_axis(Axis(0)));
    }
    need_dx.then(|| {
        let w = split(ctx, params).0;
        let mut dx = Array2::zeros((dy.nrows(), n_in));
        gemm(T::one(), &dy, &w.t(), T::zero(), &mut dx.view_mut());
        dx
    })
}

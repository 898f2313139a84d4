//! Dropout: while training, each activation is zeroed with probability `p` and the rest are
//! scaled by `1 / (1 - p)`. The mask comes from the batch's seed and the layer's position,
//! so backward (and a verifier recomputing the gradient) draws exactly the same one.

use ndarray::{Array2, ArrayView2};

use super::Ctx;
use crate::rng::SplitMix64;
use crate::scalar::Scalar;

/// Multiplies `a` (in row-major order) by the layer's mask; identity when evaluating.
fn apply<T: Scalar>(ctx: &Ctx, p: f32, mut a: Array2<T>) -> Array2<T> {
    let Some(seed) = ctx.seed else { return a };
    if p == 0.0 {
        return a;
    }
    let scale = T::one() / (T::one() - T::from_f32(p).unwrap_or_else(T::zero));
    let layer = (ctx.index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut rng = SplitMix64::new(seed ^ layer);
    rng.skip((ctx.row0 * a.ncols()) as u64);
    let p = f64::from(p);
    for v in a.iter_mut() {
        if rng.next_f64() >= p {
            *v *= scale;
        } else {
            *v = T::zero();
        }
    }
    a
}

pub(crate) fn forward<T: Scalar>(ctx: &Ctx, p: f32, x: ArrayView2<'_, T>) -> Array2<T> {
    apply(ctx, p, x.to_owned())
}

pub(crate) fn backward<T: Scalar>(ctx: &Ctx, p: f32, dy: Array2<T>) -> Array2<T> {
    apply(ctx, p, dy)
}

//! Dropout: while training, each activation is zeroed with probability `p` and the rest are
//! scaled by `1 / (1 - p)`. The mask comes from the batch's seed and the layer's position,
//! so backward (and a verifier recomputing the gradient) draws exactly the same one.

use ndarray::{Array2, ArrayView2};

use super::Ctx;
use crate::rng::SplitMix64;
use crate::scalar::Scalar;

/// The draws for `ctx`'s rows, one a value, row-major: whether each is kept.
fn draws(ctx: &Ctx, p: f32, values: usize) -> impl Iterator<Item = bool> {
    let layer = (ctx.index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut rng = SplitMix64::new(ctx.seed.unwrap_or_default() ^ layer);
    rng.skip((ctx.row0 * ctx.output.len()) as u64);
    let p = f64::from(p);
    (0..values).map(move |_| rng.next_f64() >= p)
}

fn scale<T: Scalar>(p: f32) -> T {
    T::one() / (T::one() - T::from_f32(p).unwrap_or_else(T::zero))
}

/// Multiplies `a` (in row-major order) by the layer's mask; identity when evaluating.
fn apply<T: Scalar>(ctx: &Ctx, p: f32, mut a: Array2<T>) -> Array2<T> {
    if ctx.seed.is_none() || p == 0.0 {
        return a;
    }
    let scale = scale::<T>(p);
    let len = a.len();
    for (v, kept) in a.iter_mut().zip(draws(ctx, p, len)) {
        if kept {
            *v *= scale;
        } else {
            *v = T::zero();
        }
    }
    a
}

/// The mask itself for `rows` rows while training: 0 where a value is dropped, the scale
/// where kept (all ones for `p = 0`, as [`apply`] leaves the values alone).
pub(crate) fn mask(ctx: &Ctx, p: f32, rows: usize) -> Vec<f32> {
    let values = rows * ctx.output.len();
    if ctx.seed.is_none() || p == 0.0 {
        return vec![1.0; values];
    }
    let scale = scale::<f32>(p);
    draws(ctx, p, values)
        .map(|kept| if kept { scale } else { 0.0 })
        .collect()
}

pub(crate) fn forward<T: Scalar>(ctx: &Ctx, p: f32, x: ArrayView2<'_, T>) -> Array2<T> {
    apply(ctx, p, x.to_owned())
}

pub(crate) fn backward<T: Scalar>(ctx: &Ctx, p: f32, dy: Array2<T>) -> Array2<T> {
    apply(ctx, p, dy)
}

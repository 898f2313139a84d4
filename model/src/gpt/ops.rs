//! The GPT's operations that the chain layers lack, forward and backward, each in one fixed
//! float order built from the portable functions (`exp` from `libm`, `sqrt` rounded
//! correctly everywhere), so a tab's wasm computes what the coordinator computes.

use ndarray::{s, Array2, ArrayView1, ArrayView2, ArrayViewMut2};

use crate::gemm::gemm;
use crate::scalar::Scalar;

fn constant<T: Scalar>(v: f64) -> T {
    T::from_f64(v).expect("a constant every float type holds")
}

/// `x · w + b`, `w` of shape `[in, out]` (GPT-2's `Conv1D`).
pub(crate) fn linear<T: Scalar>(
    x: ArrayView2<'_, T>,
    w: ArrayView2<'_, T>,
    b: ArrayView1<'_, T>,
) -> Array2<T> {
    let mut z = Array2::zeros((x.nrows(), w.ncols()));
    z += &b;
    gemm(T::one(), &x, &w, T::one(), &mut z.view_mut());
    z
}

/// The backward of [`linear`]: writes `dw = xᵀ · dy` and `db = Σ dy` (overwriting them) and
/// returns `dx = dy · wᵀ`.
pub(crate) fn linear_backward<T: Scalar>(
    x: ArrayView2<'_, T>,
    w: ArrayView2<'_, T>,
    dy: ArrayView2<'_, T>,
    dw: &mut [T],
    db: &mut [T],
) -> Array2<T> {
    let mut dw = ArrayViewMut2::from_shape(w.dim(), dw).expect("layout matches the weight");
    gemm(T::one(), &x.t(), &dy, T::zero(), &mut dw);
    column_sums(dy, db);
    let mut dx = Array2::zeros((dy.nrows(), w.nrows()));
    gemm(T::one(), &dy, &w.t(), T::zero(), &mut dx.view_mut());
    dx
}

/// `out[j] = Σ_i m[i, j]`, rows in order.
pub(crate) fn column_sums<T: Scalar>(m: ArrayView2<'_, T>, out: &mut [T]) {
    out.fill(T::zero());
    for row in m.rows() {
        for (o, &v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}

/// LayerNorm of each row: `(x − mean) / sqrt(var + eps) · g + b` (the biased variance, as
/// PyTorch). Returns the output and each row's mean and `1 / sqrt(var + eps)`.
pub(crate) fn layer_norm<T: Scalar>(
    x: ArrayView2<'_, T>,
    g: &[T],
    b: &[T],
) -> (Array2<T>, Vec<(T, T)>) {
    let c = x.ncols();
    let inv_c = T::one() / T::from_usize(c).expect("a width");
    let eps = constant::<T>(super::LN_EPS);
    let mut y = Array2::zeros(x.dim());
    let mut stats = Vec::with_capacity(x.nrows());
    for (row, mut out) in x.rows().into_iter().zip(y.rows_mut()) {
        let mean = row.iter().fold(T::zero(), |s, &v| s + v) * inv_c;
        let var = row
            .iter()
            .fold(T::zero(), |s, &v| s + (v - mean) * (v - mean))
            * inv_c;
        let rstd = T::one() / (var + eps).sqrt();
        for (((o, &v), &g), &b) in out.iter_mut().zip(row).zip(g).zip(b) {
            *o = (v - mean) * rstd * g + b;
        }
        stats.push((mean, rstd));
    }
    (y, stats)
}

/// The backward of [`layer_norm`] at its input `x`: writes `dg` and `db` (overwriting them)
/// and returns `dx = rstd · (dŷ − mean(dŷ) − x̂ · mean(dŷ · x̂))`, `dŷ = dy · g`.
pub(crate) fn layer_norm_backward<T: Scalar>(
    x: ArrayView2<'_, T>,
    stats: &[(T, T)],
    g: &[T],
    dy: ArrayView2<'_, T>,
    dg: &mut [T],
    db: &mut [T],
) -> Array2<T> {
    let c = x.ncols();
    let inv_c = T::one() / T::from_usize(c).expect("a width");
    dg.fill(T::zero());
    db.fill(T::zero());
    let mut dx = Array2::zeros(x.dim());
    let mut xhat = vec![T::zero(); c];
    let mut dxhat = vec![T::zero(); c];
    for (((row, dy), mut out), &(mean, rstd)) in x
        .rows()
        .into_iter()
        .zip(dy.rows())
        .zip(dx.rows_mut())
        .zip(stats)
    {
        let (mut sum_d, mut sum_dx) = (T::zero(), T::zero());
        for j in 0..c {
            xhat[j] = (row[j] - mean) * rstd;
            dxhat[j] = dy[j] * g[j];
            dg[j] += dy[j] * xhat[j];
            db[j] += dy[j];
            sum_d += dxhat[j];
            sum_dx += dxhat[j] * xhat[j];
        }
        let (mean_d, mean_dx) = (sum_d * inv_c, sum_dx * inv_c);
        for j in 0..c {
            out[j] = (dxhat[j] - mean_d - xhat[j] * mean_dx) * rstd;
        }
    }
    dx
}

/// `tanh(u)` as `1 − 2 / (exp(2u) + 1)`: one portable `exp` (the same on every platform, so
/// still bit for bit between wasm and native) where `libm`'s `tanhf` costs an `expm1f` and
/// more. Measured (`bench --bin gpt`, perf): GELU's `tanhf` took 32 % of a GPT's forward and
/// backward. Within 2 ulp of `tanh` near ±1 and 1e-7 absolute near 0, which GELU's
/// `x/2 · (1 + t)` reads as an absolute error. Saturates without NaN: `exp` overflows to
/// infinity for `u` above 44, and `2 / ∞` is 0.
fn tanh_by_exp<T: Scalar>(u: T) -> T {
    let two = constant::<T>(2.0);
    T::one() - two / ((two * u).exp_portable() + T::one())
}

/// GPT-2's GELU (`gelu_new`): `x/2 · (1 + tanh(sqrt(2/π) · (x + 0.044715 x³)))`.
#[cfg(test)]
pub(crate) fn gelu<T: Scalar>(x: T) -> T {
    gelu_from(x, gelu_tanh(x))
}

/// GELU's `tanh(sqrt(2/π) · (x + 0.044715 x³))`: the one `exp` of its forward, kept by the
/// pass so that the backward computes no other (it was half of GELU's cost).
pub(crate) fn gelu_tanh<T: Scalar>(x: T) -> T {
    let (k, a) = (
        constant::<T>(0.797_884_560_802_865_4),
        constant::<T>(0.044_715),
    );
    tanh_by_exp(k * (x + a * x * x * x))
}

/// GELU of `x` from its [`gelu_tanh`] `t`: `x/2 · (1 + t)`.
pub(crate) fn gelu_from<T: Scalar>(x: T, t: T) -> T {
    constant::<T>(0.5) * x * (T::one() + t)
}

/// Its derivative: `(1 + t)/2 + x/2 · (1 − t²) · sqrt(2/π) · (1 + 3 · 0.044715 x²)`.
#[cfg(test)]
pub(crate) fn gelu_slope<T: Scalar>(x: T) -> T {
    gelu_slope_from(x, gelu_tanh(x))
}

/// The derivative at `x` from its [`gelu_tanh`] `t`.
pub(crate) fn gelu_slope_from<T: Scalar>(x: T, t: T) -> T {
    let (k, a) = (
        constant::<T>(0.797_884_560_802_865_4),
        constant::<T>(0.044_715),
    );
    let (half, three) = (constant::<T>(0.5), constant::<T>(3.0));
    half * (T::one() + t) + half * x * (T::one() - t * t) * k * (T::one() + three * a * x * x)
}

/// Causal self-attention of `samples` windows of `context` rows each: `qkv` holds each row's
/// query, key and value (`[n, 3·width]`, heads side by side in each). Returns the heads'
/// outputs side by side (`[n, width]`) and every head's attention weights
/// (`[samples · heads · context, context]`, zero above the diagonal).
pub(crate) fn attention<T: Scalar>(
    qkv: ArrayView2<'_, T>,
    context: usize,
    heads: usize,
) -> (Array2<T>, Array2<T>) {
    let (n, width) = (qkv.nrows(), qkv.ncols() / 3);
    let hs = width / heads;
    let samples = n / context;
    let scale = T::one() / T::from_usize(hs).expect("a head size").sqrt();
    let mut y = Array2::zeros((n, width));
    let mut att = Array2::zeros((samples * heads * context, context));
    for b in 0..samples {
        let rows = b * context..(b + 1) * context;
        for h in 0..heads {
            let q = qkv.slice(s![rows.clone(), h * hs..(h + 1) * hs]);
            let k = qkv.slice(s![rows.clone(), width + h * hs..width + (h + 1) * hs]);
            let v = qkv.slice(s![
                rows.clone(),
                2 * width + h * hs..2 * width + (h + 1) * hs
            ]);
            let at = (b * heads + h) * context;
            let mut a = att.slice_mut(s![at..at + context, ..]);
            gemm(scale, &q, &k.t(), T::zero(), &mut a);
            for (i, mut row) in a.rows_mut().into_iter().enumerate() {
                let max = row
                    .iter()
                    .take(i + 1)
                    .fold(T::neg_infinity(), |m, &v| m.max(v));
                // The exponentials in a loop of their own, which vectorises, then their sum
                // in order.
                let mut sum = T::zero();
                let seen = &mut row.as_slice_mut().expect("att's rows are contiguous")[..i + 1];
                for v in seen.iter_mut() {
                    *v = (*v - max).exp_portable();
                }
                for &v in seen.iter() {
                    sum += v;
                }
                let inv = T::one() / sum;
                for (j, v) in row.iter_mut().enumerate() {
                    *v = if j <= i { *v * inv } else { T::zero() };
                }
            }
            let mut out = y.slice_mut(s![rows.clone(), h * hs..(h + 1) * hs]);
            gemm(T::one(), &a.view(), &v, T::zero(), &mut out);
        }
    }
    (y, att)
}

/// The backward of [`attention`]: `dqkv` from the outputs' gradient `dy`.
pub(crate) fn attention_backward<T: Scalar>(
    qkv: ArrayView2<'_, T>,
    att: ArrayView2<'_, T>,
    dy: ArrayView2<'_, T>,
    context: usize,
    heads: usize,
) -> Array2<T> {
    let (n, width) = (qkv.nrows(), qkv.ncols() / 3);
    let hs = width / heads;
    let samples = n / context;
    let scale = T::one() / T::from_usize(hs).expect("a head size").sqrt();
    let mut dqkv = Array2::zeros(qkv.dim());
    let mut datt = Array2::zeros((context, context));
    for b in 0..samples {
        let rows = b * context..(b + 1) * context;
        for h in 0..heads {
            let cols = |part: usize| part * width + h * hs..part * width + (h + 1) * hs;
            let q = qkv.slice(s![rows.clone(), cols(0)]);
            let k = qkv.slice(s![rows.clone(), cols(1)]);
            let v = qkv.slice(s![rows.clone(), cols(2)]);
            let dy = dy.slice(s![rows.clone(), h * hs..(h + 1) * hs]);
            let at = (b * heads + h) * context;
            let a = att.slice(s![at..at + context, ..]);
            gemm(T::one(), &dy, &v.t(), T::zero(), &mut datt.view_mut());
            gemm(
                T::one(),
                &a.t(),
                &dy,
                T::zero(),
                &mut dqkv.slice_mut(s![rows.clone(), cols(2)]),
            );
            // Softmax's backward, row by row: ds = a · (da − Σ a · da), scaled as the scores were.
            for (i, (mut d, a)) in datt.rows_mut().into_iter().zip(a.rows()).enumerate() {
                let dot = (0..=i).fold(T::zero(), |s, j| s + a[j] * d[j]);
                for j in 0..context {
                    d[j] = if j <= i {
                        a[j] * (d[j] - dot) * scale
                    } else {
                        T::zero()
                    };
                }
            }
            gemm(
                T::one(),
                &datt.view(),
                &k,
                T::zero(),
                &mut dqkv.slice_mut(s![rows.clone(), cols(0)]),
            );
            gemm(
                T::one(),
                &datt.t(),
                &q,
                T::zero(),
                &mut dqkv.slice_mut(s![rows.clone(), cols(1)]),
            );
        }
    }
    dqkv
}

/// Cross-entropy of each row of `logits` against its target, summed; with `scale`, each
/// row's gradient `(softmax − onehot) · scale` in place of the logits. Targets are checked
/// by the caller.
pub(crate) fn cross_entropy<T: Scalar>(
    logits: &mut Array2<T>,
    targets: &[usize],
    scale: Option<T>,
) -> T {
    let mut total = T::zero();
    for (mut row, &t) in logits.rows_mut().into_iter().zip(targets) {
        let max = row.fold(T::neg_infinity(), |m, &v| m.max(v));
        let shifted = row[t] - max;
        let sum = row
            .iter()
            .fold(T::zero(), |s, &v| s + (v - max).exp_portable());
        total += sum.ln_portable() - shifted;
        if let Some(scale) = scale {
            row.mapv_inplace(|v| (v - max).exp_portable() / sum * scale);
            row[t] -= scale;
        }
    }
    total
}

#[cfg(test)]
mod tests;

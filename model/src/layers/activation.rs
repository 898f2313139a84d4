//! Element-wise activations: ReLU, tanh (its forward is `Scalar::tanh_portable`) and GELU.

use ndarray::{Array2, ArrayView2, Zip};

use crate::scalar::Scalar;

pub(crate) fn relu<T: Scalar>(v: T) -> T {
    if v > T::zero() {
        v
    } else {
        T::zero()
    }
}

/// ReLU's derivative at its input `v` (0 at and below zero).
pub(crate) fn relu_slope<T: Scalar>(v: T) -> T {
    if v > T::zero() {
        T::one()
    } else {
        T::zero()
    }
}

fn half<T: Scalar>() -> T {
    T::from_f64(0.5).unwrap_or_else(T::one)
}

fn sqrt_half<T: Scalar>() -> T {
    T::from_f64(std::f64::consts::FRAC_1_SQRT_2).unwrap_or_else(T::one)
}

/// Exact GELU, `x · Φ(x)` with `Φ(x) = (1 + erf(x / √2)) / 2`.
pub(crate) fn gelu<T: Scalar>(v: T) -> T {
    v * half::<T>() * (T::one() + (v * sqrt_half::<T>()).erf_portable())
}

/// `Φ(x) + x · φ(x)`.
pub(crate) fn gelu_slope<T: Scalar>(v: T) -> T {
    let inv_sqrt_2pi = T::from_f64(0.398_942_280_401_432_7).unwrap_or_else(T::one);
    let cdf = half::<T>() * (T::one() + (v * sqrt_half::<T>()).erf_portable());
    let pdf = inv_sqrt_2pi * (-(v * v) * half::<T>()).exp_portable();
    cdf + v * pdf
}

/// `dy · slope(at)`, where `at` is the layer's input or output as `slope` expects. A zero
/// slope gives an exact zero (ReLU's gradient is masked, not multiplied by 0).
pub(crate) fn backward<T: Scalar>(
    mut dy: Array2<T>,
    at: ArrayView2<'_, T>,
    slope: impl Fn(T) -> T,
) -> Array2<T> {
    Zip::from(&mut dy).and(&at).for_each(|d, &a| {
        let s = slope(a);
        if s == T::zero() {
            *d = T::zero();
        } else if s != T::one() {
            *d *= s;
        }
    });
    dy
}

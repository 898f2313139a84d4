//! The float types the maths is generic over: `f32` in production, `f64` for the gradient
//! check, which needs the extra precision for central differences to be meaningful.

use ndarray::{LinalgScalar, ScalarOperand};
use num_traits::{Float, FromPrimitive, NumAssign};

pub trait Scalar:
    Float
    + FromPrimitive
    + NumAssign
    + LinalgScalar
    + ScalarOperand
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// `e^x` that every target rounds identically (the platform's `exp` differs in the last
    /// bit between glibc and wasm32): for `f32` plain arithmetic that vectorises
    /// (`crate::exp`), for `f64` the pure-Rust `libm`.
    fn exp_portable(self) -> Self;
    /// Natural logarithm from `libm`, for the same reason.
    fn ln_portable(self) -> Self;
    /// Hyperbolic tangent from `libm`.
    fn tanh_portable(self) -> Self;
    /// The error function from `libm` (for GELU).
    fn erf_portable(self) -> Self;
}

impl Scalar for f32 {
    // Inlined, so that a loop of it vectorises.
    #[inline(always)]
    fn exp_portable(self) -> Self {
        crate::exp::expf(self)
    }
    fn ln_portable(self) -> Self {
        libm::logf(self)
    }
    fn tanh_portable(self) -> Self {
        libm::tanhf(self)
    }
    fn erf_portable(self) -> Self {
        libm::erff(self)
    }
}

impl Scalar for f64 {
    fn exp_portable(self) -> Self {
        libm::exp(self)
    }
    fn ln_portable(self) -> Self {
        libm::log(self)
    }
    fn tanh_portable(self) -> Self {
        libm::tanh(self)
    }
    fn erf_portable(self) -> Self {
        libm::erf(self)
    }
}

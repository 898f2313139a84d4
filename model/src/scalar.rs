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
}

impl Scalar for f32 {}
impl Scalar for f64 {}

//! A multi-layer perceptron with ReLU hidden layers and a linear output layer, trained with
//! softmax cross-entropy. Forward and backward are written out on ndarray.
//!
//! Parameters, in order, for each layer `l`: `l{l}.weight` with shape `[in, out]` (row-major,
//! so `z = x · W + b`), then `l{l}.bias` with shape `[out]`.

use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2, Axis};

use crate::error::ModelError;
use crate::loss::{cross_entropy_sum_and_correct, softmax_cross_entropy};
use crate::params::ParamLayout;
use crate::rng::SplitMix64;
use crate::scalar::Scalar;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mlp {
    sizes: Vec<usize>,
    layout: ParamLayout,
}

impl Mlp {
    /// `sizes` lists every layer's width, input first, classes last (e.g. `[784, 128, 10]`).
    pub fn new(sizes: &[usize]) -> Result<Self, ModelError> {
        if sizes.len() < 2 {
            return Err(ModelError::TooFewLayers(sizes.len()));
        }
        if let Some(index) = sizes.iter().position(|&w| w == 0) {
            return Err(ModelError::ZeroWidth { index });
        }
        let mut layout = ParamLayout::default();
        for (l, w) in sizes.windows(2).enumerate() {
            layout.push(format!("l{l}.weight"), vec![w[0], w[1]]);
            layout.push(format!("l{l}.bias"), vec![w[1]]);
        }
        Ok(Self {
            sizes: sizes.to_vec(),
            layout,
        })
    }

    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    pub fn param_count(&self) -> usize {
        self.layout.total()
    }

    pub fn inputs(&self) -> usize {
        self.sizes[0]
    }

    pub fn classes(&self) -> usize {
        self.sizes[self.sizes.len() - 1]
    }

    fn layers(&self) -> usize {
        self.sizes.len() - 1
    }

    /// He-uniform weights (`U(±sqrt(6 / fan_in))`, suited to ReLU) and zero biases. The same
    /// seed gives the same weights on every platform.
    pub fn init<T: Scalar>(&self, seed: u64) -> Vec<T> {
        let mut rng = SplitMix64::new(seed);
        let mut params = vec![T::zero(); self.param_count()];
        for l in 0..self.layers() {
            let bound = (6.0 / self.sizes[l] as f64).sqrt();
            let range = self.layout.tensors()[2 * l].range();
            for p in &mut params[range] {
                *p = T::from_f64((rng.next_f64() * 2.0 - 1.0) * bound).unwrap_or_else(T::zero);
            }
        }
        params
    }

    fn check_params<T>(&self, params: &[T]) -> Result<(), ModelError> {
        if params.len() != self.param_count() {
            return Err(ModelError::ShapeMismatch {
                what: "parameters",
                expected: self.param_count(),
                got: params.len(),
            });
        }
        Ok(())
    }

    fn check_input<T>(&self, x: &ArrayView2<'_, T>) -> Result<(), ModelError> {
        if x.ncols() != self.inputs() {
            return Err(ModelError::ShapeMismatch {
                what: "input features",
                expected: self.inputs(),
                got: x.ncols(),
            });
        }
        if x.nrows() == 0 {
            return Err(ModelError::EmptyBatch);
        }
        Ok(())
    }

    fn weight<'a, T: Scalar>(&self, params: &'a [T], l: usize) -> ArrayView2<'a, T> {
        let spec = &self.layout.tensors()[2 * l];
        ArrayView2::from_shape((spec.shape[0], spec.shape[1]), &params[spec.range()])
            .expect("layout shapes match their ranges")
    }

    fn bias<'a, T: Scalar>(&self, params: &'a [T], l: usize) -> ArrayView1<'a, T> {
        ArrayView1::from(&params[self.layout.tensors()[2 * l + 1].range()])
    }

    /// Pre-activations of every layer (the last one is the logits).
    fn forward_all<T: Scalar>(&self, params: &[T], x: ArrayView2<'_, T>) -> Vec<Array2<T>> {
        let mut zs: Vec<Array2<T>> = Vec::with_capacity(self.layers());
        for l in 0..self.layers() {
            let mut z = Array2::zeros((x.nrows(), self.sizes[l + 1]));
            z += &self.bias(params, l);
            match zs.last() {
                None => general_mat_mul(T::one(), &x, &self.weight(params, l), T::one(), &mut z),
                Some(prev) => {
                    let a = prev.mapv(relu);
                    general_mat_mul(T::one(), &a, &self.weight(params, l), T::one(), &mut z)
                }
            }
            zs.push(z);
        }
        zs
    }

    /// Logits for a batch `x` of shape `[n, inputs]`.
    pub fn forward<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
    ) -> Result<Array2<T>, ModelError> {
        self.check_params(params)?;
        self.check_input(&x)?;
        Ok(self
            .forward_all(params, x)
            .pop()
            .expect("at least one layer"))
    }

    /// Mean cross-entropy over the batch and its gradient with respect to every parameter,
    /// flat, in the parameter layout.
    pub fn loss_and_grad<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
    ) -> Result<(T, Vec<T>), ModelError> {
        self.check_params(params)?;
        self.check_input(&x)?;
        let zs = self.forward_all(params, x);
        let (loss, mut dz) = softmax_cross_entropy(zs[self.layers() - 1].view(), labels)?;
        let mut grads = vec![T::zero(); self.param_count()];
        for l in (0..self.layers()).rev() {
            let (w_spec, b_spec) = (
                &self.layout.tensors()[2 * l],
                &self.layout.tensors()[2 * l + 1],
            );
            let (w_grad, b_grad) = grads[w_spec.offset..].split_at_mut(w_spec.len());
            let mut dw = ArrayViewMut2::from_shape((w_spec.shape[0], w_spec.shape[1]), w_grad)
                .expect("layout shapes match their ranges");
            let mut db = ArrayViewMut1::from(&mut b_grad[..b_spec.len()]);
            db.assign(&dz.sum_axis(Axis(0)));
            if l == 0 {
                general_mat_mul(T::one(), &x.t(), &dz, T::zero(), &mut dw);
            } else {
                let a = zs[l - 1].mapv(relu);
                general_mat_mul(T::one(), &a.t(), &dz, T::zero(), &mut dw);
                // Back through W, then through the ReLU of layer l-1.
                let mut da = dz.dot(&self.weight(params, l).t());
                ndarray::Zip::from(&mut da)
                    .and(&zs[l - 1])
                    .for_each(|d, &z| {
                        if z <= T::zero() {
                            *d = T::zero();
                        }
                    });
                dz = da;
            }
        }
        Ok((loss, grads))
    }

    /// Summed cross-entropy and number of correct predictions over a batch.
    pub fn loss_sum_and_correct<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
    ) -> Result<(T, usize), ModelError> {
        let logits = self.forward(params, x)?;
        cross_entropy_sum_and_correct(logits.view(), labels)
    }
}

fn relu<T: Scalar>(v: T) -> T {
    if v > T::zero() {
        v
    } else {
        T::zero()
    }
}

#[cfg(test)]
mod tests;

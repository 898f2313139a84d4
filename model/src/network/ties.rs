//! Near-ties, and how far they can move a gradient: what a verifier allows beyond rounding.
//!
//! Two honest machines compute the same forward pass in a different float order (FMA or
//! not, wasm or native), so their activations differ in the last bits. Where a ReLU's input
//! or the two largest values of a max-pool window are within those bits of each other, they
//! may take different branches, and then the gradient of everything behind that unit
//! differs by far more than rounding. Those are the only places an honest answer may leave
//! the per-value tolerance.
//!
//! [`Network::loss_grad_envelope`] finds the near-ties of the verifier's own forward pass
//! (a margin within [`TIE_MARGIN`] of the row's largest magnitude, exact ties included,
//! but not those every machine computes alike: two pool candidates from one filter over
//! identical patches, such as an image's uniform background, or a ReLU input from an
//! all-zero patch), takes the other branch
//! at each one in turn (one backward pass each, over the same activations: the forward
//! values move by less than the margin), and sums each flip's effect on every parameter,
//! its negative parts into `below` and positive ones into `above`. Any subset of flips
//! (ties in different samples add up exactly; two in one sample interact only at second
//! order) then lies within `gradient + below ..= gradient + above`, value by value. A value
//! an honest worker may send is in that envelope, give or take rounding; one outside it is
//! not explained by any branch.
//!
//! Float order also moves every value without any branch: a gradient is a sum of many
//! products (18,432 of them for each weight of the `cnn` preset's first convolution), and
//! where they cancel, the sum's rounding is large next to the sum. The envelope carries, per
//! parameter, the same sums taken over magnitudes (`magnitude`: the backward pass over
//! `|weights|`, `|activations|` and `|∂loss|`, with the forward pass's own branches): the
//! first-order bound of rounding error is a small multiple of the unit roundoff times that.
//!
//! Cost: nothing unless asked; when asked, a forward pass, `2 +` ties backward passes, at
//! most [`MAX_TIES`] ties (the closest: float order flips only the nearest).

use ndarray::{Array2, ArrayView2};

use super::chain::Chain;
use super::{standard, Network, Part, Pass};
use crate::error::ModelError;
use crate::scalar::Scalar;
use crate::spec::Layer;

/// A near-tie: a margin at most this share of its row's largest magnitude.
pub const TIE_MARGIN: f64 = 2e-5;
/// Near-ties followed at most, the closest first.
pub const MAX_TIES: usize = 256;

/// How far the gradient moves where near-ties take the other branch.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<T> {
    /// Per parameter (full layout), the sum of the flips' negative effects (≤ 0).
    pub below: Vec<T>,
    /// The sum of their positive effects (≥ 0).
    pub above: Vec<T>,
    /// Near-ties followed.
    pub ties: usize,
    /// Near-ties found (more than [`MAX_TIES`]: the farthest were not followed).
    pub found: usize,
    /// Per parameter, the sums behind its gradient taken over magnitudes (≥ |gradient|).
    pub magnitude: Vec<T>,
}

/// One near-tie: the activation array a backward pass reads it from (an index into the
/// forward pass's outputs), its row and column, the value that takes the other branch, and
/// its margin relative to its row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tie<T> {
    pub(super) array: usize,
    pub(super) row: usize,
    pub(super) col: usize,
    /// The branch this pass took: a ReLU's 1 (open) or 0 (closed); a max-pool's winner,
    /// the column `col` lost to.
    pub(super) taken: usize,
    flipped: T,
    /// A ReLU's output too (the next array, same place): what a pool after it sees, so
    /// that an opened ReLU in a window of zeros takes the pool's route, as on the machine
    /// where it is open.
    output: Option<T>,
    pub(super) margin: f64,
}

impl Network {
    /// The gradient of [`Network::loss_and_grad`], and its [`Envelope`] under near-ties.
    pub fn loss_grad_envelope<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
        seed: u64,
    ) -> Result<(Vec<T>, Envelope<T>), ModelError> {
        self.check(params, &x)?;
        let Some(chain) = self.chain() else {
            return Err(ModelError::Unsupported(
                "a gpt's gradient has no rounding envelope: its answers are replayed in order",
            ));
        };
        let x = standard(x);
        let whole = Part::whole(x.nrows());
        let mut outs = chain.forward_all(params, x.view(), Some(seed), whole);
        let (_, grads) =
            chain.backward_all(params, x.view(), &outs, labels, seed, whole, Pass::Gradient)?;
        let mut ties = chain.near_ties(x.view(), &outs);
        let found = ties.len();
        ties.sort_by(|a, b| a.margin.total_cmp(&b.margin));
        ties.truncate(MAX_TIES);
        let mut below = vec![T::zero(); grads.len()];
        let mut above = vec![T::zero(); grads.len()];
        for tie in &ties {
            let at = [tie.row, tie.col];
            let kept = outs[tie.array][at];
            outs[tie.array][at] = tie.flipped;
            let kept_output = tie.output.map(|o| {
                let kept = outs[tie.array + 1][at];
                outs[tie.array + 1][at] = o;
                kept
            });
            let flipped =
                chain.backward_all(params, x.view(), &outs, labels, seed, whole, Pass::Gradient);
            outs[tie.array][at] = kept;
            if let Some(o) = kept_output {
                outs[tie.array + 1][at] = o;
            }
            let (_, other) = flipped?;
            for (((lo, hi), &g), &o) in below.iter_mut().zip(&mut above).zip(&grads).zip(&other) {
                let d = o - g;
                if d < T::zero() {
                    *lo += d;
                } else {
                    *hi += d;
                }
            }
        }
        let (_, magnitude) = chain.backward_all(
            params,
            x.view(),
            &outs,
            labels,
            seed,
            whole,
            Pass::Magnitude,
        )?;
        Ok((
            grads,
            Envelope {
                below,
                above,
                ties: ties.len(),
                found,
                magnitude,
            },
        ))
    }
}

impl Chain {
    /// Every near-tie of a forward pass: ReLU inputs near zero, and max-pool windows whose
    /// two largest values are near each other (not equal: see the module's notes).
    pub(super) fn near_ties<T: Scalar>(
        &self,
        x: ArrayView2<'_, T>,
        outs: &[Array2<T>],
    ) -> Vec<Tie<T>> {
        let mut ties = Vec::new();
        // A branch layer's input is the previous layer's output; the first layer's input
        // is the data, with no trained layer before it to reach.
        for (i, l) in self.layers.iter().enumerate().skip(1) {
            let array = i - 1;
            let input = outs[array].view();
            match l.layer {
                Layer::Relu => {
                    for (row, values) in input.rows().into_iter().enumerate() {
                        let scale = scale(values.iter().copied());
                        for (col, &v) in values.iter().enumerate() {
                            let margin = v.abs().to_f64().unwrap_or(f64::INFINITY) / scale;
                            let exact = margin == 0.0;
                            if margin <= TIE_MARGIN
                                && !(exact && self.same_inputs(x, outs, array, row, col, None))
                            {
                                let (flipped, output) = if v > T::zero() {
                                    (T::zero(), T::zero())
                                } else {
                                    let open = v.abs().max(T::min_positive_value());
                                    (T::min_positive_value(), open)
                                };
                                ties.push(Tie {
                                    array,
                                    row,
                                    col,
                                    taken: usize::from(v > T::zero()),
                                    flipped,
                                    output: Some(output),
                                    margin,
                                });
                            }
                        }
                    }
                }
                Layer::MaxPool { size, stride } => {
                    let ctx = self.ctx(i, None, 0);
                    // Two zeros out of a ReLU: either route ends at a closed ReLU.
                    let after_relu = self.layers[i - 1].layer == Layer::Relu;
                    for (row, values) in input.rows().into_iter().enumerate() {
                        let values = values.to_slice().expect("activations are contiguous");
                        let scale = scale(values.iter().copied());
                        crate::layers::windows(&ctx, stride, |_, corner| {
                            let best = crate::layers::window(ctx.input, size, corner)
                                .fold(corner, |b, i| if values[i] > values[b] { i } else { b });
                            let b = values[best];
                            // Every other candidate near the best (three may be near).
                            for other in crate::layers::window(ctx.input, size, corner) {
                                let v = values[other];
                                if other == best || (after_relu && b == T::zero() && v == T::zero())
                                {
                                    continue;
                                }
                                let margin = (b - v).to_f64().unwrap_or(f64::INFINITY) / scale;
                                let exact = margin == 0.0;
                                if margin <= TIE_MARGIN
                                    && !(exact
                                        && self.same_inputs(x, outs, array, row, best, Some(other)))
                                {
                                    // Just above the best: the pool routes to it instead.
                                    let step = b.abs() * T::epsilon() * (T::one() + T::one());
                                    ties.push(Tie {
                                        array,
                                        row,
                                        col: other,
                                        taken: best,
                                        flipped: b + step.max(T::min_positive_value()),
                                        output: None,
                                        margin,
                                    });
                                }
                            }
                        });
                    }
                }
                _ => {}
            }
        }
        ties
    }

    /// Whether the values at columns `p` and `q` of one row of `outs[array]` come from the
    /// same operations on the same numbers, so that every machine computes them equal
    /// (they stay tied, whatever the float order): through element-wise ReLUs only, from
    /// one convolution filter over two identical patches. With `q = None`: whether `p`
    /// comes from an all-zero patch or input (it is then the bias on every machine). Where
    /// it cannot tell, `false`: the tie is followed.
    fn same_inputs<T: Scalar>(
        &self,
        x: ArrayView2<'_, T>,
        outs: &[Array2<T>],
        array: usize,
        row: usize,
        p: usize,
        q: Option<usize>,
    ) -> bool {
        let mut k = array;
        while k > 0 && self.layers[k].layer == Layer::Relu {
            k -= 1;
        }
        let input = if k == 0 {
            x.row(row)
        } else {
            outs[k - 1].row(row)
        };
        match self.layers[k].layer {
            Layer::Dense { .. } => q.is_none() && input.iter().all(|&v| v == T::zero()),
            Layer::Conv2d {
                kernel,
                stride,
                padding,
                ..
            } => {
                let ctx = self.ctx(k, None, 0);
                let (inp, out) = (ctx.input, ctx.output);
                let plane = out.h * out.w;
                // The patch under output `o`, zeros where it hangs over the padding.
                let patch = |o: usize| {
                    let (oy, ox) = ((o % plane) / out.w, o % out.w);
                    (0..inp.c).flat_map(move |c| {
                        (0..kernel).flat_map(move |ky| {
                            (0..kernel).map(move |kx| {
                                let iy = (oy * stride + ky).checked_sub(padding);
                                let ix = (ox * stride + kx).checked_sub(padding);
                                match (iy, ix) {
                                    (Some(iy), Some(ix)) if iy < inp.h && ix < inp.w => {
                                        input[(c * inp.h + iy) * inp.w + ix]
                                    }
                                    _ => T::zero(),
                                }
                            })
                        })
                    })
                };
                match q {
                    None => patch(p).all(|v| v == T::zero()),
                    Some(q) => p / plane == q / plane && patch(p).eq(patch(q)),
                }
            }
            _ => false,
        }
    }
}

/// A row's largest magnitude (at least the smallest normal, so margins stay finite).
pub(super) fn scale<T: Scalar>(values: impl Iterator<Item = T>) -> f64 {
    values
        .fold(T::zero(), |m, v| m.max(v.abs()))
        .to_f64()
        .unwrap_or(f64::INFINITY)
        .max(f64::from(f32::MIN_POSITIVE))
}

#[cfg(test)]
pub(super) mod tests {
    use ndarray::Array2;

    use super::*;
    use crate::spec::{LayerSpec, NetSpec, Shape};

    /// What a verifier allows one value: rounding, as `coordinator-core` does for f32.
    fn tolerance(g: f32) -> f32 {
        1e-6 + 1e-4 * g.abs()
    }

    /// Every value of `other` within the envelope around `g`, give or take rounding.
    fn explained(g: &[f32], e: &Envelope<f32>, other: &[f32]) -> bool {
        g.iter()
            .zip(other)
            .zip(e.below.iter().zip(&e.above))
            .all(|((&g, &o), (&lo, &hi))| o >= g + lo - tolerance(g) && o <= g + hi + tolerance(g))
    }

    fn differs(g: &[f32], other: &[f32]) -> bool {
        g.iter()
            .zip(other)
            .any(|(&g, &o)| (g - o).abs() > tolerance(g) * 10.0)
    }

    fn layers(layers: Vec<Layer>) -> Vec<LayerSpec> {
        layers
            .into_iter()
            .map(|layer| LayerSpec {
                layer,
                frozen: false,
            })
            .collect()
    }

    /// A hidden unit whose input is 1e-7 from zero on the verifier: the other side of
    /// zero (another machine's float order) gives a gradient far outside rounding, and
    /// inside the envelope; a value changed elsewhere is outside it.
    #[test]
    fn a_relu_near_zero_explains_the_other_branch_and_nothing_else() {
        let spec = NetSpec::mlp(Shape::flat(20), &[8], 3);
        let net = Network::new(spec, 3).expect("model");
        let mut rng = crate::rng::SplitMix64::new(3);
        let x = Array2::from_shape_fn((4, 20), |_| rng.next_f64() as f32 * 2.0 - 1.0);
        let labels = [0u8, 1, 2, 1];
        let mut params: Vec<f32> = net.init(7);
        // Unit 0's bias (after the 20 × 8 weights) moves its input for sample 0 to ~0+.
        let bias = 160;
        let unit_input = |p: &[f32]| {
            net.chain()
                .expect("a chain")
                .forward_all(p, x.view(), Some(1), Part::whole(x.nrows()))[0][[0, 0]]
        };
        params[bias] -= unit_input(&params);
        while unit_input(&params) <= 0.0 {
            params[bias] += 1e-7;
        }
        let z = unit_input(&params);
        assert!(z > 0.0 && z < 1e-6, "{z}");
        let (g, e) = net
            .loss_grad_envelope(&params, x.view(), &labels, 1)
            .expect("grads");
        assert!(e.ties >= 1 && e.found >= e.ties, "{e:?}");
        let (_, plain) = net
            .loss_and_grad(&params, x.view(), &labels, 1)
            .expect("grads");
        assert_eq!(g, plain, "the same gradient as loss_and_grad");
        // The other branch: the same unit just below zero.
        let mut other = params.clone();
        while unit_input(&other) > 0.0 {
            other[bias] -= 1e-7;
        }
        let (_, g2) = net
            .loss_and_grad(&other, x.view(), &labels, 1)
            .expect("grads");
        assert!(differs(&g, &g2), "the branch matters");
        assert!(explained(&g, &e, &g2), "and is explained");
        // A change at a weight into unit 1, which no tie touches, is not.
        let norm = g.iter().map(|v| v * v).sum::<f32>().sqrt();
        let mut cheat = g.clone();
        cheat[1] += 0.01 * norm;
        assert!(!explained(&g, &e, &cheat));
    }

    /// A 1 × 1 convolution adding two channels of 2 × 2 pixels, a 2 × 2 max-pool and a
    /// dense layer of 3; `sample(d)` is an input whose pooled pixels 0 and 1 are 1 and 1 + d.
    pub(in crate::network) fn two_pixel_pool() -> (Network, Vec<f32>, impl Fn(f32) -> Array2<f32>) {
        let spec = NetSpec::Chain(crate::spec::ChainSpec {
            input: Shape::new(2, 2, 2),
            layers: layers(vec![
                Layer::Conv2d {
                    filters: 1,
                    kernel: 1,
                    stride: 1,
                    padding: 0,
                },
                Layer::MaxPool { size: 2, stride: 2 },
                Layer::Flatten,
                Layer::Dense { units: 3 },
            ]),
        });
        let net = Network::new(spec, 3).expect("model");
        let mut params: Vec<f32> = net.init(7);
        params[..3].copy_from_slice(&[1.0, 1.0, 0.0]);
        let sample = |d: f32| {
            // Channel a, then channel b, each 2 × 2.
            Array2::from_shape_vec((1, 8), vec![0.3, 0.7, -1.0, -1.0, 0.7, 0.3 + d, -1.0, -1.0])
                .expect("shape")
        };
        (net, params, sample)
    }

    /// Two pixels of a max-pool window within 1e-6 of each other, reached from different
    /// inputs: routing to the other one moves the convolution's gradient, within the
    /// envelope.
    #[test]
    fn a_max_pool_tie_explains_the_other_route() {
        let (net, params, sample) = two_pixel_pool();
        let (x, labels) = (sample(1e-6), [2u8]);
        let (g, e) = net
            .loss_grad_envelope(&params, x.view(), &labels, 1)
            .expect("grads");
        assert_eq!(e.ties, 1, "{e:?}");
        let (_, g2) = net
            .loss_and_grad(&params, sample(-1e-6).view(), &labels, 1)
            .expect("grads");
        assert!(differs(&g, &g2), "the route matters");
        assert!(explained(&g, &e, &g2));
        // Far from a tie: nothing to explain, no backward pass beyond the first.
        let (_, far) = net
            .loss_grad_envelope(&params, sample(0.1).view(), &labels, 1)
            .expect("grads");
        assert_eq!((far.ties, far.found), (0, 0));
    }

    /// The sums over magnitudes bound the sums: every parameter's magnitude is at least its
    /// gradient's size, and somewhere far more (cancellation), on dense and convolutional
    /// layers alike.
    #[test]
    fn magnitudes_bound_the_gradient() {
        let spec = NetSpec::cnn(Shape::new(1, 28, 28), 10);
        let net = Network::new(spec, 10).expect("model");
        let mut rng = crate::rng::SplitMix64::new(5);
        let x = Array2::from_shape_fn((4, 784), |_| rng.next_f64() as f32);
        let labels = [3u8, 1, 4, 1];
        let params: Vec<f32> = net.init(9);
        let (g, e) = net
            .loss_grad_envelope(&params, x.view(), &labels, 2)
            .expect("grads");
        assert_eq!(e.magnitude.len(), g.len());
        let mut cancelled = 0;
        for (&g, &m) in g.iter().zip(&e.magnitude) {
            assert!(
                m >= 0.0 && m >= g.abs() * (1.0 - 1e-4) - 1e-9,
                "{m} < |{g}|"
            );
            cancelled += usize::from(m > 10.0 * g.abs());
        }
        assert!(cancelled > 0, "some sums cancel");
    }
}

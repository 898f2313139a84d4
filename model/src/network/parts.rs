//! A batch's gradient computed in parts, on several cores, and exactly the same wherever it
//! is computed.
//!
//! A worker with `k` cores splits its batch into `k` parts of consecutive rows
//! ([`Part::split`]), computes each part's share of the batch's mean gradient on its own
//! core ([`Network::part_loss_and_grad`]: the part's sum over the whole batch's size, with
//! the dropout masks the whole batch would draw for those rows), and adds the shares in
//! part order ([`add_parts`]). Every value is then a fixed function of the batch, the weights
//! and the number of parts: which core computed which part, and when, does not move a bit.
//! A worker says how many parts it used with its answer, and the coordinator's verifier
//! recomputes in as many ([`Network::loss_and_grad_parts`]), so a tab's answer computed on
//! four Web Workers is replayed bit for bit, local phases included.
//!
//! One part is [`Network::loss_and_grad`] itself. Parts differ from it only in the order of
//! the sums over samples (each part's sum, then the parts'), by rounding.

use std::ops::Range;

use ndarray::ArrayView2;

use super::{standard, Body, Network, Pass};
use crate::error::ModelError;
use crate::scalar::Scalar;

/// Most parts a batch is split into, and fewest rows a part has (but a batch of fewer): a
/// worker's claim is bounded by both, so a hostile count cannot make the verifier's
/// recomputation fine-grained (a batch of 32 of the `mlp` in its 32 rows costs 7 times the
/// batch at once; in 8 parts of 4 rows, 2.7 times).
pub const MAX_PARTS: usize = 64;
pub const MIN_PART_ROWS: usize = 4;

/// Rows `start..end` of a batch of `batch` samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub start: usize,
    pub end: usize,
    pub batch: usize,
}

impl Part {
    /// The whole batch of `batch` rows, as one part.
    pub fn whole(batch: usize) -> Self {
        Self {
            start: 0,
            end: batch,
            batch,
        }
    }

    /// The most parts a batch of `batch` rows is split into: one a [`MIN_PART_ROWS`] rows,
    /// at least one, at most [`MAX_PARTS`].
    pub fn most(batch: usize) -> usize {
        (batch / MIN_PART_ROWS).clamp(1, MAX_PARTS)
    }

    /// How many parts [`Part::split`] makes of `batch` rows asked for `parts`: between 1
    /// and [`Part::most`].
    pub fn count(batch: usize, parts: usize) -> usize {
        parts.clamp(1, Self::most(batch))
    }

    /// A batch of `batch` rows in [`Part::count`] parts of consecutive rows, as even as can
    /// be (part `i` starts at `i · batch / parts`).
    pub fn split(batch: usize, parts: usize) -> Vec<Self> {
        let parts = Self::count(batch, parts);
        (0..parts)
            .map(|i| Self {
                start: i * batch / parts,
                end: (i + 1) * batch / parts,
                batch,
            })
            .collect()
    }

    pub fn rows(&self) -> Range<usize> {
        self.start..self.end
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// The parts' losses and gradients (in part order) added in that order: the batch's.
pub fn add_parts<T: Scalar>(
    parts: impl IntoIterator<Item = Result<(T, Vec<T>), ModelError>>,
) -> Result<(T, Vec<T>), ModelError> {
    let mut sum: Option<(T, Vec<T>)> = None;
    for part in parts {
        let (loss, grads) = part?;
        match &mut sum {
            None => sum = Some((loss, grads)),
            Some((total, values)) => {
                assert_eq!(values.len(), grads.len(), "gradient length");
                *total += loss;
                for (s, g) in values.iter_mut().zip(grads) {
                    *s += g;
                }
            }
        }
    }
    sum.ok_or(ModelError::EmptyBatch)
}

impl Network {
    /// `part`'s share of the batch's mean loss and of its gradient, for `x` and `labels`
    /// holding only that part's rows (full layout, like [`Network::loss_and_grad`]).
    pub fn part_loss_and_grad<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
        seed: u64,
        part: Part,
    ) -> Result<(T, Vec<T>), ModelError> {
        let mut grads = Vec::new();
        let loss = self.part_loss_and_grad_into(params, x, labels, seed, part, &mut grads)?;
        Ok((loss, grads))
    }

    /// The same into `grads` (its memory reused; every value written).
    pub fn part_loss_and_grad_into<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
        seed: u64,
        part: Part,
        grads: &mut Vec<T>,
    ) -> Result<T, ModelError> {
        self.check(params, &x)?;
        if x.nrows() != part.len() || part.end > part.batch {
            return Err(ModelError::ShapeMismatch {
                what: "rows of a part of a batch",
                expected: part.len(),
                got: x.nrows(),
            });
        }
        match &self.body {
            Body::Chain(chain) => {
                let x = standard(x);
                let outs = chain.forward_all(params, x.view(), Some(seed), part);
                let draw = (seed, part);
                chain.backward_into(params, x.view(), &outs, labels, draw, Pass::Gradient, grads)
            }
            Body::Gpt(gpt) => {
                let acts = gpt.forward(params, x, true)?;
                gpt.backward(params, acts, part.batch, grads)
            }
        }
    }

    /// The batch's mean loss and gradient computed in `parts` parts ([`Part::split`]) one
    /// after the other, and added in order: what `parts` cores compute together, bit for
    /// bit.
    pub fn loss_and_grad_parts<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
        seed: u64,
        parts: usize,
    ) -> Result<(T, Vec<T>), ModelError> {
        add_parts(Part::split(x.nrows(), parts).into_iter().map(|part| {
            let rows = part.rows();
            let labels_part = labels.get(rows.clone()).ok_or(ModelError::ShapeMismatch {
                what: "labels",
                expected: x.nrows(),
                got: labels.len(),
            })?;
            let x_part = x.slice(ndarray::s![rows, ..]);
            self.part_loss_and_grad(params, x_part, labels_part, seed, part)
        }))
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array2;

    use super::*;
    use crate::rng::SplitMix64;
    use crate::spec::{NetSpec, Shape};

    fn data(net: &Network, n: usize, seed: u64) -> (Array2<f32>, Vec<u8>) {
        let mut rng = SplitMix64::new(seed);
        let x = Array2::from_shape_fn((n, net.inputs()), |_| rng.next_f64() as f32);
        let labels = (0..n).map(|_| rng.below(net.classes()) as u8).collect();
        (x, labels)
    }

    #[test]
    fn parts_cover_the_batch_in_order_and_never_exceed_its_rows() {
        for (batch, parts, want) in [
            (32, 1, vec![(0, 32)]),
            (32, 2, vec![(0, 16), (16, 32)]),
            (12, 3, vec![(0, 4), (4, 8), (8, 12)]),
            // At least 4 rows a part.
            (10, 3, vec![(0, 5), (5, 10)]),
            (3, 8, vec![(0, 3)]),
            (5, 0, vec![(0, 5)]),
        ] {
            let got: Vec<_> = Part::split(batch, parts)
                .iter()
                .map(|p| (p.start, p.end))
                .collect();
            assert_eq!(got, want, "{batch} rows in {parts}");
        }
        assert_eq!(Part::split(1000, 1000).len(), MAX_PARTS);
    }

    /// One part is the whole batch's gradient, bit for bit; more parts are within rounding
    /// of it (the sums over samples in another order), with dropout drawing the same masks:
    /// checked against a naive reference, each row's own gradient over the batch size
    /// summed in f64.
    #[test]
    fn parts_add_up_to_the_batch_gradient_with_the_same_dropout_masks() {
        let input = Shape::new(1, 8, 8);
        let spec: NetSpec =
            "input 1x8x8; conv2d 4 k3 p1; relu; maxpool 2; flatten; dense 16; relu; dropout 0.5; dense 3"
                .parse()
            .expect("spec");
        assert_eq!(spec.input(), input);
        let net = Network::new(spec, 3).expect("net");
        let params: Vec<f32> = net.init(3);
        let (x, labels) = data(&net, 12, 5);
        let seed = 99;
        let (loss, whole) = net
            .loss_and_grad(&params, x.view(), &labels, seed)
            .expect("whole");
        let (loss1, one) = net
            .loss_and_grad_parts(&params, x.view(), &labels, seed, 1)
            .expect("one part");
        assert_eq!((loss1.to_bits(), &one), (loss.to_bits(), &whole));
        // The naive reference: every row alone, as a part of one row of the batch of 12.
        let mut naive = vec![0f64; whole.len()];
        let mut naive_loss = 0f64;
        for row in 0..12 {
            let part = Part {
                start: row,
                end: row + 1,
                batch: 12,
            };
            let x_row = x.slice(ndarray::s![row..row + 1, ..]);
            let (l, g) = net
                .part_loss_and_grad(&params, x_row, &labels[row..=row], seed, part)
                .expect("row");
            naive_loss += f64::from(l);
            for (n, v) in naive.iter_mut().zip(g) {
                *n += f64::from(v);
            }
        }
        let norm = naive.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!(norm > 1e-3, "a gradient to compare: {norm}");
        for parts in [1, 2, 3] {
            let (l, g) = net
                .loss_and_grad_parts(&params, x.view(), &labels, seed, parts)
                .expect("parts");
            assert!(
                (f64::from(l) - naive_loss).abs() < 1e-5,
                "{parts}: loss {l}"
            );
            for (i, (&v, &n)) in g.iter().zip(&naive).enumerate() {
                assert!(
                    (f64::from(v) - n).abs() <= 1e-6 + 1e-5 * n.abs(),
                    "{parts} parts, value {i}: {v} against {n}"
                );
            }
        }
        // Without the masks' offset a part would draw row 0's mask again: the dropout
        // layer's rows really differ, so this test would see it.
        let shifted = Part {
            start: 0,
            end: 1,
            batch: 12,
        };
        let x_row = x.slice(ndarray::s![5..6, ..]);
        let (_, wrong) = net
            .part_loss_and_grad(&params, x_row, &labels[5..6], seed, shifted)
            .expect("row");
        let right = net
            .part_loss_and_grad(
                &params,
                x_row,
                &labels[5..6],
                seed,
                Part {
                    start: 5,
                    end: 6,
                    batch: 12,
                },
            )
            .expect("row")
            .1;
        assert_ne!(wrong, right);
    }

    #[test]
    fn a_part_of_the_wrong_size_is_refused() {
        let net = Network::mlp(&[4, 3, 2]).expect("mlp");
        let params: Vec<f32> = net.init(1);
        let (x, labels) = data(&net, 4, 1);
        let part = Part {
            start: 0,
            end: 3,
            batch: 4,
        };
        assert!(net
            .part_loss_and_grad(&params, x.view(), &labels, 1, part)
            .is_err());
    }
}

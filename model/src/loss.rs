//! Softmax cross-entropy, fused with its gradient.

use ndarray::{Array2, ArrayView2, Axis};

use crate::error::ModelError;
use crate::scalar::Scalar;

/// Mean softmax cross-entropy of `logits` (`[n, classes]`) against `labels`, and its gradient
/// with respect to the logits, `(softmax - onehot) / n`.
pub fn softmax_cross_entropy<T: Scalar>(
    logits: ArrayView2<'_, T>,
    labels: &[u8],
) -> Result<(T, Array2<T>), ModelError> {
    softmax_cross_entropy_of(logits, labels, logits.nrows())
}

/// The same for rows that are part of a batch of `batch` samples: their share of the
/// batch's mean (their sum over `batch`), and its gradient, `(softmax - onehot) / batch`.
pub fn softmax_cross_entropy_of<T: Scalar>(
    logits: ArrayView2<'_, T>,
    labels: &[u8],
    batch: usize,
) -> Result<(T, Array2<T>), ModelError> {
    let (n, classes) = logits.dim();
    check_labels(n, classes, labels)?;
    if batch < n {
        return Err(ModelError::ShapeMismatch {
            what: "rows of a part of a batch (at most the batch)",
            expected: batch,
            got: n,
        });
    }
    let inv_n = T::one() / T::from_usize(batch).ok_or(ModelError::EmptyBatch)?;
    let mut grad = logits.to_owned();
    let mut total = T::zero();
    for (mut row, &label) in grad.axis_iter_mut(Axis(0)).zip(labels) {
        // Subtracting the max keeps exp() finite for any logits.
        let max = row.fold(T::neg_infinity(), |m, &v| m.max(v));
        let label = label as usize;
        // log p(label) = (z_label - max) - ln(sum exp(z - max)), finite even when p underflows.
        let shifted_label = row[label] - max;
        row.mapv_inplace(|v| (v - max).exp_portable());
        let sum = row.sum();
        total += sum.ln_portable() - shifted_label;
        row.mapv_inplace(|v| v / sum * inv_n);
        row[label] -= inv_n;
    }
    Ok((total * inv_n, grad))
}

/// Per-sample cross-entropy summed over the batch, and the number of correct argmax
/// predictions: what evaluation needs, without a gradient.
pub fn cross_entropy_sum_and_correct<T: Scalar>(
    logits: ArrayView2<'_, T>,
    labels: &[u8],
) -> Result<(T, usize), ModelError> {
    let (n, classes) = logits.dim();
    check_labels(n, classes, labels)?;
    let mut total = T::zero();
    let mut correct = 0;
    for (row, &label) in logits.axis_iter(Axis(0)).zip(labels) {
        let (argmax, max) =
            row.iter()
                .enumerate()
                .fold((0, T::neg_infinity()), |(bi, bv), (i, &v)| {
                    if v > bv {
                        (i, v)
                    } else {
                        (bi, bv)
                    }
                });
        let log_sum = row
            .iter()
            .fold(T::zero(), |s, &v| s + (v - max).exp_portable())
            .ln_portable();
        total = total + log_sum - (row[label as usize] - max);
        correct += usize::from(argmax == label as usize);
    }
    Ok((total, correct))
}

fn check_labels(n: usize, classes: usize, labels: &[u8]) -> Result<(), ModelError> {
    if n == 0 {
        return Err(ModelError::EmptyBatch);
    }
    if labels.len() != n {
        return Err(ModelError::ShapeMismatch {
            what: "labels",
            expected: n,
            got: labels.len(),
        });
    }
    if let Some((index, &label)) = labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l as usize >= classes)
    {
        return Err(ModelError::LabelOutOfRange {
            index,
            label,
            classes,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use ndarray::array;

    use super::*;

    #[test]
    fn matches_a_hand_computed_value() {
        let logits = array![[1.0f64, 2.0, 3.0], [0.0, 0.0, 0.0]];
        let (loss, grad) = softmax_cross_entropy(logits.view(), &[2, 0]).expect("valid");
        let p = |x: f64| x.exp() / (1f64.exp() + 2f64.exp() + 3f64.exp());
        let expected = (-(p(3.0)).ln() + 3f64.ln()) / 2.0;
        assert!((loss - expected).abs() < 1e-12);
        assert!((grad[[0, 2]] - (p(3.0) - 1.0) / 2.0).abs() < 1e-12);
        assert!((grad[[1, 1]] - (1.0 / 3.0) / 2.0).abs() < 1e-12);
        // Each row of (softmax - onehot) sums to zero.
        for row in grad.rows() {
            assert!(row.sum().abs() < 1e-12);
        }
        let (sum, correct) = cross_entropy_sum_and_correct(logits.view(), &[2, 0]).expect("ok");
        assert!((sum / 2.0 - loss).abs() < 1e-12);
        assert_eq!(correct, 2); // argmax ties resolve to the first class
    }

    #[test]
    fn huge_logits_stay_finite() {
        let logits = array![[1e30f32, -1e30, 0.0]];
        let (loss, grad) = softmax_cross_entropy(logits.view(), &[1]).expect("valid");
        assert!(loss.is_finite() && grad.iter().all(|g| g.is_finite()));
    }

    #[test]
    fn bad_labels_are_errors() {
        let logits = array![[0.0f32, 0.0]];
        assert!(matches!(
            softmax_cross_entropy(logits.view(), &[2]),
            Err(ModelError::LabelOutOfRange { label: 2, .. })
        ));
        assert!(matches!(
            softmax_cross_entropy(logits.view(), &[0, 1]),
            Err(ModelError::ShapeMismatch { .. })
        ));
    }
}

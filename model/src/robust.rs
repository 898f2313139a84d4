//! Coordinate-wise robust combination of a round's gradients: per coordinate, sort the K
//! values, drop `drop` from each end, and average the rest (`drop = 0`: the mean; `drop =
//! (K-1)/2`: the median). Here, in the optimised maths crate, because it touches every value
//! of every gradient of a round.

/// The coordinate-wise trimmed mean of `grads` (all the same length), dropping `drop`
/// values from each end of every coordinate. `None` if `grads` is empty or `2·drop ≥ K`.
pub fn trimmed_mean(grads: &[Vec<f32>], drop: usize) -> Option<Vec<f32>> {
    let k = grads.len();
    if k == 0 || 2 * drop >= k {
        return None;
    }
    let middle = (k - 2 * drop) as f32;
    Some(sorted_columns(grads, |column| {
        column[drop..k - drop].iter().sum::<f32>() / middle
    }))
}

/// The coordinate-wise mean around the median ("MeaMed", Xie et al. 2018): per coordinate,
/// the mean of the `K - drop` values nearest the median. With `drop` hostile values that are
/// outliers, exactly they are dropped and every honest value kept, so unlike the trimmed
/// mean it does not also drop honest values from the other end. `None` if `grads` is empty
/// or `drop ≥ K`.
pub fn mean_around_median(grads: &[Vec<f32>], drop: usize) -> Option<Vec<f32>> {
    let k = grads.len();
    if k == 0 || drop >= k {
        return None;
    }
    let keep = k - drop;
    Some(sorted_columns(grads, |column| {
        let median = if k % 2 == 1 {
            column[k / 2]
        } else {
            (column[k / 2 - 1] + column[k / 2]) / 2.0
        };
        // The `keep` nearest values are a contiguous window of the sorted column: the one
        // whose farther end is nearest the median.
        let reach = |s: usize| (median - column[s]).max(column[s + keep - 1] - median);
        let start = (0..=drop)
            .min_by(|&a, &b| reach(a).total_cmp(&reach(b)))
            .unwrap_or(0);
        column[start..start + keep].iter().sum::<f32>() / keep as f32
    }))
}

/// Applies `combine` to every coordinate's values across `grads` (non-empty, equal lengths),
/// sorted ascending.
fn sorted_columns(grads: &[Vec<f32>], mut combine: impl FnMut(&[f32]) -> f32) -> Vec<f32> {
    let len = grads[0].len();
    let mut column = vec![0.0f32; grads.len()];
    let mut out = Vec::with_capacity(len);
    for i in 0..len {
        for (c, g) in column.iter_mut().zip(grads) {
            *c = g[i];
        }
        sort_small(&mut column);
        out.push(combine(&column));
    }
    out
}

/// Insertion sort: a column is a round's worth of workers, usually a handful, where it beats
/// the general sort. NaN sorts last (callers pass finite values).
fn sort_small(values: &mut [f32]) {
    for i in 1..values.len() {
        let v = values[i];
        let mut j = i;
        while j > 0 && values[j - 1].total_cmp(&v).is_gt() {
            values[j] = values[j - 1];
            j -= 1;
        }
        values[j] = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_the_extremes_of_each_coordinate() {
        let grads = vec![
            vec![1.0, 5.0],
            vec![100.0, 4.0],
            vec![2.0, -50.0],
            vec![3.0, 6.0],
        ];
        assert_eq!(trimmed_mean(&grads, 1), Some(vec![2.5, 4.5]));
        assert_eq!(trimmed_mean(&grads, 0), Some(vec![26.5, -8.75]));
        assert_eq!(trimmed_mean(&grads, 2), None);
        assert_eq!(trimmed_mean(&[], 0), None);
    }

    #[test]
    fn mean_around_median_drops_the_outliers_only() {
        let grads = vec![
            vec![1.0, 5.0],
            vec![100.0, 4.0],
            vec![2.0, -50.0],
            vec![3.0, 6.0],
            vec![2.5, 5.5],
        ];
        // Column 0: 1 2 2.5 3 100, median 2.5: drop 100, keep 1 2 2.5 3.
        // Column 1: -50 4 5 5.5 6, median 5: drop -50, keep 4 5 5.5 6.
        assert_eq!(mean_around_median(&grads, 1), Some(vec![2.125, 5.125]));
        assert_eq!(mean_around_median(&grads, 0), trimmed_mean(&grads, 0));
        assert_eq!(mean_around_median(&grads, 5), None);
    }

    #[test]
    fn sorting_small_columns_sorts() {
        let mut rng = crate::rng::SplitMix64::new(3);
        for k in 1..12 {
            let mut v: Vec<f32> = (0..k).map(|_| rng.next_f64() as f32 - 0.5).collect();
            let mut want = v.clone();
            want.sort_by(f32::total_cmp);
            sort_small(&mut v);
            assert_eq!(v, want);
        }
    }
}

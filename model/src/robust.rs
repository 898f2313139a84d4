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

/// Multi-Krum (Blanchard et al. 2017, El Mhamdi et al. 2018): with at most `hostile` of the
/// K gradients hostile, each gradient's score is the sum of its squared distances to its
/// `K - hostile - 2` nearest others; the `K - hostile` with the lowest scores are averaged,
/// weighted by `weights`. Returns the average and the indices selected (ascending score).
/// `None` if `grads` is empty or `K < 2·hostile + 3` (Krum's bound; callers clamp).
///
/// Distances are summed in f64 over O(K²·P) work; inputs are finite and norm-bounded.
pub fn multi_krum(
    grads: &[Vec<f32>],
    weights: &[f32],
    hostile: usize,
) -> Option<(Vec<f32>, Vec<usize>)> {
    let k = grads.len();
    if k == 0 || (hostile > 0 && k < 2 * hostile + 3) {
        return None;
    }
    let mut distance = vec![0.0f64; k * k];
    for i in 0..k {
        for j in i + 1..k {
            let d: f64 = grads[i]
                .iter()
                .zip(&grads[j])
                .map(|(&a, &b)| {
                    let d = f64::from(a) - f64::from(b);
                    d * d
                })
                .sum();
            distance[i * k + j] = d;
            distance[j * k + i] = d;
        }
    }
    let neighbours = k.saturating_sub(hostile + 2);
    let scores: Vec<f64> = (0..k)
        .map(|i| {
            let mut others: Vec<f64> = (0..k)
                .filter(|&j| j != i)
                .map(|j| distance[i * k + j])
                .collect();
            others.sort_by(f64::total_cmp);
            others[..neighbours.min(others.len())].iter().sum()
        })
        .collect();
    let mut order: Vec<usize> = (0..k).collect();
    // Ties keep arrival order, so the result does not depend on the sort.
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    order.truncate(k - hostile);
    let total: f64 = order.iter().map(|&i| f64::from(weights[i])).sum();
    let mut mean = vec![0.0f64; grads[0].len()];
    for &i in &order {
        let w = if total > 0.0 {
            f64::from(weights[i]) / total
        } else {
            1.0 / order.len() as f64
        };
        for (m, &g) in mean.iter_mut().zip(&grads[i]) {
            *m += w * f64::from(g);
        }
    }
    Some((mean.into_iter().map(|m| m as f32).collect(), order))
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
    fn multi_krum_selects_the_clustered_gradients() {
        // Six honest gradients near (1, 1), two colluding far away at the same point.
        let mut grads = vec![
            vec![1.0, 1.0],
            vec![1.1, 0.9],
            vec![0.9, 1.1],
            vec![1.0, 1.2],
            vec![1.2, 1.0],
            vec![0.8, 0.8],
        ];
        grads.push(vec![-10.0, -10.0]);
        grads.push(vec![-10.0, -10.0]);
        let weights = [1.0; 8];
        let (mean, selected) = multi_krum(&grads, &weights, 2).expect("8 >= 7");
        let mut selected = selected;
        selected.sort_unstable();
        assert_eq!(selected, vec![0, 1, 2, 3, 4, 5], "the six honest ones");
        assert!((mean[0] - 1.0).abs() < 1e-6 && (mean[1] - 1.0).abs() < 1e-6);
        // Naive reference for a score: gradient 0's 4 nearest squared distances.
        let mut d: Vec<f64> = (1..8)
            .map(|j| {
                (0..2)
                    .map(|c| (f64::from(grads[0][c]) - f64::from(grads[j][c])).powi(2))
                    .sum()
            })
            .collect();
        d.sort_by(f64::total_cmp);
        assert!(d[..4].iter().sum::<f64>() < 0.2);
        // Krum's bound, and f = 0 is the weighted mean.
        assert_eq!(multi_krum(&grads[..6], &weights[..6], 2), None);
        let (mean, _) = multi_krum(&[vec![1.0], vec![4.0]], &[3.0, 1.0], 0).expect("mean");
        assert_eq!(mean, vec![1.75]);
        assert_eq!(multi_krum(&[], &[], 0), None);
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

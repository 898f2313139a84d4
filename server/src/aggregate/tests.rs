//! The rules against naive per-coordinate references.

use super::*;

/// Naive reference: sort each coordinate in f64, drop `drop` per end, average the rest.
fn naive(grads: &[Vec<f32>], drop: usize) -> Vec<f64> {
    (0..grads[0].len())
        .map(|i| {
            let mut col: Vec<f64> = grads.iter().map(|g| f64::from(g[i])).collect();
            col.sort_by(f64::total_cmp);
            let kept = &col[drop..col.len() - drop];
            kept.iter().sum::<f64>() / kept.len() as f64
        })
        .collect()
}

fn random_grads(k: usize, len: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = model::SplitMix64::new(seed);
    (0..k)
        .map(|_| {
            (0..len)
                .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
                .collect()
        })
        .collect()
}

#[test]
fn trimmed_mean_and_median_equal_the_naive_reference() {
    for k in [1usize, 2, 3, 5, 7, 10] {
        let grads = random_grads(k, 200, k as u64);
        for (rule, drop) in [
            (Rule::TrimmedMean { trim: 0.2 }, (k as f64 * 0.2) as usize),
            (Rule::Median, (k - 1) / 2),
        ] {
            let mut agg = CoordinateWise::new(rule, 200, k);
            for g in &grads {
                agg.add(g, 32, 32.0, 1.0);
            }
            assert_eq!((agg.contributions(), agg.samples()), (k, 32 * k as u64));
            let got = agg.take().expect("non-empty");
            for (a, b) in got.iter().zip(naive(&grads, drop)) {
                assert!(
                    (f64::from(*a) - b).abs() < 1e-6,
                    "{rule:?} k={k}: {a} vs {b}"
                );
            }
            assert_eq!(agg.take(), None, "reset");
        }
    }
}

#[test]
fn one_outlier_in_five_is_dropped_in_every_coordinate() {
    let mut grads = vec![vec![1.0f32, -1.0, 0.0]; 4];
    grads[1] = vec![1.5, -0.5, 0.25];
    let trimmed = AggregatorKind {
        rule: Rule::TrimmedMean { trim: 0.2 },
        ..AggregatorKind::default()
    };
    let mut agg = trimmed.build(3, 5);
    for g in &grads {
        agg.add(g, 32, 32.0, 1.0);
    }
    // An attacker's 3e38 everywhere, clipped by the norm bound to length ~1.
    agg.add(&[3e38; 3], 32, 32.0, (1.0 / (3e38 * 3f64.sqrt())) as f32);
    let got = agg.take().expect("five");
    // Per coordinate: drop the largest and the smallest of five, average three.
    let want = naive(
        &[grads.clone(), vec![vec![1.0 / 3f32.sqrt(); 3]]].concat(),
        1,
    );
    for (a, b) in got.iter().zip(want) {
        assert!((f64::from(*a) - b).abs() < 1e-6, "{a} vs {b}");
    }
    assert!(
        got[2].abs() < 0.1,
        "the attacker's 0.577 is dropped: {got:?}"
    );
}

/// Naive reference: per coordinate, the mean of the `K - drop` values nearest the median.
fn naive_mean_around_median(grads: &[Vec<f32>], drop: usize) -> Vec<f64> {
    (0..grads[0].len())
        .map(|i| {
            let mut col: Vec<f64> = grads.iter().map(|g| f64::from(g[i])).collect();
            col.sort_by(f64::total_cmp);
            let k = col.len();
            let median = if k % 2 == 1 {
                col[k / 2]
            } else {
                (col[k / 2 - 1] + col[k / 2]) / 2.0
            };
            col.sort_by(|a, b| (a - median).abs().total_cmp(&(b - median).abs()));
            col[..k - drop].iter().sum::<f64>() / (k - drop) as f64
        })
        .collect()
}

#[test]
fn mean_around_median_equals_the_naive_reference_and_keeps_every_honest_value() {
    for k in [1usize, 3, 5, 8, 10] {
        let grads = random_grads(k, 200, 40 + k as u64);
        let rule = Rule::MeanAroundMedian { trim: 0.2 };
        let mut agg = CoordinateWise::new(rule, 200, k);
        for g in &grads {
            agg.add(g, 32, 32.0, 1.0);
        }
        let got = agg.take().expect("non-empty");
        for (a, b) in got
            .iter()
            .zip(naive_mean_around_median(&grads, rule.trimmed(k)))
        {
            assert!((f64::from(*a) - b).abs() < 1e-6, "k={k}: {a} vs {b}");
        }
    }
    // The default: four honest values and one far outlier per coordinate. Only the outlier
    // goes; the trimmed mean would also drop an honest value from the other end.
    let honest = [
        vec![1.0f32, -1.0],
        vec![1.2, -0.8],
        vec![0.8, -1.2],
        vec![1.4, -0.6],
    ];
    let mut agg = AggregatorKind::default().build(2, 5);
    for g in &honest {
        agg.add(g, 32, 32.0, 1.0);
    }
    agg.add(&[-40.0, 40.0], 32, 32.0, 1.0);
    assert_eq!(agg.take(), Some(vec![1.1, -0.9]));
}

#[test]
fn rounds_with_nothing_to_trim_or_too_many_gradients_stream_the_exact_mean() {
    // Four gradients at trim 0.2: nothing to drop, so the weighted mean (weights honoured).
    let mut agg = AggregatorKind::default().build(1, 4);
    agg.add(&[4.0], 10, 1.0, 1.0);
    agg.add(&[1.0], 10, 3.0, 1.0);
    assert_eq!(agg.take(), Some(vec![1.75]));
    // Over the memory budget: the mean too.
    let tight = AggregatorKind {
        memory: 1000,
        ..AggregatorKind::default()
    };
    let mut agg = tight.build(100, 10);
    for v in [1.0f32, 2.0, 3.0, 4.0, 100.0, 6.0, 7.0, 8.0, 9.0, 10.0] {
        agg.add(&[v; 100], 1, 1.0, 1.0);
    }
    assert_eq!(agg.take().expect("ten")[0], 15.0, "the plain mean");
}

#[test]
fn trimming_never_drops_everything() {
    assert_eq!(Rule::TrimmedMean { trim: 0.5 }.trimmed(4), 1);
    assert_eq!(Rule::TrimmedMean { trim: 0.49 }.trimmed(3), 1);
    assert_eq!(Rule::Median.trimmed(4), 1);
    assert_eq!(Rule::Median.trimmed(1), 0);
    assert_eq!(Rule::Mean.trimmed(10), 0);
}

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

/// The run's aggregator, beginning a round of `expected`.
fn round_of(kind: AggregatorKind, len: usize, expected: usize) -> Box<dyn Aggregator> {
    let mut agg = kind.build(len);
    agg.begin(expected);
    agg
}

fn kind(rule: Rule) -> AggregatorKind {
    AggregatorKind {
        rule,
        ..AggregatorKind::default()
    }
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
            let mut agg = round_of(kind(rule), 200, k);
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
    let mut agg = round_of(trimmed, 3, 5);
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
        let mut agg = round_of(kind(rule), 200, k);
        for g in &grads {
            agg.add(g, 32, 32.0, 1.0);
        }
        let got = agg.take().expect("non-empty");
        for (a, b) in got
            .iter()
            .zip(naive_mean_around_median(&grads, rule.dropped(k)))
        {
            assert!((f64::from(*a) - b).abs() < 1e-6, "k={k}: {a} vs {b}");
        }
    }
    // Four honest values and one far outlier per coordinate. Only the outlier goes; the
    // trimmed mean would also drop an honest value from the other end.
    let honest = [
        vec![1.0f32, -1.0],
        vec![1.2, -0.8],
        vec![0.8, -1.2],
        vec![1.4, -0.6],
    ];
    let mut agg = round_of(kind(Rule::MeanAroundMedian { trim: 0.2 }), 2, 5);
    for g in &honest {
        agg.add(g, 32, 32.0, 1.0);
    }
    agg.add(&[-40.0, 40.0], 32, 32.0, 1.0);
    assert_eq!(agg.take(), Some(vec![1.1, -0.9]));
}

#[test]
fn rounds_with_nothing_to_trim_or_too_many_gradients_stream_the_exact_mean() {
    // Four gradients at trim 0.2: nothing to drop, so the weighted mean (weights honoured).
    let meamed = kind(Rule::MeanAroundMedian { trim: 0.2 });
    let mut agg = round_of(meamed, 1, 4);
    agg.add(&[4.0], 10, 1.0, 1.0);
    agg.add(&[1.0], 10, 3.0, 1.0);
    assert_eq!(agg.take(), Some(vec![1.75]));
    // Over the memory budget: the mean too.
    let tight = AggregatorKind {
        memory: 1000,
        ..meamed
    };
    let mut agg = round_of(tight, 100, 10);
    for v in [1.0f32, 2.0, 3.0, 4.0, 100.0, 6.0, 7.0, 8.0, 9.0, 10.0] {
        agg.add(&[v; 100], 1, 1.0, 1.0);
    }
    assert_eq!(agg.take().expect("ten")[0], 15.0, "the plain mean");
}

#[test]
fn trimming_never_drops_everything() {
    assert_eq!(Rule::TrimmedMean { trim: 0.5 }.dropped(4), 1);
    assert_eq!(Rule::TrimmedMean { trim: 0.49 }.dropped(3), 1);
    assert_eq!(Rule::Median.dropped(4), 1);
    assert_eq!(Rule::Median.dropped(1), 0);
    assert_eq!(Rule::Mean.dropped(10), 0);
}

#[test]
fn multi_krum_drops_two_colluders_of_eight_and_the_aggregator_is_reused_across_rounds() {
    let mut agg = round_of(kind(Rule::MultiKrum { hostile: 0.25 }), 50, 8);
    for round in 0..3u64 {
        if round > 0 {
            agg.begin(8);
        }
        let honest = random_grads(6, 50, 70 + round);
        for g in &honest {
            agg.add(g, 32, 32.0, 1.0);
        }
        // Two colluders send the same far point, inside every coordinate's range [-1, 1].
        for _ in 0..2 {
            agg.add(&[-0.99; 50], 32, 32.0, 1.0);
        }
        assert_eq!(agg.contributions(), 8);
        let got = agg.take().expect("eight");
        for (i, &v) in got.iter().enumerate() {
            let want = honest.iter().map(|g| f64::from(g[i])).sum::<f64>() / 6.0;
            assert!(
                (f64::from(v) - want).abs() < 1e-6,
                "round {round}: {v} vs {want}"
            );
        }
        assert_eq!(agg.take(), None, "reset");
    }
    assert_eq!(Rule::MultiKrum { hostile: 0.25 }.dropped(8), 2);
    assert_eq!(
        Rule::MultiKrum { hostile: 0.4 }.dropped(8),
        2,
        "Krum's bound"
    );
    assert_eq!(Rule::MultiKrum { hostile: 0.25 }.dropped(4), 0);
}

#[test]
fn a_round_that_outgrows_the_memory_budget_folds_into_the_mean() {
    // Room for 5 gradients of 100 values; the round expected 5 and got 7.
    let tight = AggregatorKind {
        rule: Rule::Median,
        memory: 5 * 100 * 4,
        momentum: 0.0,
    };
    let mut agg = round_of(tight, 100, 5);
    for v in 1..=7 {
        agg.add(&[v as f32; 100], 1, 1.0, 1.0);
    }
    assert_eq!(agg.contributions(), 7);
    assert_eq!(agg.samples(), 7);
    assert_eq!(
        agg.take().expect("seven")[0],
        4.0,
        "the mean, not a median of 5"
    );
    // The next round of 5 keeps again: the median.
    agg.begin(5);
    for v in [1.0, 2.0, 3.0, 4.0, 100.0] {
        agg.add(&[v; 100], 1, 1.0, 1.0);
    }
    assert_eq!(agg.take().expect("five")[0], 3.0);
}

/// Naive centered clipping in f64: one round around `center` with radius `tau`.
fn naive_centered(center: &[f64], grads: &[Vec<f32>], tau: f64) -> Vec<f64> {
    let mut out = center.to_vec();
    for g in grads {
        let diff: Vec<f64> = g
            .iter()
            .zip(center)
            .map(|(&g, c)| f64::from(g) - c)
            .collect();
        let norm = diff.iter().map(|d| d * d).sum::<f64>().sqrt();
        let shrink = if norm > tau { tau / norm } else { 1.0 };
        for (o, d) in out.iter_mut().zip(diff) {
            *o += shrink * d / grads.len() as f64;
        }
    }
    out
}

#[test]
fn centered_clipping_equals_the_naive_reference_round_after_round() {
    let mut agg = round_of(kind(Rule::CenteredClip { radius: Some(0.5) }), 20, 5);
    let mut center = vec![0.0f64; 20];
    for round in 0..4u64 {
        agg.begin(5);
        let mut grads = random_grads(5, 20, 90 + round);
        grads[4] = vec![50.0; 20];
        for g in &grads {
            agg.add(g, 32, 32.0, 1.0);
        }
        let got = agg.take().expect("five");
        center = naive_centered(&center, &grads, 0.5);
        for (a, b) in got.iter().zip(&center) {
            assert!(
                (f64::from(*a) - b).abs() < 1e-5,
                "round {round}: {a} vs {b}"
            );
        }
        // The attacker's 50s moved each coordinate by at most τ / 5.
        assert!(got.iter().all(|v| v.abs() < 1.0 + 0.1 * round as f32 + 0.5));
    }
}

#[test]
fn centered_clipping_adapts_its_radius_to_twice_the_median_distance() {
    let mut clip = CenteredClip::new(1, None);
    assert_eq!(clip.radius(), f64::INFINITY, "nothing seen: no clipping");
    for v in [1.0f32, 2.0, 3.0, 4.0, 1000.0] {
        clip.add(&[v], 1, 1.0, 1.0);
    }
    assert_eq!(clip.clipped(), 0);
    let first = clip.take().expect("five")[0];
    assert!((first - 202.0).abs() < 1e-3, "{first}");
    // Distances from 0 were 1, 2, 3, 4, 1000: twice the median, 6, is the next radius.
    assert_eq!(clip.radius(), 6.0);
    clip.add(&[first + 1000.0], 1, 1.0, 1.0);
    assert_eq!(clip.take().expect("one")[0], first + 6.0);
    assert_eq!(clip.clipped(), 1);
    // A clipped gradient (scale < 1) is measured after scaling.
    let mut clip = CenteredClip::new(2, Some(10.0));
    clip.add(&[3e38, 0.0], 1, 1.0, (1.0 / 3e38) as f32);
    let got = clip.take().expect("one");
    assert!((got[0] - 1.0).abs() < 1e-6 && got[1] == 0.0, "{got:?}");
}

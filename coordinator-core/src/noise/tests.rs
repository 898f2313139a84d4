use super::*;

/// A seeded normal generator (xorshift64* and Box-Muller), enough for a known noise.
struct Normal(u64);

impl Normal {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        (bits as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn sample(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// The two norms, straight from their definitions in f64.
#[test]
fn a_reading_is_its_definition() {
    let answers: [(&[f32], f32, u64); 3] = [
        (&[1.0, -2.0, 0.5], 1.0, 32),
        (&[0.5, 1.5, -1.0], 0.5, 96),
        (&[-1.0, 0.25, 2.0], 2.0, 16),
    ];
    let mut spread = Spread::default();
    for (grads, scale, samples) in answers {
        spread.add(grads, scale, samples);
    }
    let reading = spread.take().expect("three answers");
    let n: f64 = answers.iter().map(|a| a.2 as f64).sum();
    let scaled =
        |(g, s, _): &(&[f32], f32, u64)| g.iter().map(|&v| f64::from(v * s)).collect::<Vec<f64>>();
    let small: f64 = answers
        .iter()
        .map(|a| a.2 as f64 * scaled(a).iter().map(|v| v * v).sum::<f64>())
        .sum::<f64>()
        / n;
    let big: f64 = (0..3)
        .map(|i| {
            let mean: f64 = answers
                .iter()
                .map(|a| a.2 as f64 * scaled(a)[i])
                .sum::<f64>()
                / n;
            mean * mean
        })
        .sum();
    assert!(
        (reading.small - small).abs() < 1e-9 * small,
        "{reading:?} {small}"
    );
    assert!((reading.big - big).abs() < 1e-6 * big, "{reading:?} {big}");
    assert_eq!(reading.big_batch, 144.0);
    assert_eq!(reading.small_batch, 48.0);
    assert!(spread.take().is_none(), "taking empties it");
}

#[test]
fn one_answer_tells_nothing() {
    let mut spread = Spread::default();
    spread.add(&[1.0, 2.0], 1.0, 64);
    assert_eq!(spread.take(), None);
    let mut scale = NoiseScale::default();
    assert_eq!(scale.report(), None);
    let reading = Reading {
        small_batch: 10.0,
        big_batch: 20.0,
        small: 1.0,
        big: 1.0,
    };
    scale.observe(&reading);
    let report = scale.report().expect("one reading");
    assert_eq!(report.samples, Some(0.0), "no spread: no noise");
    assert_eq!(
        report.doubling_gain,
        Some(1.0),
        "doubling a noiseless batch saves no step"
    );
}

/// Answers drawn around a known gradient with a known per-sample noise: the estimate finds
/// `B_noise = S / |G|²` (500 samples here) within 10 %, whether the crowd's batch is below
/// it or past it, with unequal answers and local phases' scales.
#[test]
fn the_estimate_finds_a_known_noise_scale() {
    const P: usize = 4000;
    let g = 0.02f64; // |G|² = P · 4e-4 = 0.16
    let sigma2 = 0.2f64; // S = P · 0.2 = 80: B_noise = 500
    let truth = (P as f64 * sigma2) / (P as f64 * g * g);
    for (answers, batch) in [(2usize, 16u32), (4, 64), (8, 256)] {
        let mut rng = Normal(0x9e37_79b9_7f4a_7c15 ^ answers as u64);
        let mut scale = NoiseScale::default();
        for _ in 0..300 {
            let mut spread = Spread::default();
            for k in 0..answers {
                // Unequal phases: H_k of 2 or 4 steps, each answer scaled by H̄ / H_k
                // (H̄ = 3): its mean is 3·G and its noise 9·S / n_k.
                let steps = if k % 2 == 0 { 2u64 } else { 4 };
                let n = u64::from(batch) * steps;
                let phase = 3.0 / steps as f64;
                let grads: Vec<f32> = (0..P)
                    .map(|_| {
                        let sum = steps as f64 * g
                            + (sigma2 * steps as f64 / f64::from(batch)).sqrt() * rng.sample();
                        sum as f32
                    })
                    .collect();
                spread.add(&grads, phase as f32, n);
            }
            scale.observe(&spread.take().expect("several answers"));
        }
        let report = scale.report().expect("readings");
        let estimate = report.samples.expect("a positive signal");
        assert!(
            (estimate / truth - 1.0).abs() < 0.1,
            "{answers} answers of batch {batch}: {estimate} against {truth}"
        );
        // The update's samples: K answers of `batch` over H̄ = 3 steps on average.
        assert_eq!(report.crowd_batch, (answers as u32 * batch * 3) as f64);
        let b = report.crowd_batch;
        let gain = report.doubling_gain.expect("a batch");
        assert!((gain - (1.0 + estimate / b) / (1.0 + estimate / (2.0 * b))).abs() < 1e-12);
    }
}

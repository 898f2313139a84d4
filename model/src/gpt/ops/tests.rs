//! Each operation against a naive reference: forward against straightforward loops, backward
//! against central differences in f64.

use ndarray::{Array1, Array2};

use super::*;
use crate::rng::SplitMix64;

fn random(rng: &mut SplitMix64, rows: usize, cols: usize) -> Array2<f64> {
    Array2::from_shape_simple_fn((rows, cols), || rng.next_f64() * 2.0 - 1.0)
}

/// `Σ f(x) · r` and its gradient by central differences, for each value of `x`.
fn numeric(
    x: &Array2<f64>,
    r: &Array2<f64>,
    f: impl Fn(&Array2<f64>) -> Array2<f64>,
) -> Array2<f64> {
    let h = 1e-6;
    let mut grad = Array2::zeros(x.dim());
    for idx in ndarray::indices(x.dim()) {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[idx] += h;
        down[idx] -= h;
        grad[idx] = ((f(&up) * r).sum() - (f(&down) * r).sum()) / (2.0 * h);
    }
    grad
}

fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-6 * (1.0 + y.abs()),
            "{what}[{i}]: {x} against {y}"
        );
    }
}

#[test]
fn layer_norm_matches_its_definition_and_its_backward_the_differences() {
    let mut rng = SplitMix64::new(1);
    let x = random(&mut rng, 3, 6);
    let g: Vec<f64> = (0..6).map(|_| rng.next_f64() + 0.5).collect();
    let b: Vec<f64> = (0..6).map(|_| rng.next_f64()).collect();
    let (y, stats) = layer_norm(x.view(), &g, &b);
    for (i, row) in x.rows().into_iter().enumerate() {
        let mean = row.sum() / 6.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 6.0;
        for j in 0..6 {
            let want = (row[j] - mean) / (var + 1e-5).sqrt() * g[j] + b[j];
            assert!((y[[i, j]] - want).abs() < 1e-12);
        }
    }
    let r = random(&mut rng, 3, 6);
    let (mut dg, mut db) = (vec![0.0; 6], vec![0.0; 6]);
    let dx = layer_norm_backward(x.view(), &stats, &g, r.view(), &mut dg, &mut db);
    let want = numeric(&x, &r, |x| layer_norm(x.view(), &g, &b).0);
    close(dx.as_slice().unwrap(), want.as_slice().unwrap(), "dx");
    // dg and db: the same differences in g and b.
    let as_row = |v: &[f64]| Array2::from_shape_vec((1, 6), v.to_vec()).unwrap();
    let want_g = numeric(&as_row(&g), &Array2::ones((1, 1)), |g| {
        Array2::from_elem(
            (1, 1),
            (layer_norm(x.view(), g.as_slice().unwrap(), &b).0 * &r).sum(),
        )
    });
    close(&dg, want_g.as_slice().unwrap(), "dg");
    close(&db, &r.sum_axis(ndarray::Axis(0)).to_vec(), "db");
}

#[test]
fn gelu_is_gpt2s_tanh_form_and_its_slope_the_difference() {
    // torch.nn.functional.gelu(x, approximate="tanh") at 1, -0.5 and 2.5.
    for (x, want) in [
        (1.0f64, 0.841_191_990_608_276_8),
        (-0.5, -0.154_285_990_174_856_06),
        (2.5, 2.484_915_733_910_001),
    ] {
        assert!((gelu(x) - want).abs() < 1e-12, "gelu({x}) = {}", gelu(x));
        let numeric = (gelu(x + 1e-6) - gelu(x - 1e-6)) / 2e-6;
        assert!((gelu_slope(x) - numeric).abs() < 1e-8);
    }
}

/// The pass keeps GELU's `tanh` and computes the output and the slope from it: the values
/// are those of computing each from `x` alone, bit for bit (a verifier of an older worker
/// replays the same bits), in f32 and f64, saturated tails included.
#[test]
fn gelu_from_its_kept_tanh_is_gelu_bit_for_bit() {
    fn alone<T: Scalar>(x: T) -> (T, T) {
        let c = |v: f64| T::from_f64(v).unwrap();
        let (k, a, half, two, three) = (
            c(0.797_884_560_802_865_4),
            c(0.044_715),
            c(0.5),
            c(2.0),
            c(3.0),
        );
        let tanh =
            |x: T| T::one() - two / ((two * (k * (x + a * x * x * x))).exp_portable() + T::one());
        let out = half * x * (T::one() + tanh(x));
        let t = tanh(x);
        let slope = half * (T::one() + t)
            + half * x * (T::one() - t * t) * k * (T::one() + three * a * x * x);
        (out, slope)
    }
    let mut rng = SplitMix64::new(5);
    for i in 0..20_000 {
        let x = (rng.next_f64() * 2.0 - 1.0) * if i % 2 == 0 { 4.0 } else { 60.0 };
        let t = gelu_tanh(x);
        assert_eq!(
            (gelu_from(x, t).to_bits(), gelu_slope_from(x, t).to_bits()),
            {
                let (o, s) = alone(x);
                (o.to_bits(), s.to_bits())
            }
        );
        let x = x as f32;
        let t = gelu_tanh(x);
        let (o, s) = alone(x);
        assert_eq!(gelu_from(x, t).to_bits(), o.to_bits(), "{x}");
        assert_eq!(gelu_slope_from(x, t).to_bits(), s.to_bits(), "{x}");
    }
}

/// Attention by its definition, one query at a time.
fn naive_attention(qkv: &Array2<f64>, context: usize, heads: usize) -> Array2<f64> {
    let width = qkv.ncols() / 3;
    let hs = width / heads;
    let mut y = Array2::zeros((qkv.nrows(), width));
    for b in 0..qkv.nrows() / context {
        for h in 0..heads {
            for i in 0..context {
                let qi = b * context + i;
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..hs)
                            .map(|d| {
                                qkv[[qi, h * hs + d]] * qkv[[b * context + j, width + h * hs + d]]
                            })
                            .sum::<f64>()
                            / (hs as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hs {
                    y[[qi, h * hs + d]] = (0..=i)
                        .map(|j| e[j] / sum * qkv[[b * context + j, 2 * width + h * hs + d]])
                        .sum();
                }
            }
        }
    }
    y
}

#[test]
fn causal_attention_matches_its_definition_and_its_backward_the_differences() {
    let mut rng = SplitMix64::new(2);
    let (context, heads, width) = (4, 2, 6);
    let qkv = random(&mut rng, 2 * context, 3 * width) * 2.0;
    let (y, att) = attention(qkv.view(), context, heads);
    let want = naive_attention(&qkv, context, heads);
    close(y.as_slice().unwrap(), want.as_slice().unwrap(), "y");
    // Nothing attends to a later position.
    for (r, row) in att.rows().into_iter().enumerate() {
        let i = r % context;
        assert!(row.iter().skip(i + 1).all(|&v| v == 0.0));
        assert!((row.sum() - 1.0).abs() < 1e-12);
    }
    let r = random(&mut rng, 2 * context, width);
    let dqkv = attention_backward(qkv.view(), att.view(), r.view(), context, heads);
    let want = numeric(&qkv, &r, |qkv| attention(qkv.view(), context, heads).0);
    close(dqkv.as_slice().unwrap(), want.as_slice().unwrap(), "dqkv");
}

#[test]
fn linear_backward_is_the_differences() {
    let mut rng = SplitMix64::new(3);
    let x = random(&mut rng, 3, 4);
    let w = random(&mut rng, 4, 5);
    let b = Array1::from_shape_simple_fn(5, || rng.next_f64());
    let r = random(&mut rng, 3, 5);
    let (mut dw, mut db) = (vec![0.0; 20], vec![9.0; 5]);
    let dx = linear_backward(x.view(), w.view(), r.view(), &mut dw, &mut db);
    close(
        dx.as_slice().unwrap(),
        numeric(&x, &r, |x| linear(x.view(), w.view(), b.view()))
            .as_slice()
            .unwrap(),
        "dx",
    );
    close(
        &dw,
        numeric(&w, &r, |w| linear(x.view(), w.view(), b.view()))
            .as_slice()
            .unwrap(),
        "dw",
    );
    close(&db, &r.sum_axis(ndarray::Axis(0)).to_vec(), "db");
}

#[test]
fn cross_entropy_and_its_gradient() {
    let mut rng = SplitMix64::new(4);
    let logits = random(&mut rng, 3, 5) * 3.0;
    let targets = [4, 0, 2];
    let loss = |l: &Array2<f64>| cross_entropy(&mut l.clone(), &targets, None);
    let want: f64 = logits
        .rows()
        .into_iter()
        .zip(&targets)
        .map(|(row, &t)| row.iter().map(|v| v.exp()).sum::<f64>().ln() - row[t])
        .sum();
    assert!((loss(&logits) - want).abs() < 1e-12);
    let mut grad = logits.clone();
    let total = cross_entropy(&mut grad, &targets, Some(0.5));
    assert!((total - want).abs() < 1e-12);
    let numeric = numeric(&logits, &Array2::ones((1, 1)), |l| {
        Array2::from_elem((1, 1), loss(l) * 0.5)
    });
    close(
        grad.as_slice().unwrap(),
        numeric.as_slice().unwrap(),
        "dlogits",
    );
}

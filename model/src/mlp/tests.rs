use ndarray::Array2;

use super::*;

fn random_batch(
    rng: &mut SplitMix64,
    n: usize,
    d: usize,
    classes: usize,
) -> (Array2<f64>, Vec<u8>) {
    let x = Array2::from_shape_fn((n, d), |_| rng.next_f64() * 2.0 - 1.0);
    let labels = (0..n).map(|_| rng.below(classes) as u8).collect();
    (x, labels)
}

/// Analytic gradients against central finite differences, in f64, on every parameter.
#[test]
fn gradient_check_against_central_differences() {
    let mlp = Mlp::new(&[6, 5, 4, 3]).expect("valid");
    let mut rng = SplitMix64::new(11);
    let mut params: Vec<f64> = mlp.init(5);
    // Non-zero biases so their gradients are exercised away from the init.
    for p in params.iter_mut() {
        *p += (rng.next_f64() - 0.5) * 0.2;
    }
    let (x, labels) = random_batch(&mut rng, 8, 6, 3);
    let (_, analytic) = mlp.loss_and_grad(&params, x.view(), &labels).expect("ok");

    let eps = 1e-6;
    let mut worst: f64 = 0.0;
    for i in 0..params.len() {
        let mut plus = params.clone();
        plus[i] += eps;
        let mut minus = params.clone();
        minus[i] -= eps;
        let lp = mlp.loss_and_grad(&plus, x.view(), &labels).expect("ok").0;
        let lm = mlp.loss_and_grad(&minus, x.view(), &labels).expect("ok").0;
        let numeric = (lp - lm) / (2.0 * eps);
        let denom = analytic[i].abs().max(numeric.abs()).max(1e-8);
        let rel = (analytic[i] - numeric).abs() / denom;
        // Tiny gradients are dominated by cancellation; judge them absolutely.
        let err = if denom < 1e-6 {
            (analytic[i] - numeric).abs()
        } else {
            rel
        };
        worst = worst.max(err);
    }
    assert!(worst < 1e-3, "max relative error {worst}");
}

#[test]
fn the_f32_path_agrees_with_the_f64_path() {
    let mlp = Mlp::new(&[6, 5, 3]).expect("valid");
    let mut rng = SplitMix64::new(1);
    let (x, labels) = random_batch(&mut rng, 4, 6, 3);
    let p64: Vec<f64> = mlp.init(9);
    let p32: Vec<f32> = mlp.init(9);
    let (l64, g64) = mlp.loss_and_grad(&p64, x.view(), &labels).expect("ok");
    let (l32, g32) = mlp
        .loss_and_grad(&p32, x.mapv(|v| v as f32).view(), &labels)
        .expect("ok");
    assert!((l64 - f64::from(l32)).abs() < 1e-5);
    for (a, b) in g64.iter().zip(&g32) {
        assert!((a - f64::from(*b)).abs() < 1e-5);
    }
}

#[test]
fn init_is_deterministic_and_he_scaled() {
    let mlp = Mlp::new(&[784, 128, 10]).expect("valid");
    assert_eq!(mlp.param_count(), 784 * 128 + 128 + 128 * 10 + 10);
    let a: Vec<f32> = mlp.init(42);
    assert_eq!(a, mlp.init::<f32>(42));
    assert_ne!(a, mlp.init::<f32>(43));
    let bound = (6.0f32 / 784.0).sqrt();
    let w0 = &a[mlp.layout().tensors()[0].range()];
    assert!(w0.iter().all(|w| w.abs() <= bound));
    assert!(a[mlp.layout().tensors()[1].range()]
        .iter()
        .all(|&b| b == 0.0));
    let names: Vec<_> = mlp
        .layout()
        .tensors()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(names, ["l0.weight", "l0.bias", "l1.weight", "l1.bias"]);
}

#[test]
fn shapes_are_checked() {
    assert_eq!(Mlp::new(&[3]), Err(ModelError::TooFewLayers(1)));
    assert_eq!(
        Mlp::new(&[3, 0, 2]),
        Err(ModelError::ZeroWidth { index: 1 })
    );
    let mlp = Mlp::new(&[3, 2]).expect("valid");
    let x = Array2::<f32>::zeros((2, 3));
    assert!(matches!(
        mlp.loss_and_grad(&[0.0f32; 7], x.view(), &[0, 1]),
        Err(ModelError::ShapeMismatch {
            what: "parameters",
            ..
        })
    ));
    let wrong_x = Array2::<f32>::zeros((2, 4));
    assert!(matches!(
        mlp.forward(&[0.0f32; 8], wrong_x.view()),
        Err(ModelError::ShapeMismatch {
            what: "input features",
            ..
        })
    ));
    let empty = Array2::<f32>::zeros((0, 3));
    assert_eq!(
        mlp.forward(&[0.0f32; 8], empty.view()),
        Err(ModelError::EmptyBatch)
    );
}

use ndarray::Array2;

use super::*;
use crate::spec::LayerSpec;

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

/// Analytic gradients against central finite differences, in f64, on every parameter (and,
/// through the layers before, on every layer's input gradient). Returns the worst error.
fn gradient_check(spec: NetSpec, classes: usize) -> f64 {
    gradient_check_every(spec, classes, 1)
}

/// [`gradient_check`] on every `step`-th parameter.
fn gradient_check_every(spec: NetSpec, classes: usize, step: usize) -> f64 {
    let net = Network::new(spec, classes).expect("valid spec");
    let mut rng = SplitMix64::new(11);
    let mut params: Vec<f64> = net.init(5);
    for p in params.iter_mut() {
        *p += (rng.next_f64() - 0.5) * 0.2;
    }
    let (x, labels) = random_batch(&mut rng, 5, net.inputs(), classes);
    let seed = batch_seed(3, 40);
    let (_, analytic) = net
        .loss_and_grad(&params, x.view(), &labels, seed)
        .expect("ok");
    let loss = |p: &[f64]| net.loss_and_grad(p, x.view(), &labels, seed).expect("ok").0;
    let eps = 1e-6;
    let mut worst: f64 = 0.0;
    for i in (0..params.len()).step_by(step) {
        let mut plus = params.clone();
        plus[i] += eps;
        let mut minus = params.clone();
        minus[i] -= eps;
        let numeric = (loss(&plus) - loss(&minus)) / (2.0 * eps);
        let denom = analytic[i].abs().max(numeric.abs());
        // Tiny gradients are dominated by cancellation; judge them absolutely.
        let err = if denom < 1e-6 {
            (analytic[i] - numeric).abs()
        } else {
            (analytic[i] - numeric).abs() / denom
        };
        worst = worst.max(err);
    }
    worst
}

fn spec(text: &str) -> NetSpec {
    text.parse().expect("valid spec text")
}

#[test]
fn dense_gradient_check() {
    assert!(gradient_check(spec("input 6; dense 5; dense 3"), 3) < 1e-6);
}

#[test]
fn relu_tanh_gelu_gradient_checks() {
    for act in ["relu", "tanh", "gelu"] {
        let worst = gradient_check(spec(&format!("input 6; dense 5; {act}; dense 3")), 3);
        assert!(worst < 1e-5, "{act}: {worst}");
    }
}

#[test]
fn conv2d_gradient_check_with_stride_and_padding() {
    for (k, s, p) in [(3, 1, 0), (3, 2, 1), (2, 1, 1), (1, 1, 0)] {
        let text = format!("input 2x5x6; conv2d 3 k{k} s{s} p{p}; flatten; dense 4");
        let worst = gradient_check(spec(&text), 4);
        assert!(worst < 1e-5, "{text}: {worst}");
    }
}

#[test]
fn max_and_avg_pool_gradient_checks() {
    for pool in ["maxpool 2", "maxpool 3 s2", "avgpool 2", "avgpool 3 s1"] {
        let text = format!("input 2x6x7; conv2d 2 k1; {pool}; dense 3");
        let worst = gradient_check(spec(&text), 3);
        assert!(worst < 1e-5, "{text}: {worst}");
    }
}

#[test]
fn dropout_gradient_check_and_determinism() {
    let text = "input 8; dense 6; relu; dropout 0.5; dense 3";
    assert!(gradient_check(spec(text), 3) < 1e-6);
    let net = Network::new(spec(text), 3).expect("valid");
    let p: Vec<f32> = net.init(2);
    let x = Array2::from_shape_fn((4, 8), |(i, j)| (i * 8 + j) as f32 / 32.0);
    let labels = [0, 1, 2, 0];
    let g = |seed| {
        net.loss_and_grad(&p, x.view(), &labels, seed)
            .expect("ok")
            .1
    };
    assert_eq!(g(batch_seed(1, 0)), g(batch_seed(1, 0)));
    assert_ne!(g(batch_seed(1, 0)), g(batch_seed(2, 0)));
    assert_ne!(g(batch_seed(1, 0)), g(batch_seed(1, 32)));
    // Evaluation does not drop anything: the logits equal the net without the dropout.
    let plain = Network::new(spec("input 8; dense 6; relu; dense 3"), 3).expect("valid");
    assert_eq!(
        net.forward(&p, x.view()).expect("ok"),
        plain.forward(&p, x.view()).expect("ok")
    );
}

#[test]
fn a_spec_using_every_layer_type_passes_the_gradient_check() {
    let text = "input 2x8x8; conv2d 4 k3 s1 p1; relu; maxpool 2; conv2d 3 k2 s1 p0; tanh; \
                avgpool 2 s1; flatten; dense 6; gelu; dropout 0.25; dense 3";
    let worst = gradient_check(spec(text), 3);
    assert!(worst < 1e-5, "{worst}");
}

#[test]
fn the_cnn_preset_passes_the_gradient_check_on_a_small_image() {
    // Every 13th of its 17,252 parameters (each costs two forward passes). Five layers
    // deep, central differences in f64 agree to about 2e-5 (a wrong backward is off by O(1)).
    let worst = gradient_check_every(NetSpec::cnn(Shape::new(1, 16, 16), 4), 4, 13);
    assert!(worst < 1e-4, "{worst}");
}

#[test]
fn the_f32_path_agrees_with_the_f64_path() {
    let net = Network::new(NetSpec::cnn(Shape::new(1, 28, 28), 10), 10).expect("valid");
    let mut rng = SplitMix64::new(1);
    let (x, labels) = random_batch(&mut rng, 3, 784, 10);
    let (p64, p32): (Vec<f64>, Vec<f32>) = (net.init(9), net.init(9));
    let (l64, g64) = net.loss_and_grad(&p64, x.view(), &labels, 1).expect("ok");
    let x32 = x.mapv(|v| v as f32);
    let (l32, g32) = net.loss_and_grad(&p32, x32.view(), &labels, 1).expect("ok");
    assert!((l64 - f64::from(l32)).abs() < 1e-5);
    for (a, b) in g64.iter().zip(&g32) {
        assert!((a - f64::from(*b)).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn frozen_layers_get_no_gradient_and_are_listed_as_untrained() {
    let mut s = spec("input 6; dense 5; relu; dense 4; relu; dense 3");
    let NetSpec::Chain(chain) = &mut s else {
        panic!("a chain")
    };
    chain.layers[0].frozen = true;
    let net = Network::new(s, 3).expect("valid");
    let p: Vec<f32> = net.init(1);
    let x = Array2::from_shape_fn((4, 6), |(i, j)| (i + j) as f32 / 10.0);
    let (_, g) = net
        .loss_and_grad(&p, x.view(), &[0, 1, 2, 0], 1)
        .expect("ok");
    let l0 = 0..6 * 5 + 5;
    assert!(g[l0.clone()].iter().all(|&v| v == 0.0));
    assert!(g[l0.end..].iter().any(|&v| v != 0.0));
    assert_eq!(net.trainable(), [l0.end..l0.end + 24, l0.end + 24..p.len()]);
}

#[test]
fn init_is_deterministic_he_scaled_and_named_per_layer_with_parameters() {
    let net = Network::new(NetSpec::mlp(Shape::new(1, 28, 28), &[128], 10), 10).expect("ok");
    assert_eq!(net.param_count(), 784 * 128 + 128 + 128 * 10 + 10);
    let a: Vec<f32> = net.init(42);
    assert_eq!(a, net.init::<f32>(42));
    assert_ne!(a, net.init::<f32>(43));
    let bound = (6.0f32 / 784.0).sqrt();
    assert!(a[net.layout().tensors()[0].range()]
        .iter()
        .all(|w| w.abs() <= bound));
    assert!(a[net.layout().tensors()[1].range()]
        .iter()
        .all(|&b| b == 0.0));
    let names: Vec<_> = net
        .layout()
        .tensors()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(names, ["l0.weight", "l0.bias", "l1.weight", "l1.bias"]);

    let cnn = Network::new(NetSpec::cnn(Shape::new(1, 28, 28), 10), 10).expect("ok");
    let shapes: Vec<_> = cnn
        .layout()
        .tensors()
        .iter()
        .map(|t| t.shape.clone())
        .collect();
    assert_eq!(
        shapes,
        [
            vec![16, 1, 5, 5],
            vec![16],
            vec![32, 16, 5, 5],
            vec![32],
            vec![512, 128],
            vec![128],
            vec![128, 10],
            vec![10]
        ]
    );
    let w1 = &cnn.init::<f32>(1)[cnn.layout().tensors()[2].range()];
    let bound = (6.0f32 / 400.0).sqrt();
    assert!(w1.iter().all(|w| w.abs() <= bound) && w1.iter().any(|w| w.abs() > bound / 2.0));
}

#[test]
fn a_model_beyond_the_parameter_limit_is_refused_before_allocating() {
    let huge = spec("input 3x4000x4000; conv2d 4096 k3000; flatten; dense 10");
    let err = Network::new(huge, 10).expect_err("too large");
    assert!(
        err.to_string().contains("more than the limit of 67108864"),
        "{err}"
    );
    let overflow = spec("input 4096x1048576x1048576; conv2d 1048576 k1048576; flatten; dense 2");
    assert!(Network::new(overflow, 2).is_err());
}

#[test]
fn shapes_are_checked() {
    let net = Network::new(spec("input 3; dense 2"), 2).expect("valid");
    let x = Array2::<f32>::zeros((2, 3));
    assert!(matches!(
        net.loss_and_grad(&[0.0f32; 7], x.view(), &[0, 1], 0),
        Err(ModelError::ShapeMismatch {
            what: "parameters",
            ..
        })
    ));
    let wrong_x = Array2::<f32>::zeros((2, 4));
    assert!(matches!(
        net.forward(&[0.0f32; 8], wrong_x.view()),
        Err(ModelError::ShapeMismatch {
            what: "input features",
            ..
        })
    ));
    let empty = Array2::<f32>::zeros((0, 3));
    assert_eq!(
        net.forward(&[0.0f32; 8], empty.view()),
        Err(ModelError::EmptyBatch)
    );
    let _ = LayerSpec {
        layer: crate::Layer::Relu,
        frozen: false,
    };
}

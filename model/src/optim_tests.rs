//! The optimizers against their formulas, their finiteness check, and save/restore.

use super::*;

#[test]
fn sgd_and_momentum_match_their_formulas() {
    let mut p = vec![1.0, -2.0];
    Sgd { lr: 0.5 }.step(&mut p, &[2.0, 2.0]);
    assert_eq!(p, [0.0, -3.0]);

    let mut m = Momentum::new(0.1, 0.9, 1);
    let mut p = vec![0.0];
    m.step(&mut p, &[1.0]); // v = 1
    m.step(&mut p, &[1.0]); // v = 1.9
    assert!((p[0] - -(0.1 + 0.19)).abs() < 1e-7);
}

/// Nesterov against PyTorch's `SGD(nesterov=True)` written out: `v = μv + g`,
/// `p -= lr·(g + μv)`, in f64 by hand.
#[test]
fn nesterov_matches_its_formula() {
    let mut n = Nesterov(Momentum::new(0.7, 0.9, 2));
    let mut p = vec![1.0f32, -0.5];
    let (mut want, mut v) = ([1.0f64, -0.5], [0.0f64; 2]);
    for g in [[0.2f32, -0.1], [0.3, 0.05], [-0.1, 0.4]] {
        n.step(&mut p, &g);
        for i in 0..2 {
            v[i] = 0.9 * v[i] + f64::from(g[i]);
            want[i] -= 0.7 * (f64::from(g[i]) + 0.9 * v[i]);
        }
    }
    for (got, want) in p.iter().zip(want) {
        assert!((f64::from(*got) - want).abs() < 1e-6, "{got} vs {want}");
    }
    assert!(!n.would_stay_finite(&[f32::MAX, 0.0], &[-3e38, 0.0]));
}

#[test]
fn adam_first_step_moves_each_weight_by_lr() {
    // With bias correction, the first Adam step is lr · sign(g) (up to eps).
    let mut adam = Adam::new(0.01, 0.9, 0.999, 1e-8, 3);
    let mut p = vec![0.0, 0.0, 5.0];
    adam.step(&mut p, &[3.0, -0.001, 0.0]);
    assert!((p[0] - -0.01).abs() < 1e-6);
    assert!((p[1] - 0.01).abs() < 1e-5);
    assert_eq!(p[2], 5.0);
}

#[test]
fn a_step_that_would_overflow_is_seen_before_it_is_taken() {
    for kind in [
        OptimizerKind::Sgd { lr: 0.1 },
        OptimizerKind::Momentum {
            lr: 0.1,
            momentum: 0.9,
        },
        OptimizerKind::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    ] {
        let opt = kind.build(2);
        let params = [1.0f32, -1.0];
        assert!(opt.would_stay_finite(&params, &[0.5, 0.5]), "{kind:?}");
        // 3e38 squared overflows Adam's second moment; times lr it still fits SGD, so
        // push SGD over with parameters already near the top of f32.
        assert!(
            !opt.would_stay_finite(&[f32::MAX, 0.0], &[-3e38, 0.0]),
            "{kind:?}"
        );
        assert!(
            !opt.would_stay_finite(&params, &[f32::NAN, 0.0]),
            "{kind:?}"
        );
    }
    let adam = OptimizerKind::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    }
    .build(1);
    assert!(!adam.would_stay_finite(&[0.0], &[3e38]), "g² overflows v");
}

/// One of each optimizer, with rates that minimise a small quadratic.
fn kinds() -> [OptimizerKind; 4] {
    [
        OptimizerKind::Sgd { lr: 0.1 },
        OptimizerKind::Momentum {
            lr: 0.05,
            momentum: 0.9,
        },
        OptimizerKind::Nesterov {
            lr: 0.05,
            momentum: 0.9,
        },
        OptimizerKind::Adam {
            lr: 0.05,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    ]
}

/// Stepping, saving, restoring into a fresh optimizer and stepping on gives exactly the
/// parameters of never stopping; a state of another shape is refused.
#[test]
fn a_restored_optimizer_continues_bit_for_bit() {
    for kind in kinds() {
        let grad = |p: &[f32], i: usize| -> Vec<f32> {
            p.iter().map(|v| v * (1.0 + i as f32 * 0.1) - 0.3).collect()
        };
        let (mut straight, mut p) = (kind.build(3), vec![3.0f32, -4.0, 0.5]);
        let mut stopped = kind.build(3);
        let mut q = p.clone();
        for i in 0..5 {
            let g = grad(&p, i);
            straight.step(&mut p, &g);
            let g = grad(&q, i);
            stopped.step(&mut q, &g);
        }
        let mut resumed = kind.build(3);
        resumed.restore(stopped.state()).expect("same optimizer");
        for i in 5..12 {
            let g = grad(&p, i);
            straight.step(&mut p, &g);
            let g = grad(&q, i);
            resumed.step(&mut q, &g);
        }
        assert_eq!(
            p.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            q.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{kind:?}"
        );
        if kind != (OptimizerKind::Sgd { lr: 0.1 }) {
            let err = kind.build(4).restore(straight.state()).expect_err("length");
            assert!(
                err.to_string().contains("has 3 values, the model 4"),
                "{err}"
            );
        }
    }
    let adam = OptimizerKind::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    let momentum = OptimizerKind::Momentum {
        lr: 0.1,
        momentum: 0.9,
    };
    let err = adam
        .build(2)
        .restore(momentum.build(2).state())
        .expect_err("another optimizer");
    assert!(
        err.to_string().contains("expected tensors [\"m\", \"v\"]"),
        "{err}"
    );
    let mut nan = adam.build(2).state();
    nan.tensors[0].1[1] = f32::NAN;
    assert!(adam.build(2).restore(nan).is_err());
}

#[test]
fn every_optimizer_minimises_a_quadratic() {
    for kind in kinds() {
        let mut opt = kind.build(2);
        let mut p = vec![3.0f32, -4.0];
        for _ in 0..500 {
            let g = p.clone(); // gradient of |p|²/2
            opt.step(&mut p, &g);
        }
        assert!(p.iter().all(|v| v.abs() < 1e-2), "{kind:?}: {p:?}");
    }
}

use ndarray::Array2;

use super::*;
use crate::network::ties::TIE_MARGIN;
use crate::rng::SplitMix64;
use crate::spec::{NetSpec, Shape};

/// The largest difference between two gradients, over the larger one's norm.
fn apart(a: &[f32], b: &[f32]) -> f64 {
    let norm = a.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
    let off = a
        .iter()
        .zip(b)
        .map(|(&a, &b)| f64::from(a - b).powi(2))
        .sum::<f64>()
        .sqrt();
    off / norm
}

fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&v| f64::from(v)).collect()
}

fn to32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&v| v as f32).collect()
}

/// An MLP, a batch, and weights where hidden unit `unit` of sample 0 takes one branch in
/// f32 and the other in f64 (two float orders of the same weights: a GPU's and the
/// verifier's), found by moving the unit's bias an ulp at a time across its tie.
fn split_unit() -> (Network, Array2<f32>, [u8; 4], Vec<f32>, usize) {
    let net = Network::new(NetSpec::mlp(Shape::flat(64), &[8], 3), 3).expect("model");
    let mut rng = SplitMix64::new(3);
    let x = Array2::from_shape_fn((4, 64), |_| rng.next_f64() as f32 * 2.0 - 1.0);
    let labels = [0u8, 1, 2, 1];
    let base: Vec<f32> = net.init(7);
    let input32 = |p: &[f32]| {
        net.chain()
            .expect("a chain")
            .forward_all(p, x.view(), None, Part::whole(4))[0]
            .clone()
    };
    let x64 = x.mapv(f64::from);
    let input64 = |p: &[f32]| {
        net.chain()
            .expect("a chain")
            .forward_all(&to64(p), x64.view(), None, Part::whole(4))[0]
            .clone()
    };
    for unit in 0..8 {
        let bias = 64 * 8 + unit;
        let mut params = base.clone();
        params[bias] -= input32(&params)[[0, unit]];
        for _ in 0..400 {
            let (a, b) = (input32(&params)[[0, unit]], input64(&params)[[0, unit]]);
            if (a > 0.0) != (b > 0.0) {
                return (net, x, labels, params, unit);
            }
            // Toward the f64 tie, an ulp at a time.
            let ulp = f32::from_bits(params[bias].to_bits() + 1) - params[bias];
            params[bias] -= ulp.abs().max(f32::MIN_POSITIVE) * b.signum() as f32;
        }
    }
    panic!("no unit whose branch f32 and f64 rounding split");
}

/// The f64 pass (the worker) takes the other branch at one unit: its logged branch,
/// forced on the f32 replay, gives the worker's gradient within rounding; unforced, the
/// replay is far from it.
#[test]
fn a_logged_relu_branch_forced_gives_the_workers_gradient() {
    let (net, x, labels, params, unit) = split_unit();
    let x64 = x.mapv(f64::from);
    let logged = net.branches(&to64(&params), x64.view(), 1).expect("log");
    let ours = Branch {
        layer: 1,
        row: 0,
        col: unit as u32,
        taken: u32::from(
            net.chain().expect("a chain").forward_all(
                &to64(&params),
                x64.view(),
                None,
                Part::whole(4),
            )[0][[0, unit]]
                > 0.0,
        ),
    };
    assert!(logged.contains(&ours), "{logged:?} lacks {ours:?}");
    assert!(logged.len() <= 4, "few near-ties: {logged:?}");
    let (_, worker) = net
        .loss_and_grad(&to64(&params), x64.view(), &labels, 1)
        .expect("grads");
    let worker = to32(&worker);
    let (_, plain) = net
        .loss_and_grad(&params, x.view(), &labels, 1)
        .expect("grads");
    let (_, replay, forced) = net
        .loss_and_grad_forced(&params, x.view(), &labels, 1, &logged)
        .expect("grads");
    assert_eq!(forced.refused, None);
    assert_eq!(forced.followed, 1, "{forced:?}");
    assert!(forced.widest <= TIE_MARGIN, "{forced:?}");
    let (unforced, forced_off) = (apart(&worker, &plain), apart(&worker, &replay));
    assert!(unforced > 1e-3, "the branch matters: {unforced:e}");
    assert!(forced_off < 1e-6, "forced, within rounding: {forced_off:e}");
    // Nothing logged: the replay is the plain gradient, bit for bit.
    let (_, same, none) = net
        .loss_and_grad_forced(&params, x.view(), &labels, 1, &[])
        .expect("grads");
    assert_eq!((same, none), (plain, Forced::default()));
}

/// A branch rounding cannot explain is refused: a unit far from its tie, a layer without
/// branches, a unit out of range, and more than a step logs.
#[test]
fn a_branch_far_from_a_tie_or_not_a_branch_is_refused() {
    let (net, x, labels, params, unit) = split_unit();
    let outs = net
        .chain()
        .expect("a chain")
        .forward_all(&params, x.view(), None, Part::whole(4));
    // Another sample's unit, far from zero: log the other side of it.
    let far = outs[0][[1, unit]];
    assert!(far.abs() > 1e-3);
    let other = Branch {
        layer: 1,
        row: 1,
        col: unit as u32,
        taken: u32::from(far <= 0.0),
    };
    let refusal = |logged: &[Branch]| {
        net.loss_and_grad_forced(&params, x.view(), &labels, 1, logged)
            .expect("grads")
            .2
            .refused
    };
    assert!(
        matches!(refusal(&[other]), Some((b, Refusal::Far(m))) if b == other && m > FORCE_MARGIN)
    );
    let dense = Branch { layer: 0, ..other };
    assert_eq!(refusal(&[dense]), Some((dense, Refusal::NotABranch)));
    let outside = Branch { col: 8, ..other };
    assert_eq!(refusal(&[outside]), Some((outside, Refusal::NotABranch)));
    let agreed = Branch {
        taken: u32::from(far > 0.0),
        ..other
    };
    assert_eq!(refusal(&[agreed]), None, "the replay's own branch");
    let many = vec![agreed; MAX_BRANCHES + 1];
    assert_eq!(refusal(&many), Some((agreed, Refusal::TooMany)));
}

/// A max-pool window whose two largest values are 1e-6 apart: the worker's route to the
/// smaller, logged and forced, gives the gradient of the input where it is the larger.
#[test]
fn a_logged_pool_route_is_forced() {
    let (net, params, sample) = crate::network::ties::tests::two_pixel_pool();
    let labels = [2u8];
    let ours = net.branches(&params, sample(1e-6).view(), 1).expect("log");
    assert_eq!(
        ours,
        [Branch {
            layer: 1,
            row: 0,
            col: 0,
            taken: 1
        }]
    );
    // The worker whose pixel 0 won, as at d = −1e-6.
    let theirs = net.branches(&params, sample(-1e-6).view(), 1).expect("log");
    assert_eq!(theirs[0].taken, 0);
    let (_, worker) = net
        .loss_and_grad(&params, sample(-1e-6).view(), &labels, 1)
        .expect("grads");
    let (_, plain) = net
        .loss_and_grad(&params, sample(1e-6).view(), &labels, 1)
        .expect("grads");
    let (_, replay, forced) = net
        .loss_and_grad_forced(&params, sample(1e-6).view(), &labels, 1, &theirs)
        .expect("grads");
    assert_eq!((forced.followed, forced.refused), (1, None), "{forced:?}");
    assert!(apart(&worker, &plain) > 1e-3);
    assert!(
        apart(&worker, &replay) < 1e-5,
        "{}",
        apart(&worker, &replay)
    );
}

/// The log of activations computed elsewhere is the log of the same pass here, and
/// activations of another shape are refused.
#[test]
fn branches_in_reads_another_executors_activations() {
    let (net, x, _, params, _) = split_unit();
    let outs =
        net.chain()
            .expect("a chain")
            .forward_all(&params, x.view(), Some(1), Part::whole(4));
    assert_eq!(
        net.branches_in(x.view(), &outs).expect("log"),
        net.branches(&params, x.view(), 1).expect("log")
    );
    assert!(net.branches_in(x.view(), &outs[1..]).is_err());
    assert!(net
        .branches_in(x.slice(ndarray::s![.., 1..]), &outs)
        .is_err());
    let mut short = outs.clone();
    short[0] = Array2::zeros((3, 8));
    assert!(net.branches_in(x.view(), &short).is_err());
}

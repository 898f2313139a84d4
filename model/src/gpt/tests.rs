use ndarray::Array2;

use super::*;

fn tiny() -> Gpt {
    Gpt::new(GptSpec {
        vocab: 7,
        context: 5,
        layers: 2,
        heads: 2,
        width: 8,
    })
    .unwrap()
}

fn windows(gpt: &Gpt, samples: usize, seed: u64) -> Array2<f64> {
    let mut rng = SplitMix64::new(seed);
    let t = gpt.spec().context + 1;
    Array2::from_shape_simple_fn((samples, t), || rng.below(gpt.spec().vocab) as f64)
}

/// Randomises every parameter (biases and gains too), so no gradient is trivially zero.
fn random_params(gpt: &Gpt, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    (0..gpt.layout().total())
        .map(|_| (rng.next_f64() * 2.0 - 1.0) * 0.5)
        .collect()
}

#[test]
fn the_layout_has_gpt2s_names_and_counts() {
    let gpt = tiny();
    let names: Vec<_> = gpt
        .layout()
        .tensors()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(
        names[..4],
        [
            "wte.weight",
            "wpe.weight",
            "h.0.ln_1.weight",
            "h.0.ln_1.bias"
        ]
    );
    assert_eq!(names[names.len() - 2..], ["ln_f.weight", "ln_f.bias"]);
    assert_eq!(gpt.layout().total(), gpt.spec().param_count().unwrap());
    // nanoGPT's configurations, with the 65 characters of Tiny Shakespeare, count as it does
    // (its count leaves out the position embedding).
    let cpu = Gpt::new(GptSpec::cpu(65)).unwrap();
    assert_eq!(cpu.layout().total() - 64 * 128, 801_664); // "0.80M"
    let big = GptSpec::shakespeare_char(65);
    assert_eq!(big.param_count().unwrap() - 256 * 384, 10_672_512); // "10.65M"
}

#[test]
fn the_gradient_of_the_whole_model_is_the_differences() {
    let gpt = tiny();
    let params = random_params(&gpt, 5);
    let x = windows(&gpt, 3, 6);
    let batch = 4; // the rows are a part of a larger batch
    let loss = |p: &[f64]| {
        let acts = gpt.forward(p, x.view(), true).unwrap();
        gpt.loss_sum_and_correct(&acts).0 / (batch * gpt.spec().context) as f64
    };
    let mut grads = Vec::new();
    let acts = gpt.forward(&params, x.view(), true).unwrap();
    let l = gpt.backward(&params, acts, batch, &mut grads).unwrap();
    assert!((l - loss(&params)).abs() < 1e-12);
    let h = 1e-6;
    for spec in gpt.layout().tensors() {
        let mut worst = 0.0f64;
        for i in spec.range() {
            let (mut up, mut down) = (params.clone(), params.clone());
            up[i] += h;
            down[i] -= h;
            let numeric = (loss(&up) - loss(&down)) / (2.0 * h);
            worst = worst.max((grads[i] - numeric).abs());
        }
        assert!(worst < 1e-8, "{}: off by {worst}", spec.name);
    }
}

/// The key bias is inert: its gradient is zero but for rounding, and moving it changes no
/// logit beyond rounding (a query's scores all move by the same amount, which the softmax
/// does not see); every other tensor's gradient is not. Adam, which divides a gradient by
/// its own running size, turns that rounding into steps of up to its learning rate, so
/// these values end a phase computed in another float order wherever rounding sent them.
#[test]
fn the_key_bias_changes_nothing_the_model_computes() {
    let gpt = tiny();
    let params = random_params(&gpt, 5);
    let x = windows(&gpt, 3, 6);
    let mut grads = Vec::new();
    let acts = gpt.forward(&params, x.view(), true).unwrap();
    gpt.backward(&params, acts, 3, &mut grads).unwrap();
    // Each block's key bias: the middle third of `attn.c_attn.bias`.
    let c = gpt.spec().width;
    let inert: Vec<_> = gpt
        .layout()
        .tensors()
        .iter()
        .filter(|t| t.name.ends_with("attn.c_attn.bias"))
        .map(|t| t.offset + c..t.offset + 2 * c)
        .collect();
    assert_eq!(inert.len(), 2);
    let largest = grads.iter().fold(0.0f64, |m, g| m.max(g.abs()));
    let mut moved = params.clone();
    for range in &inert {
        assert_eq!(range.len(), 8);
        for i in range.clone() {
            assert!(grads[i].abs() < 1e-12 * largest, "{i}: {}", grads[i]);
            moved[i] += 0.3;
        }
    }
    let a = gpt.forward(&params, x.view(), true).unwrap().logits;
    let b = gpt.forward(&moved, x.view(), true).unwrap().logits;
    let off = a
        .iter()
        .zip(&b)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(off < 1e-12, "{off}");
    for spec in gpt.layout().tensors() {
        let live = spec
            .range()
            .filter(|i| !inert.iter().any(|r| r.contains(i)));
        let size = live.map(|i| grads[i].abs()).fold(0.0, f64::max);
        assert!(size > 1e-6 * largest, "{}: {size}", spec.name);
    }
}

#[test]
fn a_later_token_never_moves_an_earlier_prediction() {
    let gpt = tiny();
    let params = gpt.init::<f32>(1);
    let x = windows(&gpt, 1, 2).mapv(|v| v as f32);
    let mut changed = x.clone();
    changed[[0, 3]] = ((x[[0, 3]] as usize + 1) % 7) as f32;
    let a = gpt.forward(&params, x.view(), true).unwrap().logits;
    let b = gpt.forward(&params, changed.view(), true).unwrap().logits;
    assert_eq!(a.slice(ndarray::s![..3, ..]), b.slice(ndarray::s![..3, ..]));
    assert_ne!(a.slice(ndarray::s![3, ..]), b.slice(ndarray::s![3, ..]));
}

#[test]
fn windows_must_hold_token_ids() {
    let gpt = tiny();
    let params = gpt.init::<f32>(1);
    for bad in [7.0, -1.0, 2.5, f32::NAN] {
        let mut x = Array2::<f32>::zeros((2, 6));
        x[[1, 2]] = bad;
        let err = gpt.forward(&params, x.view(), true).unwrap_err();
        assert_eq!(
            err,
            crate::ModelError::TokenOutOfRange { index: 8, vocab: 7 },
            "{bad}"
        );
    }
    let short = Array2::<f32>::zeros((2, 5));
    assert!(gpt.forward(&params, short.view(), true).is_err());
}

#[test]
fn initialisation_follows_gpt2() {
    let gpt = Gpt::new(GptSpec::cpu(65)).unwrap();
    let p = gpt.init::<f32>(7);
    assert_eq!(p, gpt.init::<f32>(7));
    let t = |name: &str| {
        gpt.layout()
            .tensors()
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .range()
    };
    let std = |r: std::ops::Range<usize>| {
        let v = &p[r];
        (v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
    };
    assert!((std(t("wte.weight")) - 0.02).abs() < 0.001);
    assert!((std(t("h.0.mlp.c_proj.weight")) - 0.02 / 8f64.sqrt()).abs() < 0.0005);
    assert!(p[t("h.1.ln_2.weight")].iter().all(|&v| v == 1.0));
    assert!(p[t("h.1.attn.c_attn.bias")].iter().all(|&v| v == 0.0));
    assert!(Gpt::decays("h.0.attn.c_attn.weight") && !Gpt::decays("h.0.ln_1.weight"));
    assert!(!Gpt::decays("wte.weight") && !Gpt::decays("h.2.mlp.c_fc.bias"));
}

//! crowdtrain's GPT against PyTorch's GPT-2 (Hugging Face `transformers`), as llm.c's
//! `test_gpt2`: the fixture `tests/fixtures/gpt2-tiny` (written once by
//! `scripts/fixtures/gpt2_fixture.py`) holds a random GPT-2 and PyTorch's logits, loss and
//! every parameter's gradient on one batch, then the losses of five AdamW steps; the model
//! here must compute the same.

use model::gpt::GptSpec;
use model::{clip_global_norm, NetSpec, Network, OptimizerKind};
use ndarray::Array2;
use safetensors::SafeTensors;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt2-tiny");

fn floats(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The largest `|a − b| / (tol_abs + tol_rel · |b|)`: at most 1 passes.
fn worst(a: &[f32], b: &[f32], abs: f32, rel: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (abs + rel * y.abs()))
        .fold(0.0, f32::max)
}

/// The fixture's network, its parameters in crowdtrain's layout (GPT-2's names and
/// shapes), its batch of 3 windows of 17 token ids, and PyTorch's results.
fn fixture() -> (Network, Vec<f32>, Array2<f32>, Vec<u8>) {
    let weights = std::fs::read(format!("{DIR}/model.safetensors")).unwrap();
    let weights = SafeTensors::deserialize(&weights).unwrap();
    let bytes = std::fs::read(format!("{DIR}/expected.safetensors")).unwrap();
    let expected = SafeTensors::deserialize(&bytes).unwrap();
    let spec = GptSpec {
        vocab: 50,
        context: 16,
        layers: 2,
        heads: 4,
        width: 32,
    };
    let net = Network::new(NetSpec::gpt(spec), 50).unwrap();
    // The parameters in crowdtrain's layout, which is GPT-2's names and shapes.
    let mut params = Vec::new();
    for t in net.layout().tensors() {
        let values = floats(&weights, &format!("transformer.{}", t.name));
        assert_eq!(values.len(), t.len(), "{}", t.name);
        params.extend(values);
    }
    let ids = floats(&expected, "ids");
    let x = Array2::from_shape_vec((3, 17), ids).unwrap();
    (net, params, x, bytes)
}

#[test]
fn logits_loss_and_every_gradient_match_pytorch() {
    let (net, params, x, expected) = fixture();
    let expected = SafeTensors::deserialize(&expected).unwrap();

    let logits = net.forward(&params, x.view()).unwrap();
    let want = floats(&expected, "logits");
    let w = worst(logits.as_slice().unwrap(), &want, 1e-5, 1e-4);
    eprintln!("logits: {w:.3} of the tolerance");
    assert!(w <= 1.0, "logits: {w} of the tolerance (1e-5 + 1e-4 · |v|)");

    let (loss, grads) = net.loss_and_grad(&params, x.view(), &[0; 3], 0).unwrap();
    let want_loss = floats(&expected, "loss")[0];
    eprintln!("loss {loss} against PyTorch's {want_loss}");
    assert!(
        (loss - want_loss).abs() < 1e-5,
        "loss {loss} against PyTorch's {want_loss}"
    );

    for t in net.layout().tensors() {
        let want = floats(&expected, &format!("grad.{}", t.name));
        let w = worst(&grads[t.range()], &want, 1e-6, 1e-3);
        eprintln!("{}: {w:.3} of the tolerance", t.name);
        assert!(
            w <= 1.0,
            "{}: {w} of the tolerance (1e-6 + 1e-3 · |g|)",
            t.name
        );
    }
}

/// llm.c's `test_gpt2` ends with a few optimizer steps: here five of AdamW (lr 1e-2, β
/// 0.9/0.99, ε 1e-8, decay 0.1 on the blocks' matrices, the global norm clipped at 1) on the
/// same batch, each step's loss against PyTorch's within 1e-4.
#[test]
fn five_adamw_steps_lose_what_pytorch_loses() {
    let (net, mut params, x, expected) = fixture();
    let expected = SafeTensors::deserialize(&expected).unwrap();
    let want = floats(&expected, "adamw_losses");
    let kind = OptimizerKind::AdamW {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = kind.build_masked(params.len(), net.decayed());
    for (step, want) in want.iter().enumerate() {
        let (loss, mut grads) = net.loss_and_grad(&params, x.view(), &[0; 3], 0).unwrap();
        eprintln!("step {step}: loss {loss} against PyTorch's {want}");
        assert!(
            (loss - want).abs() < 1e-4,
            "step {step}: loss {loss} against PyTorch's {want}"
        );
        clip_global_norm(&mut grads, 1.0);
        opt.step(&mut params, &grads);
    }
}

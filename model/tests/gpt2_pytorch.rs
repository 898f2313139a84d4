//! crowdtrain's GPT against PyTorch's GPT-2 (Hugging Face `transformers`), as llm.c's
//! `test_gpt2`: the fixture `tests/fixtures/gpt2-tiny` (written once by
//! `scripts/fixtures/gpt2_fixture.py`) holds a random GPT-2 and PyTorch's logits, loss and
//! every parameter's gradient on one batch; the model here must compute the same.

use model::gpt::GptSpec;
use model::{NetSpec, Network};
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

#[test]
fn logits_loss_and_every_gradient_match_pytorch() {
    let weights = std::fs::read(format!("{DIR}/model.safetensors")).unwrap();
    let weights = SafeTensors::deserialize(&weights).unwrap();
    let expected = std::fs::read(format!("{DIR}/expected.safetensors")).unwrap();
    let expected = SafeTensors::deserialize(&expected).unwrap();
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

use super::*;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../model/tests/fixtures/gpt2-tiny"
);

fn floats(bytes: &[u8], name: &str) -> Vec<f32> {
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn a_directory_saved_by_transformers_computes_pytorchs_logits_and_round_trips() {
    let (spec, params) = read_dir(Path::new(FIXTURE)).unwrap();
    assert_eq!(
        spec,
        GptSpec {
            vocab: 50,
            context: 16,
            layers: 2,
            heads: 4,
            width: 32
        }
    );
    let net = Network::new(model::NetSpec::gpt(spec), 50).unwrap();
    let expected = std::fs::read(format!("{FIXTURE}/expected.safetensors")).unwrap();
    let x = ndarray::Array2::from_shape_vec((3, 17), floats(&expected, "ids")).unwrap();
    let logits = net.forward(&params, x.view()).unwrap();
    let want = floats(&expected, "logits");
    let worst = logits
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-4, "logits {worst} from PyTorch's");

    // Written back: the same shape, the same values, and each tensor's bytes those that
    // `save_pretrained` wrote, under the same names.
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path(), &net, &params).unwrap();
    let (again_spec, again) = read_dir(dir.path()).unwrap();
    assert_eq!((again_spec, &again), (spec, &params));
    let ours = std::fs::read(dir.path().join(WEIGHTS)).unwrap();
    let theirs = std::fs::read(format!("{FIXTURE}/{WEIGHTS}")).unwrap();
    let (ours_st, theirs_st) = (
        safetensors::SafeTensors::deserialize(&ours).unwrap(),
        safetensors::SafeTensors::deserialize(&theirs).unwrap(),
    );
    let mut names = ours_st.names();
    names.sort();
    let mut their_names = theirs_st.names();
    their_names.sort();
    assert_eq!(names, their_names);
    for name in names {
        let (a, b) = (
            ours_st.tensor(name).unwrap(),
            theirs_st.tensor(name).unwrap(),
        );
        assert_eq!((a.shape(), a.data()), (b.shape(), b.data()), "{name}");
    }
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(CONFIG)).unwrap()).unwrap();
    assert_eq!(
        (config["n_embd"].as_u64(), config["n_positions"].as_u64()),
        (Some(32), Some(16))
    );
}

#[test]
fn what_crowdtrain_does_not_compute_is_refused_by_name() {
    let base = std::fs::read_to_string(format!("{FIXTURE}/{CONFIG}")).unwrap();
    let p = Path::new("config.json");
    assert!(parse_config(p, &base).is_ok());
    for (from, to, says) in [
        ("\"gelu_new\"", "\"relu\"", "activation_function"),
        ("\"n_inner\": null", "\"n_inner\": 100", "n_inner"),
        (
            "\"layer_norm_epsilon\": 1e-05",
            "\"layer_norm_epsilon\": 1e-06",
            "layer_norm_epsilon",
        ),
        ("\"n_head\": 4", "\"n_head\": 5", "heads"),
        (
            "\"model_type\": \"gpt2\"",
            "\"model_type\": \"llama\"",
            "model_type",
        ),
    ] {
        assert!(base.contains(from), "{from}");
        let err = parse_config(p, &base.replace(from, to))
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{err}");
    }
    // Weights: a tensor missing, misshapen, or an untied head.
    let (spec, params) = read_dir(Path::new(FIXTURE)).unwrap();
    let net = Network::new(model::NetSpec::gpt(spec), 50).unwrap();
    let bytes = le_bytes(&params);
    let t = net.layout().tensors();
    let file = |skip: usize, head: Option<&[u8]>| {
        let mut tensors: Vec<(&str, &[usize], &[u8])> = t
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .map(|(_, t)| {
                (
                    t.name.as_str(),
                    t.shape.as_slice(),
                    &bytes[t.offset * 4..(t.offset + t.len()) * 4],
                )
            })
            .collect();
        if let Some(head) = head {
            tensors.push(("lm_head.weight", t[0].shape.as_slice(), head));
        }
        tensors_file::encode(tensors, ("format", "pt".into()))
    };
    let err = read_weights(p, &file(3, None), &net)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("h.0.ln_1.bias") && err.contains("missing"),
        "{err}"
    );
    let tied = &bytes[..t[0].len() * 4];
    assert_eq!(
        read_weights(p, &file(usize::MAX, Some(tied)), &net).unwrap(),
        params
    );
    let untied = vec![0u8; tied.len()];
    let err = read_weights(p, &file(usize::MAX, Some(&untied)), &net)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not tied"), "{err}");
}

use super::*;

#[test]
fn the_text_form_round_trips_and_fills_defaults() {
    let cnn = NetSpec::cnn(Shape::new(1, 28, 28), 10);
    let text = cnn.to_string();
    assert_eq!(
        text,
        "input 1x28x28; conv2d 16 k5 s1 p0; relu; maxpool 2 s2; conv2d 32 k5 s1 p0; relu; \
         maxpool 2 s2; flatten; dense 128; relu; dense 10"
    );
    assert_eq!(text.parse::<NetSpec>(), Ok(cnn.clone()));
    assert_eq!(
        text.parse::<NetSpec>().map(|s| s.fingerprint()),
        Ok(cnn.fingerprint())
    );
    let short: NetSpec =
        "input 3x8x8; conv2d 4; avgpool 2; gelu; tanh; dropout 0.5; dense 2 frozen"
            .parse()
            .expect("valid");
    assert_eq!(
        short.to_string(),
        "input 3x8x8; conv2d 4 k3 s1 p0; avgpool 2 s2; gelu; tanh; dropout 0.5; dense 2 frozen"
    );
    assert!(short.layers()[5].frozen && !short.layers()[0].frozen);
    assert_ne!(short.fingerprint(), cnn.fingerprint());
}

#[test]
fn bad_text_is_refused_with_the_layer_named() {
    let err = |t: &str| t.parse::<NetSpec>().expect_err(t).to_string();
    assert!(err("dense 3").contains("must start with `input <shape>`"));
    assert!(err("input 4; dense").contains("layer 0 `dense`: dense needs a number of units"));
    assert!(err("input 4; relu; dense 0").contains("layer 1 `dense 0`"));
    assert!(err("input 4; conv 3").contains("unknown layer type `conv`"));
    assert!(err("input 4; conv2d 3 q2").contains("unknown option `q2`"));
    assert!(err("input 4; dropout 1.5").contains("probability in [0, 1)"));
    assert!(err("input 2x3; dense 2").contains("neither N nor CxHxW"));
    assert!(err(&format!("input 4{}", "; relu".repeat(70))).contains("more than 64 layers"));
}

#[test]
fn shapes_are_checked_layer_by_layer() {
    let cnn = NetSpec::cnn(Shape::new(1, 28, 28), 10);
    let shapes = cnn.shapes(10).expect("fits");
    assert_eq!(shapes[2], Shape::new(16, 12, 12));
    assert_eq!(shapes[6], Shape::flat(512));
    assert_eq!(
        NetSpec::cnn(Shape::flat(13), 3)
            .shapes(3)
            .expect_err("flat")
            .to_string(),
        "layer 0 (conv2d 16 k5 s1 p0) cannot take its input of shape 13: \
         conv2d needs an image input, got 13 flat features"
    );
    assert_eq!(
        NetSpec::cnn(Shape::new(1, 10, 10), 3)
            .shapes(3)
            .expect_err("small")
            .to_string(),
        "layer 3 (conv2d 32 k5 s1 p0) cannot take its input of shape 16x3x3: \
         a 5×5 kernel does not fit a 3×3 input"
    );
    assert_eq!(
        cnn.shapes(7).expect_err("classes").to_string(),
        "the last layer produces 10 values, but the data has 7 classes"
    );
}

/// A GPT is a model of its own: its text form round-trips unchanged (so fingerprints and
/// checkpoints written before it was one are read alike), and a `gpt` among other layers,
/// a frozen one, or one reading the wrong windows is refused with why.
#[test]
fn a_gpt_is_a_model_of_its_own_whose_text_round_trips() {
    let text = "input 65; gpt vocab 73 context 64 layers 4 heads 4 width 128";
    let spec: NetSpec = text.parse().expect("a gpt");
    assert_eq!(spec.to_string(), text);
    let gpt = spec.as_gpt().expect("a GPT");
    assert_eq!((gpt.vocab, gpt.context, gpt.layers), (73, 64, 4));
    assert_eq!(spec.input(), Shape::flat(65));
    assert!(spec.layers().is_empty() && spec.as_chain().is_none());
    assert_eq!(spec, NetSpec::gpt(gpt));
    for (bad, why) in [
        (
            "input 65; gpt vocab 73 context 64 layers 4 heads 4 width 128; dense 3",
            "only layer",
        ),
        (
            "input 65; dense 3; gpt vocab 73 context 64 layers 4 heads 4 width 128",
            "only layer",
        ),
        (
            "input 65; gpt vocab 73 context 64 layers 4 heads 4 width 128 frozen",
            "nothing to train",
        ),
        (
            "input 64; gpt vocab 73 context 64 layers 4 heads 4 width 128",
            "windows of 65",
        ),
        (
            "input 65; gpt vocab 73 context 64 layers 4 heads 3 width 128",
            "head",
        ),
    ] {
        let err = bad.parse::<NetSpec>().expect_err(bad).to_string();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

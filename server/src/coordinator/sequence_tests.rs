//! Property test: arbitrary sequences of joins, resumes, gradients (for any round, with any
//! finite values, huge ones included, straight to the coordinator or as frames through the
//! session's checks), leaves, silent workers and the passing of time, in every mode and with
//! `--replicate 2`. Nothing panics, the model stays finite, and every accepted gradient is
//! counted in exactly one round (`drive.rs` checks, after every event).

use proptest::prelude::*;

use super::drive::{gradient_frame, run, Op, MODES, PARAMS_OF_HIDDEN_3, VALUES};

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => proptest::option::of(0usize..8).prop_map(|resume| Op::Join { resume }),
        5 => (0usize..8, -2i8..3, 0..VALUES.len(), 0u32..40).prop_map(|(who, round, value, samples)| {
            Op::Gradient { who, round, value, samples }
        }),
        2 => (0usize..8, 0u64..5, 0u32..40, 0..VALUES.len()).prop_map(|(who, round, samples, v)| {
            Op::Frame { who, bytes: gradient_frame(round, samples, &[VALUES[v]], PARAMS_OF_HIDDEN_3) }
        }),
        1 => (0usize..8).prop_map(|who| Op::Leave { who }),
        3 => (0usize..8).prop_map(|who| Op::Drain { who }),
        2 => (0u16..3000).prop_map(|ms| Op::Wait { ms }),
        1 => Just(Op::Rejected),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_sequence_of_events_keeps_the_model_finite_and_the_counts_exact(
        mode in 0usize..MODES.len(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        run(MODES[mode], &ops);
    }
}

#[test]
fn fuzzer_bytes_make_sequences_of_every_kind() {
    let mut rng = model::SplitMix64::new(9);
    let bytes: Vec<u8> = (0..600).map(|_| (rng.next_f64() * 256.0) as u8).collect();
    let (mode, ops) = super::drive::from_bytes(&bytes);
    let kinds: std::collections::BTreeSet<_> = ops
        .iter()
        .map(|op| {
            format!("{op:?}")
                .split([' ', '{'])
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(kinds.len(), 7, "{kinds:?}");
    run(mode, &ops);
    assert!(super::drive::from_bytes(&[]).1.is_empty());
}

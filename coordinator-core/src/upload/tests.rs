use protocol::{
    decode_worker_frame, encode_from_worker, encode_gradient, Compression, GradientChunk,
    WorkerFrame, WorkerId, WorkerToCoordinator, CHUNK_VALUES,
};

use super::*;

fn joined(param_count: usize) -> Joined {
    Joined {
        worker: WorkerId(1),
        session: crate::io::SessionId(1),
        param_count,
        batch_size: 8,
    }
}

fn gradient(grads: Vec<f32>, samples: u32, loss: f32) -> Gradient {
    Gradient {
        compute_us: 0,
        parts: 1,
        round: Round(3),
        samples,
        loss,
        grads,
    }
}

/// Feeds `frames` to a new upload; the result of the last one taken, and how many were.
fn feed(frames: &[Vec<u8>], joined: &Joined) -> (Result<Progress, Refusal>, usize) {
    let mut upload = Upload::default();
    for (i, frame) in frames.iter().enumerate() {
        let Ok(WorkerFrame::Gradient(chunk)) = decode_worker_frame(frame) else {
            panic!("frame {i} is not a gradient chunk")
        };
        match upload.take(&chunk, joined) {
            Ok(Progress::More) => assert!(upload.in_progress()),
            other => return (other, i + 1),
        }
    }
    panic!("no chunk closed the gradient")
}

#[test]
fn chunks_reassemble_into_the_gradient_with_its_norm() {
    let n = 2 * CHUNK_VALUES + 3;
    let grads: Vec<f32> = (0..n).map(|i| ((i % 7) as f32 - 3.0) * 0.5).collect();
    let expected_norm = grads
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    for c in [Compression::None, Compression::F16, Compression::Int8] {
        let frames = encode_gradient(&gradient(grads.clone(), 8, 0.25), c);
        assert_eq!(frames.len(), 3);
        let (Ok(Progress::Done(g, norm)), 3) = feed(&frames, &joined(n)) else {
            panic!("{c:?}: not done after the third chunk")
        };
        assert_eq!((g.round, g.samples, g.loss), (Round(3), 8, 0.25));
        // Exactly what the whole tensor decodes to (int8 blocks align with chunks).
        let mut raw = Vec::new();
        protocol::tensor::encode_payload(&mut raw, &grads, c);
        assert_eq!(
            g.grads,
            protocol::tensor::decode_payload(&raw, n, c),
            "{c:?}"
        );
        // The norm of the values as decoded, summed in f64 in one plain loop.
        let exact = g
            .grads
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt();
        assert!(
            (norm - exact).abs() <= 1e-9 * exact,
            "{c:?}: {norm} vs {exact}"
        );
        if c == Compression::None {
            assert!((norm - expected_norm).abs() <= 1e-9 * expected_norm);
        }
    }
}

#[test]
fn a_bad_value_in_a_later_chunk_is_named_by_its_place_in_the_gradient() {
    let n = CHUNK_VALUES + 10;
    let mut grads = vec![0.5; n];
    grads[CHUNK_VALUES + 4] = f32::NAN;
    let frames = encode_gradient(&gradient(grads, 8, 1.0), Compression::None);
    let (Err(refusal), 2) = feed(&frames, &joined(n)) else {
        panic!("refused at the second chunk")
    };
    assert_eq!(refusal.code, ErrorCode::NonFinite);
    assert!(
        refusal
            .message
            .contains(&format!("value {} is NaN", CHUNK_VALUES + 4)),
        "{refusal}"
    );
}

#[test]
fn chunks_out_of_order_of_another_gradient_or_size_are_refused() {
    let n = CHUNK_VALUES + 10;
    let frames = encode_gradient(&gradient(vec![0.5; n], 8, 1.0), Compression::None);
    // The second chunk first.
    let (Err(r), 1) = feed(&frames[1..], &joined(n)) else {
        panic!("out of order")
    };
    assert_eq!(r.code, ErrorCode::Malformed);
    assert!(r.message.contains("next one starts at value 0"), "{r}");
    // The first chunk twice.
    let (Err(r), 2) = feed(&[frames[0].clone(), frames[0].clone()], &joined(n)) else {
        panic!("repeated")
    };
    assert_eq!(r.code, ErrorCode::Malformed);
    // A second chunk claiming another round.
    let other = encode_gradient(
        &Gradient {
            round: Round(4),
            ..gradient(vec![0.5; n], 8, 1.0)
        },
        Compression::None,
    );
    let (Err(r), 2) = feed(&[frames[0].clone(), other[1].clone()], &joined(n)) else {
        panic!("mixed rounds")
    };
    assert!(r.message.contains("round 4"), "{r}");
    // A gradient for a model of another size, refused at its first chunk.
    let (Err(r), 1) = feed(&frames, &joined(n + 1)) else {
        panic!("wrong total")
    };
    assert_eq!(r.code, ErrorCode::ShapeMismatch);
    assert!(r.message.contains(&format!("has {n} values")), "{r}");
    // An empty chunk does not advance.
    let empty = encode_from_worker(&WorkerToCoordinator::Gradient(GradientChunk {
        compute_us: 0,
        parts: 1,
        round: Round(3),
        samples: 8,
        loss: 1.0,
        total: n as u32,
        offset: 0,
        grads: vec![],
    }));
    let (Err(r), 1) = feed(&[empty], &joined(n)) else {
        panic!("empty chunk")
    };
    assert!(r.message.contains("empty chunk"), "{r}");
}

#[test]
fn validation_names_the_problem() {
    let joined = joined(3);
    // A whole gradient through the chunk path: its norm, or its refusal.
    let check = |g: &Gradient| -> Result<f64, Refusal> {
        match feed(&encode_gradient(g, Compression::None), &joined).0? {
            Progress::Done(_, norm) => Ok(norm),
            Progress::More => unreachable!("feed returns at the last chunk"),
        }
    };
    assert_eq!(check(&gradient(vec![3.0, 0.0, 4.0], 8, 1.0)), Ok(5.0));
    let two_cores = Gradient {
        parts: 2,
        ..gradient(vec![3.0, 0.0, 4.0], 8, 1.0)
    };
    assert_eq!(check(&two_cores), Ok(5.0));
    let gpu = Gradient {
        parts: protocol::UNORDERED,
        ..gradient(vec![3.0, 0.0, 4.0], 8, 1.0)
    };
    assert_eq!(check(&gpu), Ok(5.0), "a GPU's answer, unordered");
    // Finite values whose squares overflow f32: the norm is still exact, in f64.
    let huge = check(&gradient(vec![3e38; 3], 8, 1.0)).expect("finite");
    assert!((huge / (3e38 * 3f64.sqrt()) - 1.0).abs() < 1e-6, "{huge}");
    let cases = [
        (
            gradient(vec![0.0; 2], 1, 1.0),
            ErrorCode::ShapeMismatch,
            "2 values",
        ),
        (
            gradient(vec![0.0; 3], 0, 1.0),
            ErrorCode::ShapeMismatch,
            "sample count 0",
        ),
        (
            gradient(vec![0.0; 3], 9, 1.0),
            ErrorCode::ShapeMismatch,
            "sample count 9",
        ),
        (
            gradient(vec![0.0; 3], 1, f32::NAN),
            ErrorCode::NonFinite,
            "loss is NaN",
        ),
        // Parts: one a core, at least 4 samples a part (and at most 64), or 0 (a GPU).
        (
            Gradient {
                parts: 3,
                ..gradient(vec![0.0; 3], 8, 1.0)
            },
            ErrorCode::Malformed,
            "split into 3 parts: it can be 1..=2 (one a core, at least 4 samples a part, at most 64), or 0 (unordered, a GPU)",
        ),
        (
            Gradient {
                parts: 2,
                ..gradient(vec![0.0; 3], 7, 1.0)
            },
            ErrorCode::Malformed,
            "it can be 1..=1",
        ),
        (
            gradient(vec![0.0, f32::INFINITY, 0.0], 1, 1.0),
            ErrorCode::NonFinite,
            "value 1 is inf",
        ),
    ];
    for (grad, code, needle) in cases {
        let refusal = check(&grad).expect_err("invalid");
        assert_eq!(refusal.code, code);
        assert!(refusal.message.contains(needle), "{refusal}");
    }
}

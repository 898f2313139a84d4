use proptest::prelude::*;

use super::*;
use crate::chunk::{ChunkPos, CHUNK_VALUES};
use crate::message::Gradient;

/// The only frame of a tensor small enough for one chunk.
fn one(mut frames: Vec<Vec<u8>>) -> Vec<u8> {
    assert_eq!(frames.len(), 1);
    frames.remove(0)
}

fn all_worker_messages() -> Vec<WorkerToCoordinator> {
    vec![
        WorkerToCoordinator::Hello(Hello::default()),
        WorkerToCoordinator::Hello(Hello {
            kind: Some(WorkerKind::Browser),
            join_token: Some("sesame".into()),
            resume_token: Some("r-\u{e9}t\u{e9}".into()),
            compression: Compression::F16,
            fused: true,
        }),
        WorkerToCoordinator::Hello(Hello {
            kind: Some(WorkerKind::Native),
            join_token: None,
            resume_token: Some(String::new()),
            compression: Compression::Int8,
            fused: false,
        }),
        WorkerToCoordinator::Gradient(GradientChunk {
            compute_us: 123_456,
            parts: 1,
            round: Round(u64::MAX - 3),
            samples: 32,
            loss: 2.5,
            total: 20_000,
            offset: 16_384,
            grads: vec![0.0, -1.5, f32::MIN_POSITIVE, 1e30, -0.0],
        }),
        WorkerToCoordinator::Gradient(GradientChunk {
            compute_us: 0,
            parts: 1,
            round: Round(0),
            samples: 0,
            loss: 0.0,
            total: 0,
            offset: 0,
            grads: vec![],
        }),
        WorkerToCoordinator::Commitments(Commitments {
            round: Round(12),
            hashes: vec![[7; 32], [0; 32], [255; 32]],
        }),
        WorkerToCoordinator::Commitments(Commitments {
            round: Round(0),
            hashes: vec![],
        }),
        WorkerToCoordinator::Reveal(RevealChunk {
            round: Round(12),
            boundary: 3,
            total: 20_000,
            offset: 16_384,
            values: vec![0.0, -1.5, f32::MIN_POSITIVE, 1e30, -0.0],
        }),
    ]
}

fn all_coordinator_messages() -> Vec<CoordinatorToWorker> {
    vec![
        CoordinatorToWorker::Welcome(Welcome {
            worker_id: WorkerId(7),
            resume_token: "abc123".into(),
            model: ModelSpec {
                text: "input 1x28x28; dense 128; relu; dense 10".into(),
                fingerprint: 0x0123_4567_89ab_cdef,
            },
            batch_size: 32,
            compression: Compression::Int8,
        }),
        CoordinatorToWorker::Shard(Shard {
            first_index: 4000,
            shape: [3, 1, 1],
            labels: vec![1, 9],
            values: ShardValues::U8(vec![0, 128, 255, 1, 2, 3]),
            mean: vec![0.0],
            std: vec![255.0],
        }),
        CoordinatorToWorker::Shard(Shard {
            first_index: 2,
            shape: [1, 1, 2],
            labels: vec![0, 1, 1],
            values: ShardValues::F32(vec![0.5, -1.0, 3.25, 1e9, 0.0, -0.0]),
            mean: vec![1.0, 2.0],
            std: vec![0.5, 4.0],
        }),
        CoordinatorToWorker::Challenge(Challenge {
            round: Round(12),
            boundaries: vec![1, 2, 8],
        }),
        CoordinatorToWorker::Challenge(Challenge {
            round: Round(3),
            boundaries: vec![],
        }),
        CoordinatorToWorker::Frozen {
            total: 3,
            offset: 0,
            params: vec![0.5, -1.25, 3.0],
        },
        CoordinatorToWorker::Task(Task {
            local: None,
            round: Round(u64::MAX),
            batch: 0x0102_0304_0506_0708,
        }),
        CoordinatorToWorker::Task(Task {
            round: Round(7),
            batch: 3,
            local: Some(LocalPhase {
                steps: 1,
                optimizer: OptimizerKind::Sgd { lr: 0.05 },
                segment: 0,
            }),
        }),
        CoordinatorToWorker::Task(Task {
            round: Round(8),
            batch: 40,
            local: Some(LocalPhase {
                steps: MAX_LOCAL_STEPS,
                optimizer: OptimizerKind::Momentum {
                    lr: 0.01,
                    momentum: 0.9,
                },
                segment: 0,
            }),
        }),
        CoordinatorToWorker::Task(Task {
            round: Round(8),
            batch: 41,
            local: Some(LocalPhase {
                steps: 4,
                optimizer: OptimizerKind::Nesterov {
                    lr: 0.7,
                    momentum: 0.9,
                },
                segment: 0,
            }),
        }),
        CoordinatorToWorker::Task(Task {
            round: Round(9),
            batch: u64::MAX,
            local: Some(LocalPhase {
                steps: 64,
                optimizer: OptimizerKind::Adam {
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                },
                segment: 64,
            }),
        }),
        CoordinatorToWorker::Task(Task {
            round: Round(10),
            batch: 3,
            local: Some(LocalPhase {
                steps: 16,
                optimizer: OptimizerKind::AdamW {
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.99,
                    eps: 1e-8,
                    weight_decay: 0.1,
                },
                segment: 4,
            }),
        }),
        CoordinatorToWorker::Weights(Weights::whole(
            Round(12),
            (0..1000).map(|i| i as f32 * 0.25 - 3.0).collect(),
        )),
        CoordinatorToWorker::Weights(Weights {
            round: Round(13),
            total: 16_390,
            offset: 16_384,
            params: vec![1.0; 6],
        }),
        CoordinatorToWorker::WeightsDelta(Weights {
            round: Round(14),
            total: 16_390,
            offset: 16_384,
            params: vec![-0.5, 0.0, 0.25, 1e-9, 3.0, -7.0],
        }),
        CoordinatorToWorker::Error {
            code: ErrorCode::ShapeMismatch,
            message: "gradient has 3 values, the model has 101770".into(),
        },
        CoordinatorToWorker::Error {
            code: ErrorCode::Other(4242),
            message: String::new(),
        },
    ]
}

#[test]
fn every_worker_message_round_trips() {
    for msg in all_worker_messages() {
        let bytes = encode_from_worker(&msg);
        assert_eq!(decode_from_worker(&bytes).as_ref(), Ok(&msg), "{msg:?}");
    }
}

#[test]
fn every_coordinator_message_round_trips() {
    for msg in all_coordinator_messages() {
        let bytes = encode_from_coordinator(&msg);
        assert_eq!(
            decode_from_coordinator(&bytes).as_ref(),
            Ok(&msg),
            "{msg:?}"
        );
    }
}

#[test]
fn nan_and_infinity_survive_the_codec_bit_for_bit() {
    // Validation is the coordinator's job; the codec must not hide what was sent.
    let grads = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    let bytes = encode_from_worker(&WorkerToCoordinator::Gradient(GradientChunk {
        compute_us: 0,
        parts: 1,
        round: Round(1),
        samples: 1,
        loss: f32::NAN,
        total: 3,
        offset: 0,
        grads: grads.clone(),
    }));
    let WorkerToCoordinator::Gradient(g) = decode_from_worker(&bytes).expect("decodes") else {
        panic!("not a gradient")
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&g.grads), bits(&grads));
    assert!(g.loss.is_nan());
}

#[test]
fn weights_fast_path_matches_the_message_encoding() {
    let params = vec![1.0, 2.0, -3.5];
    let via_msg = encode_from_coordinator(&CoordinatorToWorker::Weights(Weights::whole(
        Round(5),
        params.clone(),
    )));
    assert_eq!(
        encode_weights(Round(5), &params, Compression::None),
        vec![via_msg.clone()]
    );
    assert!(is_weights_start(&via_msg));
    assert_eq!(
        &via_msg[WEIGHTS_DATA_OFFSET..WEIGHTS_DATA_OFFSET + 4],
        &1.0f32.to_le_bytes()
    );
}

/// A delta's frames decode to the same chunks as the whole tensor through its encoding
/// (`int4` or `int2`), under their own tag (never taken for the start of a `Weights`
/// message), in about its share of the key's bytes.
#[test]
fn a_delta_travels_in_its_encodings_chunks_under_its_own_tag() {
    let total = CHUNK_VALUES + 100;
    let delta: Vec<f32> = (0..total).map(|i| (i as f32 * 0.11).cos() * 1e-3).collect();
    let key: usize = encode_weights(Round(3), &delta, Compression::Int8)
        .iter()
        .map(Vec::len)
        .sum();
    for (encoding, tenths) in [(Compression::Int4, 6), (Compression::Int2, 4)] {
        let frames = encode_weights_delta(Round(3), &delta, encoding);
        assert_eq!(frames.len(), 2);
        let mut got = Vec::new();
        for frame in &frames {
            assert!(!is_weights_start(frame));
            let Ok(CoordinatorToWorker::WeightsDelta(w)) = decode_from_coordinator(frame) else {
                panic!("not a delta")
            };
            assert_eq!((w.round, w.total), (Round(3), total as u32));
            got.extend(w.params);
        }
        let held = vec![0.0; total];
        assert_eq!(Some(got), crate::delta::delta(&delta, &held, encoding));
        let bytes: usize = frames.iter().map(Vec::len).sum();
        assert!(
            bytes * 10 < key * tenths,
            "{encoding:?}: {bytes} bytes against the key's {key}"
        );
    }
}

#[test]
fn tensors_are_raw_little_endian_f32() {
    let frames = encode_weights(Round(1), &[1.0], Compression::None);
    let bytes = &frames[0];
    // header (5) + round (8) + total (4) + offset (4) + encoding (1) + count (4) + one f32
    assert_eq!(bytes.len(), 5 + 8 + 4 + 4 + 1 + 4 + 4);
    assert_eq!(&bytes[..2], b"CT");
    assert_eq!(&bytes[bytes.len() - 4..], &[0x00, 0x00, 0x80, 0x3f]);
}

#[test]
fn tensors_travel_in_chunks_that_reassemble_exactly() {
    let total = 2 * CHUNK_VALUES + 300;
    let values: Vec<f32> = (0..total).map(|i| (i as f32 * 0.37).sin()).collect();
    for c in [Compression::None, Compression::F16, Compression::Int8] {
        // Weights: every chunk at most 64 KiB of payload, in order, reassembling to what
        // the whole tensor would decode to (int8 blocks align with chunks).
        let frames = encode_weights(Round(9), &values, c);
        assert_eq!(frames.len(), 3);
        let mut got = Vec::new();
        let mut assembly = crate::chunk::Assembly::default();
        for (i, frame) in frames.iter().enumerate() {
            assert!(frame.len() <= 64 * 1024 + 64, "{} bytes", frame.len());
            assert_eq!(is_weights_start(frame), i == 0);
            let Ok(CoordinatorToWorker::Weights(w)) = decode_from_coordinator(frame) else {
                panic!("not weights")
            };
            let pos = ChunkPos {
                total: w.total,
                offset: w.offset,
                count: w.params.len() as u32,
            };
            assert_eq!(assembly.accept(pos, total), Ok(i == 2));
            got.extend(w.params);
        }
        let mut raw = Vec::new();
        crate::tensor::encode_payload(&mut raw, &values, c);
        assert_eq!(got, crate::tensor::decode_payload(&raw, total, c), "{c:?}");
        // Gradients: the same chunks, each carrying round, samples and loss.
        let g = Gradient {
            compute_us: 0,
            parts: 1,
            round: Round(4),
            samples: 32,
            loss: 0.5,
            grads: values.clone(),
        };
        let frames = encode_gradient(&g, c);
        let decoded = crate::tensor::decode_payload(&raw, total, c);
        assert_eq!(
            frames.iter().map(Vec::len).sum::<usize>(),
            gradient_wire_len(&decoded, c).expect("fits")
        );
        let mut got = Vec::new();
        for frame in &frames {
            let Ok(WorkerFrame::Gradient(raw)) = decode_worker_frame(frame) else {
                panic!("not a gradient chunk")
            };
            assert_eq!((raw.round, raw.samples, raw.loss), (g.round, 32, 0.5));
            assert_eq!(raw.pos.offset as usize, got.len());
            raw.decode_append(&mut got);
        }
        assert_eq!(got, crate::tensor::decode_payload(&raw, total, c), "{c:?}");
    }
}

#[test]
fn oversized_or_overflowing_chunks_are_refused() {
    let chunk = |total: u32, offset: u32, n: usize| {
        encode_from_worker(&WorkerToCoordinator::Gradient(GradientChunk {
            compute_us: 0,
            parts: 1,
            round: Round(1),
            samples: 1,
            loss: 0.0,
            total,
            offset,
            grads: vec![0.0; n],
        }))
    };
    let n = CHUNK_VALUES;
    assert!(decode_from_worker(&chunk(n as u32 + 1, 0, n)).is_ok());
    for (frame, field) in [
        (chunk(n as u32 + 1, 0, n + 1), "chunk count"),
        (chunk(10, 8, 3), "chunk offset"),
        (chunk(u32::MAX, u32::MAX, 1), "chunk offset"),
    ] {
        match decode_from_worker(&frame) {
            Err(DecodeError::InvalidValue { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

/// An int2 gradient chunk's payload carries its length; a frame whose length is past what its
/// count can take, or says more or fewer bytes than its chunks are, or whose chunks set a bit
/// past their values, is refused by field before anything is decoded; any prefix is
/// truncated.
#[test]
fn int2_gradient_chunks_are_read_whole_and_canonical_or_refused() {
    let grads: Vec<f32> = (0..100)
        .map(|i| if i % 6 == 0 { -1.0 } else { 0.1 })
        .collect();
    let g = Gradient {
        compute_us: 7,
        parts: 1,
        round: Round(2),
        samples: 4,
        loss: 1.0,
        grads: grads.clone(),
    };
    let frames = encode_gradient(&g, Compression::Int2);
    let frame = &frames[0];
    let Ok(WorkerFrame::Gradient(raw)) = decode_worker_frame(frame) else {
        panic!("a gradient chunk")
    };
    let mut got = Vec::new();
    raw.decode_append(&mut got);
    let mut want = Vec::new();
    crate::tensor::encode_payload(&mut want, &grads, Compression::Int2);
    assert_eq!(
        got,
        crate::tensor::decode_payload(&want, 100, Compression::Int2)
    );
    // The payload's length sits before its last `want.len()` bytes.
    let at = frame.len() - want.len() - 4;
    assert_eq!(frame[at..at + 4], (want.len() as u32).to_le_bytes());
    let with_len = |len: u32| {
        let mut f = frame.clone();
        f[at..at + 4].copy_from_slice(&len.to_le_bytes());
        f
    };
    let field = |f: &[u8]| match decode_worker_frame(f) {
        Err(DecodeError::InvalidValue { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    let most = Compression::Int2.payload_len(100).expect("fits") as u32;
    assert_eq!(field(&with_len(most + 1)), "payload length");
    assert_eq!(field(&with_len(want.len() as u32 - 1)), "int2 payload");
    let mut longer = with_len(want.len() as u32 + 1);
    longer.push(0);
    assert_eq!(field(&longer), "int2 payload");
    // The first chunk is 12 bytes (its scale, 8 of bits, 2 of its 11 signs); the last has
    // 36 values: a bit for a 37th, in the fifth byte of its bits.
    let mut past = frame.clone();
    let last_mask = at + 4 + 12 + 2 + 4;
    past[last_mask] |= 1 << 4;
    assert_eq!(field(&past), "int2 payload");
    for cut in 0..frame.len() {
        assert!(
            matches!(
                decode_worker_frame(&frame[..cut]),
                Err(DecodeError::Truncated { .. })
            ),
            "cut at {cut}"
        );
    }
}

#[test]
fn every_strict_prefix_of_every_message_is_truncated() {
    for msg in all_worker_messages() {
        let bytes = encode_from_worker(&msg);
        for cut in 0..bytes.len() {
            let err = decode_from_worker(&bytes[..cut]).expect_err("prefix must fail");
            assert!(
                matches!(err, DecodeError::Truncated { .. }),
                "{msg:?} cut at {cut}: {err}"
            );
        }
    }
    for msg in all_coordinator_messages() {
        let bytes = encode_from_coordinator(&msg);
        for cut in 0..bytes.len() {
            assert!(
                decode_from_coordinator(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }
}

#[test]
fn hand_written_bad_frames_are_rejected_with_the_right_error() {
    let good = encode_from_worker(&WorkerToCoordinator::Hello(Hello::default()));
    assert_eq!(decode_from_worker(b"hello"), Err(DecodeError::BadMagic));
    assert_eq!(
        decode_from_worker(&[]),
        Err(DecodeError::Truncated {
            offset: 0,
            needed: 2
        })
    );

    let mut wrong_version = good.clone();
    wrong_version[2..4].copy_from_slice(&999u16.to_le_bytes());
    let err = decode_from_worker(&wrong_version).expect_err("version");
    assert_eq!(
        err,
        DecodeError::VersionMismatch {
            got: 999,
            expected: PROTOCOL_VERSION
        }
    );
    assert_eq!(err.code(), ErrorCode::VersionMismatch);

    let mut unknown_tag = good.clone();
    unknown_tag[4] = 0x7f;
    assert_eq!(
        decode_from_worker(&unknown_tag),
        Err(DecodeError::UnknownTag(0x7f))
    );

    // A coordinator-only message sent by a worker is an unknown tag in that direction.
    let welcome = encode_from_coordinator(&all_coordinator_messages()[0]);
    assert_eq!(
        decode_from_worker(&welcome),
        Err(DecodeError::UnknownTag(TAG_WELCOME))
    );

    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(
        decode_from_worker(&trailing),
        Err(DecodeError::TrailingBytes(1))
    );

    let mut bad_kind = good.clone();
    bad_kind[5] = 9;
    assert!(matches!(
        decode_from_worker(&bad_kind),
        Err(DecodeError::InvalidValue { field: "kind", .. })
    ));

    // The last byte says whether the worker's products fuse: 0 or 1, nothing else; a Hello
    // of version 13, without it, is short.
    let mut bad_fused = good.clone();
    *bad_fused.last_mut().expect("a Hello's bytes") = 2;
    assert!(matches!(
        decode_from_worker(&bad_fused),
        Err(DecodeError::InvalidValue { field: "fused", .. })
    ));
    let short = &good[..good.len() - 1];
    assert!(matches!(
        decode_from_worker(short),
        Err(DecodeError::Truncated { .. })
    ));

    let [v0, v1] = PROTOCOL_VERSION.to_le_bytes();
    let bad_utf8 = [b'C', b'T', v0, v1, TAG_HELLO, 0, 1, 2, 0, 0xff, 0xfe, 0, 0];
    assert_eq!(
        decode_from_worker(&bad_utf8),
        Err(DecodeError::InvalidUtf8("join_token"))
    );
}

#[test]
fn a_lying_length_field_is_truncated_not_allocated() {
    // A gradient header claiming u32::MAX floats (16 GiB) in a 35-byte frame.
    let mut frame = encode_from_worker(&WorkerToCoordinator::Gradient(GradientChunk {
        compute_us: 0,
        parts: 1,
        round: Round(1),
        samples: 1,
        loss: 0.0,
        total: 0,
        offset: 0,
        grads: vec![],
    }));
    let count_at = frame.len() - 4;
    frame[count_at..].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        decode_from_worker(&frame),
        Err(DecodeError::Truncated {
            offset: frame.len(),
            needed: u32::MAX as usize * 4
        })
    );

    // A shard whose value count disagrees with labels × c × h × w.
    let shard = Shard {
        first_index: 0,
        shape: [2, 1, 1],
        labels: vec![1],
        values: ShardValues::U8(vec![1, 2]),
        mean: vec![0.0],
        std: vec![1.0],
    };
    let mut frame = encode_from_coordinator(&CoordinatorToWorker::Shard(shard.clone()));
    frame[9] = 3; // c = 3
    assert!(matches!(
        decode_from_coordinator(&frame),
        Err(DecodeError::InvalidValue {
            field: "values.len",
            ..
        })
    ));
    // A shape whose product overflows 64 bits is refused, not wrapped.
    let mut frame = encode_from_coordinator(&CoordinatorToWorker::Shard(shard.clone()));
    frame[9..21].fill(0xff);
    assert!(decode_from_coordinator(&frame).is_err());
    // An unknown element type.
    let mut frame = encode_from_coordinator(&CoordinatorToWorker::Shard(shard));
    frame[26] = 7;
    assert!(matches!(
        decode_from_coordinator(&frame),
        Err(DecodeError::InvalidValue {
            field: "values.type",
            ..
        })
    ));
}

#[test]
fn compressed_tensors_round_trip_within_their_rounding_and_shrink_the_frame() {
    let grads: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 1e-3).collect();
    let g = Gradient {
        compute_us: 0,
        parts: 1,
        round: Round(3),
        samples: 7,
        loss: 0.5,
        grads: grads.clone(),
    };
    let plain = one(encode_gradient(&g, Compression::None));
    for (c, tolerance, max_len) in [
        (Compression::F16, 0.5 / 2048.0, plain.len() / 2 + 20),
        (
            Compression::Int8,
            0.5 / 127.0 / 2.0 + 1e-6,
            plain.len() / 4 + 48,
        ),
    ] {
        let frame = one(encode_gradient(&g, c));
        assert!(
            frame.len() <= max_len,
            "{c:?}: {} bytes vs {}",
            frame.len(),
            plain.len()
        );
        let WorkerToCoordinator::Gradient(back) = decode_from_worker(&frame).expect("decodes")
        else {
            panic!("not a gradient")
        };
        assert_eq!(
            (back.round, back.samples, back.loss),
            (g.round, g.samples, g.loss)
        );
        let worst = grads
            .iter()
            .zip(&back.grads)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst <= tolerance, "{c:?}: max error {worst}");
    }
    let weights = one(encode_weights(Round(1), &grads, Compression::F16));
    let CoordinatorToWorker::Weights(w) = decode_from_coordinator(&weights).expect("decodes")
    else {
        panic!("not weights")
    };
    assert_eq!(w.params.len(), 1000);
}

#[test]
fn unknown_tensor_encodings_and_lying_compressed_lengths_are_refused() {
    let g = Gradient {
        compute_us: 0,
        parts: 1,
        round: Round(3),
        samples: 1,
        loss: 0.5,
        grads: vec![1.0; 10],
    };
    let mut frame = one(encode_gradient(&g, Compression::Int8));
    let enc_at = 5 + 8 + 4 + 4 + 4 + 1 + 4 + 4;
    frame[enc_at] = 9;
    assert!(matches!(
        decode_from_worker(&frame),
        Err(DecodeError::InvalidValue {
            field: "tensor encoding",
            value: 9
        })
    ));
    let mut frame = one(encode_gradient(&g, Compression::Int8));
    frame[enc_at + 1..enc_at + 5].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode_from_worker(&frame),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn weights_messages_are_recognised_by_their_first_chunk() {
    let weights = one(encode_weights(Round(3), &[1.0, 2.0], Compression::None));
    assert!(is_weights_start(&weights));
    let later = encode_weights(Round(3), &[1.0; CHUNK_VALUES + 1], Compression::None);
    assert!(
        !is_weights_start(&later[1]),
        "only a message's first chunk counts"
    );
    let error = encode_from_coordinator(&CoordinatorToWorker::Error {
        code: ErrorCode::Late,
        message: "x".into(),
    });
    assert!(!is_weights_start(&error));
    assert!(!is_weights_start(&weights[..HEADER_LEN]));
    assert!(!is_weights_start(b"XX\x02\x00\x83rest"));
}

#[test]
fn error_codes_round_trip_and_fatality_is_documented() {
    for code in 0..=21u16 {
        assert_eq!(ErrorCode::from_u16(code).to_u16(), code);
    }
    assert!(ErrorCode::Malformed.is_fatal());
    assert!(ErrorCode::NonFinite.is_fatal());
    assert!(!ErrorCode::RoundNotOpen.is_fatal());
    assert!(!ErrorCode::Duplicate.is_fatal());
    assert!(!ErrorCode::Mismatch.is_fatal());
    assert!(ErrorCode::Banned.is_fatal());
    assert!(ErrorCode::RateLimited.is_fatal());
    assert!(ErrorCode::Kicked.is_fatal());
    assert!(ErrorCode::Finished.is_fatal());
    // Every known code has its own name; unknown ones are "other".
    let names: std::collections::BTreeSet<_> =
        (1..=20u16).map(|c| ErrorCode::from_u16(c).name()).collect();
    assert_eq!(names.len(), 20);
    assert_eq!(ErrorCode::from_u16(21).name(), "other");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_from_worker(&bytes);
        let _ = decode_from_coordinator(&bytes);
    }

    #[test]
    fn random_payloads_behind_a_valid_header_never_panic(
        tag in prop_oneof![Just(TAG_HELLO), Just(TAG_GRADIENT), Just(TAG_WELCOME),
                           Just(TAG_SHARD), Just(TAG_WEIGHTS), Just(TAG_ERROR), any::<u8>()],
        payload in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut frame = vec![b'C', b'T'];
        frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        frame.push(tag);
        frame.extend_from_slice(&payload);
        // Whatever decodes must re-encode to the same bytes: nothing is silently skipped.
        if let Ok(msg) = decode_from_worker(&frame) {
            prop_assert_eq!(encode_from_worker(&msg), frame.clone());
        }
        if let Ok(msg) = decode_from_coordinator(&frame) {
            prop_assert_eq!(encode_from_coordinator(&msg), frame);
        }
    }

    #[test]
    fn gradients_round_trip(round in any::<u64>(), samples in any::<u32>(), loss in any::<f32>(),
                            parts in any::<u8>(), grads in proptest::collection::vec(any::<f32>(), 0..64)) {
        let (total, offset) = (grads.len() as u32 + 7, 7);
        let msg = WorkerToCoordinator::Gradient(GradientChunk { compute_us: 0, parts, round: Round(round), samples, loss, total, offset, grads });
        let bytes = encode_from_worker(&msg);
        let back = decode_from_worker(&bytes).expect("round trip");
        // Compare through the encoding so NaN payloads compare bit-for-bit.
        prop_assert_eq!(encode_from_worker(&back), bytes);
    }
}

/// The bytes of a gradient's frames follow from its count (and, in `int2`, from the values
/// as they were decoded: which are 0), without encoding it.
#[test]
fn a_gradients_wire_length_is_known_without_encoding_it() {
    for c in Compression::ALL {
        for count in [
            0usize,
            1,
            63,
            64,
            65,
            255,
            256,
            257,
            1000,
            CHUNK_VALUES,
            3 * CHUNK_VALUES + 1,
        ] {
            // Some chunks all zeros, the others a few values past half their largest.
            let grads: Vec<f32> = (0..count)
                .map(|i| match (i / 64 % 3, i % 7) {
                    (0, _) => 0.0,
                    (_, 0) => -1.0,
                    (_, 3) => 0.75,
                    _ => 0.25,
                })
                .collect();
            let g = Gradient {
                compute_us: 0,
                parts: 1,
                round: Round(3),
                samples: 32,
                loss: 1.5,
                grads: grads.clone(),
            };
            let mut raw = Vec::new();
            crate::tensor::encode_payload(&mut raw, &grads, c);
            let decoded = crate::tensor::decode_payload(&raw, count, c);
            assert_eq!(
                gradient_wire_len(&decoded, c),
                Some(encode_gradient(&g, c).iter().map(Vec::len).sum()),
                "{c:?} × {count}"
            );
        }
    }
}

/// A local phase the worker could not run, or that would make it diverge or spin, is refused
/// with the field that is wrong: no steps, too many, an unknown optimizer, a learning rate
/// that is not finite and positive, a momentum outside [0, 1), an epsilon that is not
/// positive.
#[test]
fn impossible_local_phases_are_refused_by_field() {
    let phase = |steps: u32, kind: u8, values: [f32; 4]| {
        let mut frame = encode_from_coordinator(&CoordinatorToWorker::Task(Task {
            round: Round(1),
            batch: 2,
            local: None,
        }));
        frame.pop();
        frame.push(1);
        frame.extend_from_slice(&steps.to_le_bytes());
        frame.push(kind);
        for v in values {
            frame.extend_from_slice(&v.to_le_bytes());
        }
        // Segments of 4 steps.
        frame.extend_from_slice(&4u32.to_le_bytes());
        decode_from_coordinator(&frame)
    };
    let field = |r: Result<CoordinatorToWorker, DecodeError>| match r {
        Err(DecodeError::InvalidValue { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(phase(4, 2, [1e-3, 0.9, 0.999, 1e-8]).is_ok());
    assert_eq!(field(phase(3, 0, [0.1, 0.0, 0.0, 0.0])), "task.segment");
    assert_eq!(field(phase(0, 0, [0.1, 0.0, 0.0, 0.0])), "task.steps");
    assert_eq!(
        field(phase(MAX_LOCAL_STEPS + 1, 0, [0.1, 0.0, 0.0, 0.0])),
        "task.steps"
    );
    assert!(phase(4, 4, [0.7, 0.9, 0.0, 0.0]).is_ok(), "Nesterov");
    assert_eq!(
        field(phase(4, 5, [0.1, 0.0, 0.0, 0.0])),
        "task.inner_optimizer"
    );
    assert_eq!(field(phase(4, 3, [0.1, 0.9, 0.99, 0.0])), "task.eps");
    for lr in [0.0, -0.1, f32::NAN, f32::INFINITY] {
        assert_eq!(field(phase(4, 0, [lr, 0.0, 0.0, 0.0])), "task.inner_lr");
    }
    for m in [1.0, -0.1, f32::NAN] {
        assert_eq!(field(phase(4, 1, [0.1, m, 0.0, 0.0])), "task.momentum");
        assert_eq!(field(phase(4, 2, [0.1, 0.9, m, 1e-8])), "task.beta2");
    }
    for eps in [0.0, -1e-8, f32::NAN] {
        assert_eq!(field(phase(4, 2, [0.1, 0.9, 0.999, eps])), "task.eps");
    }
    let mut frame = encode_from_coordinator(&CoordinatorToWorker::Task(Task {
        round: Round(1),
        batch: 2,
        local: None,
    }));
    *frame.last_mut().expect("the flag") = 2;
    assert_eq!(field(decode_from_coordinator(&frame)), "task.local");
}

/// AdamW's decay travels after the four values; a decay outside [0, 1) (or one that would
/// flip the weights' sign at this rate) is refused by name, not trusted.
#[test]
fn an_adamw_task_carries_its_decay_and_a_bad_one_is_refused() {
    let task = |weight_decay: f32| {
        encode_from_coordinator(&CoordinatorToWorker::Task(Task {
            round: Round(1),
            batch: 0,
            local: Some(LocalPhase {
                steps: 4,
                optimizer: OptimizerKind::AdamW {
                    lr: 0.5,
                    beta1: 0.9,
                    beta2: 0.99,
                    eps: 1e-8,
                    weight_decay,
                },
                segment: 0,
            }),
        }))
    };
    assert!(decode_from_coordinator(&task(0.1)).is_ok());
    for bad in [-0.1, 1.0, 2.5, f32::NAN] {
        let err = decode_from_coordinator(&task(bad)).expect_err("refused");
        assert!(err.to_string().contains("weight_decay"), "{bad}: {err}");
    }
    // Cut before the decay: a short frame, not a default.
    let whole = task(0.1);
    assert!(decode_from_coordinator(&whole[..whole.len() - 4]).is_err());
}

/// A challenge names boundaries once each, in order, from 1; a reveal is raw `f32` (its
/// hash is of the exact values); commitments and challenges are bounded before anything
/// is allocated.
#[test]
fn challenges_reveals_and_commitments_are_checked_by_field() {
    let field = |r: Result<CoordinatorToWorker, DecodeError>| match r {
        Err(DecodeError::InvalidValue { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let challenge = |boundaries: Vec<u32>| {
        decode_from_coordinator(&encode_from_coordinator(&CoordinatorToWorker::Challenge(
            Challenge {
                round: Round(1),
                boundaries,
            },
        )))
    };
    assert!(challenge(vec![1, 4, 9]).is_ok());
    for bad in [vec![0, 1], vec![2, 2], vec![3, 1]] {
        assert_eq!(field(challenge(bad)), "challenge.boundaries");
    }
    let many = (1..=crate::commit::MAX_CHALLENGED as u32 + 1).collect();
    assert_eq!(field(challenge(many)), "challenge.count");

    let reveal = encode_reveal(Round(2), 1, &[1.0, 2.0, 3.0]);
    let mut f16 = one(reveal.clone());
    // The tensor's encoding byte: header, round, boundary, total, offset.
    f16[HEADER_LEN + 8 + 4 + 4 + 4] = Compression::F16.to_u8();
    assert!(matches!(
        decode_worker_frame(&f16),
        Err(DecodeError::InvalidValue {
            field: "reveal encoding",
            ..
        })
    ));
    let big: Vec<f32> = (0..CHUNK_VALUES + 5).map(|i| i as f32).collect();
    let frames = encode_reveal(Round(2), 3, &big);
    assert_eq!(frames.len(), 2);
    let mut back = Vec::new();
    for f in &frames {
        let Ok(WorkerToCoordinator::Reveal(c)) = decode_from_worker(f) else {
            panic!("a reveal chunk");
        };
        assert_eq!(
            (c.round, c.boundary, c.total),
            (Round(2), 3, big.len() as u32)
        );
        back.extend(c.values);
    }
    assert_eq!(back, big);

    let mut lying = encode_from_worker(&WorkerToCoordinator::Commitments(Commitments {
        round: Round(1),
        hashes: vec![],
    }));
    let at = lying.len() - 4;
    lying[at..].copy_from_slice(&(MAX_LOCAL_STEPS + 1).to_le_bytes());
    assert!(decode_worker_frame(&lying).is_err());
}

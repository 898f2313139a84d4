use std::net::SocketAddr;

use protocol::{
    encode_from_worker, encode_gradient, Compression, ErrorCode, Gradient, Hello, Round,
    WorkerKind, WorkerToCoordinator, CHUNK_VALUES, PROTOCOL_VERSION,
};
use tokio_tungstenite::tungstenite::Message;

use crate::util::*;

const ROUNDS: u64 = 3;
const PARAMS: usize = 784 * 128 + 128 + 128 * 10 + 10;

fn gradient(round: u64, grads: Vec<f32>) -> Gradient {
    Gradient {
        compute_us: 0,
        parts: 1,
        round: Round(round),
        samples: 32,
        loss: 1.0,
        grads,
    }
}

/// Joins a client, reads its Welcome (and the current weights), so it is a worker.
async fn joined_client(addr: SocketAddr) -> RawClient {
    let mut c = RawClient::connect(addr).await;
    c.hello().await;
    c.recv().await.expect("welcome");
    c
}

/// Every kind of bad input, sent while round 1 is open and the honest workers hold their
/// gradients. Returns how many sessions were refused.
async fn misbehave(
    addr: SocketAddr,
    status: &mut tokio::sync::watch::Receiver<server::Status>,
) -> u64 {
    let honest = |s: &server::Status| s.workers == 2;

    // Garbage bytes as the first frame.
    let mut c = RawClient::connect(addr).await;
    c.send_raw(Message::Binary(vec![0xde, 0xad, 0xbe, 0xef].into()))
        .await;
    assert!(c.expect_error(ErrorCode::Malformed).await.contains("magic"));
    c.expect_closed().await;

    // A text frame.
    let mut c = RawClient::connect(addr).await;
    c.send_raw(Message::Text("{\"hello\": true}".into())).await;
    assert!(c
        .expect_error(ErrorCode::UnexpectedMessage)
        .await
        .contains("text frames"));
    c.expect_closed().await;

    // Another protocol version: the previous one (v3, whose tensors were whole messages: its
    // Hello is byte for byte ours but for the version) and a future one.
    for version in [PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1] {
        let mut c = RawClient::connect(addr).await;
        let mut hello = encode_from_worker(&WorkerToCoordinator::Hello(Hello {
            kind: Some(WorkerKind::Browser),
            ..Hello::default()
        }));
        hello[2..4].copy_from_slice(&version.to_le_bytes());
        c.send_raw(Message::Binary(hello.into())).await;
        let message = c.expect_error(ErrorCode::VersionMismatch).await;
        let wrong =
            format!("version {version} is not supported (this side speaks {PROTOCOL_VERSION})");
        assert!(message.contains(&wrong), "{message}");
        c.expect_closed().await;
    }

    // A gradient before Hello.
    let mut c = RawClient::connect(addr).await;
    c.send_gradient(&gradient(1, vec![0.0; PARAMS])).await;
    c.expect_error(ErrorCode::UnexpectedMessage).await;
    c.expect_closed().await;

    // Joined, then: a gradient of the wrong shape.
    let mut c = joined_client(addr).await;
    c.send_gradient(&gradient(1, vec![0.0; 10])).await;
    assert!(c
        .expect_error(ErrorCode::ShapeMismatch)
        .await
        .contains("10 values"));
    c.expect_closed().await;
    wait_status(status, "the bad worker to leave", honest).await;

    // NaN, and infinity.
    for bad in [f32::NAN, f32::NEG_INFINITY] {
        let mut c = joined_client(addr).await;
        let mut grads = vec![0.0; PARAMS];
        grads[PARAMS / 2] = bad;
        c.send_gradient(&gradient(1, grads)).await;
        c.expect_error(ErrorCode::NonFinite).await;
        c.expect_closed().await;
        wait_status(status, "the bad worker to leave", honest).await;
    }

    // A truncated frame whose length field lies.
    let mut c = joined_client(addr).await;
    let mut frame = encode_gradient(&gradient(1, vec![0.0; 4]), Compression::None).remove(0);
    // Header, round, samples, loss, compute time, parts, total, offset, then the encoding byte.
    let count_at = 5 + 8 + 4 + 4 + 4 + 1 + 4 + 4 + 1;
    frame[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    c.send_raw(Message::Binary(frame.into())).await;
    assert!(c
        .expect_error(ErrorCode::Malformed)
        .await
        .contains("too short"));
    c.expect_closed().await;
    wait_status(status, "the bad worker to leave", honest).await;

    // A frame larger than the coordinator accepts (one chunk plus headroom: 68 KiB, whatever
    // the model's size).
    let mut c = joined_client(addr).await;
    // The coordinator may reset the connection before the whole frame is written.
    let _ = futures_util::SinkExt::send(
        &mut c.ws,
        Message::Binary(vec![0u8; server::routes::MAX_MESSAGE_SIZE + 1].into()),
    )
    .await;
    c.expect_closed().await;
    wait_status(status, "the oversized worker to leave", honest).await;

    // A gradient abandoned after its first chunk, then begun again: out of order.
    let mut c = joined_client(addr).await;
    let frames = encode_gradient(&gradient(1, vec![0.0; PARAMS]), Compression::None);
    assert!(frames.len() > 2, "the model spans several chunks");
    for frame in [&frames[0], &frames[0]] {
        c.send_raw(Message::Binary(frame.clone().into())).await;
    }
    let message = c.expect_error(ErrorCode::Malformed).await;
    assert!(
        message.contains(&format!("next one starts at value {CHUNK_VALUES}")),
        "{message}"
    );
    c.expect_closed().await;
    wait_status(status, "the bad worker to leave", honest).await;

    // A well-formed gradient for a round that is not open: refused, not fatal.
    let mut c = joined_client(addr).await;
    c.send_gradient(&gradient(99, vec![0.0; PARAMS])).await;
    assert!(c
        .expect_error(ErrorCode::RoundNotOpen)
        .await
        .contains("round 99"));
    // ...and one for the open round from a worker that is not its participant.
    c.send_gradient(&gradient(1, vec![0.0; PARAMS])).await;
    c.expect_error(ErrorCode::NotParticipant).await;
    c.ws.close(None).await.expect("close");
    wait_status(status, "the bad worker to leave", honest).await;
    // sessions refused: garbage, text, two versions, early gradient, shape, NaN, inf, lying
    // length, out-of-order chunks
    10
}

/// Runs ROUNDS rounds with two honest workers, optionally with every bad client at round 1;
/// returns the final weights and status.
async fn run(with_bad_clients: bool) -> (Vec<u8>, server::Status) {
    let server = start_server(&[
        "--min-workers",
        "2",
        "--optimizer",
        "momentum",
        "--seed",
        "3",
    ])
    .await;
    let mut status = server.status.clone();
    let mut a = ManualWorker::join(server.addr).await;
    let mut b = ManualWorker::join(server.addr).await;
    let mut refused = 0;
    for round in 0..ROUNDS {
        let (ga, gb) = (a.next_gradient().await, b.next_gradient().await);
        if with_bad_clients && round == 1 {
            refused = misbehave(server.addr, &mut status).await;
        }
        a.send(ga).await;
        b.send(gb).await;
    }
    wait_status(&mut status, "the last round", |s| s.round == ROUNDS).await;
    let (code, _, params) = http_get(server.addr, "/api/params").await;
    assert_eq!(code, 200);
    let json = get_status_json(server.addr).await;
    assert_eq!(json["sessions_rejected"], refused);
    let s = status.borrow().clone();
    stop(server).await;
    (params, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_clients_are_refused_and_the_model_is_bit_identical() {
    let (clean, clean_status) = run(false).await;
    let (attacked, attacked_status) = run(true).await;
    assert_eq!(clean_status.round, ROUNDS);
    assert_eq!(attacked_status.round, ROUNDS);
    assert_eq!(attacked_status.counters.gradients_rejected, 2);
    assert_eq!(
        attacked_status.counters.gradients_accepted,
        clean_status.counters.gradients_accepted
    );
    assert!(clean == attacked, "the model differs after bad input");
}

//! `--upload-memory`: gradients take turns for the coordinator's upload slots, one address
//! holds at most its share of them, and a gradient that stops arriving gives its slot up. Real workers (the shared worker core over real
//! WebSockets), the real coordinator, its `/metrics`.

use protocol::ErrorCode;

use crate::util::{guard, http_get, start_server, wait_status, ManualWorker};

/// A gauge from `/metrics`.
async fn gauge(addr: std::net::SocketAddr, name: &str) -> f64 {
    let (code, _, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    let text = String::from_utf8(body).expect("utf-8");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
}

/// Waits until `/metrics` shows `name` at `value`. The slots live in the sessions, which
/// publish no event to wait on, so this asks again until it holds (bounded by the guard).
async fn until_gauge(addr: std::net::SocketAddr, name: &str, value: f64) {
    guard(&format!("{name} = {value}"), async {
        while gauge(addr, name).await != value {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Two slots (the default MLP's gradient is 0.4 MB, the budget 1 MiB), three workers (all on
/// 127.0.0.1, which may hold both here): the third gradient is not read while two are under
/// way, and goes on as soon as one of them is done. Every gradient counts; the round closes
/// with all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_gradient_waits_for_a_slot_and_then_counts() {
    let server = start_server(&[
        "--min-workers",
        "3",
        "--upload-memory",
        "1",
        "--upload-slots-per-ip",
        "2",
        "--eval-interval",
        "1000",
    ])
    .await;
    let addr = server.addr;
    let mut status = server.status.clone();
    assert_eq!(gauge(addr, "crowdtrain_upload_slots").await, 2.0);
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(ManualWorker::join(addr).await);
    }
    let mut gradients = Vec::new();
    for w in &mut workers {
        gradients.push(w.next_gradient().await);
    }
    assert!(gradients[0].len() > 2, "a gradient of several chunks");
    // A and B begin their gradients: both slots taken.
    let rest_a = gradients[0].split_off(1);
    let rest_b = gradients[1].split_off(1);
    workers[0].send(gradients[0].clone()).await;
    workers[1].send(gradients[1].clone()).await;
    until_gauge(addr, "crowdtrain_upload_slots_free", 0.0).await;
    // C sends all of it; the coordinator reads its first chunk and waits.
    let all_c = gradients[2].clone();
    workers[2].send(all_c).await;
    until_gauge(addr, "crowdtrain_uploads_waiting", 1.0).await;
    assert_eq!(server.status.borrow().round_answered, 0);
    // A finishes: its slot passes to C, whose gradient then arrives whole.
    workers[0].send(rest_a).await;
    let s = wait_status(&mut status, "A's and C's gradients", |s| {
        s.round_answered >= 2
    })
    .await;
    assert_eq!(
        (s.round_answered, s.round),
        (2, 0),
        "B's gradient is still due"
    );
    until_gauge(addr, "crowdtrain_uploads_waiting", 0.0).await;
    // B finishes: the round closes with all three.
    workers[1].send(rest_b).await;
    let s = wait_status(&mut status, "the round", |s| s.round >= 1).await;
    assert_eq!(s.counters.gradients_accepted, 3);
    assert_eq!(s.counters.gradients_rejected, 0);
    until_gauge(addr, "crowdtrain_upload_slots_free", 2.0).await;
    server.shutdown.cancel();
}

/// Two slots, one per address (the default share: half). Two workers on 127.0.0.1 begin
/// their gradients and stop; the second waits for its own address's turn, not in the queue
/// for slots, so a worker on 127.0.0.2 gets the other slot at once and its gradient counts
/// while 127.0.0.1 still holds its slot. Then the first finishes, the second goes on, and
/// the round closes with all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_keep_the_others_gradients_out() {
    let server = start_server(&[
        "--min-workers",
        "3",
        "--upload-memory",
        "1",
        "--eval-interval",
        "1000",
    ])
    .await;
    let addr = server.addr;
    let mut status = server.status.clone();
    assert_eq!(gauge(addr, "crowdtrain_upload_slots_per_ip").await, 1.0);
    let other: std::net::IpAddr = [127, 0, 0, 2].into();
    let mut workers = vec![
        ManualWorker::join(addr).await,
        ManualWorker::join(addr).await,
        ManualWorker::join_from(addr, other).await,
    ];
    let mut gradients = Vec::new();
    for w in &mut workers {
        gradients.push(w.next_gradient().await);
    }
    let rest_first = gradients[0].split_off(1);
    let rest_second = gradients[1].split_off(1);
    workers[0].send(gradients[0].clone()).await;
    until_gauge(addr, "crowdtrain_upload_slots_free", 1.0).await;
    workers[1].send(gradients[1].clone()).await;
    until_gauge(addr, "crowdtrain_uploads_waiting", 1.0).await;
    assert_eq!(gauge(addr, "crowdtrain_upload_slots_free").await, 1.0);
    // The other address's gradient is not behind 127.0.0.1's waiter.
    workers[2].send(gradients[2].clone()).await;
    let s = wait_status(&mut status, "127.0.0.2's gradient", |s| {
        s.round_answered >= 1
    })
    .await;
    assert_eq!((s.round_answered, s.round), (1, 0));
    assert_eq!(gauge(addr, "crowdtrain_uploads_waiting").await, 1.0);
    // 127.0.0.1's first gradient ends; its second goes on; the round closes with all three.
    workers[0].send(rest_first).await;
    until_gauge(addr, "crowdtrain_uploads_waiting", 0.0).await;
    workers[1].send(rest_second).await;
    let s = wait_status(&mut status, "the round", |s| s.round >= 1).await;
    assert_eq!(
        (s.counters.gradients_accepted, s.counters.gradients_rejected),
        (3, 0)
    );
    until_gauge(addr, "crowdtrain_upload_slots_free", 2.0).await;
    server.shutdown.cancel();
}

/// A coordinator with two upload slots and these ping settings, one worker joined, and the
/// chunk frames of that worker's first gradient, unsent.
async fn two_slots_and_a_gradient(
    ping_interval: &str,
    ping_timeout: &str,
) -> (server::RunningServer, ManualWorker, Vec<Vec<u8>>) {
    let server = start_server(&[
        "--upload-memory",
        "1",
        "--ping-interval",
        ping_interval,
        "--ping-timeout",
        ping_timeout,
        "--eval-interval",
        "1000",
    ])
    .await;
    let mut worker = ManualWorker::join(server.addr).await;
    let frames = worker.next_gradient().await;
    (server, worker, frames)
}

/// A worker that sends one chunk and then nothing, while answering pings, is refused with
/// `TooSlow` once the ping timeout passes without a chunk, and its slot is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_gradient_gives_its_slot_up() {
    let (server, mut worker, mut frames) = two_slots_and_a_gradient("200ms", "1s").await;
    let addr = server.addr;
    frames.truncate(1);
    worker.send(frames).await;
    until_gauge(addr, "crowdtrain_upload_slots_free", 1.0).await;
    // Reading answers the coordinator's pings, so this worker is alive, only not sending.
    let message = worker.client.expect_error(ErrorCode::TooSlow).await;
    assert!(
        message.contains("no chunk of the gradient under way")
            && message.contains("2 upload slots"),
        "{message}"
    );
    until_gauge(addr, "crowdtrain_upload_slots_free", 2.0).await;
    server.shutdown.cancel();
}

/// A worker that trickles its chunks, each in time for the stall check but the gradient as a
/// whole slower than 64 KiB/s, is refused with `TooSlow` once its share of time is up (here
/// 6.2 s for the default MLP's 0.4 MB), and its slot is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_gradient_gives_its_slot_up() {
    // Pings it answers only when it reads at the end: few enough not to be a flood.
    let (server, mut worker, frames) = two_slots_and_a_gradient("1s", "3s").await;
    let addr = server.addr;
    assert_eq!(frames.len(), 7);
    // A chunk every 1.5 s: never 3 s without one, but 7 chunks would take 9 s.
    let mut pace = tokio::time::interval(std::time::Duration::from_millis(1500));
    for frame in frames.into_iter().take(5) {
        pace.tick().await;
        worker.send(vec![frame]).await;
    }
    let message = worker.client.expect_error(ErrorCode::TooSlow).await;
    assert!(message.contains("slower than 64 KiB/s"), "{message}");
    until_gauge(addr, "crowdtrain_upload_slots_free", 2.0).await;
    server.shutdown.cancel();
}

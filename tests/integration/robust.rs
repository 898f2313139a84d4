//! Rounds that survive real volunteers: stragglers, churn with resume tokens, async and
//! hogwild modes. Native workers over real sockets; every wait is on an explicit event (the
//! status watch), and the printed figures feed the README's scenario table.

use std::time::{Duration, Instant};

use model::SplitMix64;
use protocol::CoordinatorToWorker;
use tokio_util::sync::CancellationToken;

use crate::util::*;

/// Rounds per second between two round numbers, timed on status changes.
async fn rounds_per_s(
    status: &mut tokio::sync::watch::Receiver<server::Status>,
    from: u64,
    to: u64,
) -> f64 {
    wait_status(status, "the first timed round", |s| s.round >= from).await;
    let start = Instant::now();
    wait_status(status, "the last timed round", |s| s.round >= to).await;
    (to - from) as f64 / start.elapsed().as_secs_f64()
}

/// A client that stays connected and answers pings (it keeps reading) but never sends a
/// gradient: a frozen tab.
fn spawn_frozen(addr: std::net::SocketAddr) -> CancellationToken {
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        let mut c = RawClient::connect(addr).await;
        c.hello().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                msg = c.recv() => if msg.is_none() { break },
            }
        }
    });
    cancel
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_costs_a_few_deadlines_then_is_skipped() {
    let _heavy = heavy().await;
    const FLAGS: &[&str] = &[
        "--round-timeout",
        "0.2",
        "--miss-limit",
        "2",
        "--min-workers",
        "4",
    ];

    // Without the straggler.
    let mut clean = swarm(FLAGS, 4).await;
    let baseline = rounds_per_s(&mut clean.status, 20, 620).await;
    clean.stop().await;

    // With one of five frozen: it joins first, so it is a participant from round 0.
    let server = start_server(FLAGS).await;
    let mut status = server.status.clone();
    let frozen = spawn_frozen(server.addr);
    wait_status(&mut status, "the frozen worker", |s| s.workers == 1).await;
    let started = Instant::now();
    let _workers: Vec<_> = (0..4).map(|_| spawn_worker(server.addr)).collect();
    let s = wait_status(&mut status, "it to be skipped", |s| s.skipped_workers == 1).await;
    let skipped_after = started.elapsed();
    assert_eq!(
        s.counters.deadline_closes, 2,
        "two missed deadlines, then skipped: {s:?}"
    );
    let with_straggler = rounds_per_s(&mut status, 20, 620).await;
    let s = status.borrow().clone();
    println!(
        "straggler: {baseline:.0} rounds/s without, {with_straggler:.0} with (skipped after {:.2} s); \
         late {}, stale {}, duplicate {}, deadline closes {}",
        skipped_after.as_secs_f64(), s.counters.late, s.counters.stale_rejected, s.counters.duplicate_rejected, s.counters.deadline_closes
    );
    assert!(
        with_straggler >= 0.8 * baseline,
        "{with_straggler:.1} rounds/s with a frozen worker vs {baseline:.1} without"
    );
    assert_eq!(s.workers, 5, "the frozen tab answers pings: slow, not dead");
    // Every accepted gradient is in exactly one round: applied ones, or the open one.
    assert_eq!(
        s.counters.answered_total + s.round_answered as u64,
        s.counters.gradients_accepted,
        "{s:?}"
    );
    frozen.cancel();
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_for_200_rounds_stalls_nothing_and_counts_nothing_twice() {
    let _heavy = heavy().await;
    const WORKERS: usize = 10;
    let server = start_server(&["--max-rounds", "200", "--round-timeout", "2"]).await;
    let mut status = server.status.clone();
    let options = worker::Options {
        url: ws_url(server.addr),
        ..worker::Options::default()
    };
    // Each worker: a task running `run_with` on a core it keeps (so it can resume).
    struct Slot {
        cancel: CancellationToken,
        task: tokio::task::JoinHandle<worker::WorkerCore>,
    }
    let spawn = |mut core: worker::WorkerCore| {
        let cancel = CancellationToken::new();
        let options = options.clone();
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            let _ = worker::run_with(&options, &mut core, stop).await;
            core
        });
        Slot { cancel, task }
    };
    let mut slots: Vec<Slot> = (0..WORKERS)
        .map(|_| spawn(worker::new_core(&options)))
        .collect();
    let mut rng = SplitMix64::new(99);
    let (mut disconnects, mut resumes, mut confirmed) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    let mut round = 0;
    let done = loop {
        // Every 5 rounds, 30 % of the workers drop and come back, half with their token.
        let s = wait_status(&mut status, "training to advance", |s| {
            s.round >= round + 5 || s.state == server::status::State::Done
        })
        .await;
        if s.state == server::status::State::Done {
            break s;
        }
        round = s.round;
        let mut picked: Vec<usize> = (0..WORKERS).collect();
        rng.shuffle(&mut picked);
        for (n, &i) in picked[..WORKERS * 3 / 10].iter().enumerate() {
            let slot = std::mem::replace(&mut slots[i], spawn(worker::new_core(&options)));
            slot.cancel.cancel();
            let core = guard("a worker to disconnect", slot.task)
                .await
                .expect("task");
            disconnects += 1;
            // The replacement above is a fresh identity; half of them resume instead. A core
            // that was never welcomed has no token to resume with (it was cancelled while
            // connecting): it rejoins as a fresh identity, and is not counted as a resume.
            if n % 2 == 0 && core.resume_token().is_some() {
                let fresh = std::mem::replace(&mut slots[i], spawn(core));
                fresh.cancel.cancel();
                let _ = fresh.task.await;
                resumes += 1;
            }
        }
        // Every resume reaches the coordinator before the next churn.
        let s = wait_status(&mut status, "the resumes", |s| {
            s.counters.resumed >= resumes || s.state == server::status::State::Done
        })
        .await;
        if s.state == server::status::State::Done {
            break s;
        }
        assert_eq!(s.counters.resumed, resumes, "{s:?}");
        confirmed = resumes;
    };
    let elapsed = started.elapsed();
    let summary = guard("the server to stop", server.wait())
        .await
        .expect("ran");
    println!(
        "churn: 200 rounds in {:.1} s ({:.0} rounds/s), {disconnects} disconnects, {resumes} resumes \
         (coordinator saw {}), accuracy {:?}; late {}, stale {}, duplicate {}, deadline closes {}",
        elapsed.as_secs_f64(), 200.0 / elapsed.as_secs_f64(), done.counters.resumed, summary.test_accuracy,
        done.counters.late, done.counters.stale_rejected, done.counters.duplicate_rejected, done.counters.deadline_closes
    );
    assert_eq!(summary.rounds, 200);
    // Nothing counted twice: every accepted gradient is in exactly one applied round, and no
    // honest worker ever had a gradient refused as a duplicate.
    assert_eq!(
        done.counters.answered_total, done.counters.gradients_accepted,
        "{done:?}"
    );
    assert_eq!(done.counters.duplicate_rejected, 0);
    assert!(resumes >= 10, "the churn resumed identities: {resumes}");
    // Every resume up to the last churn was confirmed by the coordinator's count. Only the
    // last churn's (at most 2) may be missing: if the 200th round ended the run while they
    // were connecting, they were refused because training was done.
    assert!(
        (confirmed..=resumes).contains(&done.counters.resumed) && resumes - confirmed <= 2,
        "{resumes} resumes sent, {confirmed} confirmed: {done:?}"
    );
    assert!(
        summary.test_accuracy.expect("evaluated") >= 0.90,
        "{summary:?}"
    );
    for slot in slots {
        slot.cancel.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_mode_with_a_5x_slower_worker_reaches_93_percent() {
    let _heavy = heavy().await;
    // A fast worker's cycle here is ~2 ms (gradient + round trip); the slow one adds 10 ms.
    let started = Instant::now();
    let swarm = swarm_with(
        &[
            "--mode",
            "async",
            "--max-staleness",
            "4",
            "--target-accuracy",
            "0.93",
            "--max-rounds",
            "20000",
        ],
        4,
        |i| worker::Options {
            compute_delay: (i == 3).then_some(Duration::from_millis(10)),
            ..worker::Options::default()
        },
    )
    .await;
    let status = swarm.status.clone();
    let (summary, _) = swarm.finish("async training to 93 %").await;
    let s = status.borrow().clone();
    println!(
        "async: {} updates to {:?} in {:.1} s ({:.0} updates/s); late {}, stale {}, duplicate {}",
        summary.rounds,
        summary.test_accuracy,
        started.elapsed().as_secs_f64(),
        summary.rounds as f64 / started.elapsed().as_secs_f64(),
        s.counters.late,
        s.counters.stale_rejected,
        s.counters.duplicate_rejected
    );
    assert!(summary.reached_target, "{summary:?}");
    assert!(
        s.counters.stale_rejected > 0,
        "the slow worker's gradients beyond S are rejected and counted: {s:?}"
    );
    assert_eq!(s.counters.answered_total, s.counters.gradients_accepted);
    assert_eq!(s.mode, "async");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hogwild_converges_on_the_default_model() {
    let _heavy = heavy().await;
    let started = Instant::now();
    let swarm = swarm(
        &[
            "--mode",
            "hogwild",
            "--target-accuracy",
            "0.93",
            "--max-rounds",
            "20000",
        ],
        4,
    )
    .await;
    let (summary, _) = swarm.finish("hogwild training").await;
    println!(
        "hogwild: {} updates to {:?} in {:.1} s",
        summary.rounds,
        summary.test_accuracy,
        started.elapsed().as_secs_f64()
    );
    assert!(summary.reached_target, "{summary:?}");
}

/// A worker that stops answering pings (its socket is open but nothing reads it) is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_stops_answering_pings_is_dropped() {
    let server = start_server(&[
        "--min-workers",
        "2",
        "--ping-interval",
        "0.05",
        "--ping-timeout",
        "0.3",
    ])
    .await;
    let mut status = server.status.clone();
    let mut silent = RawClient::connect(server.addr).await;
    silent.hello().await;
    wait_status(&mut status, "the worker to join", |s| s.workers == 1).await;
    let joined = Instant::now();
    // From here on nothing reads the socket, so no pong is ever sent.
    let s = wait_status(&mut status, "the silent worker to be dropped", |s| {
        s.workers == 0
    })
    .await;
    let gone_after = joined.elapsed();
    println!("silent worker dropped after {gone_after:?}");
    assert!(
        gone_after >= Duration::from_millis(300),
        "not before the timeout: {gone_after:?}"
    );
    assert_eq!(s.state, server::status::State::Waiting);
    drop(silent);
    stop(server).await;
}

/// A resumed worker keeps its id and its shard, and its earlier gradient is not counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_with_the_token_keeps_id_and_shard() {
    let server = start_server(&["--min-workers", "2"]).await;
    let mut status = server.status.clone();
    let mut a = ManualWorker::join(server.addr).await;
    let mut b = ManualWorker::join(server.addr).await;
    let (ga, gb) = (a.next_gradient().await, b.next_gradient().await);
    a.send(ga).await;
    b.send(gb.clone()).await;
    wait_status(&mut status, "round 0 to close", |s| s.round == 1).await;
    let before = status.borrow().worker_list.clone();
    let id = b.core.stats().worker_id.expect("welcomed");
    // A network blip: same core (same token), new connection; the old one is dropped.
    let shard = *b.shards.last().expect("b was sent a shard");
    let ManualWorker {
        client: b_client,
        core,
        ..
    } = b;
    let mut again = RawClient::connect(server.addr).await;
    again
        .send_raw(tokio_tungstenite::tungstenite::Message::Binary(
            core.hello_frame().into(),
        ))
        .await;
    drop(b_client);
    let Some(CoordinatorToWorker::Welcome(w)) = again.recv().await else {
        panic!("welcome")
    };
    assert_eq!(w.worker_id, id, "same identity");
    // Replaying the gradient it already sent for round 0 counts as late, not as new work.
    again.send_frames(gb).await;
    again.expect_error(protocol::ErrorCode::Late).await;
    // Round 1 closes without the replaced session; round 2 re-sends the resumed connection
    // its shard, and it is the same one.
    let ga = a.next_gradient().await;
    a.send(ga).await;
    let again_shard = loop {
        match again.recv().await {
            Some(CoordinatorToWorker::Shard(s)) => break (s.first_index, s.labels.len()),
            Some(_) => continue,
            None => panic!("closed before the shard"),
        }
    };
    assert_eq!(again_shard, shard, "same shard after the resume");
    let s = wait_status(&mut status, "the resume", |s| s.counters.resumed == 1).await;
    let mine = |list: &[server::status::WorkerStatus]| list.iter().find(|w| w.id == id.0).cloned();
    let (was, is) = (
        mine(&before).expect("listed"),
        mine(&s.worker_list).expect("listed"),
    );
    assert_eq!(was.gradients, is.gradients);
    assert_eq!(s.workers, 2);
    stop(server).await;
}

/// Wire compression: the default model trains with f16 and int8 weights and gradients, and
/// with int4 gradients (int8 weights), every sampled answer checked and none struck. (A
/// worker that asks for int2 here is confirmed int4: int2 answers are for local phases,
/// `Settings::answer_encoding`.) Prints
/// the accuracy after a fixed number of rounds for each, for the README's table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_workers_train_the_default_model() {
    let _heavy = heavy().await;
    let mut accuracy = Vec::new();
    for compression in [
        protocol::Compression::None,
        protocol::Compression::F16,
        protocol::Compression::Int8,
        protocol::Compression::Int4,
    ] {
        let swarm = swarm_with(&["--min-workers", "4", "--max-rounds", "300"], 4, |_| {
            worker::Options {
                compression,
                ..worker::Options::default()
            }
        })
        .await;
        let status = swarm.status.clone();
        let (summary, _) = swarm.finish("300 rounds").await;
        let a = summary.test_accuracy.expect("evaluated");
        let counters = status.borrow().counters.clone();
        println!(
            "compression {}: {:.2} % after 300 rounds, {} answers recomputed",
            compression.name(),
            a * 100.0,
            counters.gradients_verified
        );
        // Checked (probation, then sampled), and no honest answer refused.
        assert!(counters.gradients_verified >= 4, "{counters:?}");
        assert_eq!(counters.verification_mismatches, 0, "{compression:?}");
        accuracy.push(a);
    }
    assert!(accuracy.iter().all(|&a| a >= 0.90), "{accuracy:?}");
}

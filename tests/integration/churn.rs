use protocol::{CoordinatorToWorker, Round};

use crate::util::*;

/// A participant that dies mid-round does not stall the round; a worker joining later is
/// served the current weights at once and contributes from the next round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_does_not_stall_and_a_late_joiner_contributes() {
    // Two real workers and a third client that will die holding round 0. The deadline is
    // far away: this test is about leaving, and on a loaded machine an adaptive deadline
    // could refuse an honest answer as late.
    let Swarm {
        server,
        mut status,
        workers: _workers,
    } = swarm(&["--min-workers", "3", "--round-timeout", "30s"], 2).await;
    wait_status(&mut status, "two workers", |s| s.workers == 2).await;
    let mut doomed = RawClient::connect(server.addr).await;
    doomed.hello().await;
    let mut saw_round_0 = false;
    while let Some(msg) = doomed.recv().await {
        if let CoordinatorToWorker::Weights(w) = msg {
            assert_eq!(w.round, Round(0));
            saw_round_0 = true;
            break;
        }
    }
    assert!(saw_round_0, "the third worker was sent round 0");
    let s = status.borrow().clone();
    assert_eq!((s.round, s.round_participants), (0, 3));
    // Killed mid-round: the socket just goes away, no close frame, no gradient.
    drop(doomed);

    let s = wait_status(
        &mut status,
        "round 0 to close without the dead worker",
        |s| s.round >= 1,
    )
    .await;
    assert_eq!(s.workers, 2);

    // Below --min-workers now; a late joiner brings the swarm back to 3 and trains.
    let (_w3, _) = spawn_worker(server.addr);
    let s = wait_status(&mut status, "training to resume", |s| s.round >= 5).await;
    let late = s.worker_list.iter().max_by_key(|w| w.id).expect("workers");
    assert_eq!(late.id, 4);

    // A join in the middle of a round is served the current weights immediately, and its
    // gradients count from the next round on.
    let mut late = ManualWorker::join(server.addr).await;
    let first = late.client.recv().await.expect("welcome");
    let CoordinatorToWorker::Welcome(welcome) = first else {
        panic!("expected Welcome, got {first:?}")
    };
    late.core
        .handle(CoordinatorToWorker::Welcome(welcome.clone()))
        .expect("welcome");
    match late.client.recv().await.expect("task") {
        CoordinatorToWorker::Task(task) => late.core.handle(CoordinatorToWorker::Task(task)),
        other => panic!("expected the Task of the current Weights, got {other:?}"),
    }
    .expect("task");
    match late.client.recv().await.expect("weights") {
        CoordinatorToWorker::Weights(w) => {
            assert!(w.round.0 >= 5, "current weights, round {}", w.round);
            // Without a shard yet it is not a participant: no gradient for this round.
            assert!(late
                .core
                .handle(CoordinatorToWorker::Weights(w))
                .expect("ok")
                .is_none());
        }
        other => panic!("expected the current Weights right after Welcome, got {other:?}"),
    }
    for _ in 0..3 {
        let g = late.next_gradient().await;
        late.send(g).await;
    }
    let s = wait_status(&mut status, "the late joiner's gradients", |s| {
        s.worker_list
            .iter()
            .any(|w| w.id == welcome.worker_id.0 && w.gradients >= 2)
    })
    .await;
    assert_eq!(s.workers, 4);
    assert_eq!(s.counters.gradients_rejected, 0, "{s:?}");
    stop(server).await;
}

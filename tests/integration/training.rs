use crate::util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_native_workers_reach_93_percent() {
    let _heavy = heavy().await;
    let started = std::time::Instant::now();
    let swarm = swarm(
        &[
            "--min-workers",
            "4",
            "--target-accuracy",
            "0.93",
            "--max-rounds",
            "3000",
        ],
        4,
    )
    .await;
    let (summary, workers) = swarm.finish("training to 93 %").await;
    let elapsed = started.elapsed();
    println!(
        "reached {:?} test accuracy in {} rounds, {:.1} s",
        summary.test_accuracy,
        summary.rounds,
        elapsed.as_secs_f64()
    );
    assert!(
        summary.reached_target,
        "stopped at {} rounds: {summary:?}",
        summary.rounds
    );
    assert!(summary.test_accuracy.expect("evaluated") >= 0.93);
    for task in workers {
        let (ended, stats) = guard("worker end", task).await.expect("worker task");
        // Every worker was told the coordinator is going away, and contributed to most rounds.
        assert!(closed_by_shutdown(&ended), "{ended:?}");
        assert!(stats.gradients_sent >= summary.rounds - 1, "{stats:?}");
    }
}

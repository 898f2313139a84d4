//! The cluster (docs/CLUSTER.md): a real nats-server, a root and edges, with real workers on
//! loopback.

use std::time::Instant;

use server::cluster::root::RootSummary;
use server::Config;
use tokio_util::sync::CancellationToken;

use crate::nats::NatsServer;
use crate::util::*;

/// What every process of these runs shares: exact SGD (no Adam to magnify the sums' order),
/// the plain mean (a robust rule over 6 answers is not one over 2 then 3), no clipping (its
/// adaptive bound starts from each coordinator's own data), and a train split of 8,400
/// samples, so that 3 parts of 2 shards are the 6 shards of one coordinator's 6 workers.
const COMMON: [&str; 12] = [
    "--optimizer",
    "sgd",
    "--lr",
    "0.1",
    "--aggregator",
    "mean",
    "--max-grad-norm",
    "1e6",
    "--test-fraction",
    "0.16",
    "--eval-interval",
    "5",
];

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

/// A root on this task's runtime, as `coordinator --role root` runs it.
fn spawn_root(
    nats: &str,
    extra: &[&str],
) -> (
    tokio::task::JoinHandle<Result<RootSummary, server::cluster::ClusterError>>,
    CancellationToken,
) {
    let args = [
        "coordinator",
        "--role",
        "root",
        "--nats",
        nats,
        "--log-level",
        "warn",
    ]
    .into_iter()
    .chain(COMMON)
    .chain(extra.iter().copied());
    let config = Config::from_args(args).expect("root flags");
    let cluster = config.cluster.clone().expect("a cluster");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::cluster::root::run(
        config,
        cluster,
        shutdown.clone(),
    ));
    (task, shutdown)
}

/// Three edges of two native workers each train as one coordinator with the same six
/// workers: the same shards, the same batches, the same initial weights; only the order of
/// the f32 sums differs (each edge averages its two, the root the three edges'), so the
/// weights agree within rounding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_edges_train_like_one_coordinator_with_the_same_six_workers() {
    let _heavy = HEAVY.lock().await;
    let rounds = "12";
    // One coordinator, six workers.
    let single =
        start_server(&[&COMMON[..], &["--min-workers", "6", "--max-rounds", rounds]].concat())
            .await;
    let single_weights = single.weights.clone();
    let workers: Vec<_> = (0..6).map(|_| spawn_worker(single.addr)).collect();
    let started = Instant::now();
    let summary = guard("the single coordinator's run", single.wait())
        .await
        .expect("ran");
    let single_s = started.elapsed().as_secs_f64();
    drop(workers);
    let expected = floats(&single_weights.borrow().param_bytes());
    assert_eq!(summary.rounds, 12);

    // The cluster: a nats-server, a root, three edges of two workers.
    let nats = NatsServer::start().await;
    let (root, _root_stop) = spawn_root(&nats.url, &["--max-rounds", rounds, "--min-edges", "3"]);
    let mut edges = Vec::new();
    let mut edge_workers = Vec::new();
    let started = Instant::now();
    for part in 1..=3 {
        let data_part = format!("{part}/3");
        let name = format!("edge-{part}");
        let edge = start_server(
            &[
                &COMMON[..],
                &[
                    "--role",
                    "edge",
                    "--nats",
                    &nats.url,
                    "--data-part",
                    &data_part,
                    "--node-name",
                    &name,
                    "--min-workers",
                    "2",
                    "--max-rounds",
                    rounds,
                ],
            ]
            .concat(),
        )
        .await;
        edge_workers.push(spawn_worker(edge.addr));
        edge_workers.push(spawn_worker(edge.addr));
        edges.push(edge);
    }
    let root = guard("the root's run", root)
        .await
        .expect("the root task")
        .expect("the root ran");
    assert_eq!(root.version, 12, "{root:?}");
    assert_eq!(root.closed, 12, "every round closed by this root");
    let mut finals = Vec::new();
    for edge in edges {
        let weights = edge.weights.clone();
        let summary = guard("an edge's run", edge.wait()).await.expect("ran");
        assert_eq!(summary.rounds, 12);
        finals.push(floats(&weights.borrow().param_bytes()));
    }
    let cluster_s = started.elapsed().as_secs_f64();
    // Every edge ends on the root's one version, bit for bit.
    assert!(finals.windows(2).all(|w| w[0] == w[1]));
    let (mut max_diff, mut norm) = (0.0f32, 0.0f64);
    for (a, b) in finals[0].iter().zip(&expected) {
        max_diff = max_diff.max((a - b).abs());
        norm += f64::from(*b) * f64::from(*b);
    }
    println!(
        "cluster (3 edges × 2 workers) vs one coordinator × 6, 12 rounds of SGD: max |Δw| = {max_diff:e} \
         (weights' norm {:.3}); {single_s:.1} s alone, {cluster_s:.1} s as a cluster",
        norm.sqrt()
    );
    assert!(
        max_diff <= 1e-6,
        "the cluster's weights are the single coordinator's within rounding: {max_diff:e}"
    );
}

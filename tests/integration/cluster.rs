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
    let _heavy = heavy().await;
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

/// `n` edges of the run on this runtime, as `coordinator --role edge` runs them: edge-I on
/// part I of `n` of the train split, with these extra flags.
async fn start_edges(nats: &str, n: usize, extra: &[&str]) -> Vec<server::RunningServer> {
    let mut edges = Vec::with_capacity(n);
    for part in 1..=n {
        let (name, data_part) = (format!("edge-{part}"), format!("{part}/{n}"));
        let flags = [
            "--role",
            "edge",
            "--nats",
            nats,
            "--node-name",
            &name,
            "--data-part",
        ];
        let flags: Vec<&str> = flags
            .into_iter()
            .chain([data_part.as_str()])
            .chain(extra.iter().copied())
            .collect();
        edges.push(start_server(&flags).await);
    }
    edges
}

/// `per_edge` native workers on each edge.
fn spawn_workers(
    edges: &[server::RunningServer],
    per_edge: usize,
) -> Vec<(WorkerTask, CancellationToken)> {
    edges
        .iter()
        .flat_map(|edge| (0..per_edge).map(|_| spawn_worker(edge.addr)))
        .collect()
}

async fn stop_workers<T>(workers: Vec<(tokio::task::JoinHandle<T>, CancellationToken)>) {
    for (task, cancel) in workers {
        cancel.cancel();
        let _ = task.await;
    }
}

async fn stop_edges(edges: Vec<server::RunningServer>) {
    for edge in edges {
        stop(edge).await;
    }
}

/// A NATS client of the test's own, on the run's buckets, to watch the cluster's events.
async fn observer(url: &str) -> server::cluster::Nats {
    let config = server::cluster::ClusterConfig {
        url: url.to_owned(),
        run: "crowdtrain".into(),
        name: "test".into(),
        edge_timeout: std::time::Duration::from_secs(30),
        min_edges: 1,
        store_every: 1,
        public_url: None,
    };
    server::cluster::Nats::connect(&config)
        .await
        .expect("the test connects to NATS")
}

/// Waits until the root has published a version of at least `at_least` (the `version`
/// key's updates), and returns it. A watch that ends (NATS restarted) is started again.
async fn wait_version(nats: &server::cluster::Nats, at_least: u64, what: &str) -> u64 {
    use futures_util::StreamExt;
    guard(what, async {
        loop {
            let Ok(mut watch) = nats
                .leases
                .watch_with_history(server::cluster::VERSION_KEY)
                .await
            else {
                tokio::task::yield_now().await;
                continue;
            };
            while let Some(Ok(entry)) = watch.next().await {
                if let Some((_, version)) = server::cluster::parse_version_key(&entry.value) {
                    if version >= at_least {
                        return version;
                    }
                }
            }
        }
    })
    .await
}

/// Waits until the live edges' leases satisfy `pred` (by edge name).
async fn wait_edges(
    nats: &server::cluster::Nats,
    what: &str,
    mut pred: impl FnMut(&std::collections::BTreeMap<String, server::cluster::edge::EdgeLease>) -> bool,
) {
    use futures_util::StreamExt;
    guard(what, async {
        let mut watch = nats
            .leases
            .watch_with_history(format!("{}>", server::cluster::EDGE_PREFIX))
            .await
            .expect("watch the leases");
        let mut edges = std::collections::BTreeMap::new();
        while let Some(Ok(entry)) = watch.next().await {
            match serde_json::from_slice::<server::cluster::edge::EdgeLease>(&entry.value) {
                Ok(lease) => edges.insert(lease.name.clone(), lease),
                Err(_) => edges.remove(entry.key.trim_start_matches(server::cluster::EDGE_PREFIX)),
            };
            // An expired lease shows no event: take the listing too.
            let live = server::cluster::edge::live_edges(nats)
                .await
                .unwrap_or_default();
            edges.retain(|name, _| live.iter().any(|l| &l.name == name));
            if pred(&edges) {
                return;
            }
        }
        panic!("the leases' watch ended");
    })
    .await;
}

/// A native worker that moves to the next of `urls` when its coordinator dies (the
/// worker binary's `--url a,b,c --reconnect`).
fn spawn_moving_worker(urls: Vec<String>) -> (tokio::task::JoinHandle<()>, CancellationToken) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let options = worker::Options {
                url: urls[0].clone(),
                ..worker::Options::default()
            };
            worker::run_reconnecting(&options, &urls, cancel)
                .await
                .expect("an honest worker is never removed");
        }
    });
    (task, cancel)
}

/// `kill -9` of an edge mid-run: its workers move to the other edges, the root closes the
/// rounds without it (at once when its lease expires, at the latest at `--edge-timeout`),
/// and training goes on. The edges are real processes of the real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_of_an_edge_its_workers_move_and_training_goes_on() {
    let _heavy = heavy().await;
    let nats = NatsServer::start().await;
    let watch = observer(&nats.url).await;
    let (root, root_stop) = spawn_root(&nats.url, &["--edge-timeout", "5s"]);
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_coordinator"));
    let mut edges = Vec::new();
    for part in 1..=3 {
        let (name, data_part) = (format!("edge-{part}"), format!("{part}/3"));
        let flags = [
            "--role",
            "edge",
            "--nats",
            &nats.url,
            "--node-name",
            &name,
            "--data-part",
            &data_part,
            "--test-fraction",
            "0.16",
        ];
        edges.push(spawn_coordinator_at(binary, None, 0, &flags).await);
    }
    let urls: Vec<String> = edges.iter().map(|(_, addr, _)| ws_url(*addr)).collect();
    let mut workers = Vec::new();
    for own in 0..3 {
        for _ in 0..2 {
            // Its own edge first, then the others.
            let order = (0..3).map(|k| urls[(own + k) % 3].clone()).collect();
            workers.push(spawn_moving_worker(order));
        }
    }
    let before = wait_version(&watch, 4, "four rounds of the three edges").await;
    let killed = Instant::now();
    edges[1].0.kill().await.expect("kill -9 edge-2");
    wait_edges(&watch, "edge-2's workers on edge-1 and edge-3", |e| {
        !e.contains_key("edge-2") && e.values().map(|l| l.workers).sum::<usize>() == 6
    })
    .await;
    let moved = killed.elapsed().as_secs_f64();
    let next = wait_version(&watch, before + 1, "a round without edge-2").await;
    let first_round = killed.elapsed().as_secs_f64();
    let after = wait_version(&watch, next + 5, "five more rounds on two edges").await;
    println!(
        "kill -9 of edge-2 at version {before}: the next version {next} {first_round:.1} s later; \
         its workers on the other edges within {moved:.1} s; version {after} {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    stop_workers(workers).await;
    root_stop.cancel();
    let root = root.await.expect("the root task").expect("the root ran");
    assert!(root.version >= after, "{root:?}");
}

/// A root process of the real binary, and its log lines (stdout) as they come.
async fn spawn_root_process(
    nats: &str,
    name: &str,
    expect: &str,
) -> (
    tokio::process::Child,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args([
            "--role",
            "root",
            "--nats",
            nats,
            "--node-name",
            name,
            "--edge-timeout",
            "5s",
            // Every version stored: a takeover loses none.
            "--store-every",
            "1",
        ])
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a root");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    wait_line(&mut rx, expect).await;
    (child, rx)
}

/// The first line containing `what` (and returns it).
async fn wait_line(lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>, what: &str) -> String {
    guard(what, async {
        while let Some(line) = lines.recv().await {
            if line.contains(what) {
                return line;
            }
        }
        panic!("the process ended before logging {what:?}");
    })
    .await
}

/// The number after `key=` in a log line.
fn field(line: &str, key: &str) -> u64 {
    let at = line.find(&format!("{key}=")).expect("the field") + key.len() + 1;
    line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .expect("a number")
}

/// `kill -9` of the root: a standby root takes the lease when it expires, resumes from the
/// newest version in the Object Store (every version is stored before it is announced, so
/// none is lost), and the edges go on with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_of_the_root_a_standby_continues_from_the_object_store() {
    let _heavy = heavy().await;
    let nats = NatsServer::start().await;
    let watch = observer(&nats.url).await;
    let (mut first, _) = spawn_root_process(&nats.url, "root-a", "holding the lease").await;
    let (_standby, mut standby_log) = spawn_root_process(&nats.url, "root-b", "standing by").await;
    let edges = start_edges(&nats.url, 2, &[]).await;
    let workers = spawn_workers(&edges, 2);
    let before = wait_version(&watch, 4, "four rounds").await;
    let killed = Instant::now();
    first.kill().await.expect("kill -9 the root");
    wait_line(&mut standby_log, "holding the lease").await;
    let took = killed.elapsed().as_secs_f64();
    let resumed = wait_line(&mut standby_log, "resuming from the Object Store").await;
    let resumed = field(&resumed, "version");
    assert!(
        resumed >= before,
        "the standby resumed from version {resumed}, older than {before}, announced before the kill"
    );
    let after = wait_version(&watch, resumed + 3, "three rounds with the standby").await;
    println!(
        "kill -9 of the root at version ≥ {before}: the standby held the lease {took:.1} s later, \
         resumed from version {resumed} (none lost) and reached {after} {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    stop_workers(workers).await;
    stop_edges(edges).await;
}

/// nats-server killed and started again on the same store directory: the root keeps its
/// lease and version, the edges send their partials again, and the run continues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_restarted_on_its_store_loses_nothing() {
    let _heavy = heavy().await;
    let mut nats = NatsServer::start().await;
    let watch = observer(&nats.url).await;
    let (root, root_stop) = spawn_root(&nats.url, &["--edge-timeout", "5s"]);
    let edges = start_edges(&nats.url, 2, &[]).await;
    let workers = spawn_workers(&edges, 2);
    let before = wait_version(&watch, 3, "three rounds").await;
    let restarted = Instant::now();
    nats.restart().await;
    let after = wait_version(&watch, before + 3, "three rounds after the restart").await;
    println!(
        "nats-server kill -9 and restart at version {before}: version {after} {:.1} s later",
        restarted.elapsed().as_secs_f64()
    );
    root_stop.cancel();
    let root = root.await.expect("the root task").expect("the root ran on");
    assert!(root.version >= after);
    stop_workers(workers).await;
    stop_edges(edges).await;
}

/// A hostile worker on one edge is handled there: recomputed, struck and banned by that
/// edge, whose partials carry none of its answers; the other edge never hears of it, and the
/// root only ever sees the edges' partials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_worker_is_handled_at_its_edge_and_the_others_never_see_it() {
    use crate::attacks::{spawn_attacker, Attack};
    let _heavy = heavy().await;
    let nats = NatsServer::start().await;
    let watch = observer(&nats.url).await;
    let (root, root_stop) = spawn_root(&nats.url, &["--min-edges", "2"]);
    let edges = start_edges(
        &nats.url,
        2,
        &["--verify-fraction", "1", "--min-workers", "2"],
    )
    .await;
    let workers = spawn_workers(&edges, 2);
    let stop_attack = CancellationToken::new();
    let attacker = spawn_attacker(edges[0].addr, Attack::Scaled, stop_attack.clone());
    let mut hostile_edge = edges[0].status.clone();
    let banned = wait_status(&mut hostile_edge, "the cheat banned at edge-1", |s| {
        !s.bans.is_empty()
    })
    .await;
    let version = wait_version(&watch, banned.round + 3, "three rounds after the ban").await;
    let other = edges[1].status.borrow().clone();
    println!(
        "a ×1.01 cheat at edge-1: banned there at round {} ({} mismatches); edge-2: {} rejected, {} mismatches; root at version {version}",
        banned.round, banned.counters.verification_mismatches, other.counters.gradients_rejected, other.counters.verification_mismatches
    );
    assert_eq!(banned.counters.verification_mismatches, 3, "{banned:?}");
    assert_eq!(other.counters.verification_mismatches, 0, "{other:?}");
    assert_eq!(other.counters.gradients_rejected, 0, "{other:?}");
    assert!(other.bans.is_empty());
    assert_eq!(other.workers, 2, "edge-2 only ever had its own two");
    stop_attack.cancel();
    let _ = attacker.await;
    root_stop.cancel();
    root.await.expect("the root task").expect("the root ran");
    stop_workers(workers).await;
    stop_edges(edges).await;
}

/// A browser tab trains on an edge (the page it serves, unchanged), a native worker on
/// another, a third edge has no workers (and the root does not wait for it: ten rounds here
/// would take its 30 s edge timeout each), and each edge's status (what its dashboard shows)
/// has the whole run: every edge, where volunteers reach it, the workers, the root's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tab_trains_on_an_edge_and_every_edge_shows_the_whole_run() {
    use crate::browser::{page, Browser};
    let _heavy = heavy().await;
    let nats = NatsServer::start().await;
    let watch = observer(&nats.url).await;
    let (root, root_stop) = spawn_root(&nats.url, &["--min-edges", "2"]);
    let edges = start_edges(&nats.url, 3, &[]).await;
    let tab = Browser::open(&page(edges[0].addr));
    let native = spawn_worker(edges[1].addr);
    let version = wait_version(&watch, 10, "ten rounds of a tab and a native worker").await;
    let mut status = edges[0].status.clone();
    let s = wait_status(&mut status, "the tab's answers counted", |s| {
        s.worker_list
            .iter()
            .any(|w| w.kind == "browser" && w.gradients >= 5)
    })
    .await;
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    let mut other = edges[1].status.clone();
    let seen = wait_status(&mut other, "edge-2 to see both edges", |s| {
        s.cluster
            .as_ref()
            .is_some_and(|c| c.edges.len() == 3 && c.workers == 2 && c.root_version.is_some())
    })
    .await;
    let view = seen.cluster.expect("a cluster view");
    assert!(
        view.edges.iter().any(|e| e.url == ws_url(edges[0].addr)),
        "{view:?}"
    );
    // The same over HTTP, as the dashboard reads it.
    let json = get_status_json(edges[1].addr).await;
    assert_eq!(
        json["cluster"]["edges"].as_array().map(Vec::len),
        Some(3),
        "{json}"
    );
    println!(
        "a tab on edge-1 and a native worker on edge-2: version {version}; edge-2's view: {} edges, {} workers",
        view.edges.len(),
        view.workers
    );
    tab.close().await;
    native.1.cancel();
    let _ = native.0.await;
    root_stop.cancel();
    root.await.expect("the root task").expect("the root ran");
    stop_edges(edges).await;
}

/// A tab whose edge goes away moves to another edge of the run by itself: its page learnt
/// the other edges from its edge's status, and the other edge lets in the pages of the
/// run's edges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tab_moves_to_another_edge_when_its_edge_goes_away() {
    use crate::browser::{page, Browser};
    let _heavy = heavy().await;
    let nats = NatsServer::start().await;
    let watch = observer(&nats.url).await;
    let (root, root_stop) = spawn_root(&nats.url, &["--edge-timeout", "5s"]);
    let mut edges = start_edges(&nats.url, 2, &[]).await;
    let native = spawn_worker(edges[1].addr);
    let tab = Browser::open_with_devtools(&page(edges[0].addr));
    let mut first = edges[0].status.clone();
    wait_status(&mut first, "the tab training on edge-1", |s| {
        s.worker_list
            .iter()
            .any(|w| w.kind == "browser" && w.gradients >= 3)
    })
    .await;
    // The page learns the run's edges from its edge's status (it polls it).
    tab.until(
        "the page to know both edges",
        "document.getElementById('edges').dataset.count === '2'",
    )
    .await;
    let mut second = edges[1].status.clone();
    let gone = Instant::now();
    let first_edge = edges.remove(0);
    stop(first_edge).await;
    let s = wait_status(&mut second, "the tab training on edge-2", |s| {
        s.worker_list
            .iter()
            .any(|w| w.kind == "browser" && w.gradients >= 3)
    })
    .await;
    let version = wait_version(&watch, s.round + 2, "rounds with the tab on edge-2").await;
    println!(
        "edge-1 stopped: its tab trained on edge-2 {:.1} s later; version {version}",
        gone.elapsed().as_secs_f64()
    );
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    tab.close().await;
    native.1.cancel();
    let _ = native.0.await;
    root_stop.cancel();
    root.await.expect("the root task").expect("the root ran");
    stop_edges(edges).await;
}

/// Ctrl-C or SIGTERM stops every role within about two seconds, even when nats-server went
/// first: a root and an edge of the real binary, a worker training on the edge,
/// nats-server killed (SIGKILL), then SIGTERM to each. (Before, the root ran on for 6 to
/// 26 s, waiting on NATS calls that no longer answered.)
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_stops_within_two_seconds_of_sigterm_with_nats_gone() {
    let _heavy = heavy().await;
    let mut nats = NatsServer::start().await;
    let watch = observer(&nats.url).await;
    let (mut root, _root_log) = spawn_root_process(&nats.url, "root-a", "holding the lease").await;
    let flags = [
        "--role",
        "edge",
        "--nats",
        &nats.url,
        "--node-name",
        "edge-1",
    ];
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_coordinator"));
    let (mut edge, edge_addr) = spawn_coordinator(binary, None, &flags).await;
    let (worker, cancel) = spawn_worker(edge_addr);
    wait_version(&watch, 2, "two rounds on the edge").await;
    nats.kill().await;
    for (role, child) in [("root", &mut root), ("edge", &mut edge)] {
        let pid = child.id().expect("running").to_string();
        let sent = Instant::now();
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(term.success());
        let exit = guard("the role to exit", child.wait()).await.expect("wait");
        let took = sent.elapsed();
        println!(
            "{role}: exited ({exit}) {:.2} s after SIGTERM, nats-server gone",
            took.as_secs_f64()
        );
        assert!(
            took < std::time::Duration::from_secs(3),
            "the {role} took {took:?} to stop"
        );
    }
    cancel.cancel();
    let _ = guard("the worker", worker).await;
}

//! `bench --edges E`: the same K synthetic workers and rounds, through a cluster: a real
//! nats-server (JetStream on, a temporary store), a root process and E edge processes (this
//! binary re-executed with `--serve-root` and `--serve`), worker k on edge k mod E.
//!
//! Besides rounds/s (set beside `bench` without `--edges`, a single coordinator, for the
//! extra hop's cost), it reads the bytes every NATS connection moved from the server's
//! monitoring endpoint (`/connz`): the root's, the edges', and NATS's total, per round, set
//! against the bytes the edges took from their workers. The final weights are checked
//! against plain SGD on the mean gradient, as for a single coordinator.

use std::process::Stdio;
use std::time::Instant;

use anyhow::{bail, Context};
use protocol::Compression;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::{
    fetch_params, listening, matches_reference, round2, round_times, worker, WARMUP_ROUNDS,
};

/// nats-server: `NATS_SERVER`, or where `scripts/setup.sh` puts it.
fn nats_binary() -> String {
    std::env::var("NATS_SERVER")
        .unwrap_or_else(|_| ".tools/nats-server-2.15.1/nats-server".to_string())
}

/// Starts nats-server; returns it with its client URL and monitoring address.
/// Every process is killed when dropped (`kill_on_drop`).
async fn start_nats(
    store: &std::path::Path,
) -> anyhow::Result<(tokio::process::Child, String, String)> {
    let binary = nats_binary();
    let mut child = tokio::process::Command::new(&binary)
        .args(["-a", "127.0.0.1", "-p", "-1", "-m", "-1", "-js", "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!("starting {binary} (scripts/setup.sh installs it; or set NATS_SERVER)")
        })?;
    let mut lines = BufReader::new(child.stderr.take().context("stderr")?).lines();
    let (mut client, mut monitor) = (None, None);
    loop {
        let line = lines
            .next_line()
            .await?
            .context("nats-server exited before it was ready")?;
        if let Some(at) = line.find("Listening for client connections on ") {
            client = Some(line[at + 36..].trim().to_string());
        }
        if let Some(at) = line.find("Starting http monitor on ") {
            monitor = Some(line[at + 25..].trim().to_string());
        }
        if line.contains("Server is ready") {
            break;
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((
        child,
        format!("nats://{}", client.context("no client port")?),
        monitor.context("no monitoring port")?,
    ))
}

/// `GET path` on the monitoring endpoint, as JSON.
async fn monitor_json(monitor: &str, path: &str) -> anyhow::Result<serde_json::Value> {
    let mut stream = tokio::net::TcpStream::connect(monitor).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {monitor}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no HTTP header end")?
        + 4;
    Ok(serde_json::from_slice(&raw[at..])?)
}

/// Bytes each named connection (`crowdtrain NAME`, closed ones too) sent to the server and
/// received from it, and the server's totals in and out.
async fn traffic(monitor: &str) -> anyhow::Result<(Vec<(String, u64, u64)>, u64, u64)> {
    let connz = monitor_json(monitor, "/connz?state=all&limit=1024").await?;
    let mut out = Vec::new();
    for c in connz["connections"].as_array().into_iter().flatten() {
        let name = c["name"].as_str().unwrap_or_default();
        if let Some(name) = name.strip_prefix("crowdtrain ") {
            let get = |k: &str| c[k].as_u64().unwrap_or(0);
            out.push((name.to_string(), get("in_bytes"), get("out_bytes")));
        }
    }
    let varz = monitor_json(monitor, "/varz").await?;
    let get = |k: &str| varz[k].as_u64().unwrap_or(0);
    Ok((out, get("in_bytes"), get("out_bytes")))
}

pub(crate) async fn run(
    hidden: usize,
    params: usize,
    workers: usize,
    rounds: u64,
    compression: Compression,
    edges: usize,
    flags: &[String],
) -> anyhow::Result<serde_json::Value> {
    if edges == 0 || workers < edges {
        bail!("--edges must be from 1 to --workers");
    }
    let total_rounds = WARMUP_ROUNDS + rounds;
    let store = std::env::temp_dir().join(format!("crowdtrain-bench-nats-{}", std::process::id()));
    let (_nats, url, monitor) = start_nats(&store).await?;
    let exe = std::env::current_exe()?;
    let mut root_flags = flags.to_vec();
    root_flags.extend(
        [
            "--role",
            "root",
            "--nats",
            &url,
            "--node-name",
            "root",
            "--min-edges",
            &edges.to_string(),
            "--max-rounds",
            &total_rounds.to_string(),
        ]
        .map(String::from),
    );
    let root = tokio::process::Command::new(&exe)
        .arg("--serve-root")
        .args(&root_flags)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the root")?;
    let _root = root;
    let mut addrs = Vec::new();
    let mut processes = Vec::new();
    for e in 0..edges {
        let on_edge = (0..workers).filter(|k| k % edges == e).count();
        let mut edge_flags: Vec<String> = flags.iter().map(String::clone).collect::<Vec<_>>();
        // The single coordinator's flags name K workers; an edge has its share.
        for (i, f) in edge_flags.clone().iter().enumerate() {
            if matches!(
                f.as_str(),
                "--min-workers" | "--max-workers" | "--max-per-ip" | "--upload-slots-per-ip"
            ) {
                edge_flags[i + 1] = on_edge.to_string();
            }
        }
        edge_flags.extend([
            "--role".to_string(),
            "edge".into(),
            "--nats".into(),
            url.clone(),
            "--node-name".into(),
            format!("edge-{e}"),
        ]);
        let mut child = tokio::process::Command::new(&exe)
            .arg("--serve")
            .args(&edge_flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting an edge")?;
        let addr = listening(&mut child).await?;
        addrs.push(addr);
        processes.push(child);
    }
    let tasks: Vec<_> = (0..workers)
        .map(|k| tokio::spawn(worker(addrs[k % edges], k, total_rounds, compression, None)))
        .collect();
    let mut timelines = Vec::with_capacity(workers);
    for task in tasks {
        timelines.push(task.await??);
    }
    let (elapsed, round_ms) = round_times(&timelines[0], total_rounds);
    let started = Instant::now();
    let final_params = fetch_params(addrs[0], hidden).await?;
    let fetched_ms = started.elapsed().as_secs_f64() * 1e3;
    let (checksum_ok, checksum_max_diff) =
        matches_reference(&final_params, hidden, workers, total_rounds, compression);
    let (connections, nats_in, nats_out) = traffic(&monitor).await?;
    drop(processes);
    let _ = std::fs::remove_dir_all(&store);
    if !checksum_ok {
        bail!("final weights differ from the reference computation (max abs diff {checksum_max_diff})");
    }
    // Every version (the first included) crossed NATS: per round, over all of them.
    let per_round = |bytes: u64| round2(bytes as f64 / (total_rounds + 1) as f64 / 1e6);
    let root = connections.iter().find(|c| c.0 == "root");
    let edge_bytes: u64 = connections
        .iter()
        .filter(|c| c.0.starts_with("edge-"))
        .map(|c| c.1 + c.2)
        .sum();
    let from_workers = workers * (compression.payload_len(params).unwrap_or(0) + 22);
    Ok(serde_json::json!({
        "system": "crowdtrain-cluster",
        "params": params,
        "workers": workers,
        "edges": edges,
        "rounds_per_s": round2(rounds as f64 / elapsed),
        "round_ms_median": round2(round_ms[round_ms.len() / 2]),
        "edges_take_from_workers_MB_per_round": round2(from_workers as f64 / 1e6),
        "root_sends_MB_per_round": per_round(root.map_or(0, |c| c.1)),
        "root_receives_MB_per_round": per_round(root.map_or(0, |c| c.2)),
        "edges_nats_MB_per_round": per_round(edge_bytes),
        "nats_in_MB_per_round": per_round(nats_in),
        "nats_out_MB_per_round": per_round(nats_out),
        "final_params_fetch_ms": round2(fetched_ms),
        "checksum_ok": checksum_ok,
        "checksum_max_abs_diff": checksum_max_diff,
        "compression": compression.name(),
    }))
}

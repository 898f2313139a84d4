use std::time::{Duration, Instant};

use crate::util::*;

/// SIGTERM to a real coordinator process with connected workers: every session gets a close
/// frame and the process exits 0 within 5 s.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_connected_workers_exits_0_within_5_s() {
    let (mut child, addr) =
        spawn_coordinator(env!("CARGO_BIN_EXE_coordinator").as_ref(), None, &[]).await;

    let workers: Vec<_> = (0..2).map(|_| spawn_worker(addr)).collect();
    // A third, test-driven worker tells us when training is under way.
    let mut probe = ManualWorker::join(addr).await;
    for _ in 0..3 {
        let g = probe.next_gradient().await;
        probe.send(g).await;
    }

    let pid = child.id().expect("running");
    let signalled = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let exit = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("exited within 5 s")
        .expect("wait");
    println!("exited {exit} {:?} after SIGTERM", signalled.elapsed());
    assert!(exit.success(), "exit status {exit}");
    for (task, _) in workers {
        let (ended, _) = guard("worker end", task).await.expect("worker task");
        assert!(
            closed_by_shutdown(&ended),
            "workers get a close frame: {ended:?}"
        );
    }
}

/// The binary copied to another directory, run from there with no flags about where the page
/// is, serves the page and its wasm worker from itself, and trains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_binary_serves_its_page_and_trains() {
    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join("coordinator");
    std::fs::copy(env!("CARGO_BIN_EXE_coordinator"), &copy).expect("copy the binary");
    let (mut child, addr) =
        spawn_coordinator(&copy, Some(dir.path()), &["--max-rounds", "30"]).await;
    let (code, head, body) = http_get(addr, "/").await;
    assert_eq!(code, 200, "{head}");
    assert!(
        String::from_utf8_lossy(&body).contains("main.js"),
        "the volunteer page"
    );
    let (code, head, body) = http_get(addr, "/pkg/worker_wasm_bg.wasm").await;
    assert_eq!(
        code, 200,
        "the wasm worker is built in (scripts/test.sh builds it first): {head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/wasm"),
        "{head}"
    );
    assert_eq!(&body[..4], b"\0asm", "a wasm module");
    let (code, _, _) = http_get(addr, "/pkg/nothing-here.js").await;
    assert_eq!(code, 404);
    let (task, _) = spawn_worker(addr);
    let exit = guard("30 rounds and exit", child.wait())
        .await
        .expect("wait");
    assert!(exit.success(), "exit status {exit}");
    let (_, stats) = guard("worker end", task).await.expect("worker task");
    assert!(stats.gradients_sent >= 29, "{stats:?}");
}

/// Runs the binary with `flags` and `env` and one worker until it exits by itself (0), and
/// returns its log lines, each parsed as JSON.
async fn json_log_of(flags: &[&str], env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let binary = env!("CARGO_BIN_EXE_coordinator").as_ref();
    let (mut child, addr, mut lines) = spawn_coordinator_with(binary, None, 0, flags, env).await;
    let (task, _) = spawn_worker(addr);
    let exit = guard("the run to end", child.wait()).await.expect("wait");
    assert!(exit.success(), "{exit}");
    let _ = guard("worker", task).await;
    let mut parsed = Vec::new();
    while let Some(line) = lines.recv().await {
        parsed
            .push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")));
    }
    parsed
}

fn rounds(log: &[serde_json::Value]) -> Vec<u64> {
    log.iter()
        .filter(|v| v["fields"]["message"] == "round")
        .map(|v| v["fields"]["round"].as_u64().expect("a number"))
        .collect()
}

/// `--log-format json`: every line the binary logs is one JSON object with a level, a target
/// and fields, round lines with the round as a number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line() {
    let log = json_log_of(&["--log-format", "json", "--max-rounds", "3"], &[]).await;
    for v in &log {
        assert!(v["level"].is_string() && v["target"].is_string(), "{v}");
        assert!(v["fields"]["message"].is_string(), "{v}");
    }
    assert_eq!(rounds(&log), [1, 2, 3]);
}

/// The real binary with a config file and the environment: the file's `max-rounds` and the
/// environment's `CROWDTRAIN_LOG_FORMAT` both apply, under the flags; a bad file is refused
/// at once with exit code 2, naming the file and the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_and_the_environment_configure_the_binary() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("crowdtrain.toml");
    std::fs::write(&file, "max-rounds = 2\nlog-format = \"human\"\nseed = 5\n").expect("write");
    let flags = ["--config", file.to_str().expect("utf-8"), "--seed", "6"];
    // JSON lines at all: the environment's format won over the file's.
    let log = json_log_of(&flags, &[("CROWDTRAIN_LOG_FORMAT", "json")]).await;
    assert_eq!(rounds(&log), [1, 2], "the file's max-rounds");

    std::fs::write(&file, "max-rounds = 2\nbatch-sise = 8\n").expect("write");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .arg("--config")
        .arg(&file)
        .output();
    let out = guard("the refusal", out).await.expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{}: unknown key `batch-sise`", file.display())),
        "{stderr}"
    );
}

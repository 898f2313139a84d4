//! A finished run keeps its model and its dashboard: by default the coordinator checkpoints
//! into a run directory of its own, and once training finishes it goes on serving the page,
//! the dashboard, the status and the weights until it is told to stop (issue 46, item 5).

use crate::util::*;

const BIN: &str = env!("CARGO_BIN_EXE_coordinator");

/// The real binary on its defaults but for a short run (`--max-rounds 6`), in an empty
/// directory, with one native worker. Once training finishes:
/// - the log says where the model is, and how to export it; the run directory is under
///   `runs/` and already holds the last version;
/// - the process goes on serving: the page, the dashboard, `/api/status` (state `done`) and
///   `/api/params` (the trained weights, the same tensors `coordinator export` writes);
/// - a worker that comes now is told the run is finished, and trains nothing;
/// - SIGTERM stops it cleanly.
///
/// Before, the run wrote no checkpoint without `--checkpoint-dir` and the process exited as
/// training finished, taking the model and the dashboard with it.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_keeps_its_model_and_serves_its_dashboard_until_stopped() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let flags = ["--max-rounds", "6", "--eval-interval", "3"];
    let (mut child, addr, mut log) = spawn_kept_coordinator(BIN.as_ref(), cwd.path(), &flags).await;
    let (worker, _) = spawn_worker(addr);
    let (ended, stats) = guard("the worker", worker).await.expect("worker");
    assert!(matches!(ended, worker::Ended::Finished { .. }), "{ended:?}");
    assert!(stats.gradients_sent >= 6, "{stats:?}");

    let finished = guard("the log to say training finished", async {
        loop {
            let line = log
                .recv()
                .await
                .expect("the coordinator logs until it exits");
            if line.contains("coordinator export --checkpoint-dir") {
                return line;
            }
        }
    })
    .await;
    let dir = finished
        .split("--checkpoint-dir ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the export command in {finished:?}"));
    assert!(dir.starts_with("runs/mlp-"), "{finished}");
    let run_dir = cwd.path().join(dir);
    assert!(run_dir.is_dir(), "{}", run_dir.display());

    // Still serving, and saying the run is done.
    let status = get_status_json(addr).await;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["round"], 6, "{status}");
    assert_eq!(status["checkpoints"]["dir"], dir, "{status}");
    assert_eq!(status["checkpoints"]["last_version"], 6, "{status}");
    for page in ["/", "/dashboard.html"] {
        let (code, _, body) = http_get(addr, page).await;
        assert_eq!(code, 200, "{page}");
        assert!(!body.is_empty(), "{page}");
    }
    let (code, _, served) = http_get(addr, "/api/params").await;
    assert_eq!(code, 200);

    // A volunteer who comes now is thanked and sent away.
    let (late, _) = spawn_worker(addr);
    let (ended, stats) = guard("the late worker", late).await.expect("worker");
    match ended {
        worker::Ended::Finished { message } => {
            assert!(message.contains("training finished"), "{message}");
        }
        other => panic!("told it is finished, not {other:?}"),
    }
    assert_eq!(stats.gradients_sent, 0, "{stats:?}");

    // The run directory's model is the one served.
    let out = cwd.path().join("model.safetensors");
    let export = std::process::Command::new(BIN)
        .current_dir(cwd.path())
        .args(["export", "--checkpoint-dir", dir, "--out"])
        .arg(&out)
        .output()
        .expect("runs");
    let said = String::from_utf8_lossy(&export.stdout);
    assert!(export.status.success(), "{said}");
    assert!(said.contains("exported version 6"), "{said}");
    let exported = std::fs::read(&out).expect("written");
    assert_eq!(tensors_by_name(&exported), tensors_by_name(&served));

    let pid = child.id().expect("still running");
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let exit = guard("exit on SIGTERM", child.wait()).await.expect("wait");
    assert!(exit.success(), "{exit}");
}

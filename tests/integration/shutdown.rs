use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::util::*;

/// SIGTERM to a real coordinator process with connected workers: every session gets a close
/// frame and the process exits 0 within 5 s.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_connected_workers_exits_0_within_5_s() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args(["--port", "0", "--log-level", "info"])
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn coordinator");
    // The coordinator logs the address it bound; read it from its output.
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr: std::net::SocketAddr = guard("the listening line", async {
        loop {
            let line = lines
                .next_line()
                .await
                .expect("read")
                .expect("coordinator exited early");
            if let Some(rest) = line.split("http://").nth(1) {
                let addr = rest.split('/').next().expect("split yields one item");
                return addr.parse().expect("address");
            }
        }
    })
    .await;
    // Keep draining its output so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

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
            matches!(
                &ended,
                worker::Ended::ClosedByCoordinator {
                    code: Some(1001),
                    ..
                }
            ),
            "workers get a close frame: {ended:?}"
        );
    }
}

//! A real nats-server for the cluster's tests: JetStream on, a temporary store directory,
//! loopback only. `scripts/setup.sh` installs the binary (`setup_nats`) and exports its
//! path as `NATS_SERVER`; without it the tests look where setup puts it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tokio::io::AsyncBufReadExt;
use tokio::process::Child;

use crate::util::guard;

/// A running nats-server, killed when dropped.
#[derive(Debug)]
pub struct NatsServer {
    pub url: String,
    pub port: u16,
    child: Child,
    /// Its JetStream store (kept across a restart with [`NatsServer::restart`]).
    pub store: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER") {
        return path.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/nats-server-2.15.1/nats-server")
}

impl NatsServer {
    /// On a free port, with a fresh store.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = dir.path().to_path_buf();
        let mut server = Self::spawn(&store, None).await;
        server._dir = Some(dir);
        server
    }

    /// Kills it (SIGKILL) and starts it again on the same port and store.
    pub async fn restart(&mut self) {
        self.kill().await;
        let fresh = Self::spawn(&self.store, Some(self.port)).await;
        let Self { url, child, .. } = fresh;
        self.url = url;
        self.child = child;
    }

    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    async fn spawn(store: &Path, port: Option<u16>) -> Self {
        let path = binary();
        assert!(
            path.exists(),
            "no nats-server at {}: run scripts/setup.sh (setup_nats) or set NATS_SERVER",
            path.display()
        );
        let port_arg = port.map_or("-1".to_string(), |p| p.to_string());
        let mut child = tokio::process::Command::new(&path)
            .args(["-a", "127.0.0.1", "-p", &port_arg, "-js", "-sd"])
            .arg(store)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn nats-server");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        // Its log says where it listens, then that it is ready: the events waited on.
        let port = guard("nats-server to be ready", async {
            let mut port = None;
            loop {
                let line = lines
                    .next_line()
                    .await
                    .expect("read its log")
                    .expect("nats-server exited early");
                if let Some(at) = line.find("Listening for client connections on ") {
                    let addr = &line[at + "Listening for client connections on ".len()..];
                    port = addr
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.trim().parse::<u16>().ok());
                }
                if line.contains("Server is ready") {
                    return port.expect("a listening line before ready");
                }
            }
        })
        .await;
        // Keep reading its log so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            url: format!("nats://127.0.0.1:{port}"),
            port,
            child,
            store: store.to_path_buf(),
            _dir: None,
        }
    }
}

//! Test harness: start a coordinator on port 0, native workers, raw protocol clients, and a
//! minimal HTTP client.

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use protocol::{
    decode_from_coordinator, encode_from_worker, encode_gradient, Compression, CoordinatorToWorker,
    ErrorCode, Gradient, Hello, WorkerKind, WorkerToCoordinator,
};
use server::{Config, RunningServer, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

/// Held by tests whose figures (rounds/s) would be skewed by other heavy tests running at
/// the same time on this 2-core machine: an exclusive lock on a file in the tests' target
/// folder, so that it holds across processes (cargo-nextest runs each test in its own) as
/// well as across the threads of one test binary. Released when dropped.
pub async fn heavy() -> HeavyGuard {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("heavy-tests.lock");
    let file = tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        file.lock()
            .unwrap_or_else(|e| panic!("lock {}: {e}", path.display()));
        file
    })
    .await
    .expect("the lock's thread");
    HeavyGuard { _file: file }
}

/// The heavy tests' lock, held while it lives (see [`heavy`]).
#[derive(Debug)]
pub struct HeavyGuard {
    _file: std::fs::File,
}

/// Upper bound on any single wait: a guard against hangs, never a synchronisation device.
pub const GUARD: Duration = Duration::from_secs(120);

pub async fn guard<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {GUARD:?} waiting for {what}"))
}

/// Starts a coordinator on 127.0.0.1:0 with these extra flags.
pub async fn start_server(flags: &[&str]) -> RunningServer {
    start_server_at(SocketAddr::from(([127, 0, 0, 1], 0)), flags).await
}

/// Starts a coordinator on `addr` (to restart one where its workers expect it).
pub async fn start_server_at(addr: SocketAddr, flags: &[&str]) -> RunningServer {
    start_server_as(addr, &harnessed(flags)).await
}

/// Starts a coordinator as an operator runs it: once training finishes it keeps serving
/// until stopped, and without `--checkpoint-dir` it keeps its run under `runs/`.
pub async fn start_kept_server(flags: &[&str]) -> RunningServer {
    start_server_as(SocketAddr::from(([127, 0, 0, 1], 0)), flags).await
}

/// What a test's coordinator runs with besides its test's flags: it exits when training
/// finishes (so `RunningServer::wait` returns then), and takes no checkpoints unless the
/// test names their directory.
pub fn harnessed<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--exit-when-finished"];
    if !flags
        .iter()
        .any(|f| matches!(*f, "--checkpoint-dir" | "--resume"))
    {
        all.push("--no-checkpoints");
    }
    all.extend(flags);
    all
}

async fn start_server_as(addr: SocketAddr, flags: &[&str]) -> RunningServer {
    let args = ["coordinator", "--port", "0", "--log-level", "warn"]
        .into_iter()
        .chain(flags.iter().copied());
    let config = Config::from_args(args).expect("test flags are valid");
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    server::start(listener, config, std::future::pending())
        .await
        .expect("server starts")
}

pub fn ws_url(addr: SocketAddr) -> String {
    format!("ws://{addr}/ws")
}

/// Waits until the published status satisfies `pred` and returns it.
pub async fn wait_status(
    status: &mut watch::Receiver<Status>,
    what: &str,
    pred: impl FnMut(&Status) -> bool,
) -> Status {
    guard(what, status.wait_for(pred))
        .await
        .expect("coordinator alive")
        .clone()
}

/// Follows a run `every` rounds at a time, each step under the guard (a stalled run fails, a
/// slow one does not), until `reached` holds or training is done; `step` sees each status on
/// the way. Panics if `max_rounds` pass first. Returns the last status.
pub async fn follow(
    status: &mut watch::Receiver<Status>,
    every: u64,
    max_rounds: u64,
    what: &str,
    reached: impl Fn(&Status) -> bool,
    mut step: impl FnMut(&Status),
) -> Status {
    let done = |s: &Status| reached(s) || s.state == server::status::State::Done;
    loop {
        let round = status.borrow().round;
        let s = wait_status(status, &format!("{every} more rounds or {what}"), |s| {
            s.round >= round + every || done(s)
        })
        .await;
        step(&s);
        if done(&s) {
            return s;
        }
        assert!(
            s.round < max_rounds,
            "no {what} in {max_rounds} rounds: {s:?}"
        );
    }
}

/// A native worker (the `worker` crate, as the binary runs it) on its own task.
pub fn spawn_worker(addr: SocketAddr) -> (WorkerTask, CancellationToken) {
    spawn_worker_with(worker::Options {
        url: ws_url(addr),
        ..worker::Options::default()
    })
}

/// Whether a worker's session ended the way an honest worker's should: the coordinator's
/// word that training is finished, or its shutdown close (1001); never a refusal.
pub fn closed_by_shutdown(ended: &worker::Ended) -> bool {
    matches!(
        ended,
        worker::Ended::Finished { .. }
            | worker::Ended::ClosedByCoordinator {
                code: Some(1001),
                ..
            }
    )
}

pub type WorkerTask = JoinHandle<(worker::Ended, worker::Stats)>;

/// A native worker with these options.
pub fn spawn_worker_with(options: worker::Options) -> (WorkerTask, CancellationToken) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { worker::run(&options, cancel).await.expect("worker runs") }
    });
    (task, cancel)
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A protocol-level client the test drives frame by frame.
pub struct RawClient {
    pub ws: Ws,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr) -> Self {
        let (ws, _) = guard("connect", tokio_tungstenite::connect_async(ws_url(addr)))
            .await
            .expect("websocket connects");
        Self { ws }
    }

    /// Connects from `source` (any of 127.0.0.0/8 is this machine on Linux), so the
    /// coordinator sees another address than 127.0.0.1.
    pub async fn connect_from(addr: SocketAddr, source: std::net::IpAddr) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(source, 0))
            .expect("bind the source");
        let tcp = guard("connect", socket.connect(addr))
            .await
            .expect("tcp connects");
        let stream = MaybeTlsStream::Plain(tcp);
        let (ws, _) = guard(
            "handshake",
            tokio_tungstenite::client_async(ws_url(addr), stream),
        )
        .await
        .expect("websocket connects");
        Self { ws }
    }

    pub async fn send_raw(&mut self, msg: Message) {
        self.ws.send(msg).await.expect("send");
    }

    pub async fn send(&mut self, msg: &WorkerToCoordinator) {
        self.send_raw(Message::Binary(encode_from_worker(msg).into()))
            .await;
    }

    /// Sends one message's frames, flushed once. A write may fail: the coordinator refuses
    /// a bad gradient at its first bad chunk and closes before the rest is written. What it
    /// answered is for the caller to read next.
    pub async fn send_frames(&mut self, frames: Vec<Vec<u8>>) {
        for frame in frames {
            if self.ws.feed(Message::Binary(frame.into())).await.is_err() {
                return;
            }
        }
        let _ = self.ws.flush().await;
    }

    /// Sends a whole gradient as its chunk frames, uncompressed.
    pub async fn send_gradient(&mut self, g: &Gradient) {
        self.send_frames(encode_gradient(g, Compression::None))
            .await;
    }

    pub async fn hello(&mut self) {
        self.send(&WorkerToCoordinator::Hello(Hello {
            kind: Some(WorkerKind::Native),
            ..Hello::default()
        }))
        .await;
    }

    /// The next protocol message, or `None` once the coordinator closed the connection.
    pub async fn recv(&mut self) -> Option<CoordinatorToWorker> {
        // One guard for the whole wait: pings every few seconds must not keep it alive.
        guard("a frame", async {
            loop {
                match self.ws.next().await {
                    Some(Ok(Message::Binary(frame))) => {
                        return Some(
                            decode_from_coordinator(&frame).expect("coordinator frames decode"),
                        )
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                    Some(Ok(_)) => continue,
                }
            }
        })
        .await
    }

    /// Expects an `Error` frame with `code`, returns its message.
    pub async fn expect_error(&mut self, code: ErrorCode) -> String {
        loop {
            match self.recv().await {
                Some(CoordinatorToWorker::Error { code: got, message }) => {
                    assert_eq!(got, code, "error message: {message}");
                    return message;
                }
                Some(_) => continue,
                None => panic!("connection closed before an {code:?} error"),
            }
        }
    }

    /// Expects the coordinator to close the connection (after any remaining frames).
    pub async fn expect_closed(&mut self) {
        while let Some(msg) = self.recv().await {
            if let CoordinatorToWorker::Error { code, .. } = msg {
                panic!("unexpected error {code:?} before close");
            }
        }
    }
}

/// A worker whose gradients the test sends when it decides: the shared worker core over a
/// raw client.
pub struct ManualWorker {
    pub client: RawClient,
    pub core: worker_core::WorkerCore,
    /// Every shard it was sent, as (first index, samples).
    pub shards: Vec<(u32, usize)>,
}

impl ManualWorker {
    pub async fn join(addr: SocketAddr) -> Self {
        Self::joined(RawClient::connect(addr).await).await
    }

    /// Joins from `source` (see [`RawClient::connect_from`]).
    pub async fn join_from(addr: SocketAddr, source: std::net::IpAddr) -> Self {
        Self::joined(RawClient::connect_from(addr, source).await).await
    }

    async fn joined(mut client: RawClient) -> Self {
        let core = worker_core::WorkerCore::new(WorkerKind::Native, None);
        client
            .send_raw(Message::Binary(core.hello_frame().into()))
            .await;
        Self {
            client,
            core,
            shards: Vec::new(),
        }
    }

    /// Reads frames until the core produces a gradient; returns its chunk frames unsent.
    pub async fn next_gradient(&mut self) -> Vec<Vec<u8>> {
        loop {
            let frame = match guard("weights", self.client.ws.next()).await {
                Some(Ok(Message::Binary(frame))) => frame,
                Some(Ok(_)) => continue,
                other => panic!("connection ended while waiting for weights: {other:?}"),
            };
            if let Ok(CoordinatorToWorker::Shard(s)) = decode_from_coordinator(&frame) {
                self.shards.push((s.first_index, s.labels.len()));
            }
            let reply = self.core.handle_frame(&frame).expect("valid frames");
            if !reply.is_empty() {
                return reply;
            }
        }
    }

    /// Sends one message's frames, flushed once.
    pub async fn send(&mut self, frames: Vec<Vec<u8>>) {
        self.client.send_frames(frames).await;
    }
}

/// A minimal HTTP/1.0 GET (no client library needed): status code, headers, body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
    http_get_with(addr, path, "HTTP/1.0").await
}

/// The same with another protocol version (Chromium's DevTools server wants HTTP/1.1; with
/// `Connection: close` it answers with a Content-Length body and closes).
pub async fn http_get_with(addr: SocketAddr, path: &str, version: &str) -> (u16, String, Vec<u8>) {
    http_request(addr, &format!("GET {path} {version}"), &[], &[]).await
}

/// Any request (`line` is `METHOD PATH VERSION`) with extra headers and a body.
pub async fn http_request(
    addr: SocketAddr,
    line: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut request = format!("{line}\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    if !body.is_empty() || !line.starts_with("GET") {
        request += &format!("Content-Length: {}\r\n", body.len());
    }
    request += "\r\n";
    stream.write_all(request.as_bytes()).await.expect("write");
    stream.write_all(body).await.expect("write body");
    // Read the head, then the body by Content-Length (or to EOF without one).
    let mut raw = Vec::new();
    let read = async {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if length.is_some_and(|n| raw.len() >= split + 4 + n) {
                    return;
                }
            }
            let n = stream.read(&mut chunk).await.expect("read");
            if n == 0 {
                return;
            }
            raw.extend_from_slice(&chunk[..n]);
        }
    };
    guard("http response", read).await;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    (code, head, raw[split + 4..].to_vec())
}

pub async fn get_status_json(addr: SocketAddr) -> serde_json::Value {
    let (code, _, body) = http_get(addr, "/api/status").await;
    assert_eq!(code, 200);
    serde_json::from_slice(&body).expect("status is JSON")
}

/// Parses a safetensors file into `(name, shape, values)` in file order.
pub fn parse_safetensors(bytes: &[u8]) -> (serde_json::Value, Vec<f32>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let values = bytes[8 + n..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (header, values)
}

/// The parameters of a weights snapshot as floats.
pub fn snapshot_params(snapshot: &server::coordinator::WeightsSnapshot) -> Vec<f32> {
    snapshot
        .param_bytes()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A coordinator on port 0 with native workers: the shape most tests start from.
pub struct Swarm {
    pub server: RunningServer,
    pub status: watch::Receiver<Status>,
    pub workers: Vec<(WorkerTask, CancellationToken)>,
}

/// Starts a coordinator with `flags` and `n` default native workers.
pub async fn swarm(flags: &[&str], n: usize) -> Swarm {
    swarm_with(flags, n, |_| worker::Options::default()).await
}

/// The same, with worker `i`'s options from `options(i)` (the URL is filled in).
pub async fn swarm_with(
    flags: &[&str],
    n: usize,
    options: impl Fn(usize) -> worker::Options,
) -> Swarm {
    let server = start_server(flags).await;
    let status = server.status.clone();
    let workers = (0..n)
        .map(|i| {
            spawn_worker_with(worker::Options {
                url: ws_url(server.addr),
                ..options(i)
            })
        })
        .collect();
    Swarm {
        server,
        status,
        workers,
    }
}

impl Swarm {
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Waits until the status satisfies `pred`.
    pub async fn wait_for(&mut self, what: &str, pred: impl FnMut(&Status) -> bool) -> Status {
        wait_status(&mut self.status, what, pred).await
    }

    /// Waits for training to end by itself (--max-rounds or --target-accuracy).
    pub async fn finish(self, what: &str) -> (server::Summary, Vec<WorkerTask>) {
        let summary = guard(what, self.server.wait()).await.expect("server ran");
        (summary, self.workers.into_iter().map(|(t, _)| t).collect())
    }

    /// Stops the coordinator and expects a clean stop.
    pub async fn stop(self) {
        stop(self.server).await;
    }
}

/// Stops a coordinator and expects a clean stop.
pub async fn stop(server: RunningServer) {
    guard("a clean stop", server.stop())
        .await
        .expect("clean stop");
}

/// Runs a real coordinator binary (`--port 0`, plus `flags`) in `cwd`, and reads the address
/// it logs. Its output keeps being drained so it never blocks on a full pipe.
pub async fn spawn_coordinator(
    binary: &std::path::Path,
    cwd: Option<&std::path::Path>,
    flags: &[&str],
) -> (tokio::process::Child, SocketAddr) {
    let (child, addr, _) = spawn_coordinator_at(binary, cwd, 0, flags).await;
    (child, addr)
}

/// The same on `port` (to restart one where its workers expect it), also giving every line
/// it logs but the listening line, until it exits: the events a test waits on.
pub async fn spawn_coordinator_at(
    binary: &std::path::Path,
    cwd: Option<&std::path::Path>,
    port: u16,
    flags: &[&str],
) -> Spawned {
    spawn_coordinator_with(binary, cwd, port, flags, &[]).await
}

/// A coordinator process, its address, and the lines it logs but the listening line.
pub type Spawned = (
    tokio::process::Child,
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<String>,
);

/// The same with these environment variables.
pub async fn spawn_coordinator_with(
    binary: &std::path::Path,
    cwd: Option<&std::path::Path>,
    port: u16,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Spawned {
    spawn_coordinator_as(binary, cwd, port, &harnessed(flags), env).await
}

/// The real binary as an operator runs it (see [`start_kept_server`]), in `cwd`.
pub async fn spawn_kept_coordinator(
    binary: &std::path::Path,
    cwd: &std::path::Path,
    flags: &[&str],
) -> Spawned {
    spawn_coordinator_as(binary, Some(cwd), 0, flags, &[]).await
}

async fn spawn_coordinator_as(
    binary: &std::path::Path,
    cwd: Option<&std::path::Path>,
    port: u16,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Spawned {
    use tokio::io::AsyncBufReadExt;
    let mut command = tokio::process::Command::new(binary);
    command
        .args(["--port", &port.to_string(), "--log-level", "info"])
        .args(flags)
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let mut child = command.spawn().expect("spawn coordinator");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let addr: SocketAddr = guard("the listening line", async {
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
            let _ = tx.send(line);
        }
    })
    .await;
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = tx.send(line);
        }
    });
    (child, addr, rx)
}

/// After a run at `--verify-fraction 1` of `rounds` rounds with `workers` honest workers:
/// every gradient was recomputed, none differed, nobody was banned.
///
/// Every answer but a newcomer's phase excused unreplayed: while one of its phases waits
/// for a core, its next is excused from its round without a replay or a strike
/// (`checks/machine.rs`), and counted (`probation_unchecked`). How often depends on how
/// fast this machine replays against how fast the workers compute: none here, one of 50
/// on CI's slower machine (2026-12-01). Each is still an answer that was not flagged; and
/// where there were any, every worker's probation ended all the same, each of its phases
/// replayed.
pub fn assert_never_flagged(who: &str, s: &Status, rounds: u64, workers: u64, expected: u64) {
    let c = &s.counters;
    println!(
        "{who}: verified {} of {} gradients over {rounds} rounds ({} excused unreplayed), {} mismatches",
        c.gradients_verified, c.answered_total, c.probation_unchecked, c.verification_mismatches
    );
    assert_eq!(rounds, expected);
    assert_eq!(c.verification_mismatches, 0, "{s:?}");
    // The last round's replays may still be running when the run stops.
    assert!(
        c.gradients_verified + c.probation_unchecked + workers >= c.answered_total,
        "every answer replayed but the last round's: {s:?}"
    );
    assert!(c.answered_total >= expected, "{s:?}");
    if c.probation_unchecked > 0 {
        assert_eq!(s.on_probation, 0, "every probation replayed whole: {s:?}");
    }
    assert!(s.bans.is_empty(), "{s:?}");
}

/// The named tensors of a safetensors file, as raw bytes by name.
pub fn tensors_by_name(bytes: &[u8]) -> std::collections::BTreeMap<String, Vec<u8>> {
    let file = safetensors::SafeTensors::deserialize(bytes).expect("safetensors");
    file.tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect()
}

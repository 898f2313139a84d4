//! A home link on loopback: a TCP proxy that holds every byte for the link's one-way
//! latency and releases each direction at the link's bandwidth, as a home connection does.
//! This machine's kernel has no netem, so tests and benchmarks put one of these between a
//! real worker (a native worker or a browser tab) and the real coordinator.
//!
//! What it does not carry: TCP/IP headers (the simulator counts 52 bytes per 1,448), and
//! TCP's own pacing (it reads as fast as its side sends, then releases at the link's rate).
//!
//! Weighed against noxious (Toxiproxy's Rust port): the tests need latency and bandwidth per
//! direction on one port, started in-process and gone with the test; noxious runs a server
//! steered over HTTP, for far more than that.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// One direction of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Way {
    /// One-way delay.
    pub latency: Duration,
    /// Bytes per second.
    pub bandwidth: f64,
}

impl Way {
    /// Half of `rtt` one way, at `mbit` Mbit/s.
    pub fn new(latency: Duration, mbit: f64) -> Self {
        Self {
            latency,
            bandwidth: mbit * 1e6 / 8.0,
        }
    }
}

/// Starts a proxy to `upstream` with `up` from client to server and `down` back; returns
/// the address to connect to instead. It stops accepting when `cancel` is cancelled.
pub async fn proxy(
    upstream: SocketAddr,
    (up, down): (Way, Way),
    cancel: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = cancel.cancelled() => return,
                a = listener.accept() => a,
            };
            let Ok((client, _)) = accepted else { return };
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(carry(client_read, server_write, up));
            tokio::spawn(carry(server_read, client_write, down));
        }
    });
    Ok(addr)
}

/// One direction: what is read is released `way.latency` after the link would have
/// finished sending it.
async fn carry(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, way: Way) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut free = tokio::time::Instant::now();
    let mut buf = vec![0u8; 16 << 10];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let start = free.max(tokio::time::Instant::now());
        free = start + Duration::from_secs_f64(n as f64 / way.bandwidth);
        if tx.send((free + way.latency, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

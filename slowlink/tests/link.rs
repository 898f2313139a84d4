//! The link over real loopback sockets (a T2 test: it needs a socket).

use std::time::Duration;

use slowlink::{proxy, Way};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// 100 KB through a 20 ms, 8 Mbit/s link (1 MB/s) arrive no sooner than the latency plus
/// the time to send them, and whole.
#[tokio::test]
async fn bytes_arrive_after_the_latency_and_at_the_bandwidth() {
    let server = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let upstream = server.local_addr().expect("addr");
    let way = Way::new(Duration::from_millis(20), 8.0);
    let cancel = CancellationToken::new();
    let addr = proxy(upstream, (way, way), cancel.clone())
        .await
        .expect("proxy");
    let echo = tokio::spawn(async move {
        let (mut s, _) = server.accept().await.expect("accept");
        let mut got = vec![0u8; 100_000];
        s.read_exact(&mut got).await.expect("read");
        got
    });
    let sent: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let started = tokio::time::Instant::now();
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client.write_all(&sent).await.expect("write");
    let got = echo.await.expect("echo");
    let took = started.elapsed();
    assert_eq!(got, sent);
    assert!(took >= Duration::from_millis(20 + 100), "{took:?}");
    cancel.cancel();
}

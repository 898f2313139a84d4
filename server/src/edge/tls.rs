//! https/wss served by the coordinator itself (`--tls-cert`, `--tls-key`): rustls on ring.
//!
//! [`TlsListener`] is an `axum::serve` listener. TCP connections are accepted by a task that
//! runs each handshake in its own task, bounded in number and in time, so a client that opens
//! a socket and never finishes its handshake holds one slot for at most
//! [`HANDSHAKE_TIMEOUT`] and never delays anyone else's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How long a client has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further connections wait in the kernel's backlog.
const CONCURRENT_HANDSHAKES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the certificate chain {path}: {source}")]
    Certificates {
        path: PathBuf,
        source: tokio_rustls::rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)")]
    NoCertificate(PathBuf),
    #[error("reading the private key {path}: {source}")]
    Key {
        path: PathBuf,
        source: tokio_rustls::rustls::pki_types::pem::Error,
    },
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[source] tokio_rustls::rustls::Error),
}

/// The server configuration for a PEM certificate chain (leaf first) and its private key
/// (PKCS#8, PKCS#1 or SEC1). Offers HTTP/1.1 only: WebSockets upgrade over it.
pub fn load(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Certificates {
            path: cert.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.to_owned()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Key {
        path: key.to_owned(),
        source,
    })?;
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts TLS connections on a TCP listener until `shutdown`.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves TLS on `tcp`, bound to `local`.
    pub fn new(
        tcp: TcpListener,
        local: SocketAddr,
        config: Arc<ServerConfig>,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(accept_loop(tcp, TlsAcceptor::from(config), tx, shutdown));
        Self { ready, local }
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(CONCURRENT_HANDSHAKES));
    loop {
        let slot = tokio::select! {
            () = shutdown.cancelled() => return,
            () = ready.closed() => return,
            slot = slots.clone().acquire_owned() => slot.expect("never closed"),
        };
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            () = ready.closed() => return,
            accepted = tcp.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off as axum's own listener does.
                debug!(%e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Chunk frames go out back to back: no waiting on Nagle's algorithm between them.
        let _ = stream.set_nodelay(true);
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => debug!(%peer, %e, "TLS handshake failed"),
                Err(_) => debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop stopped (shutdown): serving is being wound down, so wait for
            // the graceful shutdown to drop this listener.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

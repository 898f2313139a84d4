//! The native worker: [`worker_core::WorkerCore`] over a tokio-tungstenite WebSocket.
//!
//! This file only moves bytes; every training decision is the shared core's, the very code
//! the browser runs. Operators with spare machines run the `worker` binary; the tests and
//! benchmarks call [`run`] directly.

pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use protocol::WorkerKind;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};
use worker_core::{Compute, ComputeClock};
pub use worker_core::{Stats, WorkerCore, WorkerError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("connecting to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: tokio_tungstenite::tungstenite::Error,
    },
    #[error("WebSocket error: {0}")]
    Socket(#[from] tokio_tungstenite::tungstenite::Error),
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// How a session ended without error.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// The coordinator closed the connection (e.g. it is shutting down or training is done).
    ClosedByCoordinator { code: Option<u16>, reason: String },
    /// `shutdown` was cancelled.
    Stopped,
    /// The coordinator said training is finished (`ErrorCode::Finished`): nothing to
    /// reconnect to.
    Finished { message: String },
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub url: String,
    pub join_token: Option<String>,
    /// Extra time spent per gradient, to play a slower volunteer (tests and benchmarks).
    pub compute_delay: Option<std::time::Duration>,
    /// Tensor compression to ask for in Hello.
    pub compression: protocol::Compression,
    /// For `wss://` URLs: the TLS configuration ([`tls::trusting`] a private CA); `None`
    /// checks the server against the public web's roots.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Threads to compute each batch on, in as many parts (`model::Part`); 0 or 1: one.
    pub threads: usize,
}

/// A fresh core for these options.
pub fn new_core(options: &Options) -> WorkerCore {
    let epoch = std::time::Instant::now();
    let clock = move || u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
    WorkerCore::new(WorkerKind::Native, options.join_token.clone())
        .with_compression(options.compression)
        .with_clock(ComputeClock::Clock(Box::new(clock)))
        .with_compute(Compute::Threads(options.threads.max(1)))
}

/// Connects, joins and trains until the coordinator closes the connection, `shutdown` is
/// cancelled, or something fails. Returns what the worker did.
pub async fn run(
    options: &Options,
    shutdown: CancellationToken,
) -> Result<(Ended, Stats), RunError> {
    run_with(options, &mut new_core(options), shutdown).await
}

/// The first wait before reconnecting; it doubles after each failure, up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_millis(500);
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Trains until `shutdown`, across coordinators: a session that fails (the coordinator is
/// unreachable or died) moves on to the next of `urls`, in turn, after a backoff (0.5 s
/// doubling to 10 s); one the coordinator ended is started again on the same URL. One core
/// throughout: a coordinator that knows its resume token keeps its identity, another (an
/// edge of the same cluster) gives it a new one. Returns when a coordinator removes or bans
/// it (coming back would not help), with that refusal.
pub async fn run_reconnecting(
    options: &Options,
    urls: &[String],
    shutdown: CancellationToken,
) -> Result<Stats, RunError> {
    let mut core = new_core(options);
    let mut backoff = BACKOFF_FIRST;
    let mut at = 0;
    let mut options = options.clone();
    loop {
        options.url.clone_from(&urls[at % urls.len().max(1)]);
        match run_with(&options, &mut core, shutdown.clone()).await {
            Ok((Ended::Stopped, stats)) => return Ok(stats),
            // The run is over: nothing to reconnect to.
            Ok((Ended::Finished { message }, stats)) => {
                info!(%message, gradients = stats.gradients_sent, "the coordinator says training is finished");
                return Ok(stats);
            }
            Ok((ended, stats)) => {
                info!(?ended, url = %options.url, gradients = stats.gradients_sent, "session ended");
                backoff = BACKOFF_FIRST;
            }
            Err(RunError::Worker(WorkerError::Rejected {
                code: code @ (protocol::ErrorCode::Kicked | protocol::ErrorCode::Banned),
                message,
            })) => {
                return Err(RunError::Worker(WorkerError::Rejected { code, message }));
            }
            Err(err) => {
                tracing::warn!(%err, url = %options.url, "session failed");
                at += 1;
            }
        }
        info!(retry_in = ?backoff, url = %urls[at % urls.len().max(1)], "reconnecting");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => return Ok(core.stats().clone()),
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Like [`run`], with a core kept across connections: after a reconnect its `Hello` carries
/// the resume token, so the worker keeps its identity.
pub async fn run_with(
    options: &Options,
    core: &mut WorkerCore,
    shutdown: CancellationToken,
) -> Result<(Ended, Stats), RunError> {
    let connector = options
        .tls
        .clone()
        .map(tokio_tungstenite::Connector::Rustls);
    let (mut ws, _) = tokio_tungstenite::connect_async_tls_with_config(
        options.url.as_str(),
        None,
        // Nagle off: a gradient's chunks go out back to back.
        true,
        connector,
    )
    .await
    .map_err(|source| RunError::Connect {
        url: options.url.clone(),
        source,
    })?;
    ws.send(Message::Binary(core.hello_frame().into())).await?;
    let ended = loop {
        // In a local phase, one inner step at a time, reading whatever has arrived between
        // two (pings are answered by the read; newer weights replace the phase).
        let arrived = if core.working() && !shutdown.is_cancelled() {
            ws.next().now_or_never()
        } else {
            None
        };
        let msg = match arrived {
            Some(msg) => msg,
            None if core.working() && !shutdown.is_cancelled() => {
                let reply = core.work()?;
                if reply.is_empty() {
                    continue;
                }
                if let Err(err) = send_all(&mut ws, reply).await {
                    return Err(after_write_error(&mut ws, core, err).await);
                }
                continue;
            }
            None => tokio::select! {
                () = shutdown.cancelled() => {
                    let _ = ws.close(None).await;
                    break Ended::Stopped;
                }
                msg = ws.next() => msg,
            },
        };
        match msg {
            Some(Ok(Message::Binary(frame))) => {
                let reply = match core.handle_frame(&frame) {
                    Err(WorkerError::Rejected {
                        code: protocol::ErrorCode::Finished,
                        message,
                    }) => {
                        let _ = ws.close(None).await;
                        break Ended::Finished { message };
                    }
                    reply => reply?,
                };
                if !reply.is_empty() {
                    if let Some(delay) = options.compute_delay {
                        // Keep answering pings while "computing", as a slow tab would.
                        let sleep = tokio::time::sleep(delay);
                        tokio::pin!(sleep);
                        loop {
                            tokio::select! {
                                () = &mut sleep => break,
                                msg = ws.next() => match msg {
                                    Some(Ok(Message::Close(_))) | None => break,
                                    Some(Err(err)) => return Err(err.into()),
                                    Some(Ok(_)) => {} // pings are answered by the read itself
                                },
                            }
                        }
                    }
                    // A gradient's chunks, written out together and flushed once.
                    if let Err(err) = send_all(&mut ws, reply).await {
                        return Err(after_write_error(&mut ws, core, err).await);
                    }
                    let stats = core.stats();
                    if stats.gradients_sent % 100 == 1 {
                        info!(
                            worker = ?stats.worker_id,
                            round = ?stats.round,
                            gradients = stats.gradients_sent,
                            loss = ?stats.last_loss,
                            "training"
                        );
                    }
                }
            }
            Some(Ok(Message::Close(frame))) => {
                break Ended::ClosedByCoordinator {
                    code: frame.as_ref().map(|f| u16::from(f.code)),
                    reason: frame.map(|f| f.reason.to_string()).unwrap_or_default(),
                };
            }
            Some(Ok(other)) => debug!(?other, "ignoring non-binary frame"),
            Some(Err(err)) => return Err(err.into()),
            None => {
                break Ended::ClosedByCoordinator {
                    code: None,
                    reason: "connection dropped".into(),
                }
            }
        }
    };
    Ok((ended, core.stats().clone()))
}

async fn send_all<S>(ws: &mut S, frames: Vec<Vec<u8>>) -> Result<(), WsError>
where
    S: futures_util::Sink<Message, Error = WsError> + Unpin,
{
    for frame in frames {
        ws.feed(Message::Binary(frame.into())).await?;
    }
    ws.flush().await
}

/// A write failed, most likely because the coordinator closed the connection while a
/// gradient's chunks were going out. If it said why first (an `Error` frame, already
/// received), that is the answer, not the broken pipe.
async fn after_write_error<S>(ws: &mut S, core: &mut WorkerCore, err: WsError) -> RunError
where
    S: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    // Only what has already arrived: the connection is closing.
    let unread = Duration::from_secs(1);
    while let Ok(Some(Ok(msg))) = tokio::time::timeout(unread, ws.next()).await {
        if let Message::Binary(frame) = msg {
            if let Err(reason) = core.handle_frame(&frame) {
                return reason.into();
            }
        }
    }
    err.into()
}

//! One task per WebSocket: the only place that touches a worker's bytes.
//!
//! The session reads `Hello`, asks the coordinator to admit the worker, then loops over four
//! things: frames from the socket (decoded and validated here, so nothing malformed reaches
//! the training state), frames from its outbox (written to the socket), a ping timer (a
//! worker silent for longer than the ping timeout is gone), and shutdown. Any bad frame ends
//! the session with an `Error` frame and a close frame; the coordinator only sees a `Leave`.
//!
//! The loop is generic over the socket (`Stream` + `Sink` of axum messages) so tests could
//! drive it with channels.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use protocol::{
    decode_worker_frame, encode_from_coordinator, CoordinatorToWorker, ErrorCode, WorkerFrame,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, instrument};

use crate::config::Liveness;
use crate::coordinator::{CoordinatorHandle, Frames, Joined, Outbound, OUTBOX_CAPACITY};
use crate::edge::rate::{TokenBucket, CONTROL_BURST, CONTROL_PER_SEC};
use crate::edge::upload::UploadSlots;
use crate::refusal::Refusal;

mod receive;
use receive::{take_frame, upload_deadline, wait_for_slot, Receiving, SlotWait, Taken};

/// Gradients a worker may send beyond the `Weights` frames it was sent on this connection.
/// An honest worker answers each `Weights` once; the slack covers a gradient computed just
/// before a reconnect. A worker over it is flooding and is closed.
pub const GRADIENT_SLACK: u64 = 2;

/// A connection that has not said `Hello` by then is closed: it holds a socket and a task.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// WebSocket close codes (RFC 6455 §7.4.1).
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_GOING_AWAY: u16 = 1001;
const CLOSE_POLICY: u16 = 1008;

#[derive(Debug)]
enum End {
    /// The peer closed or the socket failed.
    PeerGone,
    /// Shutdown: close politely.
    Shutdown,
    /// Bad input or refusal: send an `Error` frame, then close.
    Refuse(Refusal),
}

impl End {
    fn refuse(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Refuse(Refusal::new(code, message))
    }
}

/// What every session is held to, from the configuration.
#[derive(Debug, Clone)]
pub struct Limits {
    pub liveness: Liveness,
    /// `--max-upload-rate`, in bytes a second per connection.
    pub upload_rate: Option<f64>,
    /// `--upload-memory`: the gradients received at once, shared by every session.
    pub slots: UploadSlots,
}

#[instrument(name = "session", skip_all)]
pub async fn run<S, E>(
    mut socket: S,
    coordinator: CoordinatorHandle,
    shutdown: CancellationToken,
    limits: Limits,
    peer: IpAddr,
) where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin,
    E: std::fmt::Display,
{
    let (outbox, mut inbox) = mpsc::channel(OUTBOX_CAPACITY);
    let (joined, end) = match handshake(&mut socket, &coordinator, &shutdown, outbox, peer).await {
        Ok(joined) => {
            let end = serve(
                &mut socket,
                &coordinator,
                &shutdown,
                &mut inbox,
                joined,
                &limits,
                peer,
            )
            .await;
            (Some(joined), end)
        }
        Err(end) => (None, end),
    };
    if let Some(joined) = joined {
        coordinator.leave(&joined).await;
    }
    // A finished run tells each worker so just before it stops: that word, not "shutting
    // down", is what the worker must hear (it stops instead of reconnecting).
    let end = match end {
        End::Shutdown => std::iter::from_fn(|| inbox.try_recv().ok())
            .find_map(|out| match out {
                Outbound::Close(refusal) if refusal.code == ErrorCode::Finished => {
                    Some(End::Refuse(refusal))
                }
                _ => None,
            })
            .unwrap_or(End::Shutdown),
        end => end,
    };
    match end {
        End::PeerGone => {}
        End::Shutdown => {
            let _ = socket
                .send(close(CLOSE_GOING_AWAY, "coordinator shutting down"))
                .await;
            // A worker may be half way through a gradient: read it out, or the reset would
            // destroy the close frame and the worker would see a broken pipe, not a stop.
            linger(&mut socket).await;
        }
        End::Refuse(refusal) => {
            let Refusal { code, message } = refusal.clone();
            info!(worker = ?joined.map(|j| j.worker), ?code, %message, "closing session");
            if refusal.is_fatal() && !matches!(code, ErrorCode::ShuttingDown | ErrorCode::Finished)
            {
                coordinator.rejected(refusal, peer).await;
            }
            let frame = encode_from_coordinator(&CoordinatorToWorker::Error {
                code,
                message: message.clone(),
            });
            let _ = socket.send(Message::Binary(frame.into())).await;
            let reason = if code == ErrorCode::Finished {
                CLOSE_NORMAL
            } else if code == ErrorCode::ShuttingDown {
                CLOSE_GOING_AWAY
            } else {
                CLOSE_POLICY
            };
            let _ = socket.send(close(reason, &message)).await;
            linger(&mut socket).await;
        }
    }
}

/// How long a refused connection is read (and discarded) after its close frame.
const LINGER: Duration = Duration::from_secs(1);

/// Reads and discards what the peer still sends after a refusal or the shutdown's close
/// frame (the rest of a gradient's chunks), until it closes or [`LINGER`] has passed. Closing a socket with unread bytes makes
/// the kernel reset the connection, and a reset can destroy the error frame before the peer
/// reads it: the worker would never learn why it was refused.
async fn linger<S, E>(socket: &mut S)
where
    S: Stream<Item = Result<Message, E>> + Unpin,
{
    let _ = tokio::time::timeout(LINGER, async {
        while let Some(Ok(msg)) = socket.next().await {
            if matches!(msg, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

fn close(code: u16, reason: &str) -> Message {
    // Close reasons are limited to 123 bytes.
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason[..end].into(),
    }))
}

async fn handshake<S, E>(
    socket: &mut S,
    coordinator: &CoordinatorHandle,
    shutdown: &CancellationToken,
    outbox: mpsc::Sender<Outbound>,
    peer: IpAddr,
) -> Result<Joined, End>
where
    S: Stream<Item = Result<Message, E>> + Unpin,
    E: std::fmt::Display,
{
    let first = tokio::select! {
        () = shutdown.cancelled() => return Err(End::Shutdown),
        first = tokio::time::timeout(HELLO_TIMEOUT, next_binary(socket)) => first,
    };
    let frame = match first {
        Err(_) => {
            return Err(End::refuse(
                ErrorCode::UnexpectedMessage,
                format!("no Hello within {HELLO_TIMEOUT:?}"),
            ))
        }
        Ok(frame) => frame?,
    };
    let hello = match decode_worker_frame(&frame) {
        Ok(WorkerFrame::Hello(hello)) => hello,
        Ok(_) => {
            return Err(End::refuse(
                ErrorCode::UnexpectedMessage,
                "the first frame must be Hello",
            ))
        }
        Err(err) => return Err(End::refuse(err.code(), err.to_string())),
    };
    match coordinator.join(hello, outbox, peer).await {
        Ok(Ok(joined)) => Ok(joined),
        Ok(Err(refusal)) => Err(End::Refuse(refusal)),
        Err(_) => Err(End::refuse(ErrorCode::ShuttingDown, "coordinator stopped")),
    }
}

/// What a session reads: a binary frame, or a control frame (Ping or Pong) of some bytes.
enum Frame {
    Binary(bytes::Bytes),
    Control(usize),
}

/// What one socket item means to a session: a frame, or the end of the session.
fn classify<E: std::fmt::Display>(item: Option<Result<Message, E>>) -> Result<Frame, End> {
    match item {
        Some(Ok(Message::Binary(bytes))) => Ok(Frame::Binary(bytes)),
        Some(Ok(Message::Ping(b) | Message::Pong(b))) => Ok(Frame::Control(b.len())),
        Some(Ok(Message::Text(_))) => Err(End::refuse(
            ErrorCode::UnexpectedMessage,
            "text frames are not part of the protocol; send binary frames",
        )),
        Some(Ok(Message::Close(_))) | None => Err(End::PeerGone),
        // Raw frames are only ever written, never read.
        Some(Ok(Message::Frame(_))) => Err(End::PeerGone),
        Some(Err(err)) => {
            debug!(%err, "socket error");
            Err(End::PeerGone)
        }
    }
}

/// The next binary frame; anything else ends the session.
async fn next_binary<S, E>(socket: &mut S) -> Result<bytes::Bytes, End>
where
    S: Stream<Item = Result<Message, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut control = TokenBucket::new(CONTROL_BURST, CONTROL_PER_SEC, std::time::Instant::now());
    loop {
        match classify(socket.next().await)? {
            Frame::Binary(frame) => return Ok(frame),
            Frame::Control(_) => check_control(&mut control, std::time::Instant::now())?,
        }
    }
}

async fn serve<S, E>(
    socket: &mut S,
    coordinator: &CoordinatorHandle,
    shutdown: &CancellationToken,
    inbox: &mut mpsc::Receiver<Outbound>,
    joined: Joined,
    limits: &Limits,
    peer: IpAddr,
) -> End
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin,
    E: std::fmt::Display,
{
    let Limits {
        liveness,
        upload_rate,
        ref slots,
    } = *limits;
    let mut ping = tokio::time::interval(liveness.interval);
    ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is immediate.
    ping.tick().await;
    // Any frame counts as a sign of life: browsers answer pings from their network stack, so
    // a background tab with throttled timers still answers and keeps its place.
    let mut last_seen = Instant::now();
    let allowed = upload_deadline(joined.param_count, liveness.timeout, upload_rate);
    let mut receiving = Receiving::new(peer, allowed);
    let start = last_seen.into_std();
    let mut control = TokenBucket::new(CONTROL_BURST, CONTROL_PER_SEC, start);
    // A second's worth of burst; a larger frame is still read, and pays after.
    let mut upload = upload_rate.map(|rate| TokenBucket::new(rate, rate, start));
    // Over `--max-upload-rate`: not read again until then.
    let mut paused_until: Option<Instant> = None;
    // A chunk that begins a gradient, held while its slot is awaited.
    let mut waiting: Option<(Bytes, SlotWait)> = None;
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return End::Shutdown,
            out = inbox.recv() => match out {
                Some(Outbound::Frames(frames)) => {
                    if send_all(socket, &frames).await.is_err() {
                        return End::PeerGone;
                    }
                }
                Some(Outbound::Pull { task, weights }) => {
                    receiving.weights_sent += 1;
                    let sent = async {
                        socket.feed(Message::Binary(task)).await?;
                        send_all(socket, &weights).await
                    };
                    if sent.await.is_err() {
                        return End::PeerGone;
                    }
                }
                Some(Outbound::Close(refusal)) => return End::Refuse(refusal),
                // The coordinator dropped this worker (it stopped reading) or is stopping.
                None if shutdown.is_cancelled() => return End::Shutdown,
                None => return End::refuse(
                    ErrorCode::TooSlow,
                    "dropped: this worker did not read its frames",
                ),
            },
            () = sleep_until_some(paused_until) => {
                paused_until = None;
                last_seen = Instant::now();
            }
            msg = socket.next(), if paused_until.is_none() && waiting.is_none() => {
                last_seen = Instant::now();
                let now = last_seen.into_std();
                let (frame, len) = match classify(msg) {
                    Ok(Frame::Binary(frame)) => {
                        let len = frame.len();
                        (Some(frame), len)
                    }
                    Ok(Frame::Control(len)) => {
                        if let Err(end) = check_control(&mut control, now) {
                            return end;
                        }
                        (None, len)
                    }
                    Err(end) => return end,
                };
                if let Some(resume) = upload.as_mut().and_then(|b| b.take(len as f64, now)) {
                    paused_until = Some(Instant::from_std(resume));
                }
                let Some(frame) = frame else { continue };
                match take_frame(&frame, &mut receiving, slots, &joined, coordinator).await {
                    Ok(Taken::Chunk) => {}
                    Ok(Taken::NeedsSlot) => {
                        // Not read again until a slot is free: the bytes wait in the kernel.
                        let wait = slots.clone().acquire(peer);
                        waiting = Some((frame, Box::pin(wait)));
                    }
                    Err(end) => return end,
                }
            }
            slot = wait_for_slot(&mut waiting) => {
                let (frame, _) = waiting.take().expect("the branch runs only while waiting");
                receiving.grant(slot);
                // The wait was the coordinator's, not the worker's.
                last_seen = Instant::now();
                match take_frame(&frame, &mut receiving, slots, &joined, coordinator).await {
                    Ok(_) => {}
                    Err(end) => return end,
                }
            }
            _ = ping.tick() => {
                let silent = last_seen.elapsed();
                // While paused or waiting for a slot it is the coordinator that is not reading.
                let reading = paused_until.is_none() && waiting.is_none();
                if silent > liveness.timeout && reading {
                    info!(worker = %joined.worker, ?silent, "no answer to pings; dropping the worker");
                    return End::PeerGone;
                }
                // A slot is the coordinator's memory: a gradient that stops coming gives it up.
                if reading {
                    if let Err(end) = receiving.check_pace(liveness.timeout, slots.slots()) {
                        return end;
                    }
                }
                if socket.send(Message::Ping(bytes::Bytes::new())).await.is_err() {
                    return End::PeerGone;
                }
            }
        }
    }
}

/// Writes one message's frames and flushes once. With no write buffer (`routes::READ_BUFFER`)
/// tungstenite writes each frame to the socket as it takes it, and when the socket is full it
/// waits for room before taking the next one, so a connection keeps at most one chunk, never
/// a whole message (which is what made memory grow with K).
async fn send_all<S: Sink<Message> + Unpin>(
    socket: &mut S,
    frames: &Frames,
) -> Result<(), S::Error> {
    for frame in frames.iter() {
        socket.feed(Message::Binary(frame.clone())).await?;
    }
    socket.flush().await
}

/// A control frame against the connection's budget for them.
fn check_control(bucket: &mut TokenBucket, now: std::time::Instant) -> Result<(), End> {
    if bucket.try_take(1.0, now) {
        return Ok(());
    }
    Err(End::refuse(
        ErrorCode::RateLimited,
        format!(
            "more than {CONTROL_BURST} control frames at once or {CONTROL_PER_SEC} a second: pings are the coordinator's to send"
        ),
    ))
}

/// Completes at `until`, or never if `None`.
async fn sleep_until_some(until: Option<Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

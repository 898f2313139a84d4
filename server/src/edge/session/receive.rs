//! What a session does with a worker's frames: decode, check the pace, take a gradient's
//! chunks into an upload slot, and hand a whole gradient to the coordinator.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use protocol::{decode_worker_frame, ErrorCode, WorkerFrame};
use tokio::time::Instant;

use super::{End, GRADIENT_SLACK};
use crate::coordinator::{CoordinatorHandle, Joined};
use crate::edge::upload::{Progress, Slot, Upload, UploadSlots};

/// What a connection has received: the gradient under way with its clocks, and the count
/// of gradients against the `Weights` it was sent (a worker's pace is the coordinator's, so
/// this is its rate limit for gradients).
#[derive(Debug)]
pub(super) struct Receiving {
    /// Whose slots these are: one address holds at most its share of them.
    peer: IpAddr,
    upload: Upload,
    /// The upload slot the next (or current) gradient is received into.
    slot: Option<Slot>,
    pub(super) weights_sent: u64,
    gradients_received: u64,
    /// How long a gradient may hold its slot ([`upload_deadline`]), and when the one under
    /// way must be in.
    allowed: Duration,
    due: Instant,
    /// When its last chunk came.
    last_chunk: Instant,
}

/// The slowest a gradient may arrive once it holds an upload slot, in bytes (of its values,
/// 4 a value) a second: a client trickling chunks just fast enough to escape the stall check
/// would otherwise keep a slot, and with a few of them nobody else's gradient would get in.
pub(super) const MIN_UPLOAD_RATE: f64 = 64.0 * 1024.0;

/// How long a gradient of `values` values may take once it holds a slot: at
/// [`MIN_UPLOAD_RATE`] (or half `--max-upload-rate` if that is lower, since the coordinator
/// itself then slows the sender), and never less than the ping timeout.
pub(super) fn upload_deadline(
    values: usize,
    timeout: Duration,
    upload_rate: Option<f64>,
) -> Duration {
    let rate = upload_rate.map_or(MIN_UPLOAD_RATE, |r| (r / 2.0).min(MIN_UPLOAD_RATE));
    Duration::from_secs_f64(values as f64 * 4.0 / rate).max(timeout)
}

impl Receiving {
    /// `allowed`: how long a gradient may hold its slot.
    pub(super) fn new(peer: IpAddr, allowed: Duration) -> Self {
        let now = Instant::now();
        Self {
            peer,
            upload: Upload::default(),
            slot: None,
            weights_sent: 0,
            gradients_received: 0,
            allowed,
            due: now,
            last_chunk: now,
        }
    }

    /// The next gradient goes into `slot`; its clocks start now.
    pub(super) fn grant(&mut self, slot: Slot) {
        self.upload.grant(slot.buffer());
        self.slot = Some(slot);
        self.last_chunk = Instant::now();
        self.due = self.last_chunk + self.allowed;
    }

    /// A gradient under way that has sent no chunk for the ping timeout, or is past its
    /// time, gives its slot up with `TooSlow`.
    pub(super) fn check_pace(&self, timeout: Duration, slots: usize) -> Result<(), End> {
        if !self.upload.in_progress() {
            return Ok(());
        }
        if Instant::now() > self.due {
            return Err(End::refuse(
                ErrorCode::TooSlow,
                format!(
                    "the gradient under way came slower than {} KiB/s, while it holds one of the coordinator's {slots} upload slots",
                    MIN_UPLOAD_RATE / 1024.0
                ),
            ));
        }
        let stalled = self.last_chunk.elapsed();
        if stalled > timeout {
            return Err(End::refuse(
                ErrorCode::TooSlow,
                format!("no chunk of the gradient under way for {stalled:.0?}, while it holds one of the coordinator's {slots} upload slots"),
            ));
        }
        Ok(())
    }
}

/// What [`take_frame`] did with a frame.
pub(super) enum Taken {
    Chunk,
    /// The frame begins a gradient and the connection holds no slot: take it again once one
    /// is granted.
    NeedsSlot,
}

pub(super) type SlotWait = Pin<Box<dyn Future<Output = Slot> + Send>>;

/// Decodes a worker's frame and takes its chunk, into a slot taken from `slots` if one is
/// free when a gradient begins; a whole gradient goes on to the coordinator with its slot.
pub(super) async fn take_frame(
    frame: &Bytes,
    receiving: &mut Receiving,
    slots: &UploadSlots,
    joined: &Joined,
    coordinator: &CoordinatorHandle,
) -> Result<Taken, End> {
    let chunk = match decode_worker_frame(frame) {
        Ok(WorkerFrame::Gradient(chunk)) => chunk,
        // A GPU phase's hashes, and the states a challenge asked for: the coordinator's.
        Ok(WorkerFrame::Commitments(commitments)) => {
            return match coordinator.commitments(joined, commitments).await {
                Ok(()) => Ok(Taken::Chunk),
                Err(_) => Err(End::Shutdown),
            };
        }
        Ok(WorkerFrame::Reveal(chunk)) => {
            return match coordinator.revealed(joined, chunk).await {
                Ok(()) => Ok(Taken::Chunk),
                Err(_) => Err(End::Shutdown),
            };
        }
        Ok(WorkerFrame::Hello(_)) => {
            return Err(End::refuse(
                ErrorCode::UnexpectedMessage,
                "Hello was already received",
            ))
        }
        Err(err) => return Err(End::refuse(err.code(), err.to_string())),
    };
    if !receiving.upload.in_progress() {
        if receiving.slot.is_none() {
            match slots.try_acquire(receiving.peer) {
                Some(slot) => receiving.grant(slot),
                None => return Ok(Taken::NeedsSlot),
            }
        }
        receiving.gradients_received += 1;
        let (sent, received) = (receiving.weights_sent, receiving.gradients_received);
        if received > sent + GRADIENT_SLACK {
            return Err(End::refuse(
                ErrorCode::UnexpectedMessage,
                format!("{received} gradients for {sent} Weights: answer each Weights once"),
            ));
        }
    }
    receiving.last_chunk = Instant::now();
    let upload = &mut receiving.upload;
    match upload.take(&chunk, joined) {
        Ok(Progress::More) => {}
        Ok(Progress::Done(gradient, norm)) => {
            let slot = receiving.slot.take();
            if coordinator
                .gradient(joined, gradient, norm, slot)
                .await
                .is_err()
            {
                return Err(End::Shutdown);
            }
        }
        Err(refusal) => return Err(End::Refuse(refusal)),
    }
    Ok(Taken::Chunk)
}

/// The slot awaited, or never if none is.
pub(super) async fn wait_for_slot(waiting: &mut Option<(Bytes, SlotWait)>) -> Slot {
    match waiting {
        Some((_, wait)) => wait.await,
        None => std::future::pending().await,
    }
}

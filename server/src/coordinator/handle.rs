//! The coordinator's edge: the events sessions send it, the handle they send them with, and
//! what it publishes back (status, weights, the outcome). No training logic here.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use model::{Evaluation, Network};
use protocol::{Gradient, Hello, WorkerId};
use tokio::sync::{mpsc, oneshot, watch};

use crate::refusal::Refusal;
use crate::status::Status;
use crate::upload::Slot;

/// Events queued towards the coordinator. Gradients are the large ones (4 bytes per
/// parameter), so this bound also bounds the memory held by gradients in flight.
pub const EVENT_CHANNEL_CAPACITY: usize = 64;

/// Messages queued towards one session. A synchronous round sends at most a Shard and a
/// Weights message (plus the odd Error), so a worker with this many messages unread is not
/// keeping up and is dropped rather than let the coordinator block or buffer without bound.
pub const OUTBOX_CAPACITY: usize = 8;

/// One message's frames: a tensor message is many chunk frames. Encoded once and shared by
/// every connection that sends it (cloning is a reference count, not a copy).
pub type Frames = Arc<[Bytes]>;

/// What a session is told to do with its socket.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// Send these binary frames, in order.
    Frames(Frames),
    /// A pull: this worker's `Task` frame, then the weights' frames (shared by everyone).
    Pull { task: Bytes, weights: Frames },
    /// Send this refusal as an error frame, then close the session.
    Close(Refusal),
}

impl Outbound {
    /// A message of one frame.
    pub fn frame(frame: impl Into<Bytes>) -> Self {
        Self::Frames(Arc::from([frame.into()]))
    }

    /// The frames to send, in order (none for `Close`).
    pub fn frames(&self) -> impl Iterator<Item = &Bytes> {
        let (first, rest): (Option<&Bytes>, &[Bytes]) = match self {
            Self::Frames(frames) => (None, frames),
            Self::Pull { task, weights } => (Some(task), weights),
            Self::Close(_) => (None, &[]),
        };
        first.into_iter().chain(rest)
    }
}

#[derive(Debug)]
pub enum Event {
    Join {
        hello: Hello,
        outbox: mpsc::Sender<Outbound>,
        /// The address it connected from (bans are by identity and by address).
        peer: IpAddr,
        reply: oneshot::Sender<Result<Joined, Refusal>>,
    },
    Gradient {
        worker: WorkerId,
        session: SessionId,
        gradient: Gradient,
        /// Its L2 norm, computed in f64 by the session while validating.
        norm: f64,
        /// The upload slot its values occupy, given back once it is aggregated.
        slot: Option<Slot>,
    },
    Leave {
        worker: WorkerId,
        session: SessionId,
    },
    /// A session was closed for bad input (undecodable frame, wrong shape, NaN, ...), before
    /// or after joining. Counted; the worker itself leaves with its own `Leave`.
    Rejected { refusal: Refusal, peer: IpAddr },
    /// An evaluation run off the coordinator's task came back.
    Evaluated(super::evaluation::Evaluated),
    /// The history of the run so far (a dashboard connecting).
    History {
        reply: oneshot::Sender<Vec<super::history::Point>>,
    },
    /// An operator's command (admin API), from `from`; answered with what was done.
    Admin {
        command: super::Command,
        from: String,
        reply: oneshot::Sender<Result<String, String>>,
    },
}

/// One connection of a worker. A worker resuming its identity gets a new session; events of
/// the old one are ignored from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionId(pub u64);

/// What a session needs to validate its worker's frames.
#[derive(Debug, Clone, Copy)]
pub struct Joined {
    pub worker: WorkerId,
    pub session: SessionId,
    pub param_count: usize,
    pub batch_size: u32,
}

#[derive(Debug, Clone)]
pub struct CoordinatorHandle {
    pub(super) tx: mpsc::Sender<Event>,
}

/// The coordinator task has stopped (shutdown).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the coordinator has stopped")]
pub struct Stopped;

impl CoordinatorHandle {
    /// The run's history so far; `None` if the coordinator has stopped.
    pub async fn history(&self) -> Option<Vec<super::history::Point>> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Event::History { reply }).await.ok()?;
        answer.await.ok()
    }

    /// Sends an operator's command and waits for what came of it; `None` if the
    /// coordinator has stopped.
    pub async fn admin(
        &self,
        command: super::Command,
        from: String,
    ) -> Option<Result<String, String>> {
        let (reply, answer) = oneshot::channel();
        let event = Event::Admin {
            command,
            from,
            reply,
        };
        self.tx.send(event).await.ok()?;
        answer.await.ok()
    }

    pub async fn join(
        &self,
        hello: Hello,
        outbox: mpsc::Sender<Outbound>,
        peer: IpAddr,
    ) -> Result<Result<Joined, Refusal>, Stopped> {
        let (reply, rx) = oneshot::channel();
        self.send(Event::Join {
            hello,
            outbox,
            peer,
            reply,
        })
        .await?;
        rx.await.map_err(|_| Stopped)
    }

    pub async fn gradient(
        &self,
        joined: &Joined,
        gradient: Gradient,
        norm: f64,
        slot: Option<Slot>,
    ) -> Result<(), Stopped> {
        self.send(Event::Gradient {
            worker: joined.worker,
            session: joined.session,
            gradient,
            norm,
            slot,
        })
        .await
    }

    pub async fn leave(&self, joined: &Joined) {
        // If the coordinator is gone there is nobody left to tell.
        let _ = self
            .send(Event::Leave {
                worker: joined.worker,
                session: joined.session,
            })
            .await;
    }

    pub async fn rejected(&self, refusal: Refusal, peer: IpAddr) {
        let _ = self.send(Event::Rejected { refusal, peer }).await;
    }

    async fn send(&self, event: Event) -> Result<(), Stopped> {
        self.tx.send(event).await.map_err(|_| Stopped)
    }
}

/// The latest weights, for `/api/params`.
#[derive(Debug, Clone)]
pub struct WeightsSnapshot {
    pub round: u64,
    /// The uncompressed `Weights` chunk frames of all the parameters.
    pub frames: Frames,
}

impl WeightsSnapshot {
    /// The parameters as little-endian f32 bytes: each chunk's values start at
    /// `codec::WEIGHTS_DATA_OFFSET`.
    pub fn param_bytes(&self) -> Vec<u8> {
        fn data(f: &Bytes) -> &[u8] {
            &f[protocol::codec::WEIGHTS_DATA_OFFSET.min(f.len())..]
        }
        let mut out = Vec::with_capacity(self.frames.iter().map(|f| data(f).len()).sum());
        for frame in self.frames.iter() {
            out.extend_from_slice(data(frame));
        }
        out
    }
}

/// How training ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub rounds: u64,
    pub evaluation: Option<Evaluation>,
    pub reached_target: bool,
    /// `--checkpoint-dir`: the checkpoint taken on stopping failed (training itself ended
    /// normally; the newest checkpoint on disk is older).
    pub checkpoint_error: Option<String>,
}

/// The receiving ends of what the coordinator publishes.
#[derive(Debug, Clone)]
pub struct Published {
    pub status: watch::Receiver<Status>,
    pub weights: watch::Receiver<WeightsSnapshot>,
    pub net: Network,
    /// `/metrics`' histograms.
    pub histograms: crate::exposition::Histograms,
}

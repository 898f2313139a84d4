//! A worker's session as the coordinator knows it: its id, and what it is told to do with
//! its socket (frames to send, a pull, a refusal and close).

use std::sync::Arc;

use bytes::Bytes;

use crate::refusal::Refusal;

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

    /// Bytes on the wire (frame payloads).
    pub fn len(&self) -> usize {
        self.frames().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One connection of a worker. A worker resuming its identity gets a new session; what
/// comes from the old one is ignored from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

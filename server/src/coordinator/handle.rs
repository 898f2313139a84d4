//! The driver's edge: the events sessions send it and the handle they send them with, and
//! the receiving ends of what it publishes. No training logic here.

use std::net::IpAddr;

use coordinator_core::{
    Evaluated, Joined, Outbound, Recomputed, SessionId, Status, WeightsSnapshot,
};
use model::Network;
use protocol::{Commitments, Gradient, Hello, RevealChunk, WorkerId};
use tokio::sync::{mpsc, oneshot, watch};

use crate::edge::upload::Slot;
use crate::refusal::Refusal;

/// Events queued towards the coordinator. Gradients are the large ones (4 bytes per
/// parameter), so this bound also bounds the memory held by gradients in flight.
pub const EVENT_CHANNEL_CAPACITY: usize = 64;

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
    /// A GPU phase's state hashes, before its answer.
    Commitments {
        worker: WorkerId,
        session: SessionId,
        commitments: Commitments,
    },
    /// One chunk of a state a challenge asked for.
    Reveal {
        worker: WorkerId,
        session: SessionId,
        chunk: RevealChunk,
    },
    Leave {
        worker: WorkerId,
        session: SessionId,
    },
    /// A session was closed for bad input (undecodable frame, wrong shape, NaN, ...), before
    /// or after joining. Counted; the worker itself leaves with its own `Leave`.
    Rejected { refusal: Refusal, peer: IpAddr },
    /// An evaluation run off the coordinator's task came back.
    Evaluated(Evaluated),
    /// A recomputation run off the coordinator's task came back.
    Recomputed(Recomputed),
    /// The history of the run so far (a dashboard connecting).
    History {
        reply: oneshot::Sender<Vec<coordinator_core::history::Point>>,
    },
    /// An operator's command (admin API), from `from`; answered with what was done.
    Admin {
        command: coordinator_core::Command,
        from: String,
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// `--role edge`: the root published this version (`crate::cluster`).
    Adopt { version: u64, params: Vec<f32> },
    /// `--role edge`: the run's edges, as their leases say.
    Cluster(coordinator_core::remote::ClusterView),
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
    /// `--role edge`: the run's edges for the status; `Err` once the core has stopped.
    pub async fn cluster_view(
        &self,
        view: coordinator_core::remote::ClusterView,
    ) -> Result<(), Stopped> {
        self.tx
            .send(Event::Cluster(view))
            .await
            .map_err(|_| Stopped)
    }

    /// `--role edge`: hands the root's version to the core; `Err` once it has stopped.
    pub async fn adopt(&self, version: u64, params: Vec<f32>) -> Result<(), Stopped> {
        self.tx
            .send(Event::Adopt { version, params })
            .await
            .map_err(|_| Stopped)
    }

    /// The run's history so far; `None` if the coordinator has stopped.
    pub async fn history(&self) -> Option<Vec<coordinator_core::history::Point>> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Event::History { reply }).await.ok()?;
        answer.await.ok()
    }

    /// Sends an operator's command and waits for what came of it; `None` if the
    /// coordinator has stopped.
    pub async fn admin(
        &self,
        command: coordinator_core::Command,
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

    pub async fn commitments(
        &self,
        joined: &Joined,
        commitments: Commitments,
    ) -> Result<(), Stopped> {
        self.send(Event::Commitments {
            worker: joined.worker,
            session: joined.session,
            commitments,
        })
        .await
    }

    pub async fn revealed(&self, joined: &Joined, chunk: RevealChunk) -> Result<(), Stopped> {
        self.send(Event::Reveal {
            worker: joined.worker,
            session: joined.session,
            chunk,
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

/// The receiving ends of what the coordinator publishes.
#[derive(Debug, Clone)]
pub struct Published {
    pub status: watch::Receiver<Status>,
    pub weights: watch::Receiver<WeightsSnapshot>,
    pub net: Network,
    /// `/metrics`' histograms.
    pub histograms: crate::edge::exposition::Histograms,
}

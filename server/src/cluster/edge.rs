//! `--role edge`: the task beside the edge's coordinator that talks to the root.
//!
//! It publishes each round's partial (sent again every [`TICK`] until the root's next
//! version, so a partial lost to a NATS restart or a root that died costs a tick, not the
//! run), renews the edge's lease with what it serves, and brings each new version of the
//! root's back to the coordinator: announced on the versions subject, or found in the
//! `version` key at a tick, and read from the Object Store once.

use coordinator_core::remote::Partial;
use coordinator_core::Status;
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{wire, ClusterError, Nats, EDGE_PREFIX, TICK};
use crate::coordinator::CoordinatorHandle;

/// What an edge says about itself in its lease (and so what the root and the other edges'
/// dashboards can show).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EdgeLease {
    pub name: String,
    /// Where volunteers reach it (ws:// or wss://).
    pub url: String,
    pub workers: usize,
    pub version: u64,
}

/// The edge's side of the cluster, until `shutdown`.
#[derive(Debug)]
pub struct EdgeLink {
    pub nats: Nats,
    pub name: String,
    pub url: String,
    pub partials: mpsc::Receiver<Partial>,
    pub coordinator: CoordinatorHandle,
    pub status: watch::Receiver<Status>,
    pub shutdown: CancellationToken,
}

impl EdgeLink {
    pub async fn run(mut self) -> Result<(), ClusterError> {
        let mut versions = self
            .nats
            .client
            .subscribe(self.nats.versions.clone())
            .await
            .map_err(|e| ClusterError::JetStream {
                what: "subscribing to versions",
                error: e.to_string(),
            })?;
        let mut state = State::default();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!(edge = %self.name, "edge: waiting for the root's weights");
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => break,
                partial = self.partials.recv() => match partial {
                    Some(partial) => {
                        self.publish(&partial).await;
                        state.pending = Some(partial);
                    }
                    None => break,
                },
                message = versions.next() => {
                    let Some(message) = message else { break };
                    if let Ok(bytes) = <[u8; 8]>::try_from(message.payload.as_ref()) {
                        self.version(&mut state, u64::from_le_bytes(bytes)).await;
                    }
                }
                _ = tick.tick() => self.tick(&mut state).await,
            }
        }
        let _ = self
            .nats
            .leases
            .delete(format!("{EDGE_PREFIX}{}", self.name))
            .await;
        Ok(())
    }

    async fn publish(&self, partial: &Partial) {
        for chunk in wire::encode_partial(&self.name, partial) {
            if let Err(e) = self
                .nats
                .client
                .publish(self.nats.partials.clone(), chunk)
                .await
            {
                warn!(round = partial.round, error = %e, "a partial could not be published");
                return;
            }
        }
        debug!(
            round = partial.round,
            samples = partial.samples,
            "partial sent to the root"
        );
    }

    /// The root is at `version`: adopt it if it is newer; if the root is (again) at the
    /// round of the partial this edge is waiting on, send it again (a root that took over
    /// from the Object Store never saw it).
    async fn version(&self, state: &mut State, version: u64) {
        if state.adopted.is_some_and(|a| version <= a) {
            if let Some(p) = state.pending.as_ref().filter(|p| p.round == version) {
                self.publish(p).await;
            }
            return;
        }
        let latest = match self.nats.latest().await {
            Ok(Some(latest)) => latest,
            Ok(None) => return,
            Err(e) => {
                warn!(version, error = %e, "the root's version could not be read");
                return;
            }
        };
        if state.adopted.is_some_and(|a| latest.version <= a) {
            return;
        }
        let version = latest.version;
        if self
            .coordinator
            .adopt(version, latest.params)
            .await
            .is_err()
        {
            return;
        }
        debug!(version, "adopted the root's version");
        state.adopted = Some(version);
        if state.pending.as_ref().is_some_and(|p| p.round < version) {
            state.pending = None;
        }
    }

    /// Renews the lease, looks for a version it missed, and sends an unanswered partial
    /// again.
    async fn tick(&self, state: &mut State) {
        let status = self.status.borrow().clone();
        let lease = EdgeLease {
            name: self.name.clone(),
            url: self.url.clone(),
            workers: status.workers,
            version: status.round,
        };
        let value = serde_json::to_vec(&lease).expect("a lease serialises");
        if let Err(e) = self
            .nats
            .leases
            .put(format!("{EDGE_PREFIX}{}", self.name), value.into())
            .await
        {
            warn!(error = %e, "the edge's lease could not be renewed");
        }
        match self.nats.newest_version().await {
            Ok(Some(newest)) => {
                self.version(state, newest).await;
                if let Some(p) = state.pending.as_ref().filter(|p| p.round >= newest) {
                    self.publish(p).await;
                }
            }
            Ok(None) => {}
            Err(e) => debug!(error = %e, "no version key"),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// The newest version handed to the coordinator.
    adopted: Option<u64>,
    /// The partial sent for the round the coordinator waits on.
    pending: Option<Partial>,
}

/// The live edges' leases.
pub async fn live_edges(nats: &Nats) -> Result<Vec<EdgeLease>, ClusterError> {
    let err = |e: &dyn std::fmt::Display| ClusterError::JetStream {
        what: "listing the edges",
        error: e.to_string(),
    };
    let mut keys = nats.leases.keys().await.map_err(|e| err(&e))?;
    let mut edges = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| err(&e))?;
        if !key.starts_with(EDGE_PREFIX) {
            continue;
        }
        if let Ok(Some(value)) = nats.leases.get(&key).await {
            if let Ok(lease) = serde_json::from_slice::<EdgeLease>(&value) {
                edges.push(lease);
            }
        }
    }
    Ok(edges)
}

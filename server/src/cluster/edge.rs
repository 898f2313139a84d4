//! `--role edge`: the task beside the edge's coordinator that talks to the root.
//!
//! It publishes each round's partial (sent again every [`TICK`] while the root has not
//! moved past that round, so a partial lost to a NATS restart or a root that died costs a
//! tick, not the run), renews the edge's lease with what it serves, and brings each new
//! version of the root's weights (the weights subject) to the coordinator. A version of a
//! new root epoch is taken even if older: a root that took over resumed from its last
//! stored version, and the run goes on from there.

use coordinator_core::remote::{ClusterView, EdgeView, Partial};
use coordinator_core::Status;
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::wire::{self, WeightsAssembler};
use super::{last_words, unless_shut, ClusterError, Nats, EDGE_PREFIX, TICK};
use crate::coordinator::CoordinatorHandle;

/// What an edge says about itself in its lease (and so what the root and the other edges'
/// dashboards show): the view of it the core's status carries.
pub type EdgeLease = EdgeView;

/// The edge's side of the cluster, until `shutdown`.
#[derive(Debug)]
pub struct EdgeLink {
    pub nats: Nats,
    pub name: String,
    pub url: String,
    /// All the model's parameters: the length of the root's weights.
    pub params: usize,
    pub partials: mpsc::Receiver<Partial>,
    pub coordinator: CoordinatorHandle,
    pub status: watch::Receiver<Status>,
    /// This edge's admission: the run's other edges' pages are let in, so that their tabs
    /// can move here.
    pub admission: std::sync::Arc<crate::edge::admission::Admission>,
    pub shutdown: CancellationToken,
}

impl EdgeLink {
    pub async fn run(mut self) -> Result<(), ClusterError> {
        let mut weights = self
            .nats
            .client
            .subscribe(self.nats.weights_subject.clone())
            .await
            .map_err(|e| ClusterError::JetStream {
                what: "subscribing to the weights",
                error: e.to_string(),
            })?;
        let mut assembler = WeightsAssembler::new(self.params);
        let mut state = State::default();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!(edge = %self.name, "edge: waiting for the root's weights");
        let shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                partial = self.partials.recv() => match partial {
                    Some(partial) => {
                        if unless_shut(&shutdown, self.publish(&partial)).await.is_none() {
                            break;
                        }
                        state.pending = Some(partial);
                    }
                    None => break,
                },
                message = weights.next() => {
                    let Some(message) = message else { break };
                    let whole = wire::decode_weights_chunk(&message.payload)
                        .and_then(|chunk| assembler.add(chunk));
                    match whole {
                        Ok(Some((epoch, version, params))) => {
                            let adopted = self.weights(&mut state, epoch, version, params);
                            if unless_shut(&shutdown, adopted).await.is_none() {
                                break;
                            }
                        }
                        Ok(None) => {}
                        Err(e) => warn!(error = %e, "a message on the weights subject was refused"),
                    }
                }
                _ = tick.tick() => {
                    if unless_shut(&shutdown, self.tick(&mut state)).await.is_none() {
                        break;
                    }
                }
                // Workers or none, now rather than at the next tick: the root waits for
                // the partials of edges with workers only.
                Ok(()) = self.status.changed() => {
                    let working = self.status.borrow().workers > 0;
                    if state.working != Some(working)
                        && unless_shut(&shutdown, self.renew_lease(&mut state)).await.is_none()
                    {
                        break;
                    }
                }
            }
        }
        // The lease handed back at once rather than after it expires: within a second, or
        // not at all when NATS is gone.
        let lease = format!("{EDGE_PREFIX}{}", self.name);
        last_words("edge: the lease", async {
            let _ = self.nats.leases.delete(lease).await;
        })
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

    /// The root published `version` of its `epoch`: to the coordinator if it is news. The
    /// same version again means the root is waiting on this round: the partial goes again.
    async fn weights(&self, state: &mut State, epoch: u64, version: u64, params: Vec<f32>) {
        let news = match state.adopted {
            None => true,
            Some((e, v)) => e != epoch || version > v,
        };
        if !news {
            if let Some(p) = state.pending.as_ref().filter(|p| p.round == version) {
                self.publish(p).await;
            }
            return;
        }
        if self.coordinator.adopt(version, params).await.is_err() {
            return;
        }
        debug!(epoch, version, "adopted the root's version");
        state.adopted = Some((epoch, version));
        // A partial is for the version it was computed on: any other is void.
        if state.pending.as_ref().is_some_and(|p| p.round != version) {
            state.pending = None;
        }
    }

    /// The lease, with what this edge serves now.
    async fn renew_lease(&self, state: &mut State) {
        let lease = {
            let status = self.status.borrow();
            EdgeLease {
                name: self.name.clone(),
                url: self.url.clone(),
                workers: status.workers,
                version: status.round,
            }
        };
        state.working = Some(lease.workers > 0);
        let value = serde_json::to_vec(&lease).expect("a lease serialises");
        if let Err(e) = self
            .nats
            .leases
            .put(format!("{EDGE_PREFIX}{}", self.name), value.into())
            .await
        {
            warn!(error = %e, "the edge's lease could not be renewed");
        }
    }

    /// Renews the lease, and sends an unanswered partial again while the root is still at
    /// its round.
    async fn tick(&self, state: &mut State) {
        self.renew_lease(state).await;
        let newest = match self.nats.newest_version().await {
            Ok(newest) => newest.map(|(_, v)| v),
            Err(e) => {
                debug!(error = %e, "no version key");
                None
            }
        };
        if let Some(p) = state
            .pending
            .as_ref()
            .filter(|p| newest.is_some_and(|v| p.round >= v))
        {
            self.publish(p).await;
        }
        // The whole run, for this edge's status and dashboard.
        if let Ok(edges) = live_edges(&self.nats).await {
            self.admission
                .add_peer_origins(edges.iter().filter_map(|e| page_origin(&e.url)));
            let view = ClusterView {
                root_version: newest,
                workers: edges.iter().map(|e| e.workers).sum(),
                edges,
            };
            let _ = self.coordinator.cluster_view(view).await;
        }
    }
}

/// The origin of the page an edge serves, from its WebSocket URL (`ws://h:p/ws` →
/// `http://h:p`).
pub fn page_origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let host = rest.split('/').next().filter(|h| !h.is_empty())?;
    let scheme = match scheme {
        "ws" => "http",
        "wss" => "https",
        _ => return None,
    };
    Some(format!("{scheme}://{host}"))
}

#[derive(Debug, Default)]
struct State {
    /// The root's epoch and the newest version handed to the coordinator.
    adopted: Option<(u64, u64)>,
    /// The partial sent for the round the coordinator waits on.
    pending: Option<Partial>,
    /// Whether the lease last said it has workers.
    working: Option<bool>,
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

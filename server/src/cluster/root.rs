//! `--role root`: the process that combines the edges' partials and owns the optimizer.
//!
//! It takes the root lease (or waits as a standby until the holder's lease expires), resumes
//! from the newest version in the Object Store (or starts at version 0 from `--seed`, as a
//! single coordinator would), and then, round after round: gathers the partials of the
//! live edges, closes the round when every live edge has sent its own (or `--edge-timeout`
//! after the first), steps the optimizer (`coordinator_core::root`) and publishes the new
//! weights on the weights subject. Every `--store-every` versions (and at the end) it also
//! writes the version and the optimizer's state to the Object Store, first: a root killed
//! at any point loses at most that many versions. A tick with no partial publishes the
//! current weights again, for an edge that missed them or joined since.

use std::collections::BTreeSet;
use std::time::Duration;

use coordinator_core::root::Root;
use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::edge::{live_edges, EdgeLease};
use super::wire::{self, Assembler, Version};
use super::{
    last_words, unless_shut, ClusterConfig, ClusterError, Nats, EDGE_PREFIX, LATEST, ROOT_KEY,
    TICK, VERSION_KEY,
};
use crate::config::Config;
use async_nats::jetstream::kv;

/// How a root's run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RootSummary {
    /// The newest version published.
    pub version: u64,
    /// Its score on the test split, when it was evaluated.
    pub test_accuracy: Option<f64>,
    /// Rounds this process closed (a resumed root closed fewer than `version`).
    pub closed: u64,
}

/// Runs the root until `--max-rounds`, `--target-accuracy` or `shutdown`.
pub async fn run(
    config: Config,
    cluster: ClusterConfig,
    shutdown: CancellationToken,
) -> Result<RootSummary, ClusterError> {
    let setup = |e: &dyn std::fmt::Display| ClusterError::Resume(e.to_string());
    let data = config
        .load_data(config.training.seed)
        .map_err(|e| setup(&e))?;
    let net = data.network(&config.model).map_err(|e| setup(&e))?;
    let mut root = Root::new(
        net,
        config.training.seed,
        config.training.optimizer,
        data.data().test,
    )
    .map_err(|e| setup(&e))?
    .stepping(config.training.lr_schedule, config.training.clip_norm);
    let nats = Nats::connect(&cluster).await?;
    let Some(revision) = take_lease(&nats, &cluster.name, &shutdown).await? else {
        return Ok(RootSummary {
            version: root.version(),
            test_accuracy: None,
            closed: 0,
        });
    };
    match nats.latest().await? {
        Some(v) => {
            let version = v.version;
            root.restore(v.params, v.optimizer, version)
                .map_err(ClusterError::Resume)?;
            info!(
                version,
                "root: resuming from the Object Store's newest version"
            );
        }
        None => info!("root: starting at version 0"),
    }
    let mut partials = nats
        .client
        .subscribe(nats.partials.clone())
        .await
        .map_err(|e| ClusterError::JetStream {
            what: "subscribing to partials",
            error: e.to_string(),
        })?;
    // The live edges: every lease put shows at once (a watch); an expired one is noticed
    // at the next tick's listing.
    let mut leases = nats
        .leases
        .watch_with_history(format!("{EDGE_PREFIX}>"))
        .await
        .map_err(|e| ClusterError::JetStream {
            what: "watching the edges' leases",
            error: e.to_string(),
        })?;
    let mut rounds = Rounds::start(config, cluster, shutdown, nats, root, revision).await;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = rounds.shutdown.clone();
    while !rounds.done() {
        let go_on = tokio::select! {
            () = shutdown.cancelled() => false,
            message = partials.next() => match message {
                Some(message) => {
                    rounds.partial(&message.payload);
                    true
                }
                None => false,
            },
            entry = leases.next() => match entry {
                Some(Ok(entry)) => rounds.lease(&entry).await,
                _ => true,
            },
            _ = tick.tick() => rounds.tick().await?,
            () = sleep_until(rounds.deadline) => {
                rounds.edge_timeout();
                true
            }
        };
        if !go_on || !rounds.close_if_due().await {
            break;
        }
    }
    Ok(rounds.finish().await)
}

/// The root's rounds once it holds the lease: what it knows of the edges, the partials of
/// the round under way, and what it has published.
struct Rounds {
    config: Config,
    cluster: ClusterConfig,
    shutdown: CancellationToken,
    nats: Nats,
    root: Root,
    /// This root's epoch: its lease's first revision, which only grows in the bucket.
    epoch: u64,
    revision: u64,
    /// Not yet published (NATS unreachable): tried again at each tick.
    unpublished: Option<ClusterError>,
    /// A partial came since the last tick.
    heard: bool,
    assembler: Assembler,
    /// Every edge with a lease (a new one is sent the weights at once), and those with
    /// workers, whose partials a round waits for.
    known: BTreeSet<String>,
    live: BTreeSet<String>,
    /// When the round under way closes without the partials still missing.
    deadline: Option<Instant>,
    closed: u64,
    accuracy: Option<f64>,
}

impl Rounds {
    /// The current weights published, and the edges listed.
    async fn start(
        config: Config,
        cluster: ClusterConfig,
        shutdown: CancellationToken,
        nats: Nats,
        root: Root,
        revision: u64,
    ) -> Self {
        let epoch = revision;
        let unpublished = publish(&nats, epoch, weights_of(epoch, &root)).await.err();
        let assembler = Assembler::new(root.net().trainable_count(), root.version());
        let (known, live) = edge_sets(&nats).await;
        Self {
            config,
            cluster,
            shutdown,
            nats,
            root,
            epoch,
            revision,
            unpublished,
            heard: false,
            assembler,
            known,
            live,
            deadline: None,
            closed: 0,
            accuracy: None,
        }
    }

    /// `--max-rounds` reached.
    fn done(&self) -> bool {
        let version = self.root.version();
        self.config
            .training
            .max_rounds
            .is_some_and(|max| version >= max)
    }

    /// A chunk of a partial came on the partials subject.
    fn partial(&mut self, payload: &[u8]) {
        let chunk = match wire::decode_chunk(payload) {
            Ok(chunk) => chunk,
            Err(e) => {
                warn!(error = %e, "root: a message on the partials subject was not a partial");
                return;
            }
        };
        match self.assembler.add(chunk) {
            Ok(Some((edge, partial))) => {
                let round = partial.round;
                let before = self.root.received();
                match self.root.partial(&edge, partial) {
                    Ok(()) => {
                        debug!(%edge, round, "root: partial");
                        // An edge's first partial this round is progress; one sent again
                        // is not.
                        self.heard |= self.root.received() > before;
                        self.live.insert(edge);
                        let timeout = self.cluster.edge_timeout;
                        self.deadline
                            .get_or_insert_with(|| Instant::now() + timeout);
                    }
                    Err(e) => warn!(%edge, error = %e, "root: partial refused"),
                }
            }
            Ok(None) => {}
            // An old round's chunk (an edge sending again): nothing to do.
            Err(e) => debug!(error = %e, "root: chunk dropped"),
        }
    }

    /// An edge's lease was put or went. `false`: shutting down.
    async fn lease(&mut self, entry: &kv::Entry) -> bool {
        let name = entry.key.trim_start_matches(EDGE_PREFIX).to_owned();
        let lease = serde_json::from_slice::<EdgeLease>(&entry.value).ok();
        let Some(lease) = lease.filter(|_| entry.operation == kv::Operation::Put) else {
            self.known.remove(&name);
            self.live.remove(&name);
            return true;
        };
        // Rounds wait only for edges with workers: one with none sends no partial.
        if lease.workers > 0 {
            self.live.insert(name.clone());
        } else {
            self.live.remove(&name);
        }
        if self.known.insert(name) {
            // A new edge: the current weights at once, rather than at a tick.
            return self.publish().await;
        }
        true
    }

    /// The lease renewed; the weights again if nothing came since the last tick (an edge
    /// missed them, or joined since), or if they could not go at all; the edges listed.
    /// `Ok(false)`: shutting down; an error: another root holds the lease now.
    async fn tick(&mut self) -> Result<bool, ClusterError> {
        let renewed = renew(&self.nats, &self.cluster.name, self.revision);
        let Some(renewed) = unless_shut(&self.shutdown, renewed).await else {
            return Ok(false);
        };
        self.revision = renewed?;
        if (self.unpublished.is_some() || !std::mem::take(&mut self.heard)) && !self.publish().await
        {
            return Ok(false);
        }
        if let Some(e) = &self.unpublished {
            warn!(version = self.root.version(), error = %e, "root: the version is not published yet; trying again");
            return Ok(true);
        }
        let Some(sets) = unless_shut(&self.shutdown, edge_sets(&self.nats)).await else {
            return Ok(false);
        };
        (self.known, self.live) = sets;
        Ok(true)
    }

    /// The round's deadline passed: it closes with the partials received, if enough came;
    /// else it waits on, as a coordinator extends a round without its quorum.
    fn edge_timeout(&mut self) {
        if self.root.received() >= self.cluster.min_edges {
            info!(
                round = self.root.version(),
                received = self.root.received(),
                live = self.live.len(),
                "root: edge timeout; closing with the partials received"
            );
        } else {
            self.deadline = Some(Instant::now() + self.cluster.edge_timeout);
        }
    }

    /// The current weights on the weights subject. `false`: shutting down.
    async fn publish(&mut self) -> bool {
        let sent = publish(&self.nats, self.epoch, weights_of(self.epoch, &self.root));
        let Some(sent) = unless_shut(&self.shutdown, sent).await else {
            return false;
        };
        self.unpublished = sent.err();
        true
    }

    /// Closes the round if every live edge sent its partial (or its deadline passed with
    /// enough of them): the optimizer's step, the new version stored when due and
    /// published, and evaluated when due. `false`: the run is over (a target reached, or
    /// shutting down).
    async fn close_if_due(&mut self) -> bool {
        let due = self.deadline.is_some_and(|d| Instant::now() >= d);
        let enough = self.root.received() >= self.cluster.min_edges;
        if !(self.root.complete(&self.live, self.cluster.min_edges) || due && enough) {
            return true;
        }
        let Some(round) = self.root.close() else {
            return true;
        };
        self.deadline = None;
        self.heard = true;
        self.closed += 1;
        if round.refused {
            warn!(
                version = round.version,
                "root: update not applied: it would have made a parameter non-finite"
            );
        }
        let version = self.root.version();
        self.assembler.round(version);
        if version.is_multiple_of(self.cluster.store_every) {
            let stored = store(&self.nats, snapshot(&self.root));
            if unless_shut(&self.shutdown, stored).await.is_none() {
                return false;
            }
        }
        if !self.publish().await {
            return false;
        }
        info!(
            round = round.version,
            edges = round.edges.len(),
            answered = round.answered,
            samples = round.samples,
            train_loss = format_args!("{:.4}", round.mean_loss),
            "root: round"
        );
        if !(version.is_multiple_of(self.config.training.eval_interval) || self.done()) {
            return true;
        }
        let Some(e) = self.root.evaluate() else {
            return true;
        };
        info!(
            round = version,
            test_accuracy = e.accuracy,
            "root: evaluated"
        );
        self.accuracy = Some(e.accuracy);
        let training = &self.config.training;
        let reached = training.target_accuracy.is_some_and(|t| e.accuracy >= t)
            || training.target_loss.is_some_and(|t| e.loss <= t);
        !reached
    }

    /// The last version stored, and the lease handed over at once rather than after it
    /// expires: within a second, or not at all when NATS is gone.
    async fn finish(self) -> RootSummary {
        let last = snapshot(&self.root);
        let nats = &self.nats;
        last_words("root: the last version and the lease", async {
            store(nats, last).await;
            let _ = nats.leases.delete(ROOT_KEY).await;
        })
        .await;
        RootSummary {
            version: self.root.version(),
            test_accuracy: self.accuracy,
            closed: self.closed,
        }
    }
}

/// Takes the root lease, waiting as a standby while another root holds it. `None`: shut
/// down first.
async fn take_lease(
    nats: &Nats,
    name: &str,
    shutdown: &CancellationToken,
) -> Result<Option<u64>, ClusterError> {
    let mut said = false;
    loop {
        match nats.leases.create(ROOT_KEY, name.to_owned().into()).await {
            Ok(revision) => {
                info!(root = name, "root: holding the lease");
                return Ok(Some(revision));
            }
            Err(e) => {
                if !said {
                    info!(root = name, reason = %e, "root: standing by; another root holds the lease");
                    said = true;
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            () = tokio::time::sleep(TICK / 2) => {}
        }
    }
}

/// Renews the lease by compare-and-set. Another root holding it now means this one lost
/// it: an error, and this root stops. NATS unreachable is not: the lease is renewed, or
/// taken again if it expired meanwhile, once NATS is back.
async fn renew(nats: &Nats, name: &str, revision: u64) -> Result<u64, ClusterError> {
    let value = bytes::Bytes::from(name.to_owned());
    let failed = match nats.leases.update(ROOT_KEY, value.clone(), revision).await {
        Ok(revision) => return Ok(revision),
        Err(e) => e,
    };
    match nats.leases.entry(ROOT_KEY).await {
        Ok(Some(entry))
            if entry.operation == kv::Operation::Put && entry.value.as_ref() != name.as_bytes() =>
        {
            Err(ClusterError::JetStream {
                what: "renewing the root lease",
                error: format!(
                    "another root ({}) holds it now",
                    String::from_utf8_lossy(&entry.value)
                ),
            })
        }
        Ok(Some(entry)) if entry.operation == kv::Operation::Put => Ok(entry.revision),
        // Expired (NATS was away longer than the lease): take it again.
        Ok(_) => match nats.leases.create(ROOT_KEY, value).await {
            Ok(revision) => Ok(revision),
            Err(e) => {
                warn!(error = %e, "root: the lease could not be taken again");
                Ok(revision)
            }
        },
        Err(e) => {
            warn!(error = %failed, cause = %e, "root: NATS unreachable; the lease is renewed when it is back");
            Ok(revision)
        }
    }
}

/// The current version, as the Object Store keeps it (built before any await: the root's
/// optimizer is not `Sync`).
fn snapshot(root: &Root) -> (u64, Vec<u8>) {
    let version = root.version();
    let bytes = wire::encode_version(&Version {
        version,
        params: root.params().to_vec(),
        optimizer: root.optimizer_state(),
    });
    (version, bytes)
}

/// A version and the optimizer's state into the Object Store: the checkpoint a new root
/// resumes from. A failure is logged; the next store is the next chance.
async fn store(nats: &Nats, (version, bytes): (u64, Vec<u8>)) {
    if let Err(e) = nats.weights.put(LATEST, &mut bytes.as_slice()).await {
        warn!(version, error = %e, "root: the version could not be stored");
    }
}

/// The current weights as the messages to publish (built before any await: the root's
/// optimizer is not `Sync`).
fn weights_of(epoch: u64, root: &Root) -> (u64, Vec<bytes::Bytes>) {
    let version = root.version();
    (version, wire::encode_weights(epoch, version, root.params()))
}

/// A version's weights on the weights subject, then the `version` key.
async fn publish(
    nats: &Nats,
    epoch: u64,
    (version, chunks): (u64, Vec<bytes::Bytes>),
) -> Result<(), ClusterError> {
    let failed = |e: &dyn std::fmt::Display| ClusterError::JetStream {
        what: "publishing the weights",
        error: e.to_string(),
    };
    for chunk in chunks {
        nats.client
            .publish(nats.weights_subject.clone(), chunk)
            .await
            .map_err(|e| failed(&e))?;
    }
    nats.leases
        .put(VERSION_KEY, super::version_key(epoch, version))
        .await
        .map_err(|e| failed(&e))?;
    Ok(())
}

/// The edges with a lease, and those of them with workers.
async fn edge_sets(nats: &Nats) -> (BTreeSet<String>, BTreeSet<String>) {
    match live_edges(nats).await {
        Ok(edges) => {
            let working = edges
                .iter()
                .filter(|e| e.workers > 0)
                .map(|e| e.name.clone())
                .collect();
            (edges.into_iter().map(|e| e.name).collect(), working)
        }
        Err(e) => {
            warn!(error = %e, "root: the edges' leases could not be read");
            (BTreeSet::new(), BTreeSet::new())
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// How long a root waits for the edges' partials after the first, by default.
pub const EDGE_TIMEOUT: Duration = Duration::from_secs(30);

//! The cluster: edge coordinators and a root on NATS JetStream (docs/CLUSTER.md).
//!
//! - [`edge`]: the task beside an edge's coordinator that publishes its partials, keeps its
//!   lease, and brings the root's versions back to it.
//! - [`root`]: the root process: combines the partials (`coordinator_core::root`), owns the
//!   optimizer, and publishes each version.
//! - [`wire`]: the bytes of a partial and of a version.
//!
//! What lives where in NATS, for run `R`:
//! - subject `crowdtrain.R.partials`: the edges' partials, in chunks (core NATS: at most
//!   once; an edge sends its partial again every [`TICK`] until the next version, and the
//!   root takes an edge's partial once per round);
//! - subject `crowdtrain.R.weights`: each new version of the root's, in chunks, once (the
//!   root publishes it again at a tick in which no partial came: an edge that missed it, or
//!   joined since, asks nothing and waits at most a tick);
//! - key-value bucket `crowdtrain-R`, whose values expire after [`LEASE`]: `root` (the
//!   root's lease, taken by create-if-absent and kept by compare-and-set on its revision,
//!   which is the root's epoch), `edge.NAME` (each edge's lease and what it serves),
//!   `version` (the root's epoch and newest version);
//! - Object Store bucket `crowdtrain-R-weights`, object `latest`: a version's weights and
//!   optimizer state every `--store-every` versions and at the end, the checkpoint a new
//!   root resumes from.

pub mod edge;
pub mod root;
pub mod wire;

use std::time::Duration;

use async_nats::jetstream::{self, kv, object_store};

/// A lease not renewed for this long has expired: its edge or root is gone.
pub const LEASE: Duration = Duration::from_secs(6);
/// How often leases are renewed, and an unanswered partial sent again.
pub const TICK: Duration = Duration::from_secs(2);
/// Messages a subscription holds before async-nats drops the slowest consumer's (it counts
/// messages, not bytes: nats.rs#1276). A partial's chunks are at most 512 KiB, so the
/// root holds at most 32 MiB of partials it has not read yet.
pub const SUBSCRIPTION_CAPACITY: usize = 64;

/// How long a role's last words to NATS may take on its way out (the root's last version
/// stored, a lease handed back): Ctrl-C and SIGTERM stop every role within about two
/// seconds, whether NATS answers or not.
pub const LAST_WORDS: Duration = Duration::from_secs(1);

/// `work`, unless `shutdown` comes first (`None`): every NATS call in a role's loop goes
/// through here, so that a NATS that does not answer never holds a stop up.
pub async fn unless_shut<T>(
    shutdown: &tokio_util::sync::CancellationToken,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => None,
        done = work => Some(done),
    }
}

/// `work` within [`LAST_WORDS`]; `what` is logged if it does not finish in time.
pub async fn last_words(what: &str, work: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(LAST_WORDS, work).await.is_err() {
        tracing::warn!("{what}: NATS did not answer within {LAST_WORDS:?}; stopping without it");
    }
}

/// The run and role this process takes in a cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// `--nats`: the server's URL.
    pub url: String,
    /// `--run`: the run's name, in every subject and bucket.
    pub run: String,
    /// `--edge-name`: this edge's name in leases and partials (edges only).
    pub name: String,
    /// `--edge-timeout`: how long the root waits for a live edge's partial after the
    /// round's first one.
    pub edge_timeout: Duration,
    /// `--min-edges`: partials a round needs before the root closes it.
    pub min_edges: usize,
    /// `--store-every`: versions between the root's stores into the Object Store.
    pub store_every: u64,
    /// `--public-url`: where volunteers reach this edge (its lease says so to the others).
    pub public_url: Option<String>,
}

/// This process's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// One coordinator, no NATS: today's default.
    #[default]
    Single,
    Edge,
    Root,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot reach NATS at {url}: {error}")]
    Connect { url: String, error: String },
    #[error("NATS JetStream ({what}): {error}")]
    JetStream { what: &'static str, error: String },
    #[error("{0}")]
    Wire(#[from] wire::WireError),
    #[error("the version in the Object Store does not fit this model: {0}")]
    Resume(String),
}

fn js_error(what: &'static str) -> impl FnOnce(&dyn std::fmt::Display) -> ClusterError {
    move |e| ClusterError::JetStream {
        what,
        error: e.to_string(),
    }
}

/// What a process of the cluster holds of NATS.
#[derive(Clone)]
pub struct Nats {
    pub client: async_nats::Client,
    pub leases: kv::Store,
    pub weights: object_store::ObjectStore,
    pub partials: String,
    pub weights_subject: String,
}

impl std::fmt::Debug for Nats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nats")
            .field("partials", &self.partials)
            .field("weights", &self.weights_subject)
            .finish_non_exhaustive()
    }
}

impl Nats {
    /// Connects and makes sure the run's bucket and store exist (created by whichever
    /// process comes first, with the same settings).
    pub async fn connect(config: &ClusterConfig) -> Result<Self, ClusterError> {
        let client = async_nats::ConnectOptions::new()
            .name(format!("crowdtrain {}", config.name))
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
            .connection_timeout(Duration::from_secs(5))
            .connect(config.url.as_str())
            .await
            .map_err(|e| ClusterError::Connect {
                url: config.url.clone(),
                error: e.to_string(),
            })?;
        let js = jetstream::new(client.clone());
        let run = &config.run;
        let leases = js
            .create_or_update_key_value(kv::Config {
                bucket: format!("crowdtrain-{run}"),
                description: "crowdtrain: leases of the root and the edges".into(),
                history: 1,
                max_age: LEASE,
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| js_error("the leases bucket")(&e))?;
        let bucket = format!("crowdtrain-{run}-weights");
        let weights = match js.get_object_store(&bucket).await {
            Ok(store) => store,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket,
                    description: Some("crowdtrain: the newest version of the weights".into()),
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(|e| js_error("the weights store")(&e))?,
        };
        Ok(Self {
            client,
            leases,
            weights,
            partials: format!("crowdtrain.{run}.partials"),
            weights_subject: format!("crowdtrain.{run}.weights"),
        })
    }

    /// The newest version in the Object Store, if any.
    pub async fn latest(&self) -> Result<Option<wire::Version>, ClusterError> {
        use tokio::io::AsyncReadExt;
        let mut object = match self.weights.get(LATEST).await {
            Ok(object) => object,
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(js_error("reading the weights")(&e)),
        };
        let mut bytes = Vec::new();
        object
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| js_error("reading the weights")(&e))?;
        Ok(Some(wire::decode_version(&bytes)?))
    }

    /// The root's epoch and newest version (`version` key), if one is known.
    pub async fn newest_version(&self) -> Result<Option<(u64, u64)>, ClusterError> {
        let value = self
            .leases
            .get(VERSION_KEY)
            .await
            .map_err(|e| js_error("the version key")(&e))?;
        Ok(value.and_then(|v| parse_version_key(&v)))
    }
}

/// The `version` key's value: the root's epoch, then the version.
pub fn version_key(epoch: u64, version: u64) -> bytes::Bytes {
    let mut b = epoch.to_le_bytes().to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.into()
}

/// (epoch, version) from the `version` key's value.
pub fn parse_version_key(value: &[u8]) -> Option<(u64, u64)> {
    let epoch = u64::from_le_bytes(value.get(..8)?.try_into().ok()?);
    let version = u64::from_le_bytes(value.get(8..16)?.try_into().ok()?);
    Some((epoch, version))
}

/// The Object Store's object holding the newest version.
pub const LATEST: &str = "latest";
/// The key of the newest version's number.
pub const VERSION_KEY: &str = "version";
/// The key of the root's lease.
pub const ROOT_KEY: &str = "root";
/// Edges' lease keys start with this.
pub const EDGE_PREFIX: &str = "edge.";

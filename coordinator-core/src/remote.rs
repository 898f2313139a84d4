//! `--role edge`: the coordinator of some of the run's workers, whose updates a root applies
//! elsewhere (docs/CLUSTER.md).
//!
//! An edge does everything a single coordinator does for its own workers (admission,
//! uploads, verification, bans, the round and its robust aggregation) up to the update.
//! There, instead of stepping an optimizer, it hands the round's combined gradient and its
//! sample count to its driver as an [`Output::Partial`], and opens no new round until the
//! root's next version comes back through [`Coordinator::adopt`]. It opens none before the
//! root's first version either: every edge starts from the root's weights.
//!
//! Whatever version the root publishes is adopted, newer than the edge's or not the one it
//! waited for: the root may have closed a round without this edge (its deadline), or a new
//! root may have resumed from its last stored version, older than the edge's (the cluster
//! task, `server::cluster::edge`, tells a new root's versions from stale messages).

use std::sync::Arc;
use std::time::Instant;

use crate::io::Output;
pub use crate::partial::Partial;
use crate::schedule::Update;
use crate::Coordinator;

/// The whole run as an edge sees it (its cluster task reads the leases): what its status,
/// and so its dashboard, shows beside its own workers.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct ClusterView {
    /// The root's newest version.
    pub root_version: Option<u64>,
    /// Every live edge, this one included.
    pub edges: Vec<EdgeView>,
    /// Their workers together.
    pub workers: usize,
}

/// One live edge, as its lease says (the lease's value is this, as JSON).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EdgeView {
    pub name: String,
    /// Where volunteers reach it.
    pub url: String,
    pub workers: usize,
    pub version: u64,
}

/// Where an edge stands with its root.
#[derive(Debug, Default)]
pub(crate) struct Remote {
    /// Adopted a version of the root's at least once.
    started: bool,
    /// The round handed to the root, waiting for its version.
    awaiting: Option<Update>,
    /// The run's other edges, as last read.
    view: Option<Arc<ClusterView>>,
}

impl Remote {
    /// Opens no round: waiting for the root's first version, or for its next one.
    pub(crate) fn holds_rounds(&self) -> bool {
        !self.started || self.awaiting.is_some()
    }

    /// Its round is with the root.
    pub(crate) fn at_root(&self) -> bool {
        self.awaiting.is_some()
    }

    pub(crate) fn view(&self) -> Option<Arc<ClusterView>> {
        self.view.clone()
    }
}

impl Coordinator {
    /// `--role edge`: the round's update goes to the root. Returns whether it did (false on
    /// a single coordinator, which applies it itself).
    pub(crate) fn hand_to_root(&mut self, update: &Update) -> bool {
        let round = self.trainer.version();
        let Some(remote) = self.remote.as_mut() else {
            return false;
        };
        remote.awaiting = Some(update.clone());
        self.outputs.push_back(Output::Partial(Partial {
            round,
            gradient: update.gradient.clone(),
            samples: update.samples,
            mean_loss: update.mean_loss,
            answered: update.answered,
        }));
        self.registry.mark_changed();
        true
    }

    /// Input (`--role edge`): the run's edges as the leases say, for the status.
    pub fn cluster_view(&mut self, view: ClusterView) {
        if let Some(remote) = self.remote.as_mut() {
            remote.view = Some(Arc::new(view));
            self.publish();
        }
    }

    /// Input (`--role edge`): the root published `version` with these weights (all the
    /// parameters). The version the edge already has is ignored; any other is taken (an
    /// older one is a new root's, resumed from its store); weights of another length are
    /// refused with the reason.
    pub fn adopt(&mut self, version: u64, params: Vec<f32>, now: Instant) -> Result<(), String> {
        self.now = now;
        let Some(remote) = self.remote.as_mut() else {
            return Err("not an edge: this coordinator applies its own updates".into());
        };
        let current = self.trainer.version();
        if remote.started && version == current {
            return Ok(());
        }
        let optimizer = self.trainer.optimizer_state();
        self.trainer.adopt(params, optimizer, version)?;
        let remote = self.remote.as_mut().expect("checked above");
        remote.started = true;
        // The round handed over became this version: count it as applied. Going back (a new
        // root's older version) applies nothing.
        let update = remote.awaiting.take();
        if let Some(update) = update.filter(|_| version > current) {
            self.applied(&update);
        }
        self.registry.mark_changed();
        self.done(now);
        Ok(())
    }
}

//! `--role root`: combines the edges' partials and owns the optimizer (docs/CLUSTER.md).
//! Sans-IO like the coordinator: the driver (`server::cluster::root`) moves the partials,
//! the versions and the time.
//!
//! A round is the root's version `v`: each live edge sends one partial computed on `v`. The
//! root closes the round when every live edge has sent its partial (the driver says which
//! edges are live: their leases in the key-value store) and at least `--min-edges` have, or
//! at the driver's deadline with at least `--min-edges`. The update is the partials' mean weighted by the samples behind each, in
//! the edges' name order: with the edges' own sample-weighted means that is the mean over
//! every worker's answer, as a single coordinator computes it (up to the order of the f32
//! sums).
//!
//! Edges are weighted by samples and trusted, where workers are not: an edge is a process
//! the operator started, holding the run's NATS credentials, that has already verified,
//! clipped and robustly combined its own workers' answers. A partial is still checked for
//! its length and finite values, so that a broken edge cannot corrupt the model.

use std::collections::{BTreeMap, BTreeSet};

use model::{Dataset, GradientSum, ModelError, Network, OptimizerKind, OptimizerState};

use crate::remote::Partial;
use crate::trainer::Trainer;

/// A partial the root could not take, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PartialError {
    #[error("a partial for round {got} while the root is at round {at}")]
    Stale { got: u64, at: u64 },
    #[error("a partial of {got} values; the model trains {want}")]
    Length { got: usize, want: usize },
    #[error("a partial with a non-finite value or no samples")]
    NotFinite,
}

/// What one round came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Closed {
    /// The new version.
    pub version: u64,
    /// The edges whose partials it combined, by name.
    pub edges: Vec<String>,
    pub samples: u64,
    pub answered: usize,
    pub mean_loss: f64,
    /// The update would have made a parameter non-finite: not applied, version unchanged.
    pub refused: bool,
}

#[derive(Debug)]
pub struct Root {
    trainer: Trainer,
    /// This round's partials, by edge name.
    partials: BTreeMap<String, Partial>,
}

impl Root {
    /// Version 0: the initial weights of `seed`, as a single coordinator's.
    pub fn new(
        net: Network,
        seed: u64,
        optimizer: OptimizerKind,
        test: Dataset,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            trainer: Trainer::new(net, seed, optimizer, test)?,
            partials: BTreeMap::new(),
        })
    }

    /// Steps follow `schedule` and clip at `clip`, as a single coordinator's
    /// ([`Trainer::stepping`]).
    #[must_use]
    pub fn stepping(mut self, schedule: Option<model::LrSchedule>, clip: Option<f32>) -> Self {
        self.trainer = self.trainer.stepping(schedule, clip);
        self
    }

    /// Continues from a saved version (the Object Store's newest).
    pub fn restore(
        &mut self,
        params: Vec<f32>,
        optimizer: OptimizerState,
        version: u64,
    ) -> Result<(), String> {
        self.trainer.restore(params, optimizer, version)?;
        self.partials.clear();
        Ok(())
    }

    pub fn version(&self) -> u64 {
        self.trainer.version()
    }

    /// All the parameters (frozen layers included).
    pub fn params(&self) -> &[f32] {
        self.trainer.params()
    }

    pub fn optimizer_state(&self) -> OptimizerState {
        self.trainer.optimizer_state()
    }

    pub fn net(&self) -> &Network {
        self.trainer.net()
    }

    /// The test split's score of the current weights.
    pub fn evaluate(&self) -> Option<model::Evaluation> {
        self.trainer.evaluate()
    }

    /// Takes `edge`'s partial for this round (a second one from the same edge replaces its
    /// first).
    pub fn partial(&mut self, edge: &str, partial: Partial) -> Result<(), PartialError> {
        let at = self.trainer.version();
        if partial.round != at {
            return Err(PartialError::Stale {
                got: partial.round,
                at,
            });
        }
        let want = self.trainer.net().trainable_count();
        if partial.gradient.len() != want {
            return Err(PartialError::Length {
                got: partial.gradient.len(),
                want,
            });
        }
        if partial.samples == 0 || !partial.gradient.iter().all(|v| v.is_finite()) {
            return Err(PartialError::NotFinite);
        }
        self.partials.insert(edge.to_owned(), partial);
        Ok(())
    }

    /// Partials this round so far.
    pub fn received(&self) -> usize {
        self.partials.len()
    }

    /// At least `min_edges` partials (and one), and one from every edge of `live`.
    pub fn complete(&self, live: &BTreeSet<String>, min_edges: usize) -> bool {
        self.partials.len() >= min_edges.max(1)
            && live.iter().all(|e| self.partials.contains_key(e))
    }

    /// Closes the round with the partials received: their sample-weighted mean, one
    /// optimizer step. `None` without any partial.
    pub fn close(&mut self) -> Option<Closed> {
        if self.partials.is_empty() {
            return None;
        }
        let partials = std::mem::take(&mut self.partials);
        let mut sum = GradientSum::new(self.trainer.net().trainable_count());
        let (mut answered, mut loss) = (0, 0.0);
        let samples: u64 = partials.values().map(|p| p.samples).sum();
        for p in partials.values() {
            let weight = p.samples as f32;
            let count = u32::try_from(p.samples).unwrap_or(u32::MAX);
            sum.accumulate_weighted(&p.gradient, count, weight);
            answered += p.answered;
            loss += p.mean_loss * p.samples as f64;
        }
        let gradient = sum.take_mean()?;
        let refused = !self.trainer.apply(&gradient);
        Some(Closed {
            version: self.trainer.version(),
            edges: partials.into_keys().collect(),
            samples,
            answered,
            mean_loss: loss / samples as f64,
            refused,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Root {
        let split = crate::data::digits(5);
        let net =
            Network::new(model::NetSpec::mlp(split.train.shape(), &[8], 10), 10).expect("model");
        Root::new(net, 3, OptimizerKind::Sgd { lr: 0.5 }, split.test).expect("root")
    }

    fn partial(root: &Root, value: f32, samples: u64) -> Partial {
        Partial {
            round: root.version(),
            gradient: vec![value; root.net().trainable_count()],
            samples,
            mean_loss: 1.0,
            answered: 2,
        }
    }

    #[test]
    fn the_update_is_the_sample_weighted_mean_of_the_partials() {
        let mut root = root();
        let before = root.params().to_vec();
        let live: BTreeSet<String> = ["a", "b"].map(String::from).into();
        root.partial("a", partial(&root, 1.0, 64)).expect("taken");
        assert!(!root.complete(&live, 1), "b has not sent yet");
        root.partial("b", partial(&root, 4.0, 192)).expect("taken");
        assert!(root.complete(&live, 2));
        assert!(!root.complete(&live, 3), "a third edge is expected");
        let closed = root.close().expect("closes");
        assert_eq!(
            (closed.version, closed.samples, closed.answered),
            (1, 256, 4)
        );
        assert_eq!(closed.edges, ["a", "b"]);
        // (64·1 + 192·4) / 256 = 3.25, times lr 0.5.
        for (b, a) in before.iter().zip(root.params()) {
            assert!((b - a - 1.625).abs() < 1e-6, "{b} → {a}");
        }
        assert_eq!(root.close(), None, "nothing received for round 1 yet");
    }

    #[test]
    fn stale_short_and_non_finite_partials_are_refused() {
        let mut root = root();
        let mut stale = partial(&root, 1.0, 32);
        stale.round = 7;
        assert_eq!(
            root.partial("a", stale),
            Err(PartialError::Stale { got: 7, at: 0 })
        );
        let mut short = partial(&root, 1.0, 32);
        short.gradient.pop();
        assert!(matches!(
            root.partial("a", short),
            Err(PartialError::Length { .. })
        ));
        let mut nan = partial(&root, 1.0, 32);
        nan.gradient[3] = f32::NAN;
        assert_eq!(root.partial("a", nan), Err(PartialError::NotFinite));
        assert_eq!(
            root.partial("a", partial(&root, 1.0, 0)),
            Err(PartialError::NotFinite)
        );
        assert_eq!(root.received(), 0);
    }
}

//! The model being trained: parameters, optimizer, version, the encoded-weights cache, and
//! evaluation on the test split (which never leaves the coordinator).

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use model::{
    batch_seed, clip_global_norm, evaluate, Dataset, Evaluation, LrSchedule, ModelError, Network,
    Optimizer, OptimizerKind, OptimizerState,
};
use protocol::{encode_weights, Compression, Round};
use tracing::warn;

use crate::broadcast::{Chain, Held};
use crate::evaluation::EvalJob;
use crate::io::{Frames, WeightsSnapshot};

#[derive(Debug)]
pub struct Trainer {
    net: Network,
    params: Vec<f32>,
    optimizer: Box<dyn Optimizer + Send>,
    /// The base learning rate (the schedule's peak), and the schedule if any.
    base_lr: f32,
    schedule: Option<LrSchedule>,
    /// The update's global L2 norm is clipped to this before the optimizer sees it.
    clip: Option<f32>,
    /// Updates applied = version of `params`.
    version: u64,
    test: Arc<Dataset>,
    /// The current weights, encoded once per version and compression and shared by every
    /// outbox: uncompressed eagerly (for `/api/params`), f16 on first use (int8 is `chain`'s).
    frames: [Option<Frames>; 2],
    /// The same weights decoded, as a worker on that compression sees them: what
    /// verification recomputes on. Decoded at most once per version and compression.
    seen: [Option<Arc<[f32]>>; 3],
    /// With frozen layers: the `Weights` frames workers get (trained tensors only), and the
    /// `Frozen` frames (sent once per connection), per compression (int8 last).
    trained_frames: [Option<Frames>; 2],
    frozen_frames: [Option<Frames>; 3],
    /// The weights of workers on int8 (and int4) weights: a chain of deltas, or of keys.
    chain: Chain,
    /// The weights to publish (`/api/params`), when they changed since last taken.
    published: Option<WeightsSnapshot>,
}

impl Trainer {
    pub fn new(
        net: Network,
        seed: u64,
        optimizer: OptimizerKind,
        test: Dataset,
    ) -> Result<Self, ModelError> {
        let params: Vec<f32> = net.init(seed);
        let base_lr = optimizer.lr();
        let optimizer = optimizer.build_masked(params.len(), net.decayed());
        let frame = encode(0, &params, Compression::None);
        let published = Some(WeightsSnapshot {
            round: 0,
            frames: frame.clone(),
        });
        let trainer = Self {
            net,
            params,
            optimizer,
            base_lr,
            schedule: None,
            clip: None,
            version: 0,
            test: Arc::new(test),
            frames: [Some(frame), None],
            seen: [None, None, None],
            trained_frames: [None, None],
            frozen_frames: [None, None, None],
            chain: Chain::new(None),
            published,
        };
        Ok(trainer)
    }

    /// Workers on int8 weights are sent each version as a delta in `encoding` from the one
    /// they hold when they hold the one before (`--weight-deltas`, [`crate::broadcast`]);
    /// `None`: whole.
    #[must_use]
    pub fn deltas(mut self, encoding: Option<Compression>) -> Self {
        self.chain = Chain::new(encoding);
        self
    }

    /// Steps follow `schedule` (from the base learning rate) and clip the update's global
    /// norm at `clip`: both as nanoGPT, on the step the coordinator takes.
    #[must_use]
    pub fn stepping(mut self, schedule: Option<LrSchedule>, clip: Option<f32>) -> Self {
        (self.schedule, self.clip) = (schedule, clip);
        self
    }

    /// The learning rate the next step takes.
    pub fn lr(&self) -> f32 {
        match self.schedule {
            Some(s) => s.lr_at(self.base_lr, self.version),
            None => self.base_lr,
        }
    }

    /// The weights to publish, when they changed since the last call.
    pub fn poll_published(&mut self) -> Option<WeightsSnapshot> {
        self.published.take()
    }

    pub fn net(&self) -> &Network {
        &self.net
    }

    pub fn params(&self) -> &[f32] {
        &self.params
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Steps the optimizer with the combined gradient and publishes the new version. A step
    /// that would make any parameter (or the optimizer's state) non-finite is not taken:
    /// nothing changes and it returns `false`.
    /// `gradient` holds the trained tensors only (all of them without frozen layers).
    pub fn apply(&mut self, gradient: &[f32]) -> bool {
        let mut gradient = if gradient.len() == self.params.len() {
            Cow::Borrowed(gradient)
        } else {
            // Frozen layers get a zero gradient, which leaves them bit-identical under SGD,
            // momentum and Adam (their state for them stays zero; AdamW does not decay them).
            Cow::Owned(self.net.expand(gradient))
        };
        if let Some(max) = self.clip {
            clip_global_norm(gradient.to_mut(), max);
        }
        // The schedule's rate for this step: the one place the optimizer's rate is set.
        self.optimizer.set_lr(self.lr());
        if !self.optimizer.would_stay_finite(&self.params, &gradient) {
            return false;
        }
        self.optimizer.step(&mut self.params, &gradient);
        self.version += 1;
        let frame = encode(self.version, &self.params, Compression::None);
        self.frames = [Some(frame.clone()), None];
        self.seen = [None, None, None];
        self.trained_frames = [None, None];
        self.published = Some(WeightsSnapshot {
            round: self.version,
            frames: frame,
        });
        true
    }

    /// Changes the (base) learning rate from the next step on; a schedule goes on from it.
    pub fn set_lr(&mut self, lr: f32) {
        self.base_lr = lr;
    }

    /// Replaces the parameters (the admin API's `PUT /api/params`) as a new version, keeping
    /// the optimizer's state. Refuses, changing nothing, values of another length or not
    /// finite.
    pub fn replace(&mut self, params: Vec<f32>) -> Result<u64, String> {
        let version = self.version + 1;
        let optimizer = self.optimizer.state();
        self.restore(params, optimizer, version)?;
        Ok(version)
    }

    /// The optimizer's state, for a checkpoint.
    pub fn optimizer_state(&self) -> OptimizerState {
        self.optimizer.state()
    }

    /// Continues from a checkpoint: its parameters, optimizer state and version, published
    /// as the current weights. Refuses, changing nothing, parameters of another length or
    /// not finite, or an optimizer state that does not fit.
    pub fn restore(
        &mut self,
        params: Vec<f32>,
        optimizer: OptimizerState,
        version: u64,
    ) -> Result<(), String> {
        self.set(params, optimizer, version)?;
        // Not the version before plus an update: no worker may take it as a delta.
        self.chain.reset();
        Ok(())
    }

    /// Takes the root's `version` (`--role edge`), as [`Self::restore`]; a version after
    /// this one goes on from it as the root's updates do, so workers holding the one before
    /// may take it as a delta (an older one, a new root's, starts a new chain).
    pub fn adopt(
        &mut self,
        params: Vec<f32>,
        optimizer: OptimizerState,
        version: u64,
    ) -> Result<(), String> {
        let newer = version > self.version;
        self.set(params, optimizer, version)?;
        if !newer {
            self.chain.reset();
        }
        Ok(())
    }

    fn set(
        &mut self,
        params: Vec<f32>,
        optimizer: OptimizerState,
        version: u64,
    ) -> Result<(), String> {
        if params.len() != self.params.len() || params.iter().any(|p| !p.is_finite()) {
            return Err(format!(
                "the parameters must be {} finite values",
                self.params.len()
            ));
        }
        self.optimizer
            .restore(optimizer)
            .map_err(|e| e.to_string())?;
        self.params = params;
        self.version = version;
        let frame = encode(version, &self.params, Compression::None);
        self.frames = [Some(frame.clone()), None];
        self.seen = [None, None, None];
        self.trained_frames = [None, None];
        self.frozen_frames = [None, None, None];
        self.published = Some(WeightsSnapshot {
            round: version,
            frames: frame,
        });
        Ok(())
    }

    /// The L2 norm of the coordinator's own gradient on the first `batch` samples of
    /// `train` at the current weights, over the trained tensors (what workers send): a
    /// trustworthy scale for honest gradients.
    /// With local steps, the norm of the pseudo-gradient of a phase `local` from the
    /// current weights on the first batches of the train split.
    pub fn reference_norm(
        &self,
        train: &Dataset,
        batch: usize,
        local: Option<protocol::LocalPhase>,
    ) -> Result<f64, ModelError> {
        let grads = match local {
            None => {
                let (x, labels) = train.batch(0..batch.min(train.len()));
                let seed = batch_seed(0, 0);
                let (_, grads) = self
                    .net
                    .loss_and_grad(&self.params, x.view(), &labels, seed)?;
                self.net.compact(grads)
            }
            Some(local) => {
                let batches = crate::checks::verify::Batches {
                    shard: 0..train.len(),
                    first: 0,
                    size: batch,
                    parts: 1,
                };
                crate::checks::verify::replay(&self.net, train, &batches, local, &self.params)?
                    .delta
            }
        };
        Ok(crate::checks::clip::norm_and_finite(&grads).0)
    }

    fn has_frozen(&self) -> bool {
        !self.net.frozen().is_empty()
    }

    /// The current weights as `Weights` chunk frames in `compression`'s weights encoding
    /// ([`Compression::for_weights`]; the trained tensors only, if some are frozen), encoded
    /// at most once per version and compression: what a connection holding nothing is sent.
    #[cfg(test)]
    pub fn weights(&mut self, compression: Compression) -> Frames {
        self.weights_for(compression, None).0
    }

    /// The current weights for a connection that holds `holds` (what it was last sent, on
    /// int8 weights): as a delta if it holds the version before ([`crate::broadcast`]), else
    /// whole; and what it holds then.
    pub fn weights_for(
        &mut self,
        compression: Compression,
        holds: Option<Held>,
    ) -> (Frames, Option<Held>) {
        let version = self.version;
        let Some(slot) = frames_slot(compression) else {
            let (net, params) = (&self.net, &self.params);
            let (frames, held) = self
                .chain
                .frames_for(version, || net.trained_part(params), holds);
            return (frames, Some(held));
        };
        let compression = compression.for_weights();
        let (params, net) = (&self.params, &self.net);
        let frames = if self.has_frozen() {
            self.trained_frames[slot]
                .get_or_insert_with(|| encode(version, &net.trained_part(params), compression))
        } else {
            self.frames[slot].get_or_insert_with(|| encode(version, params, compression))
        };
        (frames.clone(), None)
    }

    /// The frozen tensors as `Frozen` chunk frames in `compression`, if the model has any.
    pub fn frozen(&mut self, compression: Compression) -> Option<Frames> {
        if !self.has_frozen() {
            return None;
        }
        let compression = compression.for_weights();
        let (params, net) = (&self.params, &self.net);
        let frame = self.frozen_frames[slot(compression)].get_or_insert_with(|| {
            frames(protocol::encode_frozen(
                &net.frozen_part(params),
                compression,
            ))
        });
        Some(frame.clone())
    }

    /// The current weights exactly as a worker on `compression` decodes them.
    pub fn weights_as_seen(&mut self, compression: Compression) -> Arc<[f32]> {
        let compression = compression.for_weights();
        let slot = slot(compression);
        if let Some(seen) = &self.seen[slot] {
            return Arc::clone(seen);
        }
        // What one tensor payload becomes on the wire (f32 travels exactly).
        let wire = |values: &[f32]| match compression {
            Compression::None => values.to_vec(),
            _ => {
                let mut raw = Vec::new();
                protocol::tensor::encode_payload(&mut raw, values, compression);
                protocol::tensor::decode_payload(&raw, values.len(), compression)
            }
        };
        // On int8 weights, the trained tensors as the chain has them.
        let (net, params, version) = (&self.net, &self.params, self.version);
        let chained = (slot == 2).then(|| self.chain.held(version, || net.trained_part(params)));
        let seen: Arc<[f32]> = if self.has_frozen() {
            // Two payloads: `Weights` (trained) and `Frozen`, each quantized on its own.
            let trained = match chained {
                Some(held) => held.to_vec(),
                None => wire(&self.net.trained_part(&self.params)),
            };
            let frozen = wire(&self.net.frozen_part(&self.params));
            Arc::from(self.net.join(&trained, &frozen))
        } else {
            chained.unwrap_or_else(|| Arc::from(wire(&self.params)))
        };
        self.seen[slot] = Some(Arc::clone(&seen));
        seen
    }

    /// The current weights, copied, to be scored off the coordinator's task.
    pub fn evaluation_job(&self) -> EvalJob {
        let test = Arc::clone(&self.test);
        EvalJob::new(
            self.version,
            self.net.clone(),
            self.params.clone().into(),
            test,
        )
    }

    /// Test-split loss and accuracy of the current weights, here and now.
    pub fn evaluate(&self) -> Option<Evaluation> {
        evaluate(&self.net, &self.params, &self.test)
            .inspect_err(|err| warn!(%err, "evaluation failed"))
            .ok()
    }
}

/// The cache slot of a weights encoding (`int4` never is one: its weights go as `int8`).
fn slot(compression: Compression) -> usize {
    match compression.for_weights() {
        Compression::None => 0,
        Compression::F16 => 1,
        Compression::Int8 | Compression::Int4 | Compression::Int2 => 2,
    }
}

/// The slot of a weights encoding's frames here: `None` for int8's, which are the chain's.
fn frames_slot(compression: Compression) -> Option<usize> {
    Some(slot(compression)).filter(|&slot| slot < 2)
}

fn encode(version: u64, params: &[f32], compression: Compression) -> Frames {
    frames(encode_weights(Round(version), params, compression))
}

fn frames(encoded: Vec<Vec<u8>>) -> Frames {
    encoded.into_iter().map(Bytes::from).collect()
}

#[cfg(test)]
mod tests {
    use protocol::{decode_from_coordinator, CoordinatorToWorker};

    use super::*;

    fn trainer(optimizer: OptimizerKind) -> (Trainer, ()) {
        let test = Dataset::new(4, vec![0, 255, 0, 255, 255, 0, 255, 0], vec![0, 1]).expect("ok");
        let spec = model::NetSpec::mlp(model::Shape::flat(4), &[3], 2);
        let t = Trainer::new(Network::new(spec, 2).expect("model"), 7, optimizer, test);
        (t.expect("model"), ())
    }

    /// The round and values of a `Weights` message's chunk frames, put back together.
    fn decoded(frames: &Frames) -> (u64, Vec<f32>) {
        let mut out = (0, Vec::new());
        for frame in frames.iter() {
            match decode_from_coordinator(frame).expect("frame") {
                CoordinatorToWorker::Weights(w) => {
                    assert_eq!(w.offset as usize, out.1.len(), "chunks in order");
                    out.0 = w.round.0;
                    out.1.extend(w.params);
                }
                other => panic!("not weights: {other:?}"),
            }
        }
        out
    }

    #[test]
    fn apply_steps_the_optimizer_bumps_the_version_and_publishes() {
        let (mut t, ()) = trainer(OptimizerKind::Sgd { lr: 0.5 });
        assert_eq!(t.poll_published().expect("version 0").round, 0);
        let before = t.params().to_vec();
        let gradient: Vec<f32> = (0..before.len()).map(|i| i as f32 * 0.01).collect();
        assert!(t.apply(&gradient));
        assert_eq!(t.version(), 1);
        for ((p, b), g) in t.params().iter().zip(&before).zip(&gradient) {
            assert_eq!(*p, b - 0.5 * g, "SGD: p = p - lr * g, exactly");
        }
        let published = t.poll_published().expect("a new version");
        assert_eq!(decoded(&published.frames), (1, t.params().to_vec()));
        assert_eq!(published.round, 1);
        assert!(t.poll_published().is_none(), "taken once");
    }

    /// On int8 weights with deltas: an update, or an edge adopting the root's next version,
    /// goes on from the version held (a delta, and what is seen is what the delta reaches);
    /// restored weights, or a root's older version, start afresh (the key).
    #[test]
    fn a_version_after_an_update_or_an_adoption_is_a_delta_and_a_restore_is_not() {
        let (t, ()) = trainer(OptimizerKind::Sgd { lr: 0.1 });
        let mut t = t.deltas(Some(Compression::Int4));
        let is_delta = |frames: &Frames| {
            matches!(
                decode_from_coordinator(&frames[0]).expect("a frame"),
                CoordinatorToWorker::WeightsDelta(_)
            )
        };
        let (frames, mut held) = t.weights_for(Compression::Int4, None);
        assert!(!is_delta(&frames));
        let optimizer = t.optimizer_state();
        assert!(t.apply(&vec![1.0; t.params().len()]));
        let (frames, now) = t.weights_for(Compression::Int4, held);
        assert!(is_delta(&frames), "after an update");
        held = now;
        let next: Vec<f32> = t.params().iter().map(|p| p * 0.9).collect();
        t.adopt(next.clone(), optimizer.clone(), 2)
            .expect("adopted");
        let (frames, now) = t.weights_for(Compression::Int4, held);
        assert!(is_delta(&frames), "the root's next version");
        let seen = t.weights_as_seen(Compression::Int4);
        assert!(
            seen.iter().zip(&next).all(|(s, w)| (s - w).abs() < 0.02),
            "{seen:?} {next:?}"
        );
        held = now;
        t.adopt(next.clone(), optimizer.clone(), 1)
            .expect("an older root");
        assert!(!is_delta(&t.weights_for(Compression::Int4, held).0));
        let (_, held) = t.weights_for(Compression::Int4, None);
        t.restore(next, optimizer, 2).expect("restored");
        assert!(!is_delta(&t.weights_for(Compression::Int4, held).0));
    }

    #[test]
    fn weights_are_encoded_once_per_version_and_compression() {
        let (mut t, ()) = trainer(OptimizerKind::Sgd { lr: 0.1 });
        let a = t.weights(Compression::Int8);
        let b = t.weights(Compression::Int8);
        assert_eq!(a.as_ptr(), b.as_ptr(), "shared, not re-encoded");
        assert_eq!(decoded(&t.weights(Compression::None)).1, t.params());
        assert!(t.apply(&vec![1.0; t.params().len()]));
        let c = t.weights(Compression::Int8);
        assert_ne!(a.as_ptr(), c.as_ptr(), "a new version is encoded anew");
        assert_eq!(decoded(&c).0, 1);
        // A worker answering in int4 is sent the int8 frames themselves.
        assert_eq!(t.weights(Compression::Int4).as_ptr(), c.as_ptr());
        assert!(Arc::ptr_eq(
            &t.weights_as_seen(Compression::Int4),
            &t.weights_as_seen(Compression::Int8)
        ));
    }

    #[test]
    fn a_step_that_would_break_the_model_is_not_taken() {
        let (mut t, ()) = trainer(OptimizerKind::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        });
        let before = t.params().to_vec();
        // Finite, but its square overflows Adam's second moment.
        assert!(!t.apply(&vec![3e38; before.len()]));
        assert_eq!((t.params(), t.version()), (before.as_slice(), 0));
        assert_eq!(t.poll_published().expect("version 0").round, 0);
        assert!(t.poll_published().is_none(), "nothing new published");
        // The optimizer's state was not touched either: a normal step still works.
        assert!(t.apply(&vec![0.1; before.len()]));
        assert!(t.params().iter().all(|p| p.is_finite()));
    }

    #[test]
    fn the_reference_norm_is_the_norm_of_a_real_gradient() {
        let (t, ()) = trainer(OptimizerKind::Sgd { lr: 0.1 });
        let test = Dataset::new(4, vec![0, 255, 0, 255, 255, 0, 255, 0], vec![0, 1]).expect("ok");
        let norm = t.reference_norm(&test, 32, None).expect("computes");
        assert!(norm.is_finite() && norm > 0.0, "{norm}");
    }

    #[test]
    fn the_weights_as_a_worker_decodes_them_are_decoded_once_per_version() {
        let (mut t, ()) = trainer(OptimizerKind::Sgd { lr: 0.1 });
        for c in [Compression::None, Compression::F16, Compression::Int8] {
            let seen = t.weights_as_seen(c);
            assert_eq!(&seen[..], decoded(&t.weights(c)).1.as_slice(), "{c:?}");
            assert!(Arc::ptr_eq(&seen, &t.weights_as_seen(c)), "cached");
        }
        let before = t.weights_as_seen(Compression::Int8);
        assert!(t.apply(&vec![1.0; t.params().len()]));
        let after = t.weights_as_seen(Compression::Int8);
        assert!(
            !Arc::ptr_eq(&before, &after),
            "a new version is decoded anew"
        );
        assert_eq!(
            &after[..],
            decoded(&t.weights(Compression::Int8)).1.as_slice()
        );
    }

    #[test]
    fn evaluation_scores_the_test_split() {
        let (t, ()) = trainer(OptimizerKind::Sgd { lr: 0.1 });
        let e = t.evaluate().expect("evaluates");
        assert!(
            (0.0..=1.0).contains(&e.accuracy) && e.loss.is_finite(),
            "{e:?}"
        );
    }
}

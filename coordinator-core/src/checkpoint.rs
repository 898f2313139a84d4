//! Checkpoints, as the coordinator sees them: the consistent copy of everything a restart
//! needs ([`Snapshot`], taken between two inputs), when one is due (every
//! `checkpoint_every` updates), and continuing from one. Writing, reading and the file
//! format are the driver's.

use std::time::Instant;

use tracing::{info, warn};

use crate::io::{Outcome, Output};
pub use crate::snapshot::Snapshot;
use crate::Coordinator;

impl Coordinator {
    /// `--init`: these weights as version 0, before any worker joins (a checkpoint restored
    /// after it replaces them).
    pub fn start_from(&mut self, params: Vec<f32>) -> Result<(), String> {
        let fresh = self.trainer.optimizer_state();
        self.trainer.restore(params, fresh, 0)?;
        self.rebase_norm_bound();
        self.publish();
        Ok(())
    }

    /// The norm bound's warm-up reference, from the weights training now starts from: a
    /// fine-tuned model's gradients can be far smaller than a random one's.
    fn rebase_norm_bound(&mut self) {
        let batch = self.settings.batch_size as usize;
        let local = self
            .local
            .as_ref()
            .map(crate::local::LocalPlan::first_phase);
        match self.trainer.reference_norm(&self.train, batch, local) {
            Ok(reference) => self.bound.set_reference(reference),
            Err(err) => {
                warn!(%err, "the norm bound keeps its reference: no gradient at these weights")
            }
        }
    }

    /// Continues from `snapshot`: parameters, optimizer, version, identities (departed as
    /// of `now`, so their TTL starts again), the next worker id, the deadline and norm-bound
    /// history, the recomputation sampler, bans, counters and the last evaluation. Refuses,
    /// changing nothing, a snapshot whose tensors do not fit.
    pub fn restore(&mut self, snapshot: Snapshot, now: Instant) -> Result<(), String> {
        let Snapshot {
            params,
            optimizer,
            version,
            audit_rng,
            next_worker,
            identities,
            shards: _,
            deadline_latencies,
            norm_history,
            counters,
            bans,
            evaluation,
        } = snapshot;
        self.trainer.restore(params, optimizer, version)?;
        let skipped = self.registry.restore(&identities, next_worker, now);
        if skipped > 0 {
            warn!(
                skipped,
                "malformed identities in the checkpoint were dropped"
            );
        }
        self.schedule.restore_deadlines(&deadline_latencies);
        self.rebase_norm_bound();
        self.bound.restore(&norm_history);
        self.registry.restore_bans(&bans);
        self.checks.audits.restore_rng(audit_rng);
        self.last_eval = evaluation.map(|(_, e)| e);
        self.metrics.restore(counters, evaluation);
        self.checkpointed = Some(version);
        info!(
            version,
            identities = identities.len(),
            "resumed from a checkpoint"
        );
        if self.settings.max_rounds.is_some_and(|max| version >= max) {
            warn!(
                version,
                "the checkpoint is already at --max-rounds: nothing left to train"
            );
            self.stop(Outcome {
                rounds: version,
                evaluation: self.last_eval,
                reached_target: false,
                plateaued: false,
                checkpoint_error: None,
            });
        }
        self.registry.mark_changed();
        self.publish();
        Ok(())
    }

    /// Everything a restart needs, copied now.
    pub fn snapshot(&self) -> Snapshot {
        let (counters, evaluation) = self.metrics.saved();
        Snapshot {
            params: self.trainer.params().to_vec(),
            optimizer: self.trainer.optimizer_state(),
            version: self.trainer.version(),
            audit_rng: self.checks.audits.rng_state(),
            next_worker: self.registry.next_worker(),
            identities: self.registry.saved_identities(),
            shards: self
                .registry
                .assignment()
                .into_iter()
                .map(|(id, range)| (id.0, range.start, range.end))
                .collect(),
            deadline_latencies: self.schedule.deadline_history(),
            norm_history: self.bound.history(),
            counters,
            bans: self.registry.saved_bans(),
            evaluation,
        }
    }

    /// After an update: a copy for the driver to write every `checkpoint_every` versions.
    pub(crate) fn checkpoint_if_due(&mut self) {
        let version = self.trainer.version();
        let Some(every) = self.settings.checkpoint_every else {
            return;
        };
        if !version.is_multiple_of(every.max(1)) || self.checkpointed == Some(version) {
            return;
        }
        self.checkpointed = Some(version);
        self.outputs
            .push_back(Output::Checkpoint(Box::new(self.snapshot())));
    }
}

//! The coordinator's side of checkpoints: what it copies out (between two events, so it is
//! consistent), when (every `--checkpoint-every` updates, and on stopping), and continuing
//! from one. Writing happens on the [`Writer`]'s thread.

use std::time::{Duration, Instant};

use model::Evaluation;
use tracing::{info, warn};

use super::Coordinator;
use crate::checkpoint::{Checkpoint, Fingerprint, Report, RunState, Writer};

#[derive(Debug)]
pub struct Checkpoints {
    writer: Writer,
    every: u64,
    fingerprint: Fingerprint,
    /// The version last handed to the writer.
    taken: Option<u64>,
}

impl Checkpoints {
    pub fn new(writer: Writer, every: u64, fingerprint: Fingerprint) -> Self {
        Self {
            writer,
            every: every.max(1),
            fingerprint,
            taken: None,
        }
    }

    pub fn report(&self) -> std::sync::Arc<Report> {
        self.writer.report()
    }
}

impl Coordinator {
    /// Takes checkpoints with `checkpoints` from now on.
    pub fn with_checkpoints(mut self, checkpoints: Checkpoints) -> Self {
        self.checkpoints = Some(checkpoints);
        self.publish();
        self
    }

    /// Continues from `checkpoint`: parameters, optimizer, version, identities (departed as
    /// of `now`, so their TTL starts again), the next worker id, the deadline and norm-bound
    /// history, the recomputation sampler, counters and the last evaluation. Refuses,
    /// changing nothing, a checkpoint whose tensors do not fit.
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
        let batch = self.config.batch_size as usize;
        match self.trainer.reference_norm(&self.train, batch) {
            Ok(reference) => self.bound.set_reference(reference),
            Err(err) => {
                warn!(%err, "the norm bound keeps its reference: no gradient at these weights")
            }
        }
    }

    pub fn restore(&mut self, checkpoint: Checkpoint, now: Instant) -> Result<(), String> {
        let Checkpoint {
            params,
            optimizer,
            run,
        } = checkpoint;
        self.trainer.restore(params, optimizer, run.version)?;
        let skipped = self.registry.restore(&run.identities, run.next_worker, now);
        if skipped > 0 {
            warn!(
                skipped,
                "malformed identities in the checkpoint were dropped"
            );
        }
        let latencies: Vec<Duration> = run
            .deadline_latencies_ns
            .iter()
            .map(|&ns| Duration::from_nanos(ns))
            .collect();
        self.schedule.restore_deadlines(&latencies);
        self.rebase_norm_bound();
        self.bound.restore(&run.norm_history);
        self.registry.restore_bans(&run.bans);
        self.audits.restore_rng(run.audit_rng);
        let evaluation = run
            .evaluation
            .map(|(version, loss, accuracy)| (version, Evaluation { loss, accuracy }));
        self.last_eval = evaluation.map(|(_, e)| e);
        self.metrics.restore(run.counters, evaluation);
        if let Some(checkpoints) = &mut self.checkpoints {
            checkpoints.taken = Some(run.version);
        }
        info!(
            version = run.version,
            identities = run.identities.len(),
            "resumed from a checkpoint"
        );
        if self.config.max_rounds.is_some_and(|max| run.version >= max) {
            warn!(
                version = run.version,
                "the checkpoint is already at --max-rounds: nothing left to train"
            );
            self.outcome = Some(super::Outcome {
                rounds: run.version,
                evaluation: self.last_eval,
                reached_target: false,
                checkpoint_error: None,
            });
            self.shutdown.cancel();
        }
        self.registry.mark_changed();
        self.publish();
        Ok(())
    }

    /// Everything a restart needs, copied now.
    pub(super) fn snapshot(&self, fingerprint: Fingerprint) -> Checkpoint {
        let (counters, evaluation) = self.metrics.saved();
        let written_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Checkpoint {
            params: self.trainer.params().to_vec(),
            optimizer: self.trainer.optimizer_state(),
            run: RunState {
                version: self.trainer.version(),
                fingerprint,
                written_unix_ms,
                audit_rng: self.audits.rng_state(),
                next_worker: self.registry.next_worker(),
                identities: self.registry.saved_identities(),
                shards: self
                    .registry
                    .assignment()
                    .into_iter()
                    .map(|(id, range)| (id.0, range.start, range.end))
                    .collect(),
                deadline_latencies_ns: self
                    .schedule
                    .deadline_history()
                    .iter()
                    .map(|d| d.as_nanos() as u64)
                    .collect(),
                norm_history: self.bound.history(),
                counters,
                bans: self.registry.saved_bans(),
                evaluation: evaluation.map(|(v, e)| (v, e.loss, e.accuracy)),
            },
        }
    }

    /// After an update: hands a checkpoint to the writer every `--checkpoint-every` versions.
    pub(super) fn checkpoint_if_due(&mut self) {
        let version = self.trainer.version();
        let Some(c) = &self.checkpoints else { return };
        if !version.is_multiple_of(c.every) || c.taken == Some(version) {
            return;
        }
        let checkpoint = self.snapshot(c.fingerprint.clone());
        let c = self.checkpoints.as_mut().expect("checked above");
        if c.writer.submit(checkpoint) {
            c.taken = Some(version);
        } else {
            warn!(
                version,
                "checkpoint skipped: the previous ones are still being written"
            );
        }
    }

    /// The admin API: a checkpoint of the current state, now.
    pub(super) fn checkpoint_now(&mut self) -> Result<String, String> {
        let Some(c) = &self.checkpoints else {
            return Err("checkpoints are off: start the coordinator with --checkpoint-dir".into());
        };
        let version = self.trainer.version();
        let checkpoint = self.snapshot(c.fingerprint.clone());
        let c = self.checkpoints.as_mut().expect("checked above");
        if !c.writer.submit(checkpoint) {
            return Err("the writer is still busy with earlier checkpoints: try again".into());
        }
        c.taken = Some(version);
        Ok(format!(
            "checkpoint of version {version} handed to the writer"
        ))
    }

    /// On stopping: a checkpoint of the current state (unless that version was already
    /// taken), and waits for the writer. Returns why it failed, if it did.
    pub(super) async fn final_checkpoint(&mut self) -> Option<String> {
        let c = self.checkpoints.take()?;
        let version = self.trainer.version();
        let due = c.taken != Some(version);
        let last = due.then(|| self.snapshot(c.fingerprint.clone()));
        let writer = c.writer;
        let report = tokio::task::spawn_blocking(move || writer.finish(last))
            .await
            .unwrap_or_else(|e| {
                std::sync::Arc::new(Report {
                    last_error: Some(format!("the checkpoint writer failed: {e}")),
                    ..Report::default()
                })
            });
        if report.last_error.is_none() && (!due || report.last_version == Some(version)) {
            info!(version, "checkpoints done");
            return None;
        }
        let error = report
            .last_error
            .clone()
            .unwrap_or_else(|| "it was not written".to_string());
        Some(format!(
            "the checkpoint of version {version} on stopping failed: {error}"
        ))
    }
}

//! The driver's side of checkpoints: the core's copies ([`Snapshot`]) go to the [`Writer`]'s
//! thread when due, when the operator asks, and on stopping; the writer's report goes into
//! the status.

use std::sync::Arc;

use coordinator_core::status::CheckpointReport;
use coordinator_core::Snapshot;
use tracing::{info, warn};

use crate::storage::checkpoint::{Checkpoint, Fingerprint, Report, SavedTokenizer, Writer};

#[derive(Debug)]
pub struct Checkpoints {
    writer: Writer,
    fingerprint: Fingerprint,
    /// A language model's tokeniser, kept in every checkpoint.
    tokenizer: Option<SavedTokenizer>,
    /// The version last handed to the writer.
    taken: Option<u64>,
}

impl Checkpoints {
    pub fn new(
        writer: Writer,
        fingerprint: Fingerprint,
        tokenizer: Option<SavedTokenizer>,
    ) -> Self {
        Self {
            writer,
            fingerprint,
            tokenizer,
            taken: None,
        }
    }

    /// The run resumed from the checkpoint of `version`: it is taken already.
    pub fn resumed_at(&mut self, version: u64) {
        self.taken = Some(version);
    }

    pub fn report(&self) -> Arc<CheckpointReport> {
        self.writer.report()
    }

    /// One is due (every `--checkpoint-every` updates).
    pub fn due(&mut self, snapshot: Snapshot) {
        let version = snapshot.version;
        if self.taken == Some(version) {
            return;
        }
        if self.writer.submit(self.on_disk(snapshot)) {
            self.taken = Some(version);
        } else {
            warn!(
                version,
                "checkpoint skipped: the previous ones are still being written"
            );
        }
    }

    /// The operator asks for one now.
    pub fn now(&mut self, snapshot: Snapshot, from: &str) -> Result<String, String> {
        let version = snapshot.version;
        let result = if self.writer.submit(self.on_disk(snapshot)) {
            self.taken = Some(version);
            Ok(format!(
                "checkpoint of version {version} handed to the writer"
            ))
        } else {
            Err("the writer is still busy with earlier checkpoints: try again".into())
        };
        match &result {
            Ok(done) => info!(from, action = "checkpoint", %done, "admin"),
            Err(refused) => warn!(from, action = "checkpoint", %refused, "admin command refused"),
        }
        result
    }

    /// On stopping, or when training finished: a checkpoint of the current state (unless
    /// that version was already taken), and waits for the writer. Returns why it failed, if
    /// it did, and the writer's last report.
    pub async fn finish(self, snapshot: Snapshot) -> (Option<String>, Arc<Report>) {
        let version = snapshot.version;
        let due = self.taken != Some(version);
        let last = due.then(|| self.on_disk(snapshot));
        let writer = self.writer;
        let report = tokio::task::spawn_blocking(move || writer.finish(last))
            .await
            .unwrap_or_else(|e| {
                Arc::new(Report {
                    last_error: Some(format!("the checkpoint writer failed: {e}")),
                    ..Report::default()
                })
            });
        if report.last_error.is_none() && (!due || report.last_version == Some(version)) {
            info!(version, dir = report.dir, "checkpoints done");
            return (None, report);
        }
        let error = report
            .last_error
            .clone()
            .unwrap_or_else(|| "it was not written".to_string());
        let error = format!("the checkpoint of version {version} on stopping failed: {error}");
        (Some(error), report)
    }

    fn on_disk(&self, snapshot: Snapshot) -> Checkpoint {
        Checkpoint::of(snapshot, self.fingerprint.clone(), self.tokenizer.clone())
    }
}

//! Writes checkpoints on a thread of its own, so a round never waits on the disk.
//!
//! The coordinator copies what must be consistent (parameters, optimizer state, run state)
//! between two events and hands it over; encoding, checksums, writing and fsync happen here.
//! At most one checkpoint waits while another is written: one due while both slots are taken
//! is skipped (and counted), so a slow disk costs checkpoints, not memory or rounds.

use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use tracing::{error, info};

use super::{Checkpoint, Store};

/// What the writer has done, as `/api/status` shows it under `checkpoints`.
pub type Report = coordinator_core::status::CheckpointReport;

#[derive(Debug)]
pub struct Writer {
    tx: Option<SyncSender<Checkpoint>>,
    thread: Option<JoinHandle<()>>,
    /// Replaced (not edited in place) on each change, so the status takes it with a refcount
    /// instead of a copy on every event.
    report: Arc<Mutex<Arc<Report>>>,
}

impl Writer {
    pub fn spawn(store: Store) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Checkpoint>(1);
        let report = Arc::new(Mutex::new(Arc::new(Report {
            dir: store.dir().display().to_string(),
            ..Report::default()
        })));
        let thread = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn({
                let report = Arc::clone(&report);
                move || {
                    for checkpoint in rx {
                        write(&store, &checkpoint, &report);
                    }
                }
            })
            .expect("a thread can be started");
        Self {
            tx: Some(tx),
            thread: Some(thread),
            report,
        }
    }

    /// Hands a checkpoint over; `false` (and counted) if the writer is still busy.
    pub fn submit(&self, checkpoint: Checkpoint) -> bool {
        let Some(tx) = &self.tx else { return false };
        match tx.try_send(checkpoint) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                update(&self.report, |r| r.skipped_busy += 1);
                false
            }
        }
    }

    pub fn report(&self) -> Arc<Report> {
        Arc::clone(&lock(&self.report))
    }

    /// Writes `last` (after anything still queued), waits for the thread, and returns the
    /// final report. Blocks: call it off the async runtime.
    pub fn finish(mut self, last: Option<Checkpoint>) -> Arc<Report> {
        if let (Some(tx), Some(last)) = (self.tx.take(), last) {
            // Blocks while one is queued; fails only if the thread died, reported below.
            let _ = tx.send(last);
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                update(&self.report, |r| {
                    r.last_error = Some("the checkpoint writer panicked".into());
                });
            }
        }
        self.report()
    }
}

fn write(store: &Store, checkpoint: &Checkpoint, report: &Mutex<Arc<Report>>) {
    let version = checkpoint.run.version;
    let started = Instant::now();
    let result = store.write(checkpoint);
    let ms = started.elapsed().as_secs_f64() * 1e3;
    update(report, |report| match result {
        Ok(written) => {
            info!(
                version,
                path = %written.path.display(),
                bytes = written.bytes,
                ms = format_args!("{ms:.1}"),
                "checkpoint written"
            );
            report.written += 1;
            report.last_version = Some(version);
            report.last_bytes = written.bytes;
            report.last_write_ms = ms;
            report.last_error = None;
        }
        Err(err) => {
            error!(version, %err, "checkpoint failed; training goes on, the previous checkpoints are untouched");
            report.failed += 1;
            report.last_error = Some(err.to_string());
        }
    });
}

/// Changes the report by replacing it.
fn update(report: &Mutex<Arc<Report>>, change: impl FnOnce(&mut Report)) {
    let mut guard = lock(report);
    let mut next = Report::clone(&guard);
    change(&mut next);
    *guard = Arc::new(next);
}

fn lock(report: &Mutex<Arc<Report>>) -> std::sync::MutexGuard<'_, Arc<Report>> {
    report.lock().unwrap_or_else(PoisonError::into_inner)
}

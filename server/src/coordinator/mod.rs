//! The driver: the one task that owns the [`Coordinator`] (the sans-IO core from
//! `coordinator-core`) and everything around it that does I/O.
//!
//! Sessions send it [`Event`]s over a bounded channel ([`CoordinatorHandle`]); it feeds each
//! to the core with the time, wakes the core at its deadlines, and carries out what the core
//! asks ([`Output`]): frames go to the sessions' bounded outboxes (a full or closed one is
//! told back to the core, which drops that worker), evaluations and recomputations run on
//! blocking threads and come back as events, checkpoint copies go to the [`Writer`](crate::storage::checkpoint::Writer)'s thread, latencies to
//! `/metrics`' histograms, and the status and weights to their watch channels ([`Published`]).
//! No training logic here.

mod checkpoints;
#[cfg(any(test, feature = "fuzzing"))]
pub mod drive;
mod handle;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use coordinator_core::status::CheckpointReport;
use coordinator_core::{EvalJob, Observation, Output, RecomputeJob, Status};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use self::checkpoints::Checkpoints;
pub use self::handle::{CoordinatorHandle, Event, Published, Stopped, EVENT_CHANNEL_CAPACITY};
use crate::edge::exposition::Histograms;
pub use coordinator_core::{
    Command, Coordinator, Frames, Joined, Outbound, Outcome, SessionId, Settings, WeightsSnapshot,
};

/// Messages queued towards one session. A synchronous round sends at most a Shard and a
/// Weights message (plus the odd Error), so a worker with this many messages unread is not
/// keeping up and is dropped rather than let the coordinator block or buffer without bound.
pub const OUTBOX_CAPACITY: usize = 8;

/// The task that runs the core.
#[derive(Debug)]
pub struct Driver {
    core: Coordinator,
    /// Each open session's outbox, by session.
    outboxes: HashMap<SessionId, mpsc::Sender<Outbound>>,
    events_tx: mpsc::Sender<Event>,
    events_rx: mpsc::Receiver<Event>,
    status_tx: watch::Sender<Status>,
    weights_tx: watch::Sender<WeightsSnapshot>,
    histograms: Histograms,
    checkpoints: Option<Checkpoints>,
    /// The writer's report as last published (it changes on the writer's thread).
    report: Option<Arc<CheckpointReport>>,
    /// `--role edge`: the partials for the cluster task to publish to the root.
    partials: Option<mpsc::Sender<coordinator_core::remote::Partial>>,
    shutdown: CancellationToken,
    /// Training's end stops the driver (`--exit-when-finished`); else it keeps the finished
    /// run's status and weights published until shutdown.
    exit_when_finished: bool,
    /// Training finished, and what it left to do is done: the checkpoint of the end written,
    /// and the writer's last report kept in `report`.
    finished: bool,
    /// Why the checkpoint of the end failed, if it did.
    checkpoint_error: Option<String>,
}

impl Driver {
    /// Drives `core`, stopping it when `shutdown` is cancelled (and cancelling `shutdown`
    /// when training is over).
    pub fn new(mut core: Coordinator, shutdown: CancellationToken) -> Self {
        let (events_tx, events_rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        let status = core.poll_status().unwrap_or_else(|| core.status().clone());
        let (status_tx, _) = watch::channel(status);
        let weights = core.poll_weights().expect("the core publishes version 0");
        let (weights_tx, _) = watch::channel(weights);
        Self {
            core,
            outboxes: HashMap::new(),
            events_tx,
            events_rx,
            status_tx,
            weights_tx,
            histograms: Histograms::default(),
            checkpoints: None,
            report: None,
            partials: None,
            shutdown,
            exit_when_finished: true,
            finished: false,
            checkpoint_error: None,
        }
    }

    /// Once training finishes, keeps serving what it published (the status, the weights,
    /// the history) until shutdown, its last checkpoint written at once: an operator without
    /// `--exit-when-finished`.
    pub fn serving_when_finished(mut self) -> Self {
        self.exit_when_finished = false;
        self
    }

    /// `--role edge`: each round's partial goes to `partials` (the cluster task's).
    pub fn with_partials(
        mut self,
        partials: mpsc::Sender<coordinator_core::remote::Partial>,
    ) -> Self {
        self.partials = Some(partials);
        self
    }

    /// Takes checkpoints with `checkpoints` from now on.
    pub fn with_checkpoints(mut self, checkpoints: Checkpoints) -> Self {
        self.checkpoints = Some(checkpoints);
        self.publish();
        self
    }

    /// The core, before the run starts (`--init`, `--resume`).
    pub fn core(&mut self) -> &mut Coordinator {
        &mut self.core
    }

    /// The handle sessions reach the core with.
    pub fn sender(&self) -> CoordinatorHandle {
        CoordinatorHandle {
            tx: self.events_tx.clone(),
        }
    }

    /// What it publishes: the status, the weights, the model.
    pub fn published(&mut self) -> Published {
        self.carry_out();
        Published {
            status: self.status_tx.subscribe(),
            weights: self.weights_tx.subscribe(),
            net: self.core.net().clone(),
            histograms: self.histograms.clone(),
        }
    }

    /// Feeds events and deadlines to the core until shutdown (or until training is done,
    /// which triggers shutdown unless it serves when finished); then the checkpoint on
    /// stopping.
    pub async fn run(mut self) -> Outcome {
        self.carry_out();
        loop {
            if self.core.outcome().is_some() && !self.finished {
                self.finish().await;
            }
            let deadline = self.core.poll_timeout().map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                event = self.events_rx.recv() => match event {
                    Some(event) => self.handle(event, now()),
                    None => break,
                },
                () = sleep_until(deadline) => self.core.handle_timeout(now()),
            }
            self.carry_out();
        }
        let mut outcome = self.core.outcome().cloned().unwrap_or(Outcome {
            rounds: self.core.version(),
            evaluation: self
                .core
                .status()
                .test_accuracy
                .zip(self.core.status().test_loss)
                .map(|(accuracy, loss)| model::Evaluation { loss, accuracy }),
            reached_target: false,
            plateaued: false,
            checkpoint_error: None,
        });
        if let Some(checkpoints) = self.checkpoints.take() {
            self.checkpoint_error = checkpoints.finish(self.core.snapshot()).await.0;
        }
        outcome.checkpoint_error = self.checkpoint_error;
        outcome
    }

    /// Training finished: without `--exit-when-finished`, the checkpoint of the end is
    /// written now (not at Ctrl-C), and the run keeps being served.
    async fn finish(&mut self) {
        self.finished = true;
        if self.exit_when_finished {
            self.shutdown.cancel();
            return;
        }
        let kept = match self.checkpoints.take() {
            Some(checkpoints) => {
                let (error, report) = checkpoints.finish(self.core.snapshot()).await;
                self.checkpoint_error = error;
                let dir = report.dir.clone();
                self.report = Some(report);
                let status = self.core.poll_status();
                self.publish_status(status);
                Some(dir)
            }
            None => None,
        };
        match (kept, &self.checkpoint_error) {
            (Some(dir), None) => info!(
                dir = %dir,
                "training finished; the model is kept: coordinator export --checkpoint-dir {dir} --out model.safetensors. Serving the dashboard until Ctrl-C"
            ),
            (Some(dir), Some(error)) => warn!(
                dir = %dir,
                error = %error,
                "training finished, but its last checkpoint failed; serving the dashboard and /api/params until Ctrl-C"
            ),
            (None, _) => info!(
                "training finished (no checkpoints: --no-checkpoints); serving the dashboard and /api/params until Ctrl-C"
            ),
        }
    }

    /// One event from a session or from off the task, to the core.
    pub fn handle(&mut self, event: Event, now: Instant) {
        match event {
            Event::Join {
                hello,
                outbox,
                peer,
                reply,
            } => {
                let result = self.core.join(&hello, peer, now);
                if let Ok(joined) = &result {
                    self.outboxes.insert(joined.session, outbox);
                }
                let joined = result.as_ref().ok().copied();
                if let (Err(_), Some(joined)) = (reply.send(result), joined) {
                    // The session died while joining.
                    self.outboxes.remove(&joined.session);
                    self.core.leave(joined.worker, joined.session, now);
                }
            }
            Event::Gradient {
                worker,
                session,
                gradient,
                norm,
                slot,
            } => {
                self.core.gradient(worker, session, &gradient, norm, now);
                // Aggregated (or held as a copy, or dropped): its room serves the next one.
                if let Some(slot) = slot {
                    slot.recycle(gradient.grads);
                }
            }
            Event::Commitments {
                worker,
                session,
                commitments,
            } => self.core.commitments(worker, session, commitments, now),
            Event::Reveal {
                worker,
                session,
                chunk,
            } => self.core.revealed(worker, session, chunk, now),
            Event::Leave { worker, session } => {
                self.outboxes.remove(&session);
                self.core.leave(worker, session, now);
            }
            Event::Rejected { refusal, peer } => self.core.rejected(&refusal, peer, now),
            Event::Admin {
                command: Command::Checkpoint,
                from,
                reply,
            } => {
                let answer = match (&mut self.checkpoints, &self.report) {
                    (Some(c), _) => c.now(self.core.snapshot(), &from),
                    (None, Some(kept)) if self.finished => Ok(format!(
                        "training finished: version {} is kept in {}",
                        self.core.version(),
                        kept.dir
                    )),
                    (None, _) => self.core.admin(Command::Checkpoint, &from, now),
                };
                let _ = reply.send(answer);
            }
            // The operator's stop ends the process, whether training had finished or not.
            Event::Admin {
                command: Command::Stop,
                from,
                reply,
            } if self.finished => {
                info!(from = %from, action = "stop", "admin");
                self.shutdown.cancel();
                let _ = reply.send(Ok(format!(
                    "stopping; training had finished at round {}",
                    self.core.version()
                )));
            }
            Event::Admin {
                command,
                from,
                reply,
            } => {
                if matches!(command, Command::Stop) {
                    self.exit_when_finished = true;
                }
                let _ = reply.send(self.core.admin(command, &from, now));
            }
            Event::History { reply } => {
                let _ = reply.send(self.core.history());
            }
            Event::Evaluated(evaluated) => self.core.evaluated(evaluated, now),
            Event::Recomputed(done) => self.core.recomputed(done, now),
            Event::Cluster(view) => self.core.cluster_view(view),
            Event::Adopt { version, params } => {
                if let Err(error) = self.core.adopt(version, params, now) {
                    warn!(version, %error, "the root's version could not be adopted");
                }
            }
        }
    }

    /// Everything the core asked for, in order; then what it publishes.
    fn carry_out(&mut self) {
        while let Some(output) = self.core.poll_output() {
            match output {
                Output::Send {
                    worker,
                    session,
                    message,
                } => self.send(worker, session, message),
                Output::Evaluate(job) => self.evaluate(job),
                Output::Recompute(job) => self.recompute(job),
                Output::Checkpoint(snapshot) => {
                    if let Some(c) = &mut self.checkpoints {
                        c.due(*snapshot);
                    }
                }
                Output::Observe(Observation::Round(seconds)) => {
                    self.histograms.round_seconds.observe(seconds);
                }
                Output::Observe(Observation::GradientLatency(seconds)) => {
                    self.histograms.gradient_latency_seconds.observe(seconds);
                }
                // `run` finishes the run once the core has its outcome.
                Output::Stop(_) => {}
                Output::Partial(partial) => {
                    let round = partial.round;
                    // Never blocks the core: a cluster task that cannot keep up (its link to
                    // NATS is down) loses this round's partial; the root closes without it.
                    if let Some(Err(e)) = self.partials.as_ref().map(|tx| tx.try_send(partial)) {
                        warn!(round, error = %e, "this round's partial could not go to the root");
                    }
                }
            }
        }
        self.publish();
    }

    /// Queues a message to a session. One that is full (not reading) or gone is told back
    /// to the core, which drops its worker; its outbox is closed, so its session ends.
    fn send(&mut self, worker: protocol::WorkerId, session: SessionId, message: Outbound) {
        let Some(outbox) = self.outboxes.get(&session) else {
            return;
        };
        match outbox.try_send(message) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                warn!(%worker, "worker is not reading its frames; dropping it");
                self.outboxes.remove(&session);
                self.core.unreachable(worker, session, now());
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.outboxes.remove(&session);
                self.core.unreachable(worker, session, now());
            }
        }
    }

    /// Scores a version's weights on a blocking thread; the result comes back as an event.
    fn evaluate(&self, job: EvalJob) {
        let events = self.events_tx.clone();
        tokio::task::spawn_blocking(move || {
            // Gone only if the coordinator stopped: nobody is waiting then.
            let _ = events.blocking_send(Event::Evaluated(job.run()));
        });
    }

    /// Recomputes an answer on a blocking thread (the core asks for no more at once than
    /// its `--verify-cores`); the verdict comes back as an event.
    fn recompute(&self, job: RecomputeJob) {
        let events = self.events_tx.clone();
        tokio::task::spawn_blocking(move || {
            // Gone only if the coordinator stopped: nobody is waiting then.
            let _ = events.blocking_send(Event::Recomputed(job.run()));
        });
    }

    /// The weights when they changed, then the status (with the checkpoint writer's report)
    /// when either changed: whoever sees a round in the status finds its weights published.
    fn publish(&mut self) {
        if let Some(weights) = self.core.poll_weights() {
            self.weights_tx.send_replace(weights);
        }
        // The writer's live report while it runs; its last one once training finished.
        let report = match &self.checkpoints {
            Some(checkpoints) => Some(checkpoints.report()),
            None => self.report.clone(),
        };
        let report_changed = match (&report, &self.report) {
            (Some(now), Some(then)) => !Arc::ptr_eq(now, then),
            (now, then) => now.is_some() != then.is_some(),
        };
        let status = self.core.poll_status();
        if status.is_some() || report_changed {
            self.report = report;
            self.publish_status(status);
        }
    }

    /// `status` (or the core's current one) with the checkpoint writer's report.
    fn publish_status(&mut self, status: Option<Status>) {
        let mut status = status.unwrap_or_else(|| self.core.status().clone());
        status.checkpoints.clone_from(&self.report);
        self.status_tx.send_replace(status);
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod evaluation_tests;
#[cfg(test)]
mod honest_tests;
#[cfg(test)]
mod recompute_tests;
#[cfg(test)]
mod sequence_tests;
#[cfg(test)]
mod test_swarm;

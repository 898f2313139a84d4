//! The single owner of the training state.
//!
//! One task owns the [`Trainer`] (parameters, optimizer), the [`Registry`] (workers,
//! identities, shards), the [`Schedule`] (when gradients become an update) and the
//! [`Metrics`], and processes [`Event`]s one at a time from a bounded channel: no locks
//! around training state, and every change happens here, in order.
//!
//! Each event goes to [`Coordinator::handle`] with the time; round deadlines go to
//! [`Coordinator::tick`]. The schedule answers with [`Action`]s, which `execute`
//! carries out (send weights, refuse, apply an update). Then the coordinator settles:
//! removes dropped workers and asks the schedule to close and open rounds, until nothing is
//! left to do, and publishes the status.
//!
//! Files: [`handle`] (events and the sessions' handle); `join`; [`registry`] with
//! [`identities`], [`bans`] and its shards (who is connected, who they are, what they hold,
//! who may not come back); [`tally`] (per-worker counts); [`schedule`] (the trait and its
//! actions) with [`sync`] and [`asynchronous`] (the two schedules); `checks` (what a gradient
//! must pass before a schedule sees it: [`audit`] and [`verify`] for recomputation,
//! [`replicas`] for `--replicate`, [`clip`] for the norm bound); [`trainer`] and `update`
//! (the model, and what applying an update means); [`metrics`] (counters → status) and
//! `publish`; `checkpoints` (the consistent copy a checkpoint takes, and restoring one);
//! `admin` (the operator's commands, which arrive as events like everything else);
//! `traffic` (latency, bytes and activity of each arriving gradient); [`history`].

mod admin;
pub mod asynchronous;
pub mod audit;
pub mod bans;
mod checkpoints;
mod checks;
pub mod clip;
pub mod evaluation;
pub mod handle;
pub mod history;
pub mod identities;
mod join;
pub mod metrics;
mod publish;
pub mod registry;
pub mod replicas;
pub mod schedule;
pub mod sync;
pub mod tally;
mod traffic;
pub mod trainer;
mod update;
pub mod verify;

use std::sync::Arc;
use std::time::Instant;

use model::{Dataset, Evaluation};
use protocol::{encode_from_coordinator, CoordinatorToWorker, Round, Task, WorkerId};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub use self::admin::Command;
use self::audit::Audits;
pub use self::checkpoints::Checkpoints;
use self::clip::NormBound;
pub use self::evaluation::{EvalJob, Evaluated, Evaluations};
pub use self::handle::{
    CoordinatorHandle, Event, Frames, Joined, Outbound, Outcome, Published, SessionId, Stopped,
    WeightsSnapshot, EVENT_CHANNEL_CAPACITY, OUTBOX_CAPACITY,
};
use self::metrics::{Metrics, RunInfo};
use self::registry::Registry;
use self::replicas::Replicas;
use self::schedule::{Action, Schedule, View};
use self::tally::Note;
use self::trainer::Trainer;
use crate::config::Config;
use crate::dataset::Split;
use crate::status::{Status, WorkerStatus};

pub struct Coordinator {
    config: Config,
    trainer: Trainer,
    registry: Registry,
    schedule: Box<dyn Schedule>,
    metrics: Metrics,
    bound: NormBound,
    /// `--verify-fraction`: the pulls whose answers are recomputed, sampled with a seed from
    /// the OS so workers cannot predict it.
    audits: Audits,
    /// `--replicate`: answers held until a partner's agrees.
    replicas: Replicas,
    train: Dataset,
    outcome: Option<Outcome>,
    last_eval: Option<Evaluation>,
    /// Evaluations due, running off this task, and their order.
    evaluations: Evaluations,
    worker_list: Arc<Vec<WorkerStatus>>,
    /// The operator paused training; in async modes, the workers waiting for weights.
    paused: Option<std::collections::BTreeSet<protocol::WorkerId>>,
    /// One point per update, for dashboards opened mid-run.
    history: history::History,
    /// `PUT /api/params` during an open sync round: the weights that replace the model when
    /// it closes.
    pending_params: Option<Vec<crate::tensors_file::Patch>>,
    /// The time of the event (or tick) being handled, for what its actions record.
    now: Instant,
    /// `--checkpoint-dir`: the writer, and when the next checkpoint is due.
    checkpoints: Option<Checkpoints>,
    /// The bans as published, rebuilt when one is added, not per event.
    bans: Arc<Vec<String>>,
    status_tx: watch::Sender<Status>,
    weights_rx: watch::Receiver<WeightsSnapshot>,
    events_tx: mpsc::Sender<Event>,
    events_rx: mpsc::Receiver<Event>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("version", &self.trainer.version())
            .field("workers", &self.registry.len())
            .finish_non_exhaustive()
    }
}

impl Coordinator {
    pub fn new(
        config: Config,
        data: Split,
        shutdown: CancellationToken,
    ) -> Result<Self, model::ModelError> {
        let dataset = data.describe();
        let net = data.network(&config.model)?;
        let model_text = net.spec().to_string();
        let (trainer, weights_rx) = Trainer::new(net, config.seed, config.optimizer, data.test)?;
        let params = trainer.params().len();
        let reference = trainer.reference_norm(&data.train, config.batch_size as usize)?;
        let bound = NormBound::new(config.max_grad_norm, reference);
        let schedule = schedule::for_mode(
            config.mode,
            config.aggregator,
            config.min_workers,
            trainer.net().trainable_count(),
            now(),
        );
        let metrics = Metrics::new(RunInfo {
            mode: config.mode.name(),
            aggregator: config.aggregator.rule.name(),
            model: model_text.into(),
            model_name: config.model.name().into(),
            classes: Arc::new(data.classes.clone()),
            param_count: params,
            optimizer: format!("{:?}", config.optimizer).into(),
            batch_size: config.batch_size,
            dataset: dataset.into(),
        });
        let registry = Registry::new(
            config.join_token.clone(),
            config.max_workers,
            config.ban_after,
        )
        .with_replicate(config.replicate);
        let audits = Audits::new(config.verify_fraction, checks::unpredictable_seed());
        let (events_tx, events_rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        let (status_tx, _) = watch::channel(Status::default());
        let mut coordinator = Self {
            config,
            trainer,
            registry,
            schedule,
            metrics,
            bound,
            audits,
            replicas: Replicas::default(),
            train: data.train,
            outcome: None,
            last_eval: None,
            evaluations: Evaluations::default(),
            worker_list: Arc::default(),
            checkpoints: None,
            now: now(),
            paused: None,
            pending_params: None,
            history: history::History::default(),
            bans: Arc::default(),
            status_tx,
            weights_rx,
            events_tx,
            events_rx,
            shutdown,
        };
        coordinator.publish();
        Ok(coordinator)
    }

    /// The handle sessions reach this coordinator with.
    pub fn sender(&self) -> CoordinatorHandle {
        CoordinatorHandle {
            tx: self.events_tx.clone(),
        }
    }

    /// What it publishes: the status, the weights, the model.
    pub fn published(&self) -> Published {
        Published {
            status: self.status_tx.subscribe(),
            weights: self.weights_rx.clone(),
            net: self.trainer.net().clone(),
            histograms: self.metrics.histograms(),
        }
    }

    /// The status as last published.
    pub fn status(&self) -> Status {
        self.status_tx.borrow().clone()
    }

    /// The next evaluation to run off the coordinator's task, once; its result comes back
    /// as [`Event::Evaluated`].
    pub fn poll_evaluation(&mut self) -> Option<EvalJob> {
        self.evaluations.poll()
    }

    /// Processes events and round deadlines until shutdown (or until training is done,
    /// which triggers shutdown).
    pub async fn run(mut self) -> Outcome {
        loop {
            while let Some(job) = self.poll_evaluation() {
                let events = self.events_tx.clone();
                tokio::task::spawn_blocking(move || {
                    // Gone only if the coordinator stopped: nobody is waiting then.
                    let _ = events.blocking_send(Event::Evaluated(job.run()));
                });
            }
            let deadline = self.schedule.deadline().map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                event = self.events_rx.recv() => match event {
                    Some(event) => self.handle(event, now()),
                    None => break,
                },
                () = sleep_until(deadline) => self.tick(now()),
            }
        }
        let checkpoint_error = self.final_checkpoint().await;
        let mut outcome = self.outcome.unwrap_or(Outcome {
            rounds: self.trainer.version(),
            evaluation: self.last_eval,
            reached_target: false,
            checkpoint_error: None,
        });
        outcome.checkpoint_error = checkpoint_error;
        outcome
    }

    pub fn handle(&mut self, event: Event, now: Instant) {
        self.now = now;
        match event {
            Event::Join {
                hello,
                outbox,
                peer,
                reply,
            } => {
                let result = self.join(&hello, outbox, peer, now);
                let worker = result.as_ref().ok().map(|j| j.worker);
                if let (Err(_), Some(worker)) = (reply.send(result), worker) {
                    // The session died while joining.
                    self.registry.drop_worker(worker);
                }
            }
            Event::Gradient {
                worker,
                session,
                gradient,
                norm,
                slot,
            } => {
                // A replaced session's gradients are ignored: the worker lives on elsewhere.
                if self.registry.is_current(worker, session) {
                    self.arrived(worker, &gradient, now);
                    self.gradient(worker, &gradient, norm, now);
                }
                // Aggregated (or held as a copy, or dropped): its room serves the next one.
                if let Some(slot) = slot {
                    slot.recycle(gradient.grads);
                }
            }
            Event::Leave { worker, session } => {
                if self.registry.is_current(worker, session) {
                    self.registry.drop_worker(worker);
                }
            }
            Event::Rejected { refusal, peer } => self.rejected(&refusal, peer),
            Event::Admin {
                command,
                from,
                reply,
            } => {
                let _ = reply.send(self.admin(command, &from));
            }
            Event::History { reply } => {
                let _ = reply.send(self.history.points());
            }
            Event::Evaluated(evaluated) => self.evaluated(evaluated),
        }
        self.settle(now);
        self.publish();
    }

    /// A round deadline passed.
    pub fn tick(&mut self, now: Instant) {
        self.now = now;
        if self.schedule.deadline().is_some_and(|d| now >= d) {
            // Answers held for a partner go on (recomputed) before the deadline counts.
            self.release_replicas(now);
        }
        let actions = self.schedule.tick(now);
        self.execute(actions);
        self.settle(now);
        self.publish();
    }

    /// When [`Coordinator::tick`] is next due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.schedule.deadline()
    }

    fn view(&self) -> View {
        View {
            version: self.trainer.version(),
            finished: self.outcome.is_some(),
            paused: self.paused.is_some(),
        }
    }

    /// Carries out a schedule's actions, in order.
    fn execute(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Rebalance => self.registry.rebalance(&self.train),
                Action::Weights(id) if self.holding(id) => {}
                Action::Weights(id) => self.send_weights(id),
                Action::Accepted(id) => {
                    self.metrics.accepted();
                    self.registry.note(id, Note::Accepted);
                }
                Action::Refuse(id, refusal) => {
                    debug!(worker = %id, %refusal, "gradient refused");
                    self.metrics.refused(refusal.code);
                    self.registry.note(id, Note::Rejected(refusal.code));
                    self.registry.send_error(id, refusal);
                }
                Action::Apply(update) => self.apply(&update),
                Action::Quorum(..) => self.registry.mark_changed(),
                Action::Extended => self.metrics.extended(),
            }
        }
    }

    /// A pull: the frozen tensors if this connection lacks them, then the `Task` (the batch
    /// the coordinator chose for it) and the current weights, as one message; the audit
    /// sampler decides, unseen, whether the answer is recomputed.
    fn send_weights(&mut self, id: WorkerId) {
        let Some(compression) = self.registry.compression(id) else {
            return;
        };
        if let Some(frozen) = self.trainer.frozen(compression) {
            self.registry.send_frozen_once(id, frozen);
        }
        let version = self.trainer.version();
        let Some(batch) = self.registry.pulled(id, version, self.now) else {
            return;
        };
        let task = encode_from_coordinator(&CoordinatorToWorker::Task(Task {
            round: Round(version),
            batch,
        }));
        let weights = self.trainer.weights(compression);
        self.registry.send(
            id,
            Outbound::Pull {
                task: task.into(),
                weights,
            },
        );
        let trainer = &mut self.trainer;
        let pull = self.registry.pull(id).cloned();
        self.audits.sent(id, compression, pull, || {
            trainer.weights_as_seen(compression)
        });
        self.schedule.sent(id, version);
    }

    /// Removes dropped workers and lets the schedule close and open rounds, until stable.
    fn settle(&mut self, now: Instant) {
        loop {
            let mut left = false;
            while let Some(id) = self.registry.next_dropped() {
                if self.registry.remove(id, now) {
                    self.schedule.left(id);
                    self.audits.left(id);
                    left = true;
                }
            }
            if left && self.replicas.holding() {
                // A partner may be gone: held answers go on (recomputed), not wait.
                self.release_replicas(now);
            }
            let actions = self.schedule.settle(self.view(), now);
            if actions.is_empty() && !self.registry.has_dropped() {
                break;
            }
            self.execute(actions);
        }
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

#[cfg(any(test, feature = "fuzzing"))]
pub mod drive;
#[cfg(test)]
mod honest_tests;
#[cfg(test)]
mod sequence_tests;
#[cfg(test)]
mod test_swarm;
#[cfg(test)]
mod tests;

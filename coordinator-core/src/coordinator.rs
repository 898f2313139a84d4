//! The single owner of the training state, as a state machine with no I/O and no clock.
//!
//! The [`Coordinator`] owns the [`Trainer`] (parameters, optimizer), the [`Registry`]
//! (workers, identities, shards), the [`Schedule`] (when gradients become an update) and the
//! [`Metrics`]. Its driver feeds it inputs with the time (one method each: `join`,
//! `gradient`, `leave`, `admin`, `evaluated`, `handle_timeout`, ...), wakes it at
//! [`Coordinator::poll_timeout`], and carries out what [`Coordinator::poll_output`] gives
//! (frames to send, evaluations and checkpoints to run elsewhere, stop), publishing
//! [`Coordinator::poll_status`] and [`Coordinator::poll_weights`]. Nothing here blocks,
//! spawns or reads a clock, so the same code runs under tokio in the server, in tests event
//! by event, and in the simulator in virtual time.
//!
//! Each input's schedule answers with [`Action`]s, which `execute` carries out (send weights,
//! refuse, apply an update). Then the coordinator settles: removes dropped workers and asks
//! the schedule to close and open rounds, until nothing is left to do, and publishes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use model::{Dataset, Evaluation, Network};
use protocol::{encode_from_coordinator, CoordinatorToWorker, Round, Task, WorkerId};
use tracing::debug;

use crate::checks::audit::Check;
use crate::checks::clip::NormBound;
use crate::checks::Checks;
use crate::data::Data;
use crate::evaluation::Evaluations;
use crate::history::History;
use crate::io::{Outbound, Outcome, Output, WeightsSnapshot};
use crate::local::LocalPlan;
use crate::metrics::{Metrics, RunInfo};
use crate::refusal::Refusal;
use crate::registry::tally::Note;
use crate::registry::Registry;
use crate::remote::Remote;
use crate::schedule::{self, Action, Schedule, View};
use crate::settings::{Mode, Settings};
use crate::status::{Status, WorkerStatus};
use crate::trainer::Trainer;

pub struct Coordinator {
    pub(crate) settings: Settings,
    pub(crate) trainer: Trainer,
    pub(crate) registry: Registry,
    pub(crate) schedule: Box<dyn Schedule>,
    pub(crate) metrics: Metrics,
    pub(crate) bound: NormBound,
    /// Audits, replicas, recomputations and challenges: what an answer passes before the
    /// schedule sees it.
    pub(crate) checks: Checks,
    /// `--worker-momentum`: each worker's momentum, which the aggregator combines.
    pub(crate) momenta: Option<crate::aggregate::Momenta>,
    pub(crate) train: Arc<Dataset>,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) last_eval: Option<Evaluation>,
    /// A language model's vocabulary and prompt: each evaluation also writes a sample.
    pub(crate) writer: Option<crate::language::Writer>,
    /// `--patience`: the best evaluation and its weights, and evaluations since.
    pub(crate) plateau: crate::plateau::Plateau,
    /// Evaluations due, running elsewhere, and their order.
    pub(crate) evaluations: Evaluations,
    pub(crate) worker_list: Arc<Vec<WorkerStatus>>,
    /// The operator paused training; in async modes, the workers waiting for weights.
    pub(crate) paused: Option<std::collections::BTreeSet<WorkerId>>,
    /// One point per update, for dashboards opened mid-run.
    pub(crate) history: History,
    /// `PUT /api/params` during an open sync round: the weights that replace the model when
    /// it closes.
    pub(crate) pending_params: Option<Vec<crate::admin::Patch>>,
    /// The time of the input being handled, for what its actions record.
    pub(crate) now: Instant,
    /// The version last copied for a checkpoint.
    pub(crate) checkpointed: Option<u64>,
    /// The bans as published, rebuilt when one is added, not per event.
    pub(crate) bans: Arc<Vec<String>>,
    /// What the driver has yet to carry out, oldest first.
    pub(crate) outputs: VecDeque<Output>,
    /// The status as last built, and whether the driver has seen it.
    pub(crate) status: Status,
    pub(crate) status_fresh: bool,
    /// `--local-steps`: each worker's next phase.
    pub(crate) local: Option<LocalPlan>,
    /// The workers' mean compute share, as of the worker list.
    pub(crate) utilisation: Option<f64>,
    /// Connected workers on probation, as of the worker list.
    pub(crate) on_probation: usize,
    /// `--role edge`: where the edge stands with the root that applies its updates.
    pub(crate) remote: Option<Remote>,
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
    /// A run of `net` on `data`, starting at `now`: version 0, the weights of `settings.seed`.
    pub fn new(
        settings: Settings,
        net: Network,
        data: Data,
        now: Instant,
    ) -> Result<Self, model::ModelError> {
        let model_text = net.spec().to_string();
        let settings_edge = settings.edge;
        let settings_cores = settings.verify_cores;
        let writer = (data.vocabulary).and_then(|v| crate::language::Writer::new(v, &data.test));
        let trainer = Trainer::new(net, settings.seed, settings.optimizer, data.test)?
            .stepping(settings.lr_schedule, settings.clip_norm)
            .deltas(settings.weight_deltas);
        let params = trainer.params().len();
        // A model with frozen layers is not checked by segments: its phases stay ordered.
        let frozen = !trainer.net().frozen().is_empty();
        let local = settings.local.map(|mut local| {
            if frozen {
                local.segment = 0;
            }
            let plan = LocalPlan::new(local).by_noise(settings.phases_by_noise);
            // A sync round waits for its slowest answer: the others compute until then.
            match settings.mode {
                Mode::Sync { .. } => plan.filling_rounds(),
                Mode::Async { .. } | Mode::Hogwild => plan,
            }
        });
        let reference = trainer.reference_norm(
            &data.train,
            settings.batch_size as usize,
            local.as_ref().map(LocalPlan::first_phase),
        )?;
        let bound = NormBound::new(settings.max_grad_norm, reference);
        let schedule = schedule::for_mode(
            settings.mode,
            settings.aggregator,
            settings.min_workers,
            trainer.net().trainable_count(),
            now,
        );
        let metrics = Metrics::new(RunInfo {
            mode: settings.mode.name(),
            aggregator: settings.aggregator.rule.name(),
            model: model_text.into(),
            model_name: settings.model_name.as_str().into(),
            classes: Arc::new(data.classes),
            param_count: params,
            optimizer: format!("{:?}", settings.optimizer).into(),
            batch_size: settings.batch_size,
            verify_cores: settings.verify_cores.max(1),
            dataset: data.description.into(),
            token_unit: writer.as_ref().map(|w| w.vocabulary.unit()),
        });
        let registry = Registry::new(
            settings.join_token.clone(),
            settings.max_workers,
            settings.ban_after,
        )
        .with_replicate(settings.replicate)
        .with_probation(settings.probation)
        .with_newcomers(
            settings.new_identities_per_address,
            settings.new_identities_per_network,
        );
        let seed = settings
            .audit_seed
            .unwrap_or_else(crate::checks::unpredictable_seed);
        let checks = Checks::new(seed, settings_cores);
        let kind = settings.aggregator;
        let momenta = (kind.momentum > 0.0).then(|| {
            crate::aggregate::Momenta::new(
                kind.momentum,
                trainer.net().trainable_count(),
                kind.memory,
            )
        });
        // An edge adopts the root's versions: only the root may end the run on its best.
        let patience = if settings.edge { 0 } else { settings.patience };
        let plateau = crate::plateau::Plateau::new(patience);
        let mut coordinator = Self {
            settings,
            trainer,
            registry,
            schedule,
            metrics,
            bound,
            checks,
            momenta,
            train: Arc::new(data.train),
            outcome: None,
            last_eval: None,
            writer,
            plateau,
            evaluations: Evaluations::default(),
            worker_list: Arc::default(),
            checkpointed: None,
            now,
            paused: None,
            pending_params: None,
            history: History::default(),
            bans: Arc::default(),
            outputs: VecDeque::new(),
            status: Status::default(),
            status_fresh: false,
            local,
            utilisation: None,
            on_probation: 0,
            remote: settings_edge.then(Remote::default),
        };
        coordinator.publish();
        Ok(coordinator)
    }

    /// The next thing for the driver to do, oldest first.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The status, when it changed since the last call.
    pub fn poll_status(&mut self) -> Option<Status> {
        std::mem::take(&mut self.status_fresh).then(|| self.status.clone())
    }

    /// The status as last built.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// The current weights, when they changed since the last call (a new version, new
    /// weights from the operator, a checkpoint restored).
    pub fn poll_weights(&mut self) -> Option<WeightsSnapshot> {
        self.trainer.poll_published()
    }

    /// The model being trained.
    pub fn net(&self) -> &Network {
        self.trainer.net()
    }

    /// The current parameters (all of them, frozen layers included).
    pub fn params(&self) -> &[f32] {
        self.trainer.params()
    }

    /// Gradients accepted from worker `id` in all its sessions, while its identity is
    /// kept.
    pub fn accepted_from(&self, id: WorkerId) -> u64 {
        self.registry.accepted(id)
    }

    /// Updates applied.
    pub fn version(&self) -> u64 {
        self.trainer.version()
    }

    /// How training ended, once it has.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// The run's history so far (a dashboard connecting).
    pub fn history(&self) -> Vec<crate::history::Point> {
        self.history.points()
    }

    /// When [`Coordinator::handle_timeout`] is next due: a round's deadline, or the time a
    /// challenged phase's states are due by.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let reveal = self.checks.due();
        match (self.schedule.deadline(), reveal) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The time passed [`Coordinator::poll_timeout`]: a round deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.schedule.deadline().is_some_and(|d| now >= d) {
            // Answers held for a partner go on (recomputed) before the deadline counts.
            self.release_replicas(now);
        }
        let actions = self.schedule.tick(now);
        self.execute(actions);
        self.expire_challenges(now);
        self.settle(now);
        self.publish();
    }

    /// Something an input changed: settle, then publish. Every input ends with it.
    pub(crate) fn done(&mut self, now: Instant) {
        self.expire_challenges(now);
        self.settle(now);
        self.publish();
    }

    /// Queues `message` for `worker`'s current session; a worker that is not connected gets
    /// nothing.
    pub(crate) fn send(&mut self, worker: WorkerId, message: Outbound) {
        if let Some(session) = self.registry.session(worker) {
            self.registry.sent_bytes(message.len());
            self.outputs.push_back(Output::Send {
                worker,
                session,
                message,
            });
        }
    }

    /// Training is over: every worker is told (its tab thanks the volunteer and stops
    /// computing, rather than reconnect to a run that has ended), then the driver stops.
    pub(crate) fn stop(&mut self, outcome: Outcome) {
        self.outcome = Some(outcome.clone());
        for id in self.registry.ids() {
            self.send(id, Outbound::Close(finished(&outcome)));
        }
        self.outputs.push_back(Output::Stop(outcome));
    }

    pub(crate) fn view(&self) -> View {
        View {
            version: self.trainer.version(),
            finished: self.outcome.is_some(),
            paused: self.paused.is_some() || self.remote.as_ref().is_some_and(Remote::holds_rounds),
            expected: self.local.as_ref().and_then(LocalPlan::expected),
        }
    }

    /// Carries out a schedule's actions, in order.
    pub(crate) fn execute(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Rebalance => {
                    for (id, shard) in self.registry.rebalance(&self.train) {
                        self.send(id, shard);
                    }
                }
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
                    self.send_error(id, refusal);
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
            if self.registry.frozen_sent(id) {
                self.send(id, Outbound::Frames(frozen));
            }
        }
        let version = self.trainer.version();
        let pass = self
            .registry
            .shard_len(id)
            .div_ceil(self.settings.batch_size as usize);
        let local = self.local.as_mut().map(|plan| plan.phase(id, pass));
        let Some(batch) = self.registry.pulled(id, version, local, self.now) else {
            return;
        };
        let task = encode_from_coordinator(&CoordinatorToWorker::Task(Task {
            round: Round(version),
            batch,
            local,
        }));
        let (weights, held) = self
            .trainer
            .weights_for(compression, self.registry.held(id));
        self.registry.hold(id, held);
        self.send(
            id,
            Outbound::Pull {
                task: task.into(),
                weights,
            },
        );
        let check = self.check_for(id, version);
        let trainer = &mut self.trainer;
        let pull = self.registry.pull(id).cloned();
        self.checks.audits.sent(id, compression, pull, check, || {
            trainer.weights_as_seen(compression)
        });
        self.schedule.sent(id, version);
    }

    /// How `id`'s pull of `version` is checked: on probation, always; past it, sampled at its
    /// rate (`registry/trust.rs`: `max(f, P / n)`, decaying to `--verify-fraction`), but at
    /// `f` alone while the checks are full for a sync round of local phases (`Checks::full`: the
    /// replays already asked for would keep every core busy for the round's time). A
    /// sampled phase that finds its replay far off is held, and its round with it: sixteen
    /// tabs' decaying samples (62 % after a first phase of 16 steps) held their rounds for
    /// queues of replays on one core, and thirty-two were slower than one
    /// (docs/BENCHMARKS.md, "The crowd"). The floor `f` stays whatever the load; what a
    /// busy coordinator gives up is the decay's extra checks (see `trust.rs`).
    fn check_for(&mut self, id: WorkerId, version: u64) -> Check {
        let floor = self.settings.verify_fraction;
        let probation = self.registry.on_probation(id);
        let mut rate = self.registry.check_rate(id, floor);
        if self.is_sync() && !probation && rate > floor {
            let round = self.local.as_ref().and_then(LocalPlan::expected);
            if round.is_some_and(|round| self.checks.full(version, round)) {
                self.metrics.sampling_floored();
                rate = floor;
            }
        }
        Check { rate, probation }
    }

    /// Removes dropped workers and lets the schedule close and open rounds, until stable.
    fn settle(&mut self, now: Instant) {
        loop {
            let mut left = false;
            while let Some(id) = self.registry.next_dropped() {
                if self.registry.remove(id, now) {
                    self.schedule.left(id);
                    self.checks.left(id);
                    if let Some(momenta) = self.momenta.as_mut() {
                        momenta.left(id);
                    }
                    if let Some(plan) = self.local.as_mut() {
                        plan.left(id);
                    }
                    left = true;
                }
            }
            if left && self.checks.holding_replicas() {
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

/// What a worker is told once training is over: at the end, and when it comes afterwards (a
/// finished run goes on serving its dashboard).
pub(crate) fn finished(outcome: &Outcome) -> Refusal {
    let why = if outcome.plateaued {
        "training finished: the model stopped improving"
    } else if outcome.reached_target {
        "training finished: the model reached its target"
    } else {
        "training finished"
    };
    Refusal::new(protocol::ErrorCode::Finished, why)
}

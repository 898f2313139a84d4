//! The single owner of the training state, and the handle sessions use to reach it.
//!
//! One task owns the parameters, the optimizer, the open round and the worker registry, and
//! processes [`Event`]s one at a time from a bounded channel: no locks around training state,
//! and every state change happens in one place, in order. Sessions hold a cheap, cloneable
//! [`CoordinatorHandle`]. Frames go back to each session through its own bounded outbox, so
//! the per-session order (Welcome, Shard, then Weights) is guaranteed; the weights of a round
//! are encoded once into a `Bytes` that every outbox shares.
//!
//! Modes: `sync` runs [`OpenRound`]s with deadlines (the `run` loop sleeps until the open
//! round's deadline and calls [`Coordinator::tick`]); `async` and `hogwild` apply gradients as
//! they arrive and answer each with the current weights. Identities outlive connections: a
//! resume token maps back to its worker id, and each connection is a [`SessionId`] so events
//! from a replaced connection are ignored.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use model::{evaluate, Evaluation, Mlp, Optimizer, SplitMix64};
use protocol::{
    encode_from_coordinator, encode_weights, Compression, CoordinatorToWorker, ErrorCode, Gradient,
    Hello, ModelSpec, Round, Shard, Welcome, WorkerId, WorkerKind,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::aggregate::{Aggregator, AggregatorKind};
use crate::config::{Config, Mode};
use crate::dataset::Split;
use crate::deadline::{DeadlinePolicy, RoundTimeout};
use crate::round::{OpenRound, Progress, RoundError};
use crate::status::{RoundReport, State, Status, WorkerStatus};

/// Events queued towards the coordinator. Gradients are the large ones (4 bytes per
/// parameter), so this bound also bounds the memory held by gradients in flight.
pub const EVENT_CHANNEL_CAPACITY: usize = 64;

/// Frames queued towards one session. A synchronous round sends at most a Shard and a
/// Weights frame (plus the odd Error), so a worker with this many frames unread is not
/// keeping up and is dropped rather than let the coordinator block or buffer without bound.
pub const OUTBOX_CAPACITY: usize = 8;

/// What a session is told to do with its socket.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// Send this binary frame.
    Frame(Bytes),
    /// Send this error frame, then close the session.
    Close(ErrorCode, String),
}

#[derive(Debug)]
pub enum Event {
    Join {
        hello: Hello,
        outbox: mpsc::Sender<Outbound>,
        reply: oneshot::Sender<Result<Joined, (ErrorCode, String)>>,
    },
    Gradient {
        worker: WorkerId,
        session: SessionId,
        gradient: Gradient,
    },
    Leave {
        worker: WorkerId,
        session: SessionId,
    },
}

/// One connection of a worker. A worker resuming its identity gets a new session; events of
/// the old one are ignored from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionId(pub u64);

/// What a session needs to validate its worker's frames.
#[derive(Debug, Clone, Copy)]
pub struct Joined {
    pub worker: WorkerId,
    pub session: SessionId,
    pub param_count: usize,
    pub batch_size: u32,
}

#[derive(Debug, Clone)]
pub struct CoordinatorHandle {
    tx: mpsc::Sender<Event>,
}

/// The coordinator task has stopped (shutdown).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the coordinator has stopped")]
pub struct Stopped;

impl CoordinatorHandle {
    pub async fn join(
        &self,
        hello: Hello,
        outbox: mpsc::Sender<Outbound>,
    ) -> Result<Result<Joined, (ErrorCode, String)>, Stopped> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Event::Join {
                hello,
                outbox,
                reply,
            })
            .await
            .map_err(|_| Stopped)?;
        rx.await.map_err(|_| Stopped)
    }

    pub async fn gradient(&self, joined: &Joined, gradient: Gradient) -> Result<(), Stopped> {
        self.tx
            .send(Event::Gradient {
                worker: joined.worker,
                session: joined.session,
                gradient,
            })
            .await
            .map_err(|_| Stopped)
    }

    pub async fn leave(&self, joined: &Joined) {
        // If the coordinator is gone there is nobody left to tell.
        let _ = self
            .tx
            .send(Event::Leave {
                worker: joined.worker,
                session: joined.session,
            })
            .await;
    }
}

/// The latest weights, for `/api/params`.
#[derive(Debug, Clone)]
pub struct WeightsSnapshot {
    pub round: u64,
    /// An encoded `Weights` frame; the parameters start at `codec::WEIGHTS_DATA_OFFSET`.
    pub frame: Bytes,
}

/// How training ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub rounds: u64,
    pub evaluation: Option<Evaluation>,
    pub reached_target: bool,
}

#[derive(Debug)]
struct Worker {
    kind: WorkerKind,
    outbox: mpsc::Sender<Outbound>,
    session: SessionId,
    /// Negotiated in Hello: how its weights and gradients travel.
    compression: Compression,
    /// Its resume token (the key of its entry in `identities`).
    token: String,
    /// The shard this connection holds (what was last sent on it).
    shard: Option<Range<usize>>,
    gradients: u64,
    /// Sync: deadlines missed in a row; at `miss_limit` the worker leaves the quorum.
    misses: u32,
    /// Sync: counted in rounds' quorum (false once skipped, true again when it answers).
    active: bool,
    /// Sync: holds weights it has not answered yet. A skipped worker in that state is sent
    /// nothing more until it answers: new frames would only pile up behind a frozen tab.
    unanswered: bool,
    /// Async: the version of the weights sent and not yet answered.
    awaiting: Option<u64>,
}

/// What a resume token stands for, kept after the worker leaves.
#[derive(Debug, Clone, Copy)]
struct Identity {
    id: WorkerId,
    gradients: u64,
}

/// Refused-gradient counts since the last round's log line.
#[derive(Debug, Default, Clone, Copy)]
struct RoundCounts {
    late: u64,
    stale: u64,
    duplicate: u64,
}

pub struct Coordinator {
    config: Config,
    mlp: Mlp,
    params: Vec<f32>,
    optimizer: Box<dyn Optimizer + Send>,
    data: Split,
    /// Completed updates = version of `params`.
    version: u64,
    /// Sync: the open round.
    round: Option<OpenRound>,
    deadline: DeadlinePolicy,
    /// Async and hogwild: gradients waiting for the next update.
    buffer: Box<dyn Aggregator>,
    buffer_loss: f64,
    /// Async and hogwild: when the current version was published.
    version_since: Instant,
    /// Frame for the current weights, shared by every outbox (uncompressed).
    weights_frame: Bytes,
    /// The same weights f16- and int8-compressed, encoded on first use each version.
    compressed_frames: [Option<Bytes>; 2],
    workers: BTreeMap<WorkerId, Worker>,
    identities: HashMap<String, Identity>,
    next_worker: u32,
    next_session: u64,
    /// Workers whose outbox failed while sending, or who left; removed in `settle`.
    dropped: Vec<WorkerId>,
    /// Async: shards must be re-cut (a worker joined or left).
    rebalance: bool,
    /// The published worker list is out of date (membership, skips or counts changed at a
    /// round or update). Per-gradient counts alone do not set it: that would make every
    /// event O(workers).
    workers_changed: bool,
    token_rng: SplitMix64,
    counts: RoundCounts,
    status: Status,
    status_tx: watch::Sender<Status>,
    weights_tx: watch::Sender<WeightsSnapshot>,
    shutdown: CancellationToken,
    outcome: Option<Outcome>,
    last_eval: Option<Evaluation>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("version", &self.version)
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

/// The receiving ends of what the coordinator publishes.
#[derive(Debug, Clone)]
pub struct Published {
    pub status: watch::Receiver<Status>,
    pub weights: watch::Receiver<WeightsSnapshot>,
    pub mlp: Mlp,
}

impl Coordinator {
    pub fn new(
        config: Config,
        data: Split,
        shutdown: CancellationToken,
    ) -> Result<(Self, CoordinatorHandle, mpsc::Receiver<Event>, Published), model::ModelError>
    {
        let mlp = Mlp::new(&config.layers)?;
        let params: Vec<f32> = mlp.init(config.seed);
        let optimizer = config.optimizer.build(params.len());
        let weights_frame = Bytes::from(encode_weights(Round(0), &params, Compression::None));
        let timeout = match config.mode {
            Mode::Sync { timeout, .. } => timeout,
            _ => RoundTimeout::Auto,
        };
        let status = Status {
            mode: config.mode.name(),
            model: config.layers.clone(),
            param_count: params.len(),
            optimizer: format!("{:?}", config.optimizer),
            batch_size: config.batch_size,
            ..Status::default()
        };
        let (status_tx, status_rx) = watch::channel(status.clone());
        let (weights_tx, weights_rx) = watch::channel(WeightsSnapshot {
            round: 0,
            frame: weights_frame.clone(),
        });
        let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        let token_seed = config.seed
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        let published = Published {
            status: status_rx,
            weights: weights_rx,
            mlp: mlp.clone(),
        };
        let buffer = AggregatorKind::default().build(params.len());
        let coordinator = Self {
            config,
            mlp,
            params,
            optimizer,
            data,
            version: 0,
            round: None,
            deadline: DeadlinePolicy::new(timeout),
            buffer,
            buffer_loss: 0.0,
            version_since: now(),
            weights_frame,
            compressed_frames: [None, None],
            workers: BTreeMap::new(),
            identities: HashMap::new(),
            next_worker: 1,
            next_session: 1,
            dropped: Vec::new(),
            rebalance: false,
            workers_changed: true,
            token_rng: SplitMix64::new(token_seed),
            counts: RoundCounts::default(),
            status,
            status_tx,
            weights_tx,
            shutdown,
            outcome: None,
            last_eval: None,
        };
        Ok((coordinator, CoordinatorHandle { tx }, rx, published))
    }

    /// Processes events and round deadlines until shutdown (or until training is done,
    /// which triggers shutdown).
    pub async fn run(mut self, mut events: mpsc::Receiver<Event>) -> Outcome {
        loop {
            let deadline = self
                .round
                .as_ref()
                .map(|r| tokio::time::Instant::from_std(r.deadline()));
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                event = events.recv() => match event {
                    Some(event) => self.handle(event, now()),
                    None => break,
                },
                () = sleep_until(deadline) => self.tick(now()),
            }
        }
        self.outcome.unwrap_or(Outcome {
            rounds: self.version,
            evaluation: self.last_eval,
            reached_target: false,
        })
    }

    pub fn handle(&mut self, event: Event, now: Instant) {
        match event {
            Event::Join {
                hello,
                outbox,
                reply,
            } => {
                let result = self.on_join(hello, outbox);
                let worker = result.as_ref().ok().map(|j| j.worker);
                if let (Err(_), Some(worker)) = (reply.send(result), worker) {
                    // The session died while joining.
                    self.dropped.push(worker);
                }
            }
            Event::Gradient {
                worker,
                session,
                gradient,
            } => {
                // A replaced session's gradients are ignored: the worker lives on elsewhere.
                if self
                    .workers
                    .get(&worker)
                    .is_some_and(|w| w.session == session)
                {
                    match self.config.mode {
                        Mode::Sync { .. } => self.on_sync_gradient(worker, gradient, now),
                        Mode::Async { .. } | Mode::Hogwild => {
                            self.on_async_gradient(worker, gradient, now)
                        }
                    }
                }
            }
            Event::Leave { worker, session } => {
                if self
                    .workers
                    .get(&worker)
                    .is_some_and(|w| w.session == session)
                {
                    self.dropped.push(worker);
                }
            }
        }
        self.settle(now);
        self.publish();
    }

    /// A round deadline passed.
    pub fn tick(&mut self, now: Instant) {
        let extension = self.deadline.timeout();
        let Some(round) = self.round.as_mut() else {
            return;
        };
        if round.tick(now, extension) == Progress::Extended {
            // Widen the round to workers that joined after it opened: without them a quorum
            // may be impossible (e.g. a frozen participant and a newcomer waiting outside).
            let newcomers: Vec<WorkerId> = self
                .workers
                .iter()
                .filter(|(id, w)| w.active && !round.is_participant(**id))
                .map(|(id, _)| *id)
                .collect();
            for &id in &newcomers {
                round.admit(id);
            }
            self.status.deadline_extensions += 1;
            info!(
                round = %round.round(),
                answered = round.answered(),
                quorum = self.config.min_workers,
                admitted = newcomers.len(),
                extended_by_ms = extension.as_millis() as u64,
                "deadline passed without quorum; round extended"
            );
            if !newcomers.is_empty() {
                self.rebalance_shards();
                for id in newcomers {
                    self.send_round_weights(id);
                }
            }
        }
        self.settle(now);
        self.publish();
    }

    fn on_join(
        &mut self,
        hello: Hello,
        outbox: mpsc::Sender<Outbound>,
    ) -> Result<Joined, (ErrorCode, String)> {
        if self.outcome.is_some() {
            return Err((ErrorCode::ShuttingDown, "training is finished".into()));
        }
        if let Some(expected) = &self.config.join_token {
            if hello.join_token.as_deref() != Some(expected.as_str()) {
                return Err((
                    ErrorCode::Unauthorized,
                    "missing or wrong join token".into(),
                ));
            }
        }
        let resumed = hello
            .resume_token
            .as_ref()
            .and_then(|token| self.identities.get(token).map(|i| (token.clone(), *i)));
        let is_resume = resumed.is_some();
        if !is_resume && self.workers.len() >= self.config.max_workers {
            return Err((
                ErrorCode::Full,
                format!(
                    "the coordinator accepts at most {} workers",
                    self.config.max_workers
                ),
            ));
        }
        let (resume_token, identity) = match resumed {
            Some((token, identity)) => {
                // Still connected (the old socket has not noticed it is dead): replace it.
                let mut identity = identity;
                if let Some(old) = self.workers.remove(&identity.id) {
                    identity.gradients = old.gradients;
                    let _ = old.outbox.try_send(Outbound::Close(
                        ErrorCode::Replaced,
                        "this worker resumed on another connection".into(),
                    ));
                    if let Some(round) = self.round.as_mut() {
                        round.remove(identity.id);
                    }
                }
                self.status.resumed += 1;
                (token, identity)
            }
            None => {
                let id = WorkerId(self.next_worker);
                self.next_worker += 1;
                let token = format!(
                    "{:016x}{:016x}",
                    self.token_rng.next_u64(),
                    self.token_rng.next_u64()
                );
                let identity = Identity { id, gradients: 0 };
                self.identities.insert(token.clone(), identity);
                (token, identity)
            }
        };
        let id = identity.id;
        let session = SessionId(self.next_session);
        self.next_session += 1;
        let welcome = encode_from_coordinator(&CoordinatorToWorker::Welcome(Welcome {
            worker_id: id,
            resume_token: resume_token.clone(),
            model: ModelSpec {
                layers: self.config.layers.iter().map(|&w| w as u32).collect(),
            },
            batch_size: self.config.batch_size,
            compression: hello.compression,
        }));
        let kind = hello.kind.unwrap_or(WorkerKind::Native);
        self.workers.insert(
            id,
            Worker {
                kind,
                outbox,
                session,
                compression: hello.compression,
                token: resume_token,
                shard: None,
                gradients: identity.gradients,
                misses: 0,
                active: true,
                unanswered: false,
                awaiting: None,
            },
        );
        self.send(id, Outbound::Frame(Bytes::from(welcome)));
        match self.config.mode {
            // Joining mid-round: the current weights at once; it takes part from the next round.
            Mode::Sync { .. } => {
                if self.round.is_some() {
                    let frame = self.weights_for(id);
                    self.send(id, Outbound::Frame(frame));
                }
            }
            // Async: re-cut the shards (the newcomer's first), then its first pull.
            Mode::Async { .. } | Mode::Hogwild => {
                self.rebalance_shards();
                self.send_weights(id);
            }
        }
        self.workers_changed = true;
        info!(worker = %id, ?kind, resumed = is_resume, workers = self.workers.len(), "worker joined");
        Ok(Joined {
            worker: id,
            session,
            param_count: self.params.len(),
            batch_size: self.config.batch_size,
        })
    }

    fn on_sync_gradient(&mut self, worker: WorkerId, gradient: Gradient, now: Instant) {
        let result = match self.round.as_mut() {
            None if gradient.round.0 < self.version => Err(RoundError::Late {
                got: gradient.round,
                current: Round(self.version),
            }),
            None => Err(RoundError::NotOpen {
                got: gradient.round,
                current: Round(self.version),
            }),
            Some(round) => {
                let skipped = self
                    .workers
                    .get(&worker)
                    .is_some_and(|w| !w.active && w.shard.is_some());
                if skipped && gradient.round == round.round() {
                    // A skipped worker answering again rejoins the quorum with this answer.
                    round.admit(worker);
                }
                round.accept(worker, &gradient, now)
            }
        };
        let answered_again = matches!(result, Ok(_) | Err(RoundError::Late { .. }));
        if let (true, Some(w)) = (answered_again, self.workers.get_mut(&worker)) {
            let returned = !w.active;
            w.misses = 0;
            w.active = true;
            w.unanswered = false;
            if returned {
                info!(%worker, "worker answered again; back in the quorum");
                self.workers_changed = true;
            }
        }
        match result {
            Ok(_) => self.count_accepted(worker),
            Err(err) => self.refuse(worker, err.code(), err.to_string()),
        }
    }

    fn on_async_gradient(&mut self, worker: WorkerId, gradient: Gradient, now: Instant) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        // Exactly one pull is outstanding per worker, of a known version: the gradient must
        // be computed on it. An older version answers a pull already answered.
        let pulled = match w.awaiting {
            Some(v) if gradient.round.0 == v => v,
            Some(v) if gradient.round.0 > v => {
                let msg = format!("{worker} was sent version {v}, not {}", gradient.round);
                self.refuse(worker, ErrorCode::RoundNotOpen, msg);
                return;
            }
            _ => {
                let msg = format!("{worker} already answered version {}", gradient.round);
                self.refuse(worker, ErrorCode::Duplicate, msg);
                return;
            }
        };
        w.awaiting = None;
        let staleness = self.version - pulled;
        let weight = match self.config.mode {
            Mode::Async { max_staleness, .. } if staleness > max_staleness => {
                let msg = format!(
                    "computed on version {pulled}, {staleness} versions old (max {max_staleness})"
                );
                self.refuse(worker, ErrorCode::Stale, msg);
                self.send_weights(worker);
                return;
            }
            // Stale within the bound: down-weighted by 1 / (1 + staleness).
            Mode::Async { .. } => gradient.samples as f32 / (1 + staleness) as f32,
            // Hogwild: every gradient at full weight, whatever it was computed on.
            _ => gradient.samples as f32,
        };
        self.buffer.add(&gradient.grads, gradient.samples, weight);
        self.buffer_loss += f64::from(gradient.loss) * f64::from(gradient.samples);
        self.count_accepted(worker);
        let buffer = match self.config.mode {
            Mode::Async { buffer, .. } => buffer,
            _ => 1,
        };
        if self.buffer.contributions() >= buffer {
            let answered = self.buffer.contributions();
            let samples = self.buffer.samples();
            let loss = self.buffer_loss / samples.max(1) as f64;
            self.buffer_loss = 0.0;
            if let Some(update) = self.buffer.take() {
                let duration = now.saturating_duration_since(self.version_since);
                self.version_since = now;
                self.apply(&update, samples, loss, answered, &[], false, duration);
            }
        }
        // Its next pull: the freshest weights.
        self.send_weights(worker);
    }

    fn count_accepted(&mut self, worker: WorkerId) {
        self.status.gradients_accepted += 1;
        if let Some(w) = self.workers.get_mut(&worker) {
            w.gradients += 1;
        }
    }

    /// Drops a gradient with a (non-fatal) error frame, and counts it by reason.
    fn refuse(&mut self, worker: WorkerId, code: ErrorCode, message: String) {
        debug!(%worker, ?code, %message, "gradient refused");
        let (status, round) = (&mut self.status, &mut self.counts);
        match code {
            ErrorCode::Late => (status.late += 1, round.late += 1),
            ErrorCode::Stale => (status.stale_rejected += 1, round.stale += 1),
            ErrorCode::Duplicate => (status.duplicate_rejected += 1, round.duplicate += 1),
            _ => ((), ()),
        };
        self.status.gradients_rejected += 1;
        self.send_error(worker, code, message);
    }

    /// Applies removals, closes a finished round and opens the next one, until stable.
    fn settle(&mut self, now: Instant) {
        loop {
            while let Some(id) = self.dropped.pop() {
                if let Some(w) = self.workers.remove(&id) {
                    self.workers_changed = true;
                    info!(worker = %id, workers = self.workers.len(), "worker left");
                    if let Some(identity) = self.identities.get_mut(&w.token) {
                        identity.gradients = w.gradients;
                    }
                    self.rebalance = true;
                }
                if let Some(round) = self.round.as_mut() {
                    round.remove(id);
                }
            }
            match self.config.mode {
                Mode::Sync { .. } => self.settle_round(now),
                Mode::Async { .. } | Mode::Hogwild => {
                    if std::mem::take(&mut self.rebalance) && self.outcome.is_none() {
                        self.rebalance_shards();
                    }
                }
            }
            if self.dropped.is_empty() {
                break;
            }
        }
    }

    fn settle_round(&mut self, now: Instant) {
        match self.round.as_ref().map(OpenRound::progress) {
            Some(Progress::Complete) => {
                let round = self.round.take().expect("checked above");
                self.close_round(round, now);
            }
            Some(Progress::Abandoned) => {
                let round = self.round.take().expect("checked above");
                info!(round = %round.round(), "every participant left; restarting the round");
            }
            Some(Progress::Waiting | Progress::Extended) | None => {}
        }
        if self.round.is_none()
            && self.outcome.is_none()
            && self.workers.len() >= self.config.min_workers
        {
            self.open_round(now);
        }
    }

    /// Re-cuts the train split over the connected workers (ascending id) and sends each
    /// worker whose shard changed its new one.
    fn rebalance_shards(&mut self) {
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        let shards = model::assign_shards(ids.len(), self.data.train.len());
        for (&id, range) in ids.iter().zip(shards) {
            let worker = self.workers.get_mut(&id).expect("listed above");
            if worker.shard.as_ref() == Some(&range) {
                continue;
            }
            worker.shard = Some(range.clone());
            let (features, pixels, labels) = self.data.train.slice(range.clone()).into_parts();
            let frame = encode_from_coordinator(&CoordinatorToWorker::Shard(Shard {
                first_index: range.start as u32,
                features: features as u32,
                labels,
                pixels,
            }));
            self.send(id, Outbound::Frame(Bytes::from(frame)));
        }
    }

    fn open_round(&mut self, now: Instant) {
        self.rebalance_shards();
        let active = self.workers.values().filter(|w| w.active).count();
        // Too few active workers for a quorum: give the skipped ones another chance.
        let everyone = active < self.config.min_workers;
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        let mut participants = Vec::with_capacity(ids.len());
        for id in ids {
            let w = &self.workers[&id];
            if everyone || w.active {
                participants.push(id);
                self.send_round_weights(id);
            } else if !w.unanswered {
                // Skipped, but not sitting on older weights: it may answer and rejoin.
                self.send_round_weights(id);
            }
        }
        let timeout = self.deadline.timeout();
        self.status.round_timeout_ms = Some(timeout.as_secs_f64() * 1e3);
        debug!(
            round = self.version,
            participants = participants.len(),
            "round opened"
        );
        self.round = Some(OpenRound::new(
            Round(self.version),
            participants,
            AggregatorKind::default().build(self.params.len()),
            now,
            timeout,
            self.config.min_workers,
        ));
    }

    /// Sync: sends the open round's weights to `id`, which now holds unanswered weights.
    fn send_round_weights(&mut self, id: WorkerId) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.unanswered = true;
        }
        let frame = self.weights_for(id);
        self.send(id, Outbound::Frame(frame));
    }

    /// The current weights in the compression `id` negotiated, encoded at most once per
    /// version and compression, and shared.
    fn weights_for(&mut self, id: WorkerId) -> Bytes {
        let compression = self
            .workers
            .get(&id)
            .map_or(Compression::None, |w| w.compression);
        let slot = match compression {
            Compression::None => return self.weights_frame.clone(),
            Compression::F16 => 0,
            Compression::Int8 => 1,
        };
        let (version, params) = (Round(self.version), &self.params);
        self.compressed_frames[slot]
            .get_or_insert_with(|| Bytes::from(encode_weights(version, params, compression)))
            .clone()
    }

    fn close_round(&mut self, round: OpenRound, now: Instant) {
        let closed = round.close(now);
        for &latency in &closed.latencies {
            self.deadline.record(latency);
        }
        let miss_limit = match self.config.mode {
            Mode::Sync { miss_limit, .. } => miss_limit,
            _ => u32::MAX,
        };
        for id in &closed.missed {
            if let Some(w) = self.workers.get_mut(id) {
                w.misses += 1;
                if w.active && w.misses >= miss_limit {
                    w.active = false;
                    info!(worker = %id, misses = w.misses, "worker missed too many deadlines; skipped from the quorum until it answers");
                }
            }
        }
        if closed.deadline_hit {
            self.status.deadline_closes += 1;
        }
        let Some(update) = closed.gradient else {
            return;
        };
        self.apply(
            &update,
            closed.samples,
            closed.mean_loss,
            closed.answered,
            &closed.missed,
            closed.deadline_hit,
            closed.duration,
        );
    }

    /// Steps the optimizer with `update`, publishes the new version, evaluates, logs, and
    /// stops when a stop condition is met. Shared by every mode.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        update: &[f32],
        samples: u64,
        mean_loss: f64,
        answered: usize,
        missed: &[WorkerId],
        deadline_hit: bool,
        duration: std::time::Duration,
    ) {
        self.optimizer.step(&mut self.params, update);
        self.version += 1;
        self.workers_changed = true;
        self.weights_frame = Bytes::from(encode_weights(
            Round(self.version),
            &self.params,
            Compression::None,
        ));
        self.compressed_frames = [None, None];
        self.weights_tx.send_replace(WeightsSnapshot {
            round: self.version,
            frame: self.weights_frame.clone(),
        });
        let counts = std::mem::take(&mut self.counts);
        let round_ms = duration.as_secs_f64() * 1e3;
        let s = &mut self.status;
        s.samples_seen += samples;
        s.answered_total += answered as u64;
        s.train_loss = Some(mean_loss);
        s.last_round_ms = Some(round_ms);
        s.last_round = Some(RoundReport {
            round: self.version - 1,
            answered,
            missed: missed.len(),
            late: counts.late,
            stale_rejected: counts.stale,
            duplicate_rejected: counts.duplicate,
            deadline_hit,
            ms: round_ms,
        });

        let last = self
            .config
            .max_rounds
            .is_some_and(|max| self.version >= max);
        let evaluation = if self.version.is_multiple_of(self.config.eval_interval) || last {
            self.evaluate()
        } else {
            None
        };
        info!(
            round = self.version,
            mode = %self.config.mode.name(),
            answered,
            missed = missed.len(),
            late = counts.late,
            stale = counts.stale,
            dup = counts.duplicate,
            deadline_hit,
            train_loss = format_args!("{mean_loss:.4}"),
            round_ms = format_args!("{round_ms:.1}"),
            test_accuracy = %Metric(evaluation.map(|e| e.accuracy)),
            test_loss = %Metric(evaluation.map(|e| e.loss)),
            "round"
        );
        let reached_target = match (evaluation, self.config.target_accuracy) {
            (Some(e), Some(target)) => e.accuracy >= target,
            _ => false,
        };
        if last || reached_target {
            info!(
                round = self.version,
                reached_target,
                test_accuracy = ?self.last_eval.map(|e| e.accuracy),
                "training finished"
            );
            self.outcome = Some(Outcome {
                rounds: self.version,
                evaluation: self.last_eval,
                reached_target,
            });
            self.shutdown.cancel();
        }
    }

    fn evaluate(&mut self) -> Option<Evaluation> {
        match evaluate(&self.mlp, &self.params, &self.data.test) {
            Ok(e) => {
                self.last_eval = Some(e);
                self.status.test_accuracy = Some(e.accuracy);
                self.status.test_loss = Some(e.loss);
                self.status.evaluated_round = Some(self.version);
                Some(e)
            }
            Err(err) => {
                warn!(%err, "evaluation failed");
                None
            }
        }
    }

    /// Async: sends the current weights to `id` and expects one gradient back.
    fn send_weights(&mut self, id: WorkerId) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.awaiting = Some(self.version);
        }
        let frame = self.weights_for(id);
        self.send(id, Outbound::Frame(frame));
    }

    fn send(&mut self, id: WorkerId, msg: Outbound) {
        let Some(worker) = self.workers.get(&id) else {
            return;
        };
        match worker.outbox.try_send(msg) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                warn!(worker = %id, "worker is not reading its frames; dropping it");
                self.dropped.push(id);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.dropped.push(id),
        }
    }

    fn send_error(&mut self, id: WorkerId, code: ErrorCode, message: String) {
        let frame = encode_from_coordinator(&CoordinatorToWorker::Error { code, message });
        self.send(id, Outbound::Frame(Bytes::from(frame)));
    }

    fn publish(&mut self) {
        let s = &mut self.status;
        s.state = match (&self.outcome, &self.round, self.config.mode) {
            (Some(_), _, _) => State::Done,
            (None, Some(_), _) => State::Training,
            (None, None, Mode::Async { .. } | Mode::Hogwild) if !self.workers.is_empty() => {
                State::Training
            }
            (None, None, _) => State::Waiting,
        };
        s.round = self.version;
        s.workers = self.workers.len();
        s.skipped_workers = self.workers.values().filter(|w| !w.active).count();
        s.round_participants = self
            .round
            .as_ref()
            .map_or(0, |r| r.pending() + r.answered());
        s.round_answered = self.round.as_ref().map_or(0, OpenRound::answered);
        if std::mem::take(&mut self.workers_changed) {
            self.status.worker_list = Arc::new(self.worker_list());
        }
        self.status_tx.send_replace(self.status.clone());
    }

    fn worker_list(&self) -> Vec<WorkerStatus> {
        self.workers
            .iter()
            .map(|(id, w)| WorkerStatus {
                id: id.0,
                kind: match w.kind {
                    WorkerKind::Browser => "browser",
                    WorkerKind::Native => "native",
                },
                gradients: w.gradients,
                shard_len: w.shard.as_ref().map_or(0, Range::len),
                skipped: !w.active,
            })
            .collect()
    }
}

/// A metric for the log line: four decimals, or `-` on rounds without one.
struct Metric(Option<f64>);

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(v) => write!(f, "{v:.4}"),
            None => f.write_str("-"),
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

#[cfg(test)]
mod tests;

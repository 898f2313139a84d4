//! The single owner of the training state, and the handle sessions use to reach it.
//!
//! One task owns the parameters, the optimizer, the open round and the worker registry, and
//! processes [`Event`]s one at a time from a bounded channel: no locks around training state,
//! and every state change happens in one place, in order. Sessions hold a cheap, cloneable
//! [`CoordinatorHandle`]. Frames go back to each session through its own bounded outbox, so
//! the per-session order (Welcome, Shard, then Weights) is guaranteed; the weights of a round
//! are encoded once into a `Bytes` that every outbox shares.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Instant;

use bytes::Bytes;
use model::{evaluate, Evaluation, Mlp, Optimizer, SplitMix64};
use protocol::{
    encode_from_coordinator, encode_weights, CoordinatorToWorker, ErrorCode, Gradient, Hello,
    ModelSpec, Round, Shard, Welcome, WorkerId, WorkerKind,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::dataset::Split;
use crate::round::{OpenRound, Progress};
use crate::status::{State, Status, WorkerStatus};

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
        gradient: Gradient,
    },
    Leave {
        worker: WorkerId,
    },
}

/// What a session needs to validate its worker's frames.
#[derive(Debug, Clone, Copy)]
pub struct Joined {
    pub worker: WorkerId,
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

    pub async fn gradient(&self, worker: WorkerId, gradient: Gradient) -> Result<(), Stopped> {
        self.tx
            .send(Event::Gradient { worker, gradient })
            .await
            .map_err(|_| Stopped)
    }

    pub async fn leave(&self, worker: WorkerId) {
        // If the coordinator is gone there is nobody left to tell.
        let _ = self.tx.send(Event::Leave { worker }).await;
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
    /// The shard this worker holds (what was last sent to it).
    shard: Option<Range<usize>>,
    gradients: u64,
    /// Handed out in `Welcome`; kept for reconnects (resumption is not implemented yet).
    #[allow(dead_code)]
    resume_token: String,
}

pub struct Coordinator {
    config: Config,
    mlp: Mlp,
    params: Vec<f32>,
    optimizer: Box<dyn Optimizer + Send>,
    data: Split,
    /// Completed rounds = version of `params`.
    version: u64,
    round: Option<OpenRound>,
    /// Frame for the current weights, shared by every outbox.
    weights_frame: Bytes,
    workers: BTreeMap<WorkerId, Worker>,
    next_worker: u32,
    /// Workers whose outbox failed while sending; removed in `settle`.
    dropped: Vec<WorkerId>,
    token_rng: SplitMix64,
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
        let weights_frame = Bytes::from(encode_weights(Round(0), &params));
        let status = Status {
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
        let coordinator = Self {
            config,
            mlp,
            params,
            optimizer,
            data,
            version: 0,
            round: None,
            weights_frame,
            workers: BTreeMap::new(),
            next_worker: 1,
            dropped: Vec::new(),
            token_rng: SplitMix64::new(token_seed),
            status,
            status_tx,
            weights_tx,
            shutdown,
            outcome: None,
            last_eval: None,
        };
        Ok((coordinator, CoordinatorHandle { tx }, rx, published))
    }

    /// Processes events until shutdown (or until training is done, which triggers shutdown).
    pub async fn run(mut self, mut events: mpsc::Receiver<Event>) -> Outcome {
        loop {
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                event = events.recv() => match event {
                    Some(event) => self.handle(event, now()),
                    None => break,
                },
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
            Event::Gradient { worker, gradient } => self.on_gradient(worker, gradient),
            Event::Leave { worker } => self.dropped.push(worker),
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
        if self.workers.len() >= self.config.max_workers {
            return Err((
                ErrorCode::Full,
                format!(
                    "the coordinator accepts at most {} workers",
                    self.config.max_workers
                ),
            ));
        }
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        let resume_token = format!(
            "{:016x}{:016x}",
            self.token_rng.next_u64(),
            self.token_rng.next_u64()
        );
        let welcome = encode_from_coordinator(&CoordinatorToWorker::Welcome(Welcome {
            worker_id: id,
            resume_token: resume_token.clone(),
            model: ModelSpec {
                layers: self.config.layers.iter().map(|&w| w as u32).collect(),
            },
            batch_size: self.config.batch_size,
        }));
        let kind = hello.kind.unwrap_or(WorkerKind::Native);
        self.workers.insert(
            id,
            Worker {
                kind,
                outbox,
                shard: None,
                gradients: 0,
                resume_token,
            },
        );
        self.send(id, Outbound::Frame(Bytes::from(welcome)));
        // Joining mid-round: the current weights at once; it takes part from the next round.
        if self.round.is_some() {
            self.send(id, Outbound::Frame(self.weights_frame.clone()));
        }
        info!(worker = %id, ?kind, workers = self.workers.len(), "worker joined");
        Ok(Joined {
            worker: id,
            param_count: self.params.len(),
            batch_size: self.config.batch_size,
        })
    }

    fn on_gradient(&mut self, worker: WorkerId, gradient: Gradient) {
        let Some(round) = self.round.as_mut() else {
            self.status.gradients_rejected += 1;
            let msg = format!("round {} is not open (no round is open)", gradient.round);
            self.send_error(worker, ErrorCode::RoundNotOpen, msg);
            return;
        };
        match round.accept(worker, &gradient) {
            Ok(_) => {
                self.status.gradients_accepted += 1;
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.gradients += 1;
                }
            }
            Err(err) => {
                debug!(%worker, %err, "gradient refused");
                self.status.gradients_rejected += 1;
                self.send_error(worker, err.code(), err.to_string());
            }
        }
    }

    /// Applies removals, closes a finished round and opens the next one, until stable.
    fn settle(&mut self, now: Instant) {
        loop {
            while let Some(id) = self.dropped.pop() {
                if self.workers.remove(&id).is_some() {
                    info!(worker = %id, workers = self.workers.len(), "worker left");
                }
                if let Some(round) = self.round.as_mut() {
                    round.remove(id);
                }
            }
            match self.round.as_ref().map(OpenRound::progress) {
                Some(Progress::Complete) => {
                    let round = self.round.take().expect("checked above");
                    self.close_round(round, now);
                }
                Some(Progress::Abandoned) => {
                    let round = self.round.take().expect("checked above");
                    info!(round = %round.round(), "every participant left; restarting the round");
                }
                Some(Progress::Waiting) | None => {}
            }
            if self.round.is_none()
                && self.outcome.is_none()
                && self.workers.len() >= self.config.min_workers
            {
                self.open_round(now);
            }
            if self.dropped.is_empty() {
                break;
            }
        }
    }

    fn open_round(&mut self, now: Instant) {
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
        for &id in &ids {
            self.send(id, Outbound::Frame(self.weights_frame.clone()));
        }
        debug!(
            round = self.version,
            participants = ids.len(),
            "round opened"
        );
        self.round = Some(OpenRound::new(
            Round(self.version),
            ids,
            self.params.len(),
            now,
        ));
    }

    fn close_round(&mut self, round: OpenRound, now: Instant) {
        let closed = round.close(now);
        let Some(mean) = closed.mean_gradient else {
            return;
        };
        self.optimizer.step(&mut self.params, &mean);
        self.version += 1;
        self.weights_frame = Bytes::from(encode_weights(Round(self.version), &self.params));
        self.weights_tx.send_replace(WeightsSnapshot {
            round: self.version,
            frame: self.weights_frame.clone(),
        });
        self.status.samples_seen += closed.samples;
        self.status.train_loss = Some(closed.mean_loss);
        let round_ms = closed.duration.as_secs_f64() * 1e3;
        self.status.last_round_ms = Some(round_ms);

        let last = self
            .config
            .max_rounds
            .is_some_and(|max| self.version >= max);
        let evaluation = if self.version.is_multiple_of(self.config.eval_interval) || last {
            self.evaluate()
        } else {
            None
        };
        match evaluation {
            Some(e) => info!(
                round = self.version,
                workers = closed.contributors,
                train_loss = format_args!("{:.4}", closed.mean_loss),
                round_ms = format_args!("{round_ms:.1}"),
                test_accuracy = format_args!("{:.4}", e.accuracy),
                test_loss = format_args!("{:.4}", e.loss),
                "round"
            ),
            None => info!(
                round = self.version,
                workers = closed.contributors,
                train_loss = format_args!("{:.4}", closed.mean_loss),
                round_ms = format_args!("{round_ms:.1}"),
                "round"
            ),
        }
        let reached_target = match (evaluation, self.config.target_accuracy) {
            (Some(e), Some(target)) => e.accuracy >= target,
            _ => false,
        };
        if last || reached_target {
            if evaluation.is_none() {
                self.evaluate();
            }
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
        s.state = match (&self.outcome, &self.round) {
            (Some(_), _) => State::Done,
            (None, Some(_)) => State::Training,
            (None, None) => State::Waiting,
        };
        s.round = self.version;
        s.workers = self.workers.len();
        s.round_participants = self
            .round
            .as_ref()
            .map_or(0, |r| r.pending() + r.answered());
        s.round_answered = self.round.as_ref().map_or(0, OpenRound::answered);
        s.worker_list = self
            .workers
            .iter()
            .map(|(id, w)| WorkerStatus {
                id: id.0,
                kind: match w.kind {
                    WorkerKind::Browser => "browser",
                    WorkerKind::Native => "native",
                },
                gradients: w.gradients,
                shard_len: w.shard.as_ref().map_or(0, Range::len),
            })
            .collect();
        self.status_tx.send_replace(s.clone());
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

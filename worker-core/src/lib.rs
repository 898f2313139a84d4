//! The worker's side of training, as a sans-IO state machine.
//!
//! A worker's whole job is: say `Hello` (with its resume token after a reconnect), keep the
//! `Welcome` and `Shard` it is given, and answer every `Weights` with a `Gradient` computed
//! by [`model`] on the batch that [`model::batch_positions`] picks for the batch index of the
//! `Task` sent just before those weights. The coordinator decides every index, so that it can
//! recompute any answer without knowing what a worker kept across reconnects or across the
//! coordinator's own restarts. [`WorkerCore`] does exactly that on
//! decoded frames and returns the frame to send; the transport around it (tokio-tungstenite
//! in the native `worker`, web-sys in the browser) only moves bytes. Both therefore run the
//! very same training code.

use model::{
    batch_positions, batch_seed, Dataset, LocalPhase, ModelError, NetSpec, Network, Normalization,
    OptimizerKind, Shape, Values,
};
use protocol::delta;
use protocol::{
    chunk::ChunkError, decode_from_coordinator, encode_from_worker, encode_gradient, Compression,
    CoordinatorToWorker, DecodeError, ErrorCode, Gradient, Hello, Round, Shard, ShardValues, Task,
    Weights, Welcome, WorkerId, WorkerKind, WorkerToCoordinator,
};
use thiserror::Error;

use held::Held;

mod commit;
mod compute;
mod held;
mod incoming;
mod pending;
mod segment;
mod timing;

use std::sync::Arc;

use commit::{Committing, Revealable};
use incoming::Incoming;
use pending::{Of, Pending};

pub use compute::{Compute, Cores, Job};
pub use segment::Segment;
pub use timing::ComputeClock;

/// Why a worker stopped.
#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("coordinator sent an undecodable frame: {0}")]
    Decode(#[from] DecodeError),
    #[error("coordinator refused this worker ({code:?}): {message}")]
    Rejected { code: ErrorCode, message: String },
    #[error("coordinator broke the protocol: {0}")]
    Protocol(&'static str),
    #[error("coordinator sent a chunk out of place: {0}")]
    Chunk(#[from] ChunkError),
    #[error("model error: {0}")]
    Model(#[from] ModelError),
    #[error("the coordinator's model does not build here: {0}")]
    Spec(#[from] model::SpecError),
    #[error("the model \"{text}\" reads back with fingerprint {ours:#018x}, the coordinator's is {theirs:#018x} (coordinator and worker versions differ)")]
    Fingerprint {
        text: String,
        ours: u64,
        theirs: u64,
    },
}

/// What the worker has done so far, for logs and the volunteer's page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub worker_id: Option<WorkerId>,
    /// The latest round whose weights were received.
    pub round: Option<Round>,
    pub gradients_sent: u64,
    pub samples_computed: u64,
    /// Inner steps of local phases taken (`--local-steps`).
    pub local_steps: u64,
    /// Microseconds spent computing, by the [`ComputeClock`].
    pub compute_us: u64,
    pub last_loss: Option<f32>,
    /// Samples in the current shard.
    pub shard_len: usize,
    /// The latest non-fatal error the coordinator reported.
    pub last_warning: Option<String>,
}

#[derive(Debug)]
struct Joined {
    net: Network,
    batch_size: usize,
    /// Shared with a phase under way, which keeps the shard it started on.
    shard: Option<Arc<Dataset>>,
    /// Where the shard starts in the coordinator's train split (for the dropout seed).
    first_index: usize,
    /// The frozen tensors' values (`Frozen`), when the model has any.
    frozen: Option<Vec<f32>>,
    /// `Weights`, `WeightsDelta` and `Frozen` chunks of the message under way.
    weights_in: Incoming,
    delta_in: Incoming,
    frozen_in: Incoming,
    /// With weights in `int8`: the version held, for a delta to come on.
    held: Held,
    /// What the coordinator confirmed in `Welcome`.
    compression: Compression,
    /// The `Task` for the `Weights` message under way.
    task: Option<Task>,
}

impl Joined {
    fn receiving_weights(&self) -> bool {
        self.weights_in.assembly.in_progress() || self.delta_in.assembly.in_progress()
    }
}

/// A local phase under way: what its answer needs besides the phase itself.
#[derive(Debug)]
struct Phase {
    round: Round,
    /// The batch index of its first step.
    first: u64,
    /// The shard it started on, and where that shard starts: a `Shard` arriving mid-phase
    /// (the coordinator re-cut the shards) is for the next pull, and the coordinator
    /// replays the phase on the shard of its pull.
    shard: Arc<Dataset>,
    first_index: usize,
    phase: LocalPhase,
    samples: u64,
    compute_us: u64,
    /// The parts every step of it is computed in, fixed when it starts: the coordinator
    /// replays every step in as many, so cores lent or taken back mid-phase count from
    /// the next phase. 0: unordered (a GPU's), committed every `segment` steps.
    parts: usize,
    /// An unordered phase's states, hashed and kept every `segment` steps.
    committing: Option<Committing>,
    /// Its inner optimizer (fresh at its start).
    optimizer: OptimizerKind,
}

#[derive(Debug)]
pub struct WorkerCore {
    hello: Hello,
    joined: Option<Joined>,
    resume_token: Option<String>,
    stats: Stats,
    clock: ComputeClock,
    /// The local phase under way, if any: [`WorkerCore::work`] takes its steps.
    phase: Option<Phase>,
    compute: Compute,
    /// This process's threads, for [`Compute::Threads`].
    cores: Cores,
    pending: Option<Pending>,
    /// The last committed phase's states, kept for the coordinator's `Challenge`.
    revealable: Option<Revealable>,
    /// The commitments of a phase that just finished, sent before its answer.
    commitments: Option<protocol::Commitments>,
}

impl WorkerCore {
    pub fn new(kind: WorkerKind, join_token: Option<String>) -> Self {
        Self {
            hello: Hello {
                kind: Some(kind),
                join_token,
                resume_token: None,
                compression: Compression::None,
                // Only a wasm build with relaxed SIMD, on a CPU whose multiply-add fuses: what
                // this worker's products compute, for the coordinator to replay.
                fused: model::gemm::relaxed_fuses(),
            },
            joined: None,
            resume_token: None,
            stats: Stats::default(),
            clock: ComputeClock::default(),
            phase: None,
            compute: Compute::default(),
            cores: Cores::default(),
            pending: None,
            revealable: None,
            commitments: None,
        }
    }

    /// Where and in how many parts this worker computes (one thread by default).
    pub fn with_compute(mut self, compute: Compute) -> Self {
        self.set_compute(compute);
        self
    }

    /// Changes it from the next batch on (a volunteer who lends more or fewer cores; a
    /// local phase under way keeps its parts).
    pub fn set_compute(&mut self, compute: Compute) {
        if compute != self.compute {
            self.cores = match compute {
                Compute::Threads(k) => Cores::new(k),
                Compute::Deferred(_) | Compute::Unordered => Cores::default(),
            };
        }
        self.compute = compute;
    }

    /// How the time spent computing is measured (reported with each answer: it sizes this
    /// worker's local phases under `--local-steps auto`, and its compute share).
    pub fn with_clock(mut self, clock: ComputeClock) -> Self {
        self.clock = clock;
        self
    }

    /// A local phase is under way: call [`WorkerCore::work`] until it answers. Between two
    /// calls the transport may read frames, pause, or yield to its page.
    pub fn working(&self) -> bool {
        self.phase.is_some() || self.pending.is_some()
    }

    /// Takes one inner step of the local phase under way; once its last step is done,
    /// returns the pseudo-gradient's frames. Nothing when no phase is under way, or while
    /// a step is left to the transport ([`WorkerCore::job`]).
    pub fn work(&mut self) -> Result<Vec<Vec<u8>>, WorkerError> {
        if self.pending.is_some() {
            return Ok(Vec::new());
        }
        let (Some(joined), Some(phase)) = (self.joined.as_ref(), self.phase.as_ref()) else {
            return Ok(Vec::new());
        };
        let shard = &phase.shard;
        let batch = phase.first + u64::from(phase.phase.taken());
        let (x, labels) = shard.batch(batch_positions(shard.len(), batch, joined.batch_size));
        let pending = Pending {
            x,
            labels,
            seed: batch_seed(batch, phase.first_index),
            parts: phase.parts,
            started: self.clock.start(),
            of: Of::Step,
        };
        let answer = self.start(pending)?;
        Ok(self.frames(answer))
    }

    /// An answer's frames: a committed phase's `Commitments` first, then its chunks.
    pub(crate) fn frames(&mut self, answer: Option<Gradient>) -> Vec<Vec<u8>> {
        let Some(gradient) = answer else {
            return Vec::new();
        };
        let compression = self
            .joined
            .as_ref()
            .map_or(Compression::None, |j| j.compression);
        let mut frames = Vec::new();
        if let Some(c) = self
            .commitments
            .take()
            .filter(|c| c.round == gradient.round)
        {
            frames.push(encode_from_worker(&WorkerToCoordinator::Commitments(c)));
        }
        frames.extend(encode_gradient(&gradient, compression));
        frames
    }

    /// Asks the coordinator to send and accept tensors with this compression.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.hello.compression = compression;
        self
    }

    /// Starts with a resume token from an earlier session (e.g. kept across a page reload).
    pub fn with_resume_token(mut self, token: Option<String>) -> Self {
        self.resume_token = token.filter(|t| !t.is_empty());
        self
    }

    /// The token to resume this worker's identity with, once welcomed.
    pub fn resume_token(&self) -> Option<&str> {
        self.resume_token.as_deref()
    }

    /// The first frame to send on a (re)connection. After a `Welcome` it carries the resume
    /// token, so a reconnect asks for the same identity.
    pub fn hello_frame(&self) -> Vec<u8> {
        let mut hello = self.hello.clone();
        hello.resume_token.clone_from(&self.resume_token);
        encode_from_worker(&WorkerToCoordinator::Hello(hello))
    }

    /// Some chunks of a `Weights` (or `WeightsDelta`) message are in and more are coming.
    pub fn receiving_weights(&self) -> bool {
        self.joined.as_ref().is_some_and(Joined::receiving_weights)
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Handles one binary frame from the coordinator; returns the frames to answer with (a
    /// gradient's chunks, once the last chunk of a `Weights` message is in), or none.
    pub fn handle_frame(&mut self, frame: &[u8]) -> Result<Vec<Vec<u8>>, WorkerError> {
        let msg = decode_from_coordinator(frame)?;
        if let CoordinatorToWorker::Challenge(challenge) = &msg {
            return Ok(self.reveal(challenge));
        }
        let reply = self.handle(msg)?;
        Ok(self.frames(reply))
    }

    /// Handles one decoded message (a `Weights` or `Frozen` message may be one chunk of
    /// many, or whole); returns the gradient to send, if any.
    pub fn handle(&mut self, msg: CoordinatorToWorker) -> Result<Option<Gradient>, WorkerError> {
        match msg {
            CoordinatorToWorker::Welcome(welcome) => {
                self.phase = None;
                self.pending = None;
                self.on_welcome(welcome).map(|()| None)
            }
            CoordinatorToWorker::Shard(shard) => self.on_shard(shard).map(|()| None),
            CoordinatorToWorker::Task(task) => self.on_task(task).map(|()| None),
            CoordinatorToWorker::Weights(chunk) => self.on_weights_chunk(chunk, false),
            CoordinatorToWorker::WeightsDelta(chunk) => self.on_weights_chunk(chunk, true),
            CoordinatorToWorker::Frozen {
                total,
                offset,
                params,
            } => self.on_frozen_chunk(total, offset, params).map(|()| None),
            // Answered by `handle_frame` (`WorkerCore::reveal`): it is frames, not a gradient.
            CoordinatorToWorker::Challenge(_) => Ok(None),
            CoordinatorToWorker::Error { code, message } if code.is_fatal() => {
                Err(WorkerError::Rejected { code, message })
            }
            CoordinatorToWorker::Error { code, message } => {
                self.stats.last_warning = Some(format!("{code:?}: {message}"));
                Ok(None)
            }
        }
    }

    fn on_welcome(&mut self, welcome: Welcome) -> Result<(), WorkerError> {
        let spec: NetSpec = welcome.model.text.parse()?;
        if spec.fingerprint() != welcome.model.fingerprint {
            return Err(WorkerError::Fingerprint {
                text: welcome.model.text,
                ours: spec.fingerprint(),
                theirs: welcome.model.fingerprint,
            });
        }
        let classes = spec.outputs()?;
        let net = Network::new(spec, classes)?;
        if welcome.batch_size == 0 {
            return Err(WorkerError::Protocol("Welcome with a batch size of 0"));
        }
        self.joined = Some(Joined {
            net,
            batch_size: welcome.batch_size as usize,
            shard: None,
            first_index: 0,
            frozen: None,
            weights_in: Incoming::default(),
            delta_in: Incoming::default(),
            frozen_in: Incoming::default(),
            held: Held::default(),
            compression: welcome.compression,
            task: None,
        });
        self.resume_token = Some(welcome.resume_token);
        self.stats.worker_id = Some(welcome.worker_id);
        self.stats.shard_len = 0;
        Ok(())
    }

    fn on_shard(&mut self, shard: Shard) -> Result<(), WorkerError> {
        let joined = self
            .joined
            .as_mut()
            .ok_or(WorkerError::Protocol("Shard before Welcome"))?;
        let [c, h, w] = shard.shape.map(|d| d as usize);
        let shape = Shape::new(c, h, w);
        if shape != joined.net.spec().input() {
            return Err(WorkerError::Protocol(
                "Shard's sample shape is not the model's input",
            ));
        }
        let values = match shard.values {
            ShardValues::U8(v) => Values::U8(v),
            ShardValues::F32(v) => Values::F32(v),
        };
        let norm = Normalization::new(shard.mean, shard.std);
        let data = Dataset::from_parts(shape, values, shard.labels, norm)?;
        self.stats.shard_len = data.len();
        joined.shard = Some(Arc::new(data));
        joined.first_index = shard.first_index as usize;
        Ok(())
    }

    fn on_task(&mut self, task: Task) -> Result<(), WorkerError> {
        let joined = self
            .joined
            .as_mut()
            .ok_or(WorkerError::Protocol("Task before Welcome"))?;
        if joined.receiving_weights() {
            return Err(WorkerError::Protocol(
                "Task in the middle of a Weights message",
            ));
        }
        joined.task = Some(task);
        Ok(())
    }

    fn on_frozen_chunk(
        &mut self,
        total: u32,
        offset: u32,
        params: Vec<f32>,
    ) -> Result<(), WorkerError> {
        let joined = self
            .joined
            .as_mut()
            .ok_or(WorkerError::Protocol("Frozen before Welcome"))?;
        let expected = joined.net.param_count() - joined.net.trainable_count();
        let pos = (total, offset);
        if let Some(frozen) = joined.frozen_in.take(Round(0), pos, params, expected)? {
            joined.frozen = Some(frozen);
        }
        Ok(())
    }

    /// A chunk of `Weights`, or of `WeightsDelta` (`delta`): the weights once the last is in
    /// (a delta applied to the version held).
    fn on_weights_chunk(
        &mut self,
        chunk: Weights,
        delta: bool,
    ) -> Result<Option<Gradient>, WorkerError> {
        let joined = self
            .joined
            .as_mut()
            .ok_or(WorkerError::Protocol("Weights before Welcome"))?;
        let (incoming, other) = if delta {
            (&mut joined.delta_in, &joined.weights_in)
        } else {
            (&mut joined.weights_in, &joined.delta_in)
        };
        if other.assembly.in_progress() {
            return Err(WorkerError::Protocol(
                "a Weights chunk in the middle of a WeightsDelta message, or the other way",
            ));
        }
        let expected = joined.net.trainable_count();
        let pos = (chunk.total, chunk.offset);
        let Some(params) = incoming.take(chunk.round, pos, chunk.params, expected)? else {
            return Ok(None);
        };
        let params = if delta {
            if joined.compression.for_weights() != delta::HELD_ENCODING {
                return Err(WorkerError::Protocol(
                    "WeightsDelta to a worker whose weights do not go in int8",
                ));
            }
            joined.held.advance(chunk.round, &params)?
        } else {
            if joined.compression.for_weights() == delta::HELD_ENCODING {
                joined.held.keep(chunk.round, &params);
            }
            params
        };
        self.on_weights(Weights::whole(chunk.round, params))
    }

    fn on_weights(&mut self, mut weights: Weights) -> Result<Option<Gradient>, WorkerError> {
        let joined = self
            .joined
            .as_mut()
            .ok_or(WorkerError::Protocol("Weights before Welcome"))?;
        let task = joined
            .task
            .take()
            .filter(|t| t.round == weights.round)
            .ok_or(WorkerError::Protocol(
                "Weights without the Task for their round",
            ))?;
        let joined = &*joined;
        self.stats.round = Some(weights.round);
        // With frozen layers, `Weights` carry the trained tensors and `Frozen` the rest.
        let net = &joined.net;
        if !net.frozen().is_empty() && weights.params.len() == net.trainable_count() {
            let frozen = joined.frozen.as_ref().ok_or(WorkerError::Protocol(
                "Weights without the frozen tensors before them",
            ))?;
            weights.params = net.join(&weights.params, frozen);
        }
        // Without a shard this worker is not a participant yet (it joined mid-round).
        let Some(shard) = joined.shard.as_ref().filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        if let Some(local) = task.local {
            // A GPU takes a phase in its own order only if the coordinator checks it by
            // segments; else in one ordered part, replayed whole.
            let committed = self.compute == Compute::Unordered && local.segment > 0;
            let optimizer = local.optimizer;
            // A phase replaces one under way (the coordinator moved on: its answer would be
            // refused as late anyway).
            self.phase = Some(Phase {
                round: weights.round,
                first: task.batch,
                shard: Arc::clone(shard),
                first_index: joined.first_index,
                phase: LocalPhase::new(net, &weights.params, optimizer, local.steps),
                optimizer,
                samples: 0,
                compute_us: 0,
                parts: if committed {
                    0
                } else {
                    self.compute.parts().max(1)
                },
                committing: committed.then(|| Committing::new(local.segment)),
            });
            // A step of the replaced phase left to the transport is dropped with it.
            self.pending = None;
            return Ok(None);
        }
        let batch = task.batch;
        let (x, labels) = shard.batch(batch_positions(shard.len(), batch, joined.batch_size));
        let pending = Pending {
            x,
            labels,
            seed: batch_seed(batch, joined.first_index),
            parts: self.compute.parts(),
            started: self.clock.start(),
            of: Of::Answer {
                round: weights.round,
                weights: weights.params,
            },
        };
        self.start(pending)
    }
}

#[cfg(test)]
mod tests;

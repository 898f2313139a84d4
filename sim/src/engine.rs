//! The event loop: one queue of timed events, the real coordinator core fed at their times,
//! the real worker cores fed the frames that reach them.
//!
//! A frame the coordinator sends goes down its worker's link ([`Pipe`]) and reaches the
//! worker's inbox when it arrives. A worker reads its inbox in order; when a `Weights`
//! message is whole its core computes the gradient (really, with the model's code), and the
//! gradient's chunks leave `step` of virtual time later, up the link, into the coordinator's
//! session checks ([`Upload`]) and the core. A worker computing reads nothing else meanwhile,
//! as the native worker does. Evaluations run when the core asks and come back
//! `evaluation_time` later. Every input reaches the core at its event's virtual time.
//!
//! Not modelled: WebSocket pings and the liveness timeout (a frozen worker stays connected
//! until its churn says otherwise), the upload slots, the per-address limits and the
//! outboxes' bound.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use coordinator_core::upload::{Progress, Upload};
use coordinator_core::{Coordinator, Evaluated, Joined, Outbound, Output, Recomputed, Refusal};
use model::SplitMix64;
use protocol::{
    decode_from_coordinator, decode_from_worker, decode_worker_frame, encode_from_coordinator,
    encode_gradient, CoordinatorToWorker, Gradient, WorkerFrame, WorkerId, WorkerKind,
    WorkerToCoordinator,
};
use worker_core::{ComputeClock, WorkerCore};

use crate::link::{on_the_wire, Pipe};
use crate::report::{Point, Report, WorkerReport};
use crate::scenario::{Behaviour, Churn, Scenario, Until};

/// How long a worker refused for too many new identities waits before it tries again.
const RETRY_AFTER_REFUSAL: Duration = Duration::from_secs(60);

/// How far `Behaviour::WrongBatch` moves the batch its `Task` names: the next one (a shift
/// by a multiple of the shard's batches would land on the same samples).
const BATCH_SHIFT: u64 = 1;

/// Runs `scenario` to its end and says what it measured. Deterministic: the same scenario
/// (seed included) gives the same report.
pub fn run(scenario: Scenario) -> Report {
    Engine::new(scenario).run().0
}

/// [`run`], and the real time the coordinator core spent on the workers' inputs (joins,
/// answers with their checks and recomputations, leaves): what the run cost the
/// coordinator's CPU, as far as a wall clock on an otherwise idle thread can tell. Not
/// deterministic, so not in the [`Report`].
pub fn run_measured(scenario: Scenario) -> (Report, Duration) {
    Engine::new(scenario).run()
}

#[derive(Debug)]
enum Ev {
    /// A worker opens a connection: its `Hello` goes up.
    Connect(usize),
    /// Its `Hello` reaches the coordinator.
    Hello {
        w: usize,
        epoch: u64,
    },
    ToWorker {
        w: usize,
        epoch: u64,
        delivery: Delivery,
    },
    /// A worker's gradient is computed: its chunks go up.
    Computed {
        w: usize,
        epoch: u64,
        frames: Vec<Vec<u8>>,
    },
    ToCoordinator {
        w: usize,
        epoch: u64,
        frame: Vec<u8>,
    },
    Timeout,
    Churn(usize, Churn),
    Thaw(usize),
    Evaluated(Evaluated),
    /// A recomputation came back, `recompute_step` a step after it was asked for.
    Recomputed(Recomputed),
}

#[derive(Debug)]
enum Delivery {
    Frame(Bytes),
    Close(Refusal),
}

/// The coordinator's side of one simulated connection.
struct Conn {
    joined: Joined,
    upload: Upload,
}

struct Sim {
    spec: crate::scenario::WorkerSpec,
    core: WorkerCore,
    conn: Option<Conn>,
    /// The connection frames belong to: what was in flight on an older one is dropped.
    epoch: u64,
    down: Pipe,
    up: Pipe,
    inbox: VecDeque<Bytes>,
    computing: bool,
    frozen_until: Duration,
    compute: Duration,
    connected_since: Option<Duration>,
    connected: Duration,
    gradients: u64,
    sessions: u32,
    ended: Option<String>,
    /// Left for good, or banned.
    gone: bool,
    rng: SplitMix64,
    peer: IpAddr,
    /// The identities it was issued, in order.
    ids: Vec<WorkerId>,
    /// `lies_low`: honest answers it still gives before it attacks again.
    honest_left: u32,
    /// Answers sent altered.
    poisoned: u64,
}

/// `Behaviour::Alie`: the group's honest answers for one round, held until every
/// connected member's is in: (worker, connection epoch, its answer, as its frames).
type Pool = BTreeMap<u64, Vec<(usize, u64, Gradient, Vec<Vec<u8>>)>>;

struct Engine {
    base: Instant,
    now: Duration,
    core: Coordinator,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    events: HashMap<u64, Ev>,
    seq: u64,
    workers: Vec<Sim>,
    /// The core's deadline as last scheduled.
    deadline: Option<Instant>,
    until: Until,
    evaluation_time: Duration,
    recompute_step: Duration,
    target_at: Option<Duration>,
    curve: Vec<Point>,
    stopped: bool,
    pool: Pool,
    /// Fresh addresses handed to workers coming back (`comes_back`).
    fresh_addresses: u32,
    /// Real time spent in the core's worker inputs.
    busy: Duration,
}

impl Engine {
    fn new(scenario: Scenario) -> Self {
        let base = Instant::now();
        let core = Coordinator::new(scenario.settings, scenario.net, scenario.data, base)
            .expect("the scenario's model fits its data");
        let seed = scenario.seed;
        let workers = scenario
            .workers
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                let i64 = i as u64;
                Sim {
                    core: core_for(&spec),
                    ids: Vec::new(),
                    honest_left: spec.lies_low,
                    poisoned: 0,
                    down: Pipe::new(spec.link.down, seed ^ (i64 << 32) ^ 1),
                    up: Pipe::new(spec.link.up, seed ^ (i64 << 32) ^ 2),
                    rng: SplitMix64::new(seed ^ (i64 << 32) ^ 3),
                    // Each in its own /24, as volunteers from different homes.
                    peer: IpAddr::V4(Ipv4Addr::new(10, (i / 250) as u8, (i % 250) as u8, 1)),
                    spec,
                    conn: None,
                    epoch: 0,
                    inbox: VecDeque::new(),
                    computing: false,
                    frozen_until: Duration::ZERO,
                    compute: Duration::ZERO,
                    connected_since: None,
                    connected: Duration::ZERO,
                    gradients: 0,
                    sessions: 0,
                    ended: None,
                    gone: false,
                }
            })
            .collect();
        let mut engine = Self {
            base,
            now: Duration::ZERO,
            core,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            seq: 0,
            workers,
            deadline: None,
            until: scenario.until,
            evaluation_time: scenario.evaluation_time,
            recompute_step: scenario.recompute_step,
            target_at: None,
            curve: Vec::new(),
            stopped: false,
            pool: Pool::new(),
            fresh_addresses: 0,
            busy: Duration::ZERO,
        };
        for w in 0..engine.workers.len() {
            let spec = &engine.workers[w].spec;
            let (joins, churn) = (spec.joins_at, spec.churn.clone());
            engine.at(joins, Ev::Connect(w));
            for (when, what) in churn {
                engine.at(when, Ev::Churn(w, what));
            }
        }
        engine.route();
        engine
    }

    fn at(&mut self, at: Duration, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((at.max(self.now), self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    fn run(mut self) -> (Report, Duration) {
        while let Some(Reverse((at, seq))) = self.queue.pop() {
            if at > self.until.time {
                self.now = self.until.time;
                break;
            }
            self.now = at;
            let ev = self.events.remove(&seq).expect("scheduled");
            self.handle(ev);
            self.route();
            let rounds_done = self.until.rounds.is_some_and(|r| self.core.version() >= r);
            if self.stopped || rounds_done {
                break;
            }
        }
        let busy = self.busy;
        (self.report(), busy)
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.instant();
        match ev {
            Ev::Connect(w) => self.connect(w),
            Ev::Hello { w, epoch } => self.hello(w, epoch),
            Ev::ToWorker { w, epoch, delivery } if epoch == self.workers[w].epoch => match delivery
            {
                Delivery::Frame(frame) => {
                    self.workers[w].inbox.push_back(frame);
                    self.pump(w);
                }
                Delivery::Close(refusal) => {
                    let sim = &mut self.workers[w];
                    sim.ended = Some(refusal.code.name().to_string());
                    sim.gone |= refusal.is_fatal();
                    self.disconnect(w);
                    if self.workers[w].gone && self.workers[w].spec.comes_back {
                        self.come_back_fresh(w);
                    }
                }
            },
            Ev::Computed { w, epoch, frames } if epoch == self.workers[w].epoch => {
                let sim = &mut self.workers[w];
                sim.computing = false;
                if let Behaviour::Alie(_) = sim.spec.behaviour {
                    let answer = reassemble(&frames);
                    let round = answer.round.0;
                    let pooled = (w, epoch, answer, frames);
                    self.pool.entry(round).or_default().push(pooled);
                    self.collude();
                } else {
                    let hostile = !matches!(sim.spec.behaviour, Behaviour::Honest);
                    sim.poisoned += u64::from(hostile);
                    let frames = poison(
                        sim.spec.behaviour,
                        sim.spec.compression,
                        frames,
                        &mut sim.rng,
                    );
                    self.upload(w, epoch, frames);
                }
                self.pump(w);
            }
            Ev::ToCoordinator { w, epoch, frame } if epoch == self.workers[w].epoch => {
                self.take_chunk(w, &frame);
            }
            Ev::Timeout => {
                if self.core.poll_timeout().is_some_and(|d| d <= now) {
                    self.deadline = None;
                    self.core.handle_timeout(now);
                }
            }
            Ev::Churn(w, churn) => self.churn(w, churn),
            Ev::Thaw(w) => self.pump(w),
            Ev::Recomputed(done) => self.core.recomputed(done, now),
            Ev::Evaluated(evaluated) => {
                self.core.evaluated(evaluated, now);
                let status = self.core.status();
                if let (Some(round), Some(accuracy)) =
                    (status.evaluated_round, status.test_accuracy)
                {
                    let point = Point {
                        seconds: self.now.as_secs_f64(),
                        round,
                        accuracy,
                        loss: status.test_loss,
                    };
                    if self.curve.last() != Some(&point) {
                        self.curve.push(point);
                    }
                    if self.target_at.is_none()
                        && self.until.accuracy.is_some_and(|target| accuracy >= target)
                    {
                        self.target_at = Some(self.now);
                        self.stopped = true;
                    }
                }
            }
            // For a connection that is gone.
            Ev::ToWorker { .. } | Ev::Computed { .. } | Ev::ToCoordinator { .. } => {}
        }
    }

    /// What the core asked for: frames down the links, evaluations run, its deadline set.
    fn route(&mut self) {
        while let Some(output) = self.core.poll_output() {
            match output {
                Output::Send {
                    session, message, ..
                } => {
                    let Some(w) = self
                        .workers
                        .iter()
                        .position(|s| s.conn.as_ref().is_some_and(|c| c.joined.session == session))
                    else {
                        continue;
                    };
                    let epoch = self.workers[w].epoch;
                    match message {
                        Outbound::Close(refusal) => {
                            let arrival = self.workers[w].down.send(self.now, 0);
                            let delivery = Delivery::Close(refusal);
                            self.at(arrival, Ev::ToWorker { w, epoch, delivery });
                        }
                        message => {
                            for frame in message.frames() {
                                let bytes = on_the_wire(frame.len(), false);
                                let arrival = self.workers[w].down.send(self.now, bytes);
                                let delivery = Delivery::Frame(frame.clone());
                                self.at(arrival, Ev::ToWorker { w, epoch, delivery });
                            }
                        }
                    }
                }
                Output::Evaluate(job) => {
                    let done = job.run();
                    self.at(self.now + self.evaluation_time, Ev::Evaluated(done));
                }
                Output::Recompute(job) => {
                    let took = self.recompute_step * job.steps();
                    let started = std::time::Instant::now();
                    let mut done = job.run();
                    self.busy += started.elapsed();
                    // The core is told what the job took on its simulated core, as a
                    // server's driver tells it what it took on a real one.
                    done.seconds = took.as_secs_f64();
                    self.at(self.now + took, Ev::Recomputed(done));
                }
                Output::Stop(_) => self.stopped = true,
                Output::Checkpoint(_) | Output::Observe(_) | Output::Partial(_) => {}
            }
        }
        if let Some(deadline) = self.core.poll_timeout() {
            if self.deadline != Some(deadline) {
                self.deadline = Some(deadline);
                let at = deadline.saturating_duration_since(self.base);
                self.at(at, Ev::Timeout);
            }
        }
    }

    /// A new connection: its `Hello` (with its resume token, once it has one) goes up.
    fn connect(&mut self, w: usize) {
        let now = self.now;
        let sim = &mut self.workers[w];
        if sim.conn.is_some() || sim.gone {
            return;
        }
        sim.epoch += 1;
        sim.down.reset(now);
        sim.up.reset(now);
        sim.inbox.clear();
        sim.computing = false;
        let hello = sim.core.hello_frame();
        let arrival = sim.up.send(now, on_the_wire(hello.len(), true));
        let epoch = sim.epoch;
        self.at(arrival, Ev::Hello { w, epoch });
    }

    fn hello(&mut self, w: usize, epoch: u64) {
        let now = self.instant();
        let sim = &mut self.workers[w];
        if epoch != sim.epoch || sim.conn.is_some() {
            return;
        }
        let Ok(WorkerToCoordinator::Hello(hello)) = decode_from_worker(&sim.core.hello_frame())
        else {
            unreachable!("a worker core's Hello decodes")
        };
        match self.core.join(&hello, sim.peer, now) {
            Ok(joined) => {
                if sim.ids.last() != Some(&joined.worker) {
                    sim.ids.push(joined.worker);
                }
                sim.conn = Some(Conn {
                    joined,
                    upload: Upload::default(),
                });
                sim.sessions += 1;
                sim.connected_since = Some(self.now);
            }
            Err(refusal) => {
                sim.ended = Some(refusal.code.name().to_string());
                sim.gone = true;
                if sim.spec.comes_back {
                    match refusal.code {
                        // Its address is banned: another one.
                        protocol::ErrorCode::Banned => self.come_back_fresh(w),
                        // Too many new identities: later.
                        protocol::ErrorCode::Full => {
                            sim.gone = false;
                            self.at(self.now + RETRY_AFTER_REFUSAL, Ev::Connect(w));
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// A banned worker that comes back: a fresh core (no token), a fresh address in its
    /// group's network, connecting at once.
    fn come_back_fresh(&mut self, w: usize) {
        let k = self.fresh_addresses;
        self.fresh_addresses += 1;
        let sim = &mut self.workers[w];
        sim.core = core_for(&sim.spec);
        sim.honest_left = sim.spec.lies_low;
        sim.peer = IpAddr::V4(Ipv4Addr::new(10, 200, (k / 250) as u8, (k % 250) as u8 + 1));
        sim.gone = false;
        self.connect(w);
    }

    /// A worker's answer goes up its link.
    fn upload(&mut self, w: usize, epoch: u64, frames: Vec<Vec<u8>>) {
        for frame in frames {
            let bytes = on_the_wire(frame.len(), true);
            let arrival = self.workers[w].up.send(self.now, bytes);
            self.at(arrival, Ev::ToCoordinator { w, epoch, frame });
        }
    }

    /// `Behaviour::Alie`: a round's pool goes out once every connected member's answer is
    /// in (or a later round's has started: a member that never got this round's weights
    /// must not hold it forever). Each sends mean − z·std of the pool, value by value.
    fn collude(&mut self) {
        let members = self
            .workers
            .iter()
            .filter(|s| matches!(s.spec.behaviour, Behaviour::Alie(_)) && s.conn.is_some())
            .count()
            .max(1);
        let newest = self.pool.keys().next_back().copied();
        let ready: Vec<u64> = self
            .pool
            .iter()
            .filter(|&(&round, answers)| answers.len() >= members || Some(round) < newest)
            .map(|(&round, _)| round)
            .collect();
        for round in ready {
            let answers = self.pool.remove(&round).unwrap_or_default();
            let n = answers.len() as f64;
            let len = answers.first().map_or(0, |(_, _, g, _)| g.grads.len());
            let (mut mean, mut var) = (vec![0.0f64; len], vec![0.0f64; len]);
            for (_, _, g, _) in &answers {
                for (m, &v) in mean.iter_mut().zip(&g.grads) {
                    *m += f64::from(v) / n;
                }
            }
            for (_, _, g, _) in &answers {
                for ((s, &m), &v) in var.iter_mut().zip(&mean).zip(&g.grads) {
                    *s += (f64::from(v) - m).powi(2) / n;
                }
            }
            for (w, epoch, mut g, honest) in answers {
                if epoch != self.workers[w].epoch {
                    continue;
                }
                let Behaviour::Alie(z) = self.workers[w].spec.behaviour else {
                    continue;
                };
                if self.workers[w].honest_left > 0 {
                    self.workers[w].honest_left -= 1;
                    self.upload(w, epoch, honest);
                    continue;
                }
                for ((v, &m), &s) in g.grads.iter_mut().zip(&mean).zip(&var) {
                    *v = (m - f64::from(z) * s.sqrt()) as f32;
                }
                self.workers[w].poisoned += 1;
                let frames = encode_gradient(&g, self.workers[w].spec.compression);
                self.upload(w, epoch, frames);
            }
        }
    }

    /// A worker reads its inbox until a gradient keeps it busy.
    fn pump(&mut self, w: usize) {
        let now = self.now;
        let sim = &mut self.workers[w];
        if sim.computing || now < sim.frozen_until || sim.conn.is_none() {
            return;
        }
        while let Some(frame) = sim.inbox.pop_front() {
            let frame = match sim.spec.behaviour {
                Behaviour::WrongBatch => shift_task(frame),
                _ => frame,
            };
            // An error frame is small; weights are not decoded twice.
            if sim.spec.lies_low > 0 && frame.len() < 1024 {
                if let Ok(CoordinatorToWorker::Error {
                    code: protocol::ErrorCode::Mismatch,
                    ..
                }) = decode_from_coordinator(&frame)
                {
                    sim.honest_left = sim.spec.lies_low;
                }
            }
            let reply = sim.core.handle_frame(&frame).and_then(|reply| {
                // A local phase: its steps, one after the other (nothing can arrive between
                // two of them in the same instant of virtual time).
                let (mut reply, mut steps) = (reply, 0);
                while reply.is_empty() && sim.core.working() {
                    reply = sim.core.work()?;
                    steps += 1;
                }
                Ok((reply, steps.max(1)))
            });
            match reply {
                Ok((reply, _)) if reply.is_empty() => {}
                Ok((reply, steps)) => {
                    let busy = sim.spec.step * steps;
                    sim.computing = true;
                    sim.compute += busy;
                    sim.gradients += 1;
                    let epoch = sim.epoch;
                    self.at(
                        now + busy,
                        Ev::Computed {
                            w,
                            epoch,
                            frames: reply,
                        },
                    );
                    return;
                }
                // A fatal error frame: its close follows.
                Err(worker_core::WorkerError::Rejected { code, .. }) => {
                    sim.ended = Some(code.name().to_string());
                }
                Err(err) => panic!("a simulated worker's core failed: {err}"),
            }
        }
    }

    /// A gradient chunk through the session's checks; a whole gradient to the core. A
    /// refused chunk ends the session, as the server's does.
    fn take_chunk(&mut self, w: usize, frame: &[u8]) {
        let now = self.instant();
        let sim = &mut self.workers[w];
        let Some(conn) = sim.conn.as_mut() else {
            return;
        };
        let taken = match decode_worker_frame(frame) {
            Ok(WorkerFrame::Gradient(chunk)) => conn.upload.take(&chunk, &conn.joined),
            Ok(WorkerFrame::Commitments(c)) => {
                let j = conn.joined;
                return self.core.commitments(j.worker, j.session, c, now);
            }
            Ok(WorkerFrame::Reveal(chunk)) => {
                let j = conn.joined;
                return self.core.revealed(j.worker, j.session, chunk, now);
            }
            Ok(WorkerFrame::Hello(_)) => Err(Refusal::new(
                protocol::ErrorCode::UnexpectedMessage,
                "Hello was already received",
            )),
            Err(err) => Err(Refusal::new(err.code(), err.to_string())),
        };
        let joined = conn.joined;
        match taken {
            Ok(Progress::More) => {}
            Ok(Progress::Done(gradient, norm)) => {
                let started = std::time::Instant::now();
                self.core
                    .gradient(joined.worker, joined.session, &gradient, norm, now);
                self.busy += started.elapsed();
            }
            Err(refusal) => {
                let peer = sim.peer;
                sim.ended = Some(refusal.code.name().to_string());
                self.core.rejected(&refusal, peer, now);
                self.disconnect(w);
            }
        }
    }

    fn churn(&mut self, w: usize, churn: Churn) {
        match churn {
            Churn::Leave => {
                self.disconnect(w);
                let sim = &mut self.workers[w];
                sim.gone = true;
                sim.ended = Some("left".into());
            }
            Churn::Freeze(d) => {
                self.workers[w].frozen_until = self.now + d;
                self.at(self.now + d, Ev::Thaw(w));
            }
            Churn::Reconnect => {
                self.disconnect(w);
                self.connect(w);
            }
            Churn::Rejoin => self.connect(w),
        }
    }

    /// The connection ends (both sides know at once).
    fn disconnect(&mut self, w: usize) {
        let now = self.instant();
        let sim = &mut self.workers[w];
        let Some(conn) = sim.conn.take() else {
            return;
        };
        sim.epoch += 1;
        sim.inbox.clear();
        sim.computing = false;
        if let Some(since) = sim.connected_since.take() {
            sim.connected += self.now - since;
        }
        self.core
            .leave(conn.joined.worker, conn.joined.session, now);
        if !self.pool.is_empty() {
            // One colluder fewer to wait for.
            self.collude();
        }
    }

    fn report(mut self) -> Report {
        let seconds = self.now.as_secs_f64();
        let status = self.core.status().clone();
        let mut bytes = 0;
        let mut workers = Vec::with_capacity(self.workers.len());
        for sim in &mut self.workers {
            if let Some(since) = sim.connected_since.take() {
                sim.connected += self.now - since;
            }
            bytes += sim.up.bytes + sim.down.bytes;
            let share = if sim.connected.is_zero() {
                0.0
            } else {
                (sim.compute.as_secs_f64() / sim.connected.as_secs_f64()).min(1.0)
            };
            workers.push(WorkerReport {
                gradients_sent: sim.gradients,
                local_steps: sim.core.stats().local_steps,
                compute_share: share,
                bytes_up: sim.up.bytes,
                bytes_down: sim.down.bytes,
                sessions: sim.sessions,
                ended: sim.ended.clone(),
                poisoned: sim.poisoned,
                identities: sim.ids.len() as u32,
                accepted: sim.ids.iter().map(|&id| self.core.accepted_from(id)).sum(),
            });
        }
        let computing: Vec<f64> = workers
            .iter()
            .filter(|w| w.gradients_sent > 0)
            .map(|w| w.compute_share)
            .collect();
        let samples = status.counters.samples_seen;
        Report {
            seconds,
            rounds: self.core.version(),
            samples,
            samples_per_sec: if seconds > 0.0 {
                samples as f64 / seconds
            } else {
                0.0
            },
            seconds_to_target: self.target_at.map(|t| t.as_secs_f64()),
            evaluated_round: status.evaluated_round,
            accuracy: status.test_accuracy,
            loss: status.test_loss,
            bytes_per_sample: if samples > 0 {
                bytes as f64 / samples as f64
            } else {
                0.0
            },
            mean_compute_share: computing.iter().sum::<f64>() / computing.len().max(1) as f64,
            gradients_accepted: status.counters.gradients_accepted,
            gradients_rejected: status.counters.gradients_rejected,
            verification_mismatches: status.counters.verification_mismatches,
            gradients_verified: status.counters.gradients_verified,
            probation_checks: status.counters.probation_checks,
            probation_unchecked: status.counters.probation_unchecked,
            sampling_floored: status.counters.sampling_floored,
            sampled_aside: status.counters.sampled_aside,
            deadline_extensions: status.counters.deadline_extensions,
            replicas_agreed: status.replicas_agreed,
            replicas_disputed: status.replicas_disputed,
            bans: status.bans.len(),
            noise_scale: status.noise_scale,
            curve: self.curve,
            workers,
        }
    }
}

/// `WrongBatch`: its core sees every `Task` with another batch index.
fn shift_task(frame: Bytes) -> Bytes {
    match decode_from_coordinator(&frame) {
        Ok(CoordinatorToWorker::Task(mut task)) => {
            task.batch += BATCH_SHIFT;
            encode_from_coordinator(&CoordinatorToWorker::Task(task)).into()
        }
        _ => frame,
    }
}

/// A worker core as `spec` asks: fresh, with no identity yet.
fn core_for(spec: &crate::scenario::WorkerSpec) -> WorkerCore {
    WorkerCore::new(WorkerKind::Native, None)
        .with_compression(spec.compression)
        .with_clock(ComputeClock::PerStep(spec.step.as_micros() as u64))
}

/// A hostile worker's gradient: its honest chunks, reassembled, changed, chunked again.
fn poison(
    behaviour: Behaviour,
    compression: protocol::Compression,
    frames: Vec<Vec<u8>>,
    rng: &mut SplitMix64,
) -> Vec<Vec<u8>> {
    if matches!(behaviour, Behaviour::Honest | Behaviour::WrongBatch) {
        return frames;
    }
    let mut g = reassemble(&frames);
    for v in &mut g.grads {
        match behaviour {
            Behaviour::Scaled(k) => *v *= k,
            Behaviour::Zeros => *v = 0.0,
            Behaviour::Huge => *v = 3e38,
            Behaviour::Noise(std) => *v = std * gaussian(rng),
            Behaviour::Honest | Behaviour::WrongBatch | Behaviour::Alie(_) => {}
        }
    }
    encode_gradient(&g, compression)
}

/// A worker core's answer, its chunks reassembled (as decoded: after the wire compression).
fn reassemble(frames: &[Vec<u8>]) -> Gradient {
    let mut whole: Option<Gradient> = None;
    for frame in frames {
        let Ok(WorkerToCoordinator::Gradient(chunk)) = decode_from_worker(frame) else {
            unreachable!("a worker core sends gradient chunks")
        };
        let g = whole.get_or_insert_with(|| Gradient {
            compute_us: chunk.compute_us,
            parts: 1,
            round: chunk.round,
            samples: chunk.samples,
            loss: chunk.loss,
            grads: Vec::with_capacity(chunk.total as usize),
        });
        g.grads.extend(chunk.grads);
    }
    whole.expect("at least one chunk")
}

/// A standard normal draw (Box-Muller).
fn gaussian(rng: &mut SplitMix64) -> f32 {
    let u = rng.next_f64().max(f64::MIN_POSITIVE);
    let v = rng.next_f64();
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

//! The browser worker's loop: connect, run the shared core on every frame, reconnect with
//! backoff when the coordinator goes away, until stopped.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use js_sys::{Object, Reflect};
use protocol::{ErrorCode, WorkerKind};
use wasm_bindgen::prelude::*;
use web_sys::WebSocket;
use worker_core::{Compute, ComputeClock, Stats, WorkerCore, WorkerError};

use crate::cores::Helpers;
use crate::gpu::Gpu;
use crate::race::{Race, Way};
use crate::transport::{Socket, SocketEvent};

/// Reconnect backoff: doubles from the first value up to the cap.
const BACKOFF_FIRST_MS: u32 = 500;
const BACKOFF_MAX_MS: u32 = 10_000;
/// Weight of the newest measurement in the samples/s moving average.
const RATE_SMOOTHING: f64 = 0.2;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(callback: &js_sys::Function, ms: i32) -> JsValue;
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
}

pub struct Inner {
    /// Where to connect: its own coordinator first, then (a cluster's) the other edges. A
    /// connection that fails moves on to the next.
    urls: RefCell<Vec<String>>,
    /// The index of the URL to try next.
    at: Cell<usize>,
    on_event: js_sys::Function,
    /// Bumped by every start and stop; a loop runs only while its generation is current.
    generation: Cell<u32>,
    running: Cell<bool>,
    /// The open socket of the current generation, so `stop` can close it.
    current: RefCell<Option<(u32, WebSocket)>>,
    /// The identity to resume, across stop/start and (via the page) reloads.
    resume_token: RefCell<Option<String>>,
    /// The run's join token, from the invitation link.
    join_token: Option<String>,
    /// The share of the CPU time to train (0.1-1): after each gradient the worker idles for
    /// as long as computing it took × (1 / share − 1).
    cpu: Cell<f64>,
    /// Cores to compute on: this Web Worker and `cores − 1` helpers.
    cores: Cell<u32>,
    helpers: Helpers,
    /// The GPU it computes plain gradients on, if the page asked for one and it opened,
    /// and whether it is faster than the CPU (way 2) for this model.
    gpu: RefCell<Option<Rc<Gpu>>>,
    gpu_race: RefCell<Race>,
    compression: protocol::Compression,
}

/// How a connection ended.
enum Ended {
    /// The coordinator went away or the connection failed: try again with backoff.
    Retry(String),
    /// Refused for a reason retrying cannot fix: say so and stop.
    Final(String),
    /// The run is over: thank the volunteer and stop computing.
    Finished(String),
}

impl Inner {
    pub fn new(
        url: String,
        on_event: js_sys::Function,
        resume_token: Option<String>,
        join_token: Option<String>,
        compression: protocol::Compression,
    ) -> Self {
        Self {
            urls: RefCell::new(vec![url]),
            at: Cell::new(0),
            on_event,
            generation: Cell::new(0),
            running: Cell::new(false),
            current: RefCell::new(None),
            resume_token: RefCell::new(resume_token),
            join_token,
            compression,
            cpu: Cell::new(1.0),
            cores: Cell::new(1),
            helpers: Helpers::default(),
            gpu: RefCell::new(None),
            gpu_race: RefCell::new(Race::default()),
        }
    }

    /// Computes on `gpu` from the next batch (or on the CPU alone: `None`), used always if
    /// `pinned` (the volunteer asked for it), else while it is faster than the CPU.
    pub fn set_gpu(&self, gpu: Option<Gpu>, pinned: bool) {
        let mut race = self.gpu_race.borrow_mut();
        race.restart();
        race.pinned = pinned;
        if let Some(old) = std::mem::replace(&mut *self.gpu.borrow_mut(), gpu.map(Rc::new)) {
            // Its memory back at once (a batch under way on it fails, and is computed on
            // the CPU).
            old.close();
        }
    }

    /// Computes the job the core is waiting for, if any: on the GPU when it is unordered
    /// and there is one (a GPU that fails is given up, with a message, and the batch
    /// computed on the CPU), else on the cores; returns what the core answers. With a GPU,
    /// batches are timed each way (a phase's steps too, and its segments on the GPU), for
    /// [`Inner::compute`]'s choice: a committed phase stays where it started, so a GPT's
    /// phases change device at a phase's start.
    async fn run_job(&self, core: &mut WorkerCore) -> Result<Vec<Vec<u8>>, String> {
        let gpu = self.gpu.borrow().clone();
        let Some(job) = core.job() else {
            return Ok(Vec::new());
        };
        let (timed, samples) = (gpu.is_some(), job.labels.len());
        let started = performance_now();
        if let (Some(gpu), true) = (&gpu, job.unordered()) {
            drop(job);
            // A committed phase's steps up to its next commitment, the weights and AdamW
            // kept on the GPU through them (a state the phase refuses is the GPU's
            // failure: the steps are then taken on the CPU); else this one step's gradient.
            let failed = match core.segment().filter(|s| Gpu::keeps(s.optimizer)) {
                Some(segment) => {
                    let samples = segment.batches.iter().map(|(_, l, _)| l.len()).sum();
                    let result = gpu.segment(&segment).await;
                    drop(segment);
                    match result.and_then(|(losses, state)| {
                        core.complete_segment(&losses, &state)
                            .map_err(|e| e.to_string())
                    }) {
                        Ok(reply) => {
                            let ms = performance_now() - started;
                            self.gpu_race
                                .borrow_mut()
                                .measured(Way::Second, ms, samples);
                            return Ok(reply);
                        }
                        Err(why) => why,
                    }
                }
                // A committed phase's step of a ReLU model also logs its near-ties'
                // branches, from the GPU's own activations.
                None => {
                    let logs = core.logs_branches();
                    let job = core.job().expect("the job just offered");
                    let result = match logs {
                        true => {
                            gpu.gradient_logged(job.net, &job.weights, job.x, job.labels, job.seed)
                                .await
                        }
                        false => gpu
                            .gradient(job.net, &job.weights, job.x, job.labels, job.seed)
                            .await
                            .map(|(loss, grads)| (loss, grads, Vec::new())),
                    };
                    drop(job);
                    match result {
                        Ok((loss, grads, branches)) => {
                            let ms = performance_now() - started;
                            self.gpu_race
                                .borrow_mut()
                                .measured(Way::Second, ms, samples);
                            let reply = match logs {
                                true => core.complete_logged(loss, grads, &branches),
                                false => core.complete(loss, grads),
                            };
                            return reply.map_err(|e| e.to_string());
                        }
                        Err(why) => why,
                    }
                }
            };
            // Unless it was given back meanwhile (the volunteer's choice, said).
            let current = self
                .gpu
                .borrow()
                .as_ref()
                .is_some_and(|g| Rc::ptr_eq(g, gpu));
            if current {
                self.set_gpu(None, false);
                self.emit(
                    "device",
                    &[("device", format!("CPU: the GPU failed ({failed})").into())],
                );
            }
            return self.helpers.run(core).await;
        }
        drop(job);
        let reply = self.helpers.run(core).await;
        if timed {
            let ms = performance_now() - started;
            self.gpu_race.borrow_mut().measured(Way::First, ms, samples);
        }
        reply
    }

    pub fn set_cores(&self, cores: u32, pool: Option<JsValue>, pinned: bool) {
        let cores = if pool.is_some() {
            cores.clamp(1, 64)
        } else {
            1
        };
        self.helpers.set(pool, pinned);
        self.cores.set(cores);
    }

    /// What the page shows about the cores: the cores in use, parts the helpers computed
    /// and missed, and with a GPU whether it is the faster (and so in use).
    fn cores_fields(&self) -> [(&'static str, JsValue); 4] {
        let (helped, missed) = self.helpers.counts();
        let gpu_used = match self.gpu.borrow().is_some() {
            true => (self.gpu_race.borrow().using() == Way::Second).into(),
            false => JsValue::NULL,
        };
        [
            ("coresUsed", self.helpers.using().into()),
            ("helperParts", (helped as f64).into()),
            ("helperMisses", (missed as f64).into()),
            ("gpuUsed", gpu_used),
        ]
    }

    /// How the core computes now: on the GPU, here alone, or in parts with the helpers.
    fn compute(&self) -> Compute {
        let on_gpu = self.gpu.borrow().is_some();
        if on_gpu && self.gpu_race.borrow_mut().pick() == Way::Second {
            return Compute::Unordered;
        }
        // With cores lent (or a GPU to time against), every batch goes through the
        // helpers' side, which times it on one core or on all and so learns which is
        // faster.
        match self.cores.get() {
            0 | 1 if !on_gpu => {
                self.helpers.parts(1);
                Compute::Threads(1)
            }
            k => Compute::Deferred(self.helpers.parts(k.max(1)) as usize),
        }
    }

    /// Where to connect from now on: this list, in turn (the first is tried next).
    pub fn set_urls(&self, urls: Vec<String>) {
        if !urls.is_empty() && *self.urls.borrow() != urls {
            let current = self.url();
            self.at
                .set(urls.iter().position(|u| *u == current).unwrap_or(0));
            *self.urls.borrow_mut() = urls;
        }
    }

    fn url(&self) -> String {
        let urls = self.urls.borrow();
        urls[self.at.get() % urls.len()].clone()
    }

    /// Trains `percent` % of the time (10-100).
    pub fn set_cpu(&self, percent: u32) {
        self.cpu.set(f64::from(percent.clamp(10, 100)) / 100.0);
    }

    fn is_current(&self, generation: u32) -> bool {
        self.running.get() && self.generation.get() == generation
    }

    fn emit(&self, state: &str, fields: &[(&str, JsValue)]) {
        let event = Object::new();
        let _ = Reflect::set(&event, &"state".into(), &state.into());
        for (key, value) in fields {
            let _ = Reflect::set(&event, &(*key).into(), value);
        }
        let _ = self.on_event.call1(&JsValue::NULL, &event);
    }
}

pub fn start(inner: &Rc<Inner>) {
    if inner.running.get() {
        return;
    }
    let generation = inner.generation.get().wrapping_add(1);
    inner.generation.set(generation);
    inner.running.set(true);
    wasm_bindgen_futures::spawn_local(run(inner.clone(), generation));
}

pub fn stop(inner: &Rc<Inner>) {
    inner.running.set(false);
    inner.generation.set(inner.generation.get().wrapping_add(1));
    if let Some((_, ws)) = inner.current.borrow_mut().take() {
        let _ = ws.close_with_code_and_reason(1000, "volunteer paused");
    }
}

async fn run(inner: Rc<Inner>, generation: u32) {
    // One core for the whole run: after a reconnect its Hello carries the resume token.
    let token = inner.resume_token.borrow().clone();
    let clock = || (performance_now() * 1000.0) as u64;
    let mut core = WorkerCore::new(WorkerKind::Browser, inner.join_token.clone())
        .with_resume_token(token)
        .with_compression(inner.compression)
        .with_clock(ComputeClock::Clock(Box::new(clock)));
    let mut rate = Rate::default();
    let mut backoff = BACKOFF_FIRST_MS;
    while inner.is_current(generation) {
        inner.emit("connecting", &[]);
        // The socket never opened: the page asks the coordinator why (a browser won't say).
        let mut refused = false;
        let ended = match Socket::connect(&inner.url()).await {
            // Stopped while connecting: dropping the socket closes it.
            Ok(_) if !inner.is_current(generation) => break,
            Ok(mut socket) => {
                backoff = BACKOFF_FIRST_MS;
                *inner.current.borrow_mut() = Some((generation, socket.handle()));
                let ended = session(&inner, &mut core, &mut socket, &mut rate).await;
                let mut current = inner.current.borrow_mut();
                if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                    *current = None;
                }
                ended
            }
            Err(reason) => {
                refused = true;
                // Unreachable (an edge of a cluster that died): the next URL, if any.
                inner.at.set(inner.at.get().wrapping_add(1));
                Ended::Retry(reason)
            }
        };
        if !inner.is_current(generation) {
            break;
        }
        let reason = match ended {
            Ended::Retry(reason) => reason,
            Ended::Final(message) => {
                inner.running.set(false);
                inner.emit("error", &[("message", message.into())]);
                return;
            }
            Ended::Finished(why) => {
                inner.running.set(false);
                let message = format!(
                    "The {why}. Thank you for lending this tab: it has stopped computing, and you may close it."
                );
                inner.emit("finished", &[("message", message.into())]);
                return;
            }
        };
        inner.emit(
            "disconnected",
            &[
                ("message", reason.into()),
                ("retryInMs", backoff.into()),
                ("refused", refused.into()),
            ],
        );
        sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX_MS);
    }
    inner.emit("paused", &[]);
}

/// One connection's life; returns why it ended.
async fn session(
    inner: &Inner,
    core: &mut WorkerCore,
    socket: &mut Socket,
    rate: &mut Rate,
) -> Ended {
    if let Err(e) = socket.send(&core.hello_frame()) {
        return Ended::Retry(e);
    }
    inner.emit("connected", &[]);
    // A local phase's time so far: its steps and the CPU setting's idling.
    let mut phase_ms = 0.0;
    // For the tab's compute share of its time connected.
    let since = (performance_now(), core.stats().compute_us);
    let share = |stats: &Stats| {
        let wall_ms = performance_now() - since.0;
        let compute_ms = stats.compute_us.saturating_sub(since.1) as f64 / 1000.0;
        (wall_ms > 0.0).then(|| (compute_ms / wall_ms).min(1.0))
    };
    loop {
        let event = if core.working() {
            // Between two inner steps: what has arrived (a pause closes the socket, newer
            // weights replace the phase), else the next step.
            match socket.try_next() {
                Some(event) => event,
                None => {
                    let started = performance_now();
                    core.set_compute(inner.compute());
                    let reply = match core.work() {
                        Ok(reply) if reply.is_empty() => inner.run_job(core).await,
                        Ok(reply) => Ok(reply),
                        Err(err) => Err(err.to_string()),
                    };
                    let reply = match reply {
                        Ok(reply) => reply,
                        Err(err) => return Ended::Retry(err),
                    };
                    let elapsed_ms = performance_now() - started;
                    let idle_ms = elapsed_ms * (1.0 / inner.cpu.get() - 1.0);
                    if idle_ms >= 1.0 {
                        sleep(idle_ms as u32).await;
                    } else {
                        yield_now().await;
                    }
                    phase_ms += elapsed_ms + idle_ms.max(0.0);
                    if reply.is_empty() {
                        continue;
                    }
                    for chunk in &reply {
                        if let Err(e) = socket.send(chunk) {
                            return Ended::Retry(e);
                        }
                    }
                    rate.update(core.stats().samples_computed, std::mem::take(&mut phase_ms));
                    let mut fields = stats_fields(core.stats());
                    fields.push(("samplesPerSec", rate.per_sec.into()));
                    if let Some(share) = share(core.stats()) {
                        fields.push(("computeShare", share.into()));
                    }
                    fields.extend(inner.cores_fields());
                    inner.emit("training", &fields);
                    continue;
                }
            }
        } else {
            match socket.next().await {
                Some(event) => event,
                None => break,
            }
        };
        let frame = match event {
            SocketEvent::Frame(frame) => frame,
            SocketEvent::Closed { code, reason } => {
                return Ended::Retry(format!(
                    "connection closed ({code}{}{reason})",
                    if reason.is_empty() { "" } else { ": " }
                ))
            }
        };
        let started = performance_now();
        core.set_compute(inner.compute());
        let reply = match core.handle_frame(&frame) {
            Ok(reply) if reply.is_empty() => match inner.run_job(core).await {
                Ok(reply) => reply,
                Err(err) => return Ended::Retry(err),
            },
            Ok(reply) => reply,
            Err(err) => return ended_by(inner, err),
        };
        if reply.is_empty() && core.receiving_weights() {
            // A chunk of weights still arriving: nothing to show yet.
            continue;
        }
        let mut fields = stats_fields(core.stats());
        let state = match reply.is_empty() {
            false => {
                let elapsed_ms = performance_now() - started;
                for chunk in &reply {
                    if let Err(e) = socket.send(chunk) {
                        return Ended::Retry(e);
                    }
                }
                // The CPU setting: idle after sending, so the gradient is not delayed.
                let idle_ms = elapsed_ms * (1.0 / inner.cpu.get() - 1.0);
                if idle_ms >= 1.0 {
                    sleep(idle_ms as u32).await;
                }
                rate.update(core.stats().samples_computed, elapsed_ms + idle_ms);
                fields.push(("samplesPerSec", rate.per_sec.into()));
                if let Some(share) = share(core.stats()) {
                    fields.push(("computeShare", share.into()));
                }
                fields.extend(inner.cores_fields());
                "training"
            }
            // Welcome, Shard, a non-fatal Error, or Weights before this worker has a shard.
            true => {
                let token = core.resume_token().map(str::to_owned);
                if token.is_some() && *inner.resume_token.borrow() != token {
                    fields.push((
                        "resumeToken",
                        token.clone().map_or(JsValue::NULL, Into::into),
                    ));
                    *inner.resume_token.borrow_mut() = token;
                }
                let warning = core.stats().last_warning.clone();
                fields.push(("message", warning.map_or(JsValue::NULL, Into::into)));
                "connected"
            }
        };
        inner.emit(state, &fields);
    }
    Ended::Retry("connection lost".into())
}

/// How a frame the core refused ends the session: for good (kicked, finished, banned, an
/// older page, no invitation), or to be retried.
fn ended_by(inner: &Inner, err: WorkerError) -> Ended {
    match err {
        WorkerError::Rejected {
            code: ErrorCode::Kicked,
            ..
        } => Ended::Final("the organiser removed this tab from the run".into()),
        WorkerError::Rejected {
            code: ErrorCode::Finished,
            message,
        } => Ended::Finished(message),
        WorkerError::Rejected {
            code: ErrorCode::Banned,
            message,
        } => Ended::Final(format!("the coordinator banned this tab: {message}")),
        WorkerError::Rejected {
            code: ErrorCode::VersionMismatch,
            ..
        } => Ended::Final("this page is older than the coordinator: reload it".into()),
        WorkerError::Rejected {
            code: ErrorCode::Unauthorized,
            ..
        } => Ended::Final(if inner.join_token.is_some() {
            "this invitation link is not valid for this run: ask its organiser for a new one".into()
        } else {
            "this run needs an invitation link: ask its organiser for one".into()
        }),
        err => Ended::Retry(err.to_string()),
    }
}

/// What the page shows about this worker.
fn stats_fields(stats: &Stats) -> Vec<(&'static str, JsValue)> {
    let or_null = |v: Option<JsValue>| v.unwrap_or(JsValue::NULL);
    vec![
        ("workerId", or_null(stats.worker_id.map(|w| w.0.into()))),
        ("round", or_null(stats.round.map(|r| (r.0 as f64).into()))),
        ("gradients", (stats.gradients_sent as f64).into()),
        ("loss", or_null(stats.last_loss.map(Into::into))),
        ("shardLen", (stats.shard_len as u32).into()),
    ]
}

/// Samples per second of gradient computation, smoothed.
#[derive(Default)]
struct Rate {
    last_samples: u64,
    per_sec: f64,
}

impl Rate {
    fn update(&mut self, samples_total: u64, elapsed_ms: f64) {
        let samples = samples_total.saturating_sub(self.last_samples) as f64;
        self.last_samples = samples_total;
        if elapsed_ms <= 0.0 {
            return;
        }
        let now = samples / (elapsed_ms / 1000.0);
        self.per_sec = if self.per_sec == 0.0 {
            now
        } else {
            RATE_SMOOTHING * now + (1.0 - RATE_SMOOTHING) * self.per_sec
        };
    }
}

/// Lets the page's event loop run (socket messages, a pause) between two inner steps,
/// without `setTimeout`'s 4 ms clamp: a message to itself on a `MessageChannel`.
async fn yield_now() {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let Ok(channel) = web_sys::MessageChannel::new() else {
            let _ = resolve.call0(&JsValue::NULL);
            return;
        };
        channel.port1().set_onmessage(Some(&resolve));
        if channel.port2().post_message(&JsValue::NULL).is_err() {
            let _ = resolve.call0(&JsValue::NULL);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

async fn sleep(ms: u32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        set_timeout(&resolve, ms as i32);
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

//! A tab's cores: its batches split over `k` Web Workers, still one worker to the
//! coordinator (one connection, one identity, one answer a batch).
//!
//! The tab's training Web Worker (`web/worker.js`) runs the [`crate::BrowserWorker`]; the
//! page's cores setting gives it `k − 1` helpers (`web/core.js`), each with its own
//! instance of this module running a [`PartWorker`]. For each batch the core asks for
//! ([`WorkerCore::job`], `Compute::Deferred(k)`) the training worker posts parts `1..k` to
//! the helpers (weights, the part's rows and labels, the batch's seed), computes part 0
//! itself meanwhile, then adds the parts in order: the same values as one core computing
//! `k` parts (`model::Part`), which the coordinator's verifier replays bit for bit.
//!
//! Separate Web Workers exchanging buffers, not wasm threads on shared memory: threads
//! would need a nightly toolchain rebuilding `std` with atomics and the page served
//! cross-origin isolated. Messages cost copies of the weights to each helper and of its
//! part's gradient back, both as long as the model: for a small model (`mlp`, 0.7 ms a
//! batch) they cost more than the part saves, for a larger one (`cnn`, 18 ms) far less
//! (docs/BENCHMARKS.md#a-workers-cores). So the tab measures its time a sample on one core
//! and on the cores lent ([`Choice`]) and computes on whichever is faster.

use std::cell::{Cell, RefCell};

use js_sys::{Array, Float32Array, Object, Promise, Reflect, Uint8Array};
use model::{NetSpec, Network, Part};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use worker_core::{Job, WorkerCore};

use crate::race::{Race, Way};

/// One helper's side: computes parts of batches for the training Web Worker.
#[wasm_bindgen]
#[derive(Debug)]
pub struct PartWorker {
    spec: String,
    net: Network,
    grads: Vec<f32>,
}

#[wasm_bindgen]
impl PartWorker {
    /// For the model `spec` (its text, as the coordinator's `Welcome` carries it).
    #[wasm_bindgen(constructor)]
    pub fn new(spec: &str) -> Result<PartWorker, JsError> {
        console_error_panic_hook::set_once();
        let parsed: NetSpec = spec.parse().map_err(|e| JsError::new(&format!("{e}")))?;
        let classes = parsed
            .outputs()
            .map_err(|e| JsError::new(&format!("{e}")))?;
        let net = Network::new(parsed, classes).map_err(|e| JsError::new(&format!("{e}")))?;
        Ok(PartWorker {
            spec: spec.to_owned(),
            net,
            grads: Vec::new(),
        })
    }

    /// The model text it was made for.
    pub fn spec(&self) -> String {
        self.spec.clone()
    }

    /// Computes rows `start..end` of a batch of `batch` rows (`x` holds only those rows,
    /// row-major; `labels` theirs) at `weights` (full layout) with the batch's dropout
    /// `seed`; returns the part's share of the batch's mean loss. [`PartWorker::gradient`]
    /// then has its share of the gradient.
    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &mut self,
        weights: &[f32],
        x: &[f32],
        labels: &[u8],
        seed: u64,
        start: u32,
        end: u32,
        batch: u32,
    ) -> Result<f32, JsError> {
        let rows = (end as usize).saturating_sub(start as usize);
        let x = ndarray::ArrayView2::from_shape((rows, self.net.inputs()), x)
            .map_err(|e| JsError::new(&format!("rows of a part: {e}")))?;
        let part = Part {
            start: start as usize,
            end: end as usize,
            batch: batch as usize,
        };
        self.net
            .part_loss_and_grad_into(weights, x, labels, seed, part, &mut self.grads)
            .map_err(|e| JsError::new(&format!("{e}")))
    }

    /// The gradient the last [`PartWorker::compute`] computed (copied once, into a new
    /// `Float32Array` the helper can transfer).
    pub fn gradient(&self) -> Float32Array {
        Float32Array::from(&self.grads[..])
    }
}

/// The training Web Worker's handle on its helpers: a JavaScript object with
/// `compute(index, message) → Promise<{loss, grads}>` (`web/worker.js`).
#[derive(Default)]
pub struct Helpers {
    pool: RefCell<Option<JsValue>>,
    /// Parts the helpers computed, and parts this worker computed instead because a
    /// helper failed or was missing (for the page).
    helped: Cell<u64>,
    missed: Cell<u64>,
    choice: RefCell<Choice>,
}

impl Helpers {
    pub fn set(&self, pool: Option<JsValue>, pinned: bool) {
        *self.pool.borrow_mut() = pool;
        self.choice.borrow_mut().pin(pinned);
    }

    /// Parts computed by the helpers, and parts they failed to compute.
    pub fn counts(&self) -> (u64, u64) {
        (self.helped.get(), self.missed.get())
    }

    /// The parts to compute the next batch in, of the `lent` cores: all of them or one,
    /// whichever the measurements say is faster for this model.
    pub fn parts(&self, lent: u32) -> u32 {
        self.choice.borrow_mut().parts(lent)
    }

    /// The cores in use now.
    pub fn using(&self) -> u32 {
        self.choice.borrow().using()
    }

    /// Computes the job the core is waiting for, if any, and completes it; returns what
    /// the core answers (a gradient's frames, or nothing after an inner step).
    pub async fn run(&self, core: &mut WorkerCore) -> Result<Vec<Vec<u8>>, String> {
        let Some(job) = core.job() else {
            return Ok(Vec::new());
        };
        let parts = job.parts();
        let started = performance_now();
        if parts.len() == 1 {
            let (loss, grads) = job.run().map_err(|e| e.to_string())?;
            let samples = job.labels.len();
            drop(job);
            let frames = core.complete(loss, grads).map_err(|e| e.to_string());
            let ms = performance_now() - started;
            self.choice.borrow_mut().measured(1, ms, samples);
            return frames;
        }
        let pool = self.pool.borrow().clone();
        // Posted first, so that the helpers compute while this worker computes part 0.
        let mut posted = Vec::with_capacity(parts.len());
        let spec = job.net.spec().to_string();
        for (i, &part) in parts.iter().enumerate().skip(1) {
            let promise = pool
                .as_ref()
                .and_then(|pool| post(pool, i - 1, &job, part, &spec).ok());
            posted.push((part, promise));
        }
        let mut results = vec![job.part(parts[0])];
        for (part, promise) in posted {
            let helped = match promise {
                Some(promise) => {
                    received(JsFuture::from(promise).await, job.net.param_count()).ok()
                }
                None => None,
            };
            // A helper that failed (or none): this worker computes its part, nothing lost.
            let counter = if helped.is_some() {
                &self.helped
            } else {
                &self.missed
            };
            counter.set(counter.get() + 1);
            results.push(match helped {
                Some(result) => Ok(result),
                None => job.part(part),
            });
        }
        let samples = job.labels.len();
        drop(job);
        let (loss, grads) = model::add_parts(results).map_err(|e| e.to_string())?;
        let frames = core.complete(loss, grads).map_err(|e| e.to_string());
        let ms = performance_now() - started;
        self.choice
            .borrow_mut()
            .measured(parts.len() as u32, ms, samples);
        frames
    }
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
}

/// Whether the cores lent make this tab faster: a [`Race`] between one core (way 0) and
/// all of them (way 1), measured afresh when the cores lent change. The first batch each
/// way is not counted (a helper's first also loads its wasm module), and a helper's module
/// runs baseline code until the browser has optimised it (its first phase measured 0.72 ms
/// a sample against 0.30 later, `cnn`), which the early trials catch.
#[derive(Debug, Default)]
pub struct Choice {
    race: Race,
    lent: u32,
}

impl Choice {
    pub fn parts(&mut self, lent: u32) -> u32 {
        if lent != self.lent {
            self.lent = lent;
            self.race.restart();
        }
        if lent <= 1 {
            return lent.max(1);
        }
        match self.race.pick() {
            Way::Second => lent,
            Way::First => 1,
        }
    }

    /// A batch of `samples` took `ms` in `parts` parts.
    pub fn measured(&mut self, parts: u32, ms: f64, samples: usize) {
        let way = if parts > 1 { Way::Second } else { Way::First };
        self.race.measured(way, ms, samples);
    }

    /// The cores used now (1 or the cores lent), for the page.
    pub fn using(&self) -> u32 {
        match self.race.using() {
            Way::First => 1,
            Way::Second => self.lent.max(1),
        }
    }

    fn pin(&mut self, pinned: bool) {
        self.race.pinned = pinned;
    }
}

/// Posts one part to helper `index`; its answer's promise.
fn post(
    pool: &JsValue,
    index: usize,
    job: &Job<'_>,
    part: Part,
    spec: &str,
) -> Result<Promise, JsValue> {
    let (x, labels) = job.rows(part);
    let x = x.as_standard_layout();
    let message = Object::new();
    let set = |key: &str, value: &JsValue| Reflect::set(&message, &key.into(), value);
    set("spec", &spec.into())?;
    // A copy of its own, transferred rather than copied again by postMessage.
    let weights = Float32Array::from(&job.weights[..]);
    set("transfer", &Array::of1(&weights.buffer()))?;
    set("weights", &weights)?;
    set("x", &Float32Array::from(x.as_slice().unwrap_or_default()))?;
    set("labels", &Uint8Array::from(labels))?;
    set("seed", &js_sys::BigInt::from(job.seed).into())?;
    set("start", &(part.start as u32).into())?;
    set("end", &(part.end as u32).into())?;
    set("batch", &(part.batch as u32).into())?;
    let compute: js_sys::Function = Reflect::get(pool, &"compute".into())?.dyn_into()?;
    compute
        .call2(pool, &(index as u32).into(), &message)?
        .dyn_into::<Promise>()
}

/// A helper's answer: its part's loss and gradient of `len` values.
fn received(answer: Result<JsValue, JsValue>, len: usize) -> Result<(f32, Vec<f32>), JsValue> {
    let answer = answer?;
    let loss = Reflect::get(&answer, &"loss".into())?
        .as_f64()
        .ok_or("no loss")?;
    let grads: Float32Array = Reflect::get(&answer, &"grads".into())?.dyn_into()?;
    if grads.length() as usize != len {
        return Err("a part's gradient of the wrong length".into());
    }
    Ok((loss as f32, grads.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::race::{RETRY_EVERY, TRIAL};

    /// Both ways measured first, then the faster, with the slower tried again now and
    /// then; pinned, always every core; a new number of cores starts over.
    #[test]
    fn the_tab_computes_on_whichever_is_faster() {
        let mut choice = Choice::default();
        assert_eq!(choice.parts(1), 1);
        assert_eq!(choice.parts(4), 4, "all cores are measured first");
        // Its first batch is a warm-up (a helper loading its module), not counted.
        choice.measured(4, 800.0, 32);
        assert_eq!(choice.parts(4), 4);
        choice.measured(4, 8.0, 32);
        assert_eq!(choice.parts(4), 1, "then one");
        choice.measured(1, 40.0, 32);
        assert_eq!(choice.parts(4), 1);
        choice.measured(1, 4.0, 32);
        // One core is faster (a small model): used but for short trials of all, often at
        // first (25, 50, 100, 200 batches apart), then every 400 batches.
        let picks: Vec<u32> = (0..4 * RETRY_EVERY)
            .map(|_| {
                let parts = choice.parts(4);
                choice.measured(parts, if parts == 1 { 4.0 } else { 8.0 }, 32);
                parts
            })
            .collect();
        let tried = |batches: &[u32]| batches.iter().filter(|&&p| p == 4).count() as u64;
        assert_eq!(tried(&picks[..RETRY_EVERY as usize]), 5 * TRIAL);
        let steady = tried(&picks[2 * RETRY_EVERY as usize..]);
        assert!(
            (TRIAL..=2 * TRIAL).contains(&steady),
            "{steady} trials in 800 batches"
        );
        assert_eq!(choice.using(), 1);
        // The machine's load changes: all cores become faster, and are chosen (asked
        // outside a trial of the slower way).
        for _ in 0..RETRY_EVERY + RETRY_EVERY / 2 {
            let parts = choice.parts(4);
            choice.measured(parts, if parts == 1 { 4.0 } else { 1.0 }, 32);
        }
        assert_eq!((choice.parts(4), choice.using()), (4, 4));
        choice.pin(true);
        choice.measured(4, 100.0, 32);
        assert_eq!((choice.parts(4), choice.using()), (4, 4));
        choice.pin(false);
        assert_eq!(choice.parts(2), 2, "a new count is measured afresh");
        assert_eq!(choice.race.time(Way::First), None);
    }
}

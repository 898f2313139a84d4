//! A tab's GPU: each batch's gradient computed by WebGPU compute kernels.
//!
//! The kernels are hand-written WGSL (`kernels.wgsl`, and `gpt.wgsl` for what a GPT adds),
//! one a layer's forward and one a gradient backward, and the loss; [`Plan`] says which
//! run, in what order, on which slices of the buffers, built from the network alone.
//! `engine.js` is the WebGPU host: it picks the adapter (a real one by default, a fallback
//! only when asked), keeps the buffers and pipelines, and runs a plan. This file hands it
//! the batch (a GPT's as token ids) and the dropout masks the CPU path would draw, and
//! takes back the gradient.
//!
//! A GPU's sums run in no order the coordinator can reproduce, so its answers say so
//! (`Gradient::parts` 0, `Compute::Unordered`): a plain gradient is checked within
//! rounding (`coordinator-core`'s `verify.rs`; a GPT's tensor by tensor), a GPT's local
//! phase by segments (`checks/challenge.rs`). Such a phase runs here a segment at a time
//! ([`Gpu::segment`]): each step's gradient, then AdamW's step (`adamw.wgsl`), the weights
//! and the moments staying on the GPU, read back only at each commitment
//! (docs/DESIGN.md#a-gpus-local-phase-checked-by-segments).

mod dense;
mod dispatch;
mod gpt_plan;
mod plan;

use std::cell::RefCell;

use js_sys::{Float32Array, Object, Promise, Reflect, Uint32Array};
use model::{Branch, NetSpec, Network, OptimizerKind, Part};
use ndarray::ArrayView2;
use protocol::Round;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use worker_core::Segment;

pub use dispatch::{Dispatch, Plan, TooLarge};

static KERNELS: &str = concat!(include_str!("kernels.wgsl"), include_str!("gpt.wgsl"));
static ADAMW: &str = include_str!("adamw.wgsl");

#[wasm_bindgen(module = "/src/gpu/engine.js")]
extern "C" {
    #[wasm_bindgen(js_name = openGpu)]
    fn open_gpu(allow_fallback: bool) -> Promise;

    type Engine;

    #[wasm_bindgen(constructor, catch)]
    fn new(device: &JsValue, code: &str, adam_code: &str) -> Result<Engine, JsValue>;
    #[wasm_bindgen(method)]
    fn check(this: &Engine) -> Promise;
    #[wasm_bindgen(method, catch)]
    fn prepare(this: &Engine, plan: &JsValue) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn run(
        this: &Engine,
        prepared: &JsValue,
        weights: &[f32],
        x: &[f32],
        labels: &[u32],
        masks: &[f32],
        with_acts: bool,
    ) -> Result<Promise, JsValue>;
    #[allow(clippy::too_many_arguments)]
    #[wasm_bindgen(method, catch)]
    fn segment(
        this: &Engine,
        prepared: &JsValue,
        start: &[f32],
        decay: &[u32],
        x: &[f32],
        labels: &[u32],
        masks: &[f32],
        adam: &[f32],
    ) -> Result<Promise, JsValue>;
    #[wasm_bindgen(method, js_name = kernelTimes)]
    fn kernel_times(this: &Engine, prepared: &JsValue) -> Promise;
    #[wasm_bindgen(method)]
    fn destroy(this: &Engine, prepared: &JsValue);
    #[wasm_bindgen(method)]
    fn close(this: &Engine);
}

/// An open GPU and the buffers of the last model and batch size it ran.
pub struct Gpu {
    engine: Engine,
    /// The adapter, as the page shows it.
    pub name: String,
    /// Whether it is a fallback adapter (software, on the CPU).
    pub fallback: bool,
    prepared: RefCell<Option<Prepared>>,
}

/// A plan's buffers on the GPU (`engine.js`'s handle), and what they were made for.
struct Prepared {
    spec: NetSpec,
    rows: usize,
    /// The dropout layers whose masks a batch uploads, in order.
    dropouts: Vec<usize>,
    /// Where each layer's output starts in the activations ([`Plan::outputs`]).
    outputs: Vec<usize>,
    handle: JsValue,
    /// The phase, and the steps into it, whose state the GPU holds (AdamW's moments and
    /// the weights after a segment), if any; a plain gradient overwrites the weights.
    resident: Option<((Round, u64), u64)>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("name", &self.name).finish()
    }
}

fn why(e: JsValue) -> String {
    e.dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| e.as_string())
        .unwrap_or_else(|| format!("{e:?}"))
}

fn get(object: &JsValue, key: &str) -> JsValue {
    Reflect::get(object, &key.into()).unwrap_or(JsValue::UNDEFINED)
}

impl Gpu {
    /// The GPU to compute on: a real adapter, or a fallback one too if `allow_fallback`.
    /// `Err` says why there is none (no WebGPU, only a fallback adapter, the kernels do not
    /// compile there).
    pub async fn open(allow_fallback: bool) -> Result<Gpu, String> {
        let got = JsFuture::from(open_gpu(allow_fallback))
            .await
            .map_err(why)?;
        if let Some(none) = get(&got, "none").as_string() {
            return Err(none);
        }
        let engine = Engine::new(&get(&got, "device"), KERNELS, ADAMW).map_err(why)?;
        JsFuture::from(engine.check()).await.map_err(why)?;
        Ok(Gpu {
            engine,
            name: get(&got, "name").as_string().unwrap_or_default(),
            fallback: get(&got, "fallback").as_bool().unwrap_or(false),
            prepared: RefCell::new(None),
        })
    }

    /// Gives its buffers and device back; a batch under way fails (and is computed on the
    /// CPU).
    pub fn close(&self) {
        if let Some(prepared) = self.prepared.borrow_mut().take() {
            self.engine.destroy(&prepared.handle);
        }
        self.engine.close();
    }

    /// The buffers for `net` and batches of `rows` (their handle, and the dropout layers
    /// whose masks a batch uploads), made once and kept.
    fn prepared(&self, net: &Network, rows: usize) -> Result<(JsValue, Vec<usize>), String> {
        if let Some(p) = self.prepared.borrow().as_ref() {
            if p.spec == *net.spec() && p.rows == rows {
                return Ok((p.handle.clone(), p.dropouts.clone()));
            }
        }
        let plan = Plan::new(net, rows).map_err(|e| e.to_string())?;
        let object = Object::new();
        let set = |key: &str, value: JsValue| Reflect::set(&object, &key.into(), &value);
        let kernels: js_sys::Array = plan
            .dispatches
            .iter()
            .map(|d| JsValue::from(d.kernel))
            .collect();
        let uniforms: Vec<u32> = plan.dispatches.iter().flat_map(|d| d.p).collect();
        let groups: Vec<u32> = plan
            .dispatches
            .iter()
            .flat_map(|d| {
                let (x, y) = d.groups();
                [x, y]
            })
            .collect();
        for (key, value) in [
            ("rows", JsValue::from(plan.rows as u32)),
            ("labels", JsValue::from(plan.labels as u32)),
            ("params", JsValue::from(plan.params as u32)),
            ("acts", JsValue::from(plan.acts as u32)),
            ("masks", JsValue::from(plan.masks as u32)),
            ("kernels", kernels.into()),
            ("uniforms", Uint32Array::from(&uniforms[..]).into()),
            ("groups", Uint32Array::from(&groups[..]).into()),
        ] {
            set(key, value).map_err(why)?;
        }
        let handle = self.engine.prepare(&object).map_err(why)?;
        let old = self.prepared.replace(Some(Prepared {
            spec: net.spec().clone(),
            rows,
            dropouts: plan.dropouts.clone(),
            outputs: plan.outputs.clone(),
            handle: handle.clone(),
            resident: None,
        }));
        if let Some(old) = old {
            self.engine.destroy(&old.handle);
        }
        Ok((handle, plan.dropouts))
    }

    /// Milliseconds each kernel of the last batch's plan takes, run one dispatch at a time
    /// (a profile, slowest first); empty before a batch.
    pub async fn kernel_times(&self) -> Result<Vec<(String, f64)>, String> {
        let Some(handle) = self.prepared.borrow().as_ref().map(|p| p.handle.clone()) else {
            return Ok(Vec::new());
        };
        let times = JsFuture::from(self.engine.kernel_times(&handle))
            .await
            .map_err(why)?;
        let mut out: Vec<(String, f64)> = js_sys::Object::entries(times.unchecked_ref())
            .iter()
            .filter_map(|pair| {
                let pair: js_sys::Array = pair.dyn_into().ok()?;
                Some((pair.get(0).as_string()?, pair.get(1).as_f64()?))
            })
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(out)
    }

    /// Whether [`Gpu::segment`] takes a phase with `optimizer`: Adam's or AdamW's (the
    /// moments it keeps are theirs).
    pub fn keeps(optimizer: OptimizerKind) -> bool {
        matches!(
            optimizer,
            OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. }
        )
    }

    /// A local phase's next segment taken on the GPU, the weights and the optimizer's
    /// moments staying there from step to step (and from segment to segment of one phase):
    /// each step's loss, and the state after the last (weights, `m`, `v`: what the worker
    /// commits to). Each step's gradient is the one [`Gpu::gradient`] computes; AdamW's
    /// step is the CPU path's, in WGSL (`adamw.wgsl`).
    pub async fn segment(&self, segment: &Segment<'_>) -> Result<(Vec<f32>, Vec<f32>), String> {
        let (lr, beta1, beta2, eps, weight_decay) = match segment.optimizer {
            OptimizerKind::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => (lr, beta1, beta2, eps, 0.0),
            OptimizerKind::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => (lr, beta1, beta2, eps, weight_decay),
            _ => return Err("the GPU keeps Adam's moments only".into()),
        };
        let net = segment.net;
        let rows = segment.batches.first().map_or(0, |(x, _, _)| x.nrows());
        if rows == 0 || segment.batches.iter().any(|(x, _, _)| x.nrows() != rows) {
            return Err("a segment's batches differ in size".into());
        }
        let (prepared, dropouts) = self.prepared(net, rows)?;
        let (mut xs, mut ids, mut masks) = (Vec::new(), Vec::new(), Vec::new());
        for (x, labels, seed) in &segment.batches {
            let (x, l, m) = inputs(net, &dropouts, x.view(), labels, *seed)?;
            xs.extend(x.iter());
            ids.extend(l);
            masks.extend(m);
        }
        // The step's constants, as `model::optim::Adam` computes them (its step count
        // goes on from the phase's steps taken).
        let taken = segment.taken();
        let mut adam = Vec::with_capacity(8 * segment.batches.len());
        for j in 1..=segment.batches.len() as u64 {
            let t = i32::try_from(taken + j).map_err(|_| "a phase too long".to_string())?;
            let (c1, c2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
            adam.extend([
                1.0 - lr * weight_decay,
                lr / c1,
                c2,
                beta1,
                1.0 - beta1,
                beta2,
                1.0 - beta2,
                eps,
            ]);
        }
        let params = net.param_count();
        // The decayed ranges, start and end each (the GPU makes its mask of them once).
        let decay: Vec<u32> = segment
            .decayed
            .iter()
            .flat_map(|r| [r.start as u32, r.end as u32])
            .collect();
        let held = self.prepared.borrow().as_ref().and_then(|p| p.resident)
            == Some((segment.phase, taken));
        let start = if held { Vec::new() } else { segment.start().1 };
        self.forget_state();
        let promise = self
            .engine
            .segment(&prepared, &start, &decay, &xs, &ids, &masks, &adam)
            .map_err(why)?;
        let result = JsFuture::from(promise).await.map_err(why)?;
        let state: Float32Array = get(&result, "state").dyn_into().map_err(why)?;
        let losses: Float32Array = get(&result, "loss").dyn_into().map_err(why)?;
        let (state, losses) = (state.to_vec(), losses.to_vec());
        if state.len() != 3 * params || losses.len() != rows_of(net, rows) * segment.batches.len() {
            return Err("the GPU returned a state of the wrong length".into());
        }
        let end = taken + segment.batches.len() as u64;
        if let Some(p) = self.prepared.borrow_mut().as_mut() {
            if p.handle == prepared {
                p.resident = Some((segment.phase, end));
            }
        }
        let per_step = losses.len() / segment.batches.len();
        let losses = losses
            .chunks(per_step)
            .map(|l| l.iter().fold(0.0f32, |s, &v| s + v) / l.len() as f32)
            .collect();
        Ok((losses, state))
    }

    /// What the GPU holds of a phase's state is no longer known to be so.
    fn forget_state(&self) {
        if let Some(p) = self.prepared.borrow_mut().as_mut() {
            p.resident = None;
        }
    }

    /// The mean loss of a batch and its gradient (full layout; zero for frozen layers), as
    /// `Network::loss_and_grad` computes them, within rounding.
    pub async fn gradient(
        &self,
        net: &Network,
        weights: &[f32],
        x: ArrayView2<'_, f32>,
        labels: &[u8],
        seed: u64,
    ) -> Result<(f32, Vec<f32>), String> {
        let (loss, grads, _) = self.run(net, weights, (x, labels), seed, false).await?;
        Ok((loss, grads))
    }

    /// [`Gpu::gradient`], and the branches its forward pass took at near-ties: the GPU's
    /// activations read back (every layer's output, 3.3 MB a batch of 32 for the `cnn`
    /// preset), their near-ties found as the CPU path finds its own
    /// (`Network::branches_in`): the log of a committed phase's step.
    pub async fn gradient_logged(
        &self,
        net: &Network,
        weights: &[f32],
        x: ArrayView2<'_, f32>,
        labels: &[u8],
        seed: u64,
    ) -> Result<(f32, Vec<f32>, Vec<Branch>), String> {
        let (loss, grads, acts) = self.run(net, weights, (x, labels), seed, true).await?;
        let acts = acts.ok_or("the GPU returned no activations")?;
        let outputs = self
            .prepared
            .borrow()
            .as_ref()
            .map(|p| p.outputs.clone())
            .unwrap_or_default();
        let rows = x.nrows();
        let x = ndarray::ArrayView2::from_shape((rows, net.inputs()), &acts[..rows * net.inputs()])
            .map_err(|e| e.to_string())?;
        let mut outs = Vec::with_capacity(outputs.len());
        for (stage, &at) in net.stages().iter().zip(&outputs) {
            let len = stage.output.len();
            let values = acts
                .get(at..at + rows * len)
                .ok_or("activations out of range")?;
            outs.push(
                ndarray::Array2::from_shape_vec((rows, len), values.to_vec())
                    .map_err(|e| e.to_string())?,
            );
        }
        let branches = net.branches_in(x, &outs).map_err(|e| e.to_string())?;
        Ok((loss, grads, branches))
    }

    /// One batch on the GPU: its loss, gradient and, if asked, every activation.
    async fn run(
        &self,
        net: &Network,
        weights: &[f32],
        (x, labels): (ArrayView2<'_, f32>, &[u8]),
        seed: u64,
        with_acts: bool,
    ) -> Result<(f32, Vec<f32>, Option<Vec<f32>>), String> {
        let rows = x.nrows();
        if rows == 0 || labels.len() != rows || weights.len() != net.param_count() {
            return Err("a batch the model does not fit".into());
        }
        let (prepared, dropouts) = self.prepared(net, rows)?;
        self.forget_state();
        let (x, labels, masks) = inputs(net, &dropouts, x, labels, seed)?;
        let promise = self
            .engine
            .run(
                &prepared,
                weights,
                x.as_slice().unwrap_or_default(),
                &labels,
                &masks,
                with_acts,
            )
            .map_err(why)?;
        let result = JsFuture::from(promise).await.map_err(why)?;
        let grads: Float32Array = get(&result, "grads").dyn_into().map_err(why)?;
        let losses: Float32Array = get(&result, "loss").dyn_into().map_err(why)?;
        if grads.length() as usize != net.param_count() {
            return Err("the GPU returned a gradient of the wrong length".into());
        }
        let grads = grads.to_vec();
        // The CPU path's loss: the rows' sum (a GPT's: its positions'), over their number.
        let losses = losses.to_vec();
        let loss = losses.iter().fold(0.0f32, |s, &l| s + l) / losses.len() as f32;
        if !grads.iter().all(|g| g.is_finite()) {
            return Err("the GPU computed values that are not finite".into());
        }
        let acts = match with_acts {
            true => Some(
                get(&result, "acts")
                    .dyn_into::<Float32Array>()
                    .map_err(why)?
                    .to_vec(),
            ),
            false => None,
        };
        Ok((loss, grads, acts))
    }
}

/// A batch's rows, labels (a GPT's token ids) and dropout masks, as the GPU reads them.
type Inputs = (ndarray::Array2<f32>, Vec<u32>, Vec<f32>);

/// A batch as the plan reads it: a chain's rows and labels (and its dropout layers'
/// masks, as the CPU path draws them), or a GPT's windows as token ids (each position's
/// target, then its token) with no rows.
fn inputs(
    net: &Network,
    dropouts: &[usize],
    x: ArrayView2<'_, f32>,
    labels: &[u8],
    seed: u64,
) -> Result<Inputs, String> {
    let rows = x.nrows();
    let mut masks = Vec::new();
    for &layer in dropouts {
        masks.extend(
            net.dropout_mask(layer, seed, Part::whole(rows))
                .unwrap_or_default(),
        );
    }
    Ok(match net.as_gpt() {
        Some(gpt) => {
            let (tokens, targets) = gpt.tokens(x, true).map_err(|e| e.to_string())?;
            let ids = targets.iter().chain(&tokens).map(|&id| id as u32);
            (ndarray::Array2::zeros((0, 0)), ids.collect(), masks)
        }
        None => (
            x.as_standard_layout().into_owned(),
            labels.iter().map(|&l| u32::from(l)).collect(),
            masks,
        ),
    })
}

/// The loss's rows for a batch of `samples`: a GPT's positions, else its samples.
fn rows_of(net: &Network, samples: usize) -> usize {
    net.as_gpt()
        .map_or(samples, |gpt| samples * gpt.spec().context)
}

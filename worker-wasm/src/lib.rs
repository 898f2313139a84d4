//! The browser worker: a thin `#[wasm_bindgen]` shell around the shared worker core.
//!
//! `web/worker.js` runs this in a Web Worker, so training never blocks the page. All training
//! decisions are `worker_core::WorkerCore`'s, the same code the native worker runs; this crate
//! only owns the WebSocket ([`transport`]) and the reconnect loop ([`worker`]).
//!
//! JavaScript surface (kept small on purpose):
//! ```js
//! const w = new BrowserWorker("ws://host/ws", event => postMessage(event), savedToken, "f16");
//! w.start();   // connect and train; reconnects with backoff until stopped
//! w.stop();    // leave the swarm (closes the socket)
//! ```

mod cores;
pub mod gpu;
mod race;
mod transport;
mod worker;

pub use cores::PartWorker;

use std::rc::Rc;

use wasm_bindgen::prelude::*;

/// A training worker bound to one coordinator URL.
#[wasm_bindgen]
pub struct BrowserWorker {
    inner: Rc<worker::Inner>,
}

#[wasm_bindgen]
impl BrowserWorker {
    /// `on_event` receives plain objects: `{ state, workerId, round, gradients, loss,
    /// samplesPerSec, shardLen, resumeToken, message, retryInMs, refused }` (fields present when
    /// known). `resume_token`, from an earlier `resumeToken` event, keeps the identity across
    /// a page reload (the page keeps it in sessionStorage). `compression` is `"f16"`,
    /// `"int8"`, `"int4"` or `"int2"` (answers only; weights come as int8) or anything else for none
    /// (exact `f32`). `join_token` is the run's invitation
    /// (the page takes it from the link's `#token=`); refused without a valid one, the
    /// worker says so (`state: "error"`) and stops instead of retrying.
    #[wasm_bindgen(constructor)]
    pub fn new(
        url: String,
        on_event: js_sys::Function,
        resume_token: Option<String>,
        compression: Option<String>,
        join_token: Option<String>,
    ) -> BrowserWorker {
        // Panics reach the console with their message instead of "unreachable".
        console_error_panic_hook::set_once();
        BrowserWorker {
            inner: Rc::new(worker::Inner::new(
                url,
                on_event,
                resume_token,
                join_token.filter(|t| !t.is_empty()),
                compression
                    .as_deref()
                    .and_then(protocol::Compression::from_name)
                    .unwrap_or_default(),
            )),
        }
    }

    /// Starts (or resumes) training. Does nothing if already running.
    pub fn start(&self) {
        worker::start(&self.inner);
    }

    /// Trains `percent` % of the time (clamped to 10-100): after each gradient it idles for
    /// the rest, so the tab uses about that share of one core. `samplesPerSec` counts the
    /// idle time too.
    pub fn set_cpu(&self, percent: u32) {
        self.inner.set_cpu(percent);
    }

    /// Computes on `cores` cores (1-64): this Web Worker and `cores − 1` helpers that
    /// `pool` runs, an object with `compute(index, message) → Promise<{loss, grads}>`
    /// (`web/worker.js`). Each batch is split into that many parts, and the tab is still
    /// one worker to the coordinator. Takes effect from the next batch (a local phase
    /// under way keeps its parts). Unless `pinned`, the tab times batches on one core and
    /// on all of them and computes on whichever is faster for the model.
    pub fn set_cores(&self, cores: u32, pool: JsValue, pinned: bool) {
        let pool = (!pool.is_undefined() && !pool.is_null()).then_some(pool);
        self.inner.set_cores(cores, pool, pinned);
    }

    /// Computes on the GPU from the next batch, if the browser has a real one and it is
    /// faster than the CPU for this model (timed; `gpuUsed` in the events says), or, with
    /// `allow_fallback`, on whatever adapter it has, a fallback one included (software, on
    /// the CPU), always. Resolves to what it computes on, as the page shows it (`"GPU:
    /// <adapter>"`, or `"CPU: <why not the GPU>"`). Local phases stay on the CPU (see
    /// `gpu`).
    pub async fn use_gpu(&self, allow_fallback: bool) -> String {
        let inner = Rc::clone(&self.inner);
        match gpu::Gpu::open(allow_fallback).await {
            Ok(gpu) => {
                let name = format!(
                    "GPU: {}{}",
                    gpu.name,
                    if gpu.fallback { " (fallback)" } else { "" }
                );
                // A volunteer who asked for a software GPU gets it; a real one is used while
                // it is faster than the CPU for this model (measured, as cores are).
                inner.set_gpu(Some(gpu), allow_fallback);
                name
            }
            Err(why) => {
                inner.set_gpu(None, false);
                format!("CPU: {why}")
            }
        }
    }

    /// Computes on the CPU from the next batch, and gives the GPU back.
    pub fn stop_gpu(&self) {
        self.inner.set_gpu(None, false);
    }

    /// Where to connect from now on, comma-separated: the page's own coordinator first, then
    /// the other edges of its cluster (from `/api/status`). A connection that fails moves on
    /// to the next.
    pub fn set_urls(&self, urls: String) {
        let urls = urls
            .split(',')
            .map(str::trim)
            .filter(|u| u.starts_with("ws://") || u.starts_with("wss://"))
            .map(String::from)
            .collect();
        self.inner.set_urls(urls);
    }

    /// Stops training and leaves the swarm. `start` resumes.
    pub fn stop(&self) {
        worker::stop(&self.inner);
    }
}

impl std::fmt::Debug for BrowserWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrowserWorker").finish_non_exhaustive()
    }
}

//! The crowdtrain coordinator: the rank-0 parameter server.
//!
//! It owns the model's parameters and the optimizer, serves the volunteer page and the wasm
//! worker, and runs training rounds over WebSockets: broadcast the weights of round `r`,
//! check each worker's gradient as it arrives (shape, finiteness, norm bound, sampled
//! recomputation), combine them robustly, step the optimizer, broadcast round `r + 1`.
//!
//! # Layout, by layer
//! - [`edge`]: everything that faces a client: the routes, admission, the WebSocket, one
//!   session task per worker that only moves bytes (and hands gradient chunks to the core's
//!   checks), upload slots, rate limits, TLS, and the views (the page, the admin API, SSE,
//!   `/metrics`).
//! - [`coordinator`]: the driver, the single task that owns the training state: the sans-IO
//!   core of the `coordinator-core` crate, fed events and deadlines, its outputs carried out.
//! - [`storage`]: checkpoints (their own file format, atomic writes on their own thread) and
//!   safetensors files.
//! - [`config`]: flags, file and environment into one validated `Config`; [`dataset`]: CSV,
//!   IDX and image folders into the core's data.
//! - [`server`]: wiring, `start(listener, config, shutdown)`; [`shutdown`]: Ctrl-C and
//!   SIGTERM; [`allocator`]: one malloc arena.

pub mod allocator;
pub mod cluster;
pub mod config;
pub mod coordinator;
pub mod dataset;
pub mod edge;
pub mod server;
pub mod shutdown;
pub mod storage;

pub use config::{Cli, Config, ConfigError};
// The edge's and storage's modules at the crate's root too, as tests and tools name them.
pub use coordinator_core::schedule::deadline;
pub use coordinator_core::{aggregate, refusal, status};
pub use edge::{
    admin, admission, assets, events, exposition, rate, routes, session, socket, tls, upload,
};
pub use server::{run, start, RunningServer, ServerError, Summary};
pub use status::Status;
pub use storage::{checkpoint, tensors_file};

#[cfg(test)]
mod reference_tests;

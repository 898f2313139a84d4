//! The crowdtrain coordinator: the rank-0 parameter server.
//!
//! It owns the model's parameters and the optimizer, serves the volunteer page and the wasm
//! worker, and runs training rounds over WebSockets: broadcast the weights of round `r`,
//! check each worker's gradient as it arrives (shape, finiteness, norm bound, sampled
//! recomputation), combine them robustly, step the optimizer, broadcast round `r + 1`.
//!
//! # Layout, in the order a gradient meets them
//! - [`routes`]: the axum router (`/ws`, `/api/*`, `/healthz`, the page via [`assets`]);
//!   [`admission`] decides at the upgrade (origin, connections per address).
//! - [`session`]: one task per WebSocket: decode, validate, forward, within the [`rate`]
//!   limits; [`refusal`] is what it (and everything after it) answers with.
//! - [`coordinator`]: the driver, the single task that owns the training state: the
//!   sans-IO core of the `coordinator-core` crate (registry, schedules, checks, trainer,
//!   metrics), fed events and deadlines, its outputs carried out.
//! - [`tensors_file`]: safetensors files (`/api/params`, checkpoints, export).
//! - [`config`]: the CLI and its validated form; [`dataset`]: the embedded MNIST split.
//! - [`server`]: wiring, `start(listener, config, shutdown)`; [`tls`]: https/wss with
//!   rustls; [`shutdown`]: Ctrl-C / SIGTERM.

pub mod admin;
pub mod admission;
pub mod allocator;
pub mod assets;
pub mod checkpoint;
pub mod config;
pub mod coordinator;
pub mod dataset;
pub mod events;
pub mod exposition;
pub mod rate;
pub mod routes;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod socket;
pub mod tensors_file;
pub mod tls;
pub mod upload;

pub use config::{Cli, Config, ConfigError};
pub use coordinator_core::schedule::deadline;
pub use coordinator_core::{aggregate, refusal, status};
pub use server::{run, start, RunningServer, ServerError, Summary};
pub use status::Status;

#[cfg(test)]
mod reference_tests;

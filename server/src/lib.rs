//! The crowdtrain coordinator: the rank-0 parameter server.
//!
//! It owns the model's parameters and the optimizer, serves the volunteer page and the wasm
//! worker, and runs synchronous training rounds over WebSockets: broadcast the weights of
//! round `r`, accumulate each worker's gradient as it arrives, average (weighted by samples),
//! step the optimizer, broadcast round `r + 1`.
//!
//! # Layout
//! - [`config`]: the CLI (`Cli`, clap) and its validated form (`Config`).
//! - [`dataset`]: the embedded MNIST digits and their seeded train/test split.
//! - [`round`]: the sans-IO round state machine (who must answer, deadline, quorum).
//! - [`deadline`]: fixed or adaptive round timeouts.
//! - [`aggregate`]: the `Aggregator` strategy a round combines gradients with.
//! - [`coordinator`]: the single task that owns the training state, and its handle.
//! - [`session`]: one task per WebSocket: decode, validate, forward.
//! - [`routes`]: the axum router (`/ws`, `/api/*`, `/healthz`, static files).
//! - [`status`]: what `/api/status` reports, published on a watch channel.
//! - [`safetensors`]: `/api/params` encoding.
//! - [`shutdown`]: Ctrl-C / SIGTERM.
//! - [`server`]: wiring: `start(listener, config, shutdown)`.

pub mod admission;
pub mod aggregate;
pub mod assets;
pub mod config;
pub mod coordinator;
pub mod dataset;
pub mod deadline;
pub mod refusal;
pub mod round;
pub mod routes;
pub mod safetensors;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod status;

pub use config::{Cli, Config, ConfigError};
pub use server::{run, start, RunningServer, ServerError, Summary};
pub use status::Status;

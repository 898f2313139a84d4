//! The crowdtrain coordinator's logic, with no I/O, no threads and no clock: the rank-0
//! parameter server as a state machine (quinn-proto's shape). A driver feeds it what
//! happened, with the time; it answers with what to do.
//!
//! # Layout
//! - [`Coordinator`] (`coordinator.rs`): the one owner of the training state, its outputs
//!   and its publishing. Each input has its file in `inputs/`: `join`, `gradient`, `leave`
//!   (and `unreachable`, `rejected`); the operator's commands are [`admin`], an evaluation's
//!   result `update` (with what applying an update means), a round deadline
//!   [`Coordinator::handle_timeout`].
//! - [`io`]: the sessions, frames and outputs the driver moves; [`settings`]: the run's
//!   settings; [`data`]: the splits it trains on.
//! - [`schedule`]: when gradients become an update (sync rounds with deadlines and quorum,
//!   async, hogwild); [`aggregate`]: how they are combined.
//! - [`local`]: `--local-steps`, each worker's next phase and how answers of different
//!   lengths weigh.
//! - [`checks`]: what a gradient must pass (recomputation, replicas, the norm bound).
//! - [`registry`]: who is connected, who they are, what they hold, who may not come back.
//! - `trainer`: the parameters, the optimizer, the encoded weights; [`evaluation`]: scoring
//!   off the coordinator's thread; [`checkpoint`]: the copy a restart needs.
//! - [`metrics`] and [`status`]: counters, and what is published; [`history`]: one point
//!   per update; [`refusal`]: what a refused input is answered with.
//! - [`upload`]: what a session checks in a gradient's chunks before the coordinator sees it.

pub mod admin;
pub mod aggregate;
pub mod broadcast;
mod checked;
pub mod checkpoint;
pub mod checks;
mod coordinator;
pub mod counters;
pub mod data;
pub mod evaluation;
pub mod history;
mod inputs;
pub mod io;
pub mod language;
pub mod local;
pub mod metrics;
pub mod noise;
pub mod partial;
pub mod plateau;
mod publish;
pub mod refusal;
pub mod registry;
pub mod remote;
pub mod root;
pub mod schedule;
pub mod session;
pub mod settings;
pub mod snapshot;
pub mod status;
mod trainer;
mod update;
pub mod upload;

pub use admin::{Command, Patch};
pub use checkpoint::Snapshot;
pub use checks::recompute::{RecomputeJob, Recomputed};
pub use coordinator::Coordinator;
pub use data::Data;
pub use evaluation::{EvalJob, Evaluated};
pub use io::{Frames, Joined, Observation, Outbound, Outcome, Output, SessionId, WeightsSnapshot};
pub use language::{Sample, Vocabulary};
pub use local::{Local, LocalSteps};
pub use refusal::Refusal;
pub use settings::{Mode, Settings};
pub use status::Status;

#[cfg(test)]
mod challenge_tests;
#[cfg(test)]
mod local_tests;
#[cfg(test)]
mod tests;

//! crowdtrain in virtual time: the real coordinator core (`coordinator-core`) and N real
//! worker cores (`worker-core`), every frame through the real codec and the session's real
//! checks, over simulated links, with no sockets, threads or clock. Deterministic: the same
//! [`Scenario`] gives the same [`Report`].
//!
//! Each simulated worker has its own [`Link`] (latency, bandwidth and jitter each way), its
//! own speed (virtual time per gradient), its churn (leave, freeze, reconnect, rejoin at
//! chosen times) and its [`Behaviour`] (honest, or one of the attacks the tests use). The
//! [`Report`] gives what a run came to in virtual time: rounds, samples per second, time to
//! a target accuracy, each worker's compute share of its connected time, bytes per sample.
//!
//! Files: [`link`] (pipes and what the wire carries), [`scenario`] (what a run is),
//! `engine` (the event loop), [`report`].

mod engine;
pub mod link;
pub mod report;
pub mod scenario;

pub use engine::{run, run_measured};
pub use link::{Link, Way};
pub use report::{Point, Report, WorkerReport};
pub use scenario::{measured_step, Behaviour, Churn, Scenario, Until, WorkerSpec};

#[cfg(test)]
mod gpt_tests;
#[cfg(test)]
mod local_tests;
#[cfg(test)]
mod survey_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod trust_tests;

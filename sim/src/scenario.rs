//! What a simulation runs: the coordinator's settings, its model and data, and each
//! simulated worker's link, speed, comings and goings, and behaviour.

use std::time::Duration;

use coordinator_core::{Data, Settings};
use model::Network;
use protocol::Compression;

use crate::link::Link;

/// One simulated run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub settings: Settings,
    pub net: Network,
    pub data: Data,
    pub workers: Vec<WorkerSpec>,
    /// Jitter draws and hostile noise come from it: the same seed gives the same run.
    pub seed: u64,
    /// Stops at the first of these.
    pub until: Until,
    /// Virtual time an evaluation of the test split takes (it runs beside training).
    pub evaluation_time: Duration,
    /// Virtual time the coordinator takes to recompute one step of an answer (a phase of H
    /// steps: H times it), on each of its `verify_cores`.
    pub recompute_step: Duration,
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Until {
    /// Virtual time.
    pub time: Duration,
    /// An evaluation at or above this accuracy.
    pub accuracy: Option<f64>,
    /// Updates applied.
    pub rounds: Option<u64>,
}

impl Default for Until {
    fn default() -> Self {
        Self {
            time: Duration::from_secs(3600),
            accuracy: None,
            rounds: None,
        }
    }
}

/// One simulated worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub link: Link,
    /// Virtual time one gradient takes (the batch, forward and backward).
    pub step: Duration,
    pub compression: Compression,
    /// When it first connects.
    pub joins_at: Duration,
    /// What happens to it, at what time.
    pub churn: Vec<(Duration, Churn)>,
    pub behaviour: Behaviour,
    /// Banned, it comes back at once under a fresh identity (no token) from a fresh
    /// address of its group's network (10.200.0.0/24, then the next /24s); refused for
    /// too many new identities, it tries again a minute later.
    pub comes_back: bool,
    /// An attacker who knows about probation: under each new identity, and after each
    /// answer refused as a mismatch, it answers honestly this many times before it attacks
    /// again.
    pub lies_low: u32,
}

impl WorkerSpec {
    /// An honest worker from the start, on `link`, taking `step` a gradient, exact f32.
    pub fn new(link: Link, step: Duration) -> Self {
        Self {
            link,
            step,
            compression: Compression::None,
            joins_at: Duration::ZERO,
            churn: Vec::new(),
            behaviour: Behaviour::Honest,
            comes_back: false,
            lies_low: 0,
        }
    }

    /// Honest for `n` answers under each new identity and after each mismatch.
    pub fn lying_low(mut self, n: u32) -> Self {
        self.lies_low = n;
        self
    }

    /// Banned, it comes back under a fresh identity (see `comes_back`).
    pub fn coming_back_fresh(mut self) -> Self {
        self.comes_back = true;
        self
    }

    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    pub fn joining_at(mut self, at: Duration) -> Self {
        self.joins_at = at;
        self
    }

    pub fn with_churn(mut self, at: Duration, churn: Churn) -> Self {
        self.churn.push((at, churn));
        self
    }

    pub fn behaving(mut self, behaviour: Behaviour) -> Self {
        self.behaviour = behaviour;
        self
    }
}

/// A worker's comings and goings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Churn {
    /// The tab closes: its connection ends, it does not come back.
    Leave,
    /// It stops answering for this long (a frozen tab), connected all the while.
    Freeze(Duration),
    /// Its connection drops and it comes back at once with its resume token.
    Reconnect,
    /// It connects again, with its token, if it had left.
    Rejoin,
}

/// What a worker sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Behaviour {
    Honest,
    /// Its honest gradient times this factor (1.01: a subtle cheat; -10: a sign flip).
    Scaled(f32),
    /// Gaussian noise of this standard deviation instead of its gradient.
    Noise(f32),
    /// Zeros instead of its gradient.
    Zeros,
    /// Every value 3e38: finite, but its square (and a sum of a few) overflows f32.
    Huge,
    /// Its gradient on another batch than the one its `Task` names.
    WrongBatch,
    /// "A Little Is Enough" (Baruch et al., 2019), colluding: every worker of the scenario
    /// that behaves so computes its honest answer, the group pools them, and each sends the
    /// per-value mean minus this many standard deviations of the pool.
    Alie(f32),
}

/// The time one gradient (a batch of `batch`, forward and backward) takes here with the real
/// model code: the median of 30, after 5 to warm up. For a worker as fast as this machine.
pub fn measured_step(
    net: &Network,
    train: &model::Dataset,
    batch: usize,
) -> Result<Duration, model::ModelError> {
    let params = net.init(1);
    let (x, labels) = train.batch(0..batch.clamp(1, train.len()));
    let mut times = Vec::with_capacity(30);
    for i in 0..35 {
        let started = std::time::Instant::now();
        net.loss_and_grad(&params, x.view(), &labels, i)?;
        if i >= 5 {
            times.push(started.elapsed());
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

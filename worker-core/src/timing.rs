//! How a worker measures the time it spends computing: its transport's clock, or, for a
//! simulated worker, a fixed cost per step. The core itself has no clock (it also runs in
//! the simulator, in virtual time).

/// The time spent computing, in microseconds.
#[derive(Default)]
pub enum ComputeClock {
    /// Not measured: every answer reports 0.
    #[default]
    None,
    /// A monotonic clock in microseconds (`Instant` natively, `performance.now()` in a tab).
    Clock(Box<dyn FnMut() -> u64 + Send>),
    /// Each step costs this many microseconds (a simulated worker of a given speed).
    PerStep(u64),
}

impl std::fmt::Debug for ComputeClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Clock(_) => f.write_str("Clock"),
            Self::PerStep(us) => write!(f, "PerStep({us})"),
        }
    }
}

impl ComputeClock {
    /// A reading at the start of some computation.
    pub(crate) fn start(&mut self) -> u64 {
        match self {
            Self::Clock(now) => now(),
            Self::None | Self::PerStep(_) => 0,
        }
    }

    /// Microseconds since `started`, for a computation of `steps` steps.
    pub(crate) fn elapsed(&mut self, started: u64, steps: u64) -> u64 {
        match self {
            Self::None => 0,
            Self::Clock(now) => now().saturating_sub(started),
            Self::PerStep(us) => us.saturating_mul(steps),
        }
    }
}

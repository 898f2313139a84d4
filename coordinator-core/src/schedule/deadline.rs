//! How long a synchronous round waits: fixed, or adapted to how fast workers really answer.
//!
//! Pure: it is fed answer latencies and asked for the next timeout, no clock inside.

use std::collections::VecDeque;
use std::time::Duration;

/// `--round-timeout`: seconds, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RoundTimeout {
    Fixed(Duration),
    Auto,
}

/// Until this many answers were seen, `auto` uses `AUTO_INITIAL`.
const AUTO_WARMUP: usize = 8;
const AUTO_INITIAL: Duration = Duration::from_secs(5);
/// `auto` = p90 of recent answer latencies × 1.5, clamped to this range: the floor keeps a
/// fast swarm from dropping an honest worker over scheduling noise, the ceiling bounds how
/// long a frozen tab can hold a round.
pub const AUTO_MIN: Duration = Duration::from_millis(250);
pub const AUTO_MAX: Duration = Duration::from_secs(60);
/// Answer latencies remembered (a few rounds' worth).
const HISTORY: usize = 256;

#[derive(Debug, Clone)]
pub struct DeadlinePolicy {
    timeout: RoundTimeout,
    recent: VecDeque<Duration>,
}

impl DeadlinePolicy {
    pub fn new(timeout: RoundTimeout) -> Self {
        Self {
            timeout,
            recent: VecDeque::with_capacity(HISTORY),
        }
    }

    /// The answer latencies remembered, oldest first (for a checkpoint).
    pub fn history(&self) -> Vec<Duration> {
        self.recent.iter().copied().collect()
    }

    /// Continues from a checkpoint's latencies (the newest `HISTORY`).
    pub fn restore(&mut self, latencies: &[Duration]) {
        let start = latencies.len().saturating_sub(HISTORY);
        self.recent = latencies[start..].iter().copied().collect();
    }

    /// Records how long after the round opened a worker's gradient arrived.
    pub fn record(&mut self, latency: Duration) {
        if self.recent.len() == HISTORY {
            self.recent.pop_front();
        }
        self.recent.push_back(latency);
    }

    /// The timeout for the next round (and for each extension of it).
    /// The timeout, and under `Auto` at least 1.5 × `expected` (the slowest local phase
    /// expected in the round, which may exceed `AUTO_MAX`: its length is bounded by
    /// `--max-local-steps`).
    pub fn timeout_at_least(&self, expected: Option<Duration>) -> Duration {
        let timeout = self.timeout();
        match (self.timeout, expected) {
            (RoundTimeout::Auto, Some(expected)) => timeout.max(expected * 3 / 2),
            _ => timeout,
        }
    }

    pub fn timeout(&self) -> Duration {
        match self.timeout {
            RoundTimeout::Fixed(d) => d,
            RoundTimeout::Auto if self.recent.len() < AUTO_WARMUP => AUTO_INITIAL,
            RoundTimeout::Auto => {
                let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
                sorted.sort_unstable();
                let p90 = sorted[(sorted.len() * 9 / 10).min(sorted.len() - 1)];
                (p90 * 3 / 2).clamp(AUTO_MIN, AUTO_MAX)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_is_fixed() {
        let mut p = DeadlinePolicy::new(RoundTimeout::Fixed(Duration::from_millis(700)));
        p.record(Duration::from_secs(9));
        assert_eq!(p.timeout(), Duration::from_millis(700));
    }

    #[test]
    fn auto_waits_for_the_longest_expected_local_phase_and_fixed_does_not() {
        let mut p = DeadlinePolicy::new(RoundTimeout::Auto);
        for _ in 0..50 {
            p.record(Duration::from_millis(100));
        }
        assert_eq!(p.timeout_at_least(None), Duration::from_millis(250));
        let long = Some(Duration::from_secs(80));
        assert_eq!(p.timeout_at_least(long), Duration::from_secs(120));
        let fixed = DeadlinePolicy::new(RoundTimeout::Fixed(Duration::from_secs(2)));
        assert_eq!(fixed.timeout_at_least(long), Duration::from_secs(2));
    }

    #[test]
    fn auto_is_p90_times_1_5_clamped() {
        let mut p = DeadlinePolicy::new(RoundTimeout::Auto);
        assert_eq!(p.timeout(), AUTO_INITIAL);
        for ms in 1..=100 {
            p.record(Duration::from_millis(ms * 10)); // 10 ms .. 1000 ms
        }
        // p90 of 10..=1000 step 10 is 910 ms; × 1.5 = 1365 ms.
        assert_eq!(p.timeout(), Duration::from_millis(1365));
        let mut fast = DeadlinePolicy::new(RoundTimeout::Auto);
        for _ in 0..50 {
            fast.record(Duration::from_millis(2));
        }
        assert_eq!(fast.timeout(), AUTO_MIN);
        let mut slow = DeadlinePolicy::new(RoundTimeout::Auto);
        for _ in 0..50 {
            slow.record(Duration::from_secs(100));
        }
        assert_eq!(slow.timeout(), AUTO_MAX);
    }

    #[test]
    fn history_is_bounded_and_recent_wins() {
        let mut p = DeadlinePolicy::new(RoundTimeout::Auto);
        for _ in 0..1000 {
            p.record(Duration::from_secs(30));
        }
        for _ in 0..HISTORY {
            p.record(Duration::from_millis(400));
        }
        assert_eq!(p.recent.len(), HISTORY);
        assert_eq!(p.timeout(), Duration::from_millis(600));
    }
}

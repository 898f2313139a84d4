//! Per-connection rate limits, sans-IO (time is passed in).
//!
//! Gradients are paced by the coordinator itself (a connection may not answer more `Weights`
//! than it was sent, see `session::GRADIENT_SLACK`), so these cover the rest:
//! - **control frames** (Ping, Pong), which a WebSocket stack answers by itself: at most
//!   [`CONTROL_BURST`] at once and [`CONTROL_PER_SEC`] a second, or the session is closed;
//! - **bytes**, with `--max-upload-rate`: over it the session stops reading until the budget
//!   refills, so TCP slows the sender down; nobody is closed for being fast.

use std::time::{Duration, Instant};

/// Control frames a connection may send at once. An honest worker sends one Pong per Ping
/// (one every `--ping-interval`); browsers and the native worker send no Pings of their own.
pub const CONTROL_BURST: f64 = 16.0;
/// Control frames a second, sustained.
pub const CONTROL_PER_SEC: f64 = 4.0;

/// A token bucket: `capacity` tokens, refilled at `per_sec`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    per_sec: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(capacity: f64, per_sec: f64, now: Instant) -> Self {
        Self {
            capacity,
            per_sec,
            tokens: capacity,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.capacity);
        self.at = self.at.max(now);
    }

    /// Takes `n` tokens if there are that many.
    pub fn try_take(&mut self, n: f64, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    /// Takes `n` tokens, going into debt if need be (a frame already read cannot be
    /// refused its bytes). Returns when the bucket is out of debt, if it is in debt.
    pub fn take(&mut self, n: f64, now: Instant) -> Option<Instant> {
        self.refill(now);
        self.tokens -= n;
        if self.tokens >= 0.0 {
            return None;
        }
        Some(now + Duration::from_secs_f64(-self.tokens / self.per_sec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(CONTROL_BURST, CONTROL_PER_SEC, t0);
        for i in 0..16 {
            assert!(b.try_take(1.0, t0), "burst frame {i}");
        }
        assert!(!b.try_take(1.0, t0), "the 17th at once");
        // A quarter second later, one more token (4 a second).
        assert!(!b.try_take(1.0, t0 + Duration::from_millis(240)));
        assert!(b.try_take(1.0, t0 + Duration::from_millis(250)));
        // A long silence refills to the burst, not beyond.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..16 {
            assert!(b.try_take(1.0, later));
        }
        assert!(!b.try_take(1.0, later));
    }

    #[test]
    fn debt_says_when_reading_may_resume() {
        let t0 = Instant::now();
        // 1,000 bytes/s, 500 of burst.
        let mut b = TokenBucket::new(500.0, 1000.0, t0);
        assert_eq!(b.take(400.0, t0), None);
        // 100 left; taking 600 leaves a debt of 500 bytes: half a second.
        assert_eq!(b.take(600.0, t0), Some(t0 + Duration::from_millis(500)));
        // At that moment the debt is paid and a small frame fits again... after its own debt.
        let paid = t0 + Duration::from_millis(500);
        assert_eq!(b.take(0.0, paid), None);
        assert_eq!(b.take(100.0, paid), Some(paid + Duration::from_millis(100)));
        // Time going backwards (it cannot, but a caller might pass an older instant) adds
        // no tokens.
        assert!(!b.try_take(1.0, t0));
    }
}

//! A link between a worker and the coordinator: one [`Pipe`] each way, each with its own
//! latency, bandwidth and jitter.
//!
//! A pipe is a FIFO: a frame starts when the one before it has finished (or when it is
//! sent, if later), takes `bytes / bandwidth` to go through, and arrives `latency` (plus a
//! draw of jitter) after that, never before the frame ahead of it. What goes through is the
//! frame plus what carries it: its WebSocket header (2 to 14 bytes, a client's masked) and,
//! for every 1,448 bytes of TCP segment, 52 bytes of TCP/IP headers.

use std::time::Duration;

use model::SplitMix64;

/// One direction of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Way {
    /// One-way delay.
    pub latency: Duration,
    /// Bytes a second; infinite: no limit.
    pub bandwidth: f64,
    /// Each frame's delay varies by up to this much more (uniformly).
    pub jitter: Duration,
}

impl Way {
    pub const LOOPBACK: Self = Self {
        latency: Duration::ZERO,
        bandwidth: f64::INFINITY,
        jitter: Duration::ZERO,
    };

    /// `latency` one way, `megabits` Mbit/s.
    pub fn new(latency: Duration, megabits: f64) -> Self {
        Self {
            latency,
            bandwidth: megabits * 1e6 / 8.0,
            jitter: Duration::ZERO,
        }
    }
}

/// Both directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// From the coordinator to the worker.
    pub down: Way,
    /// From the worker to the coordinator.
    pub up: Way,
}

impl Link {
    pub const LOOPBACK: Self = Self {
        down: Way::LOOPBACK,
        up: Way::LOOPBACK,
    };

    /// A symmetric link: `rtt` round trip, `megabits` Mbit/s each way.
    pub fn symmetric(rtt: Duration, megabits: f64) -> Self {
        let way = Way::new(rtt / 2, megabits);
        Self { down: way, up: way }
    }

    /// `RTT/MBIT` (`50ms/10`: 50 ms round trip, 10 Mbit/s each way; `0/0` or `0/inf` is
    /// loopback), with `jitter` on each frame's delay each way.
    pub fn parse(text: &str, jitter: Duration) -> Result<Self, String> {
        let (rtt, mbit) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?}: RTT/MBIT, like 50ms/10"))?;
        let rtt =
            duration(rtt).ok_or_else(|| format!("{text:?}: {rtt:?} is not a time like 50ms"))?;
        let mbit: f64 = mbit
            .parse()
            .map_err(|_| format!("{text:?}: {mbit:?} is not a number of Mbit/s"))?;
        let bandwidth = if mbit > 0.0 && mbit.is_finite() {
            mbit * 1e6 / 8.0
        } else {
            f64::INFINITY
        };
        let way = Way {
            latency: rtt / 2,
            bandwidth,
            jitter,
        };
        Ok(Self { down: way, up: way })
    }
}

/// `0`, `150ms`, `1.5s`, `800us`.
fn duration(text: &str) -> Option<Duration> {
    let (number, scale) = [("ms", 1e-3), ("us", 1e-6), ("s", 1.0)]
        .iter()
        .find_map(|&(unit, scale)| Some((text.strip_suffix(unit)?, scale)))
        .unwrap_or((text, 1.0));
    let value: f64 = number.trim().parse().ok()?;
    (value.is_finite() && value >= 0.0).then(|| Duration::from_secs_f64(value * scale))
}

/// Bytes a frame of `payload` bytes takes on the wire, `masked` if a client sent it.
pub fn on_the_wire(payload: usize, masked: bool) -> usize {
    let header = match payload {
        0..=125 => 2,
        126..=65_535 => 4,
        _ => 10,
    } + if masked { 4 } else { 0 };
    let frame = payload + header;
    frame + frame.div_ceil(1448) * 52
}

/// One direction in use: when it is next free, and when its last frame arrives.
#[derive(Debug, Clone)]
pub struct Pipe {
    way: Way,
    free_at: Duration,
    last_arrival: Duration,
    rng: SplitMix64,
    /// Bytes that went through.
    pub bytes: u64,
}

impl Pipe {
    pub fn new(way: Way, seed: u64) -> Self {
        Self {
            way,
            free_at: Duration::ZERO,
            last_arrival: Duration::ZERO,
            rng: SplitMix64::new(seed),
            bytes: 0,
        }
    }

    /// A frame of `bytes` (on the wire) sent at `now`: when it arrives.
    pub fn send(&mut self, now: Duration, bytes: usize) -> Duration {
        self.bytes += bytes as u64;
        let start = self.free_at.max(now);
        let transfer = if self.way.bandwidth.is_finite() {
            Duration::from_secs_f64(bytes as f64 / self.way.bandwidth)
        } else {
            Duration::ZERO
        };
        self.free_at = start + transfer;
        let jitter = self.way.jitter.mul_f64(self.rng.next_f64());
        let arrival = (self.free_at + self.way.latency + jitter).max(self.last_arrival);
        self.last_arrival = arrival;
        arrival
    }

    /// A new connection: what was in flight on the old one is gone.
    pub fn reset(&mut self, now: Duration) {
        self.free_at = now;
        self.last_arrival = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_queue_behind_each_other_and_arrive_after_the_latency() {
        let ms = Duration::from_millis;
        // 1 MB/s, 25 ms: a 10,000-byte frame takes 10 ms to go through.
        let mut pipe = Pipe::new(
            Way {
                latency: ms(25),
                bandwidth: 1e6,
                jitter: Duration::ZERO,
            },
            1,
        );
        assert_eq!(pipe.send(ms(0), 10_000), ms(35));
        // Sent at once after it: it waits for the first to go through.
        assert_eq!(pipe.send(ms(0), 10_000), ms(45));
        // Sent later, into an idle pipe.
        assert_eq!(pipe.send(ms(100), 1_000), ms(126));
        assert_eq!(pipe.bytes, 21_000);
        let mut loopback = Pipe::new(Way::LOOPBACK, 1);
        assert_eq!(loopback.send(ms(7), 1 << 20), ms(7));
    }

    #[test]
    fn jitter_never_reorders_and_the_wire_carries_headers() {
        let mut pipe = Pipe::new(
            Way {
                latency: Duration::from_millis(10),
                bandwidth: f64::INFINITY,
                jitter: Duration::from_millis(50),
            },
            3,
        );
        let mut last = Duration::ZERO;
        for i in 0..100 {
            let at = pipe.send(Duration::from_micros(i * 100), 100);
            assert!(at >= last);
            last = at;
        }
        assert_eq!(on_the_wire(100, false), 102 + 52);
        assert_eq!(on_the_wire(65_536, true), 65_550 + 46 * 52);
    }
}

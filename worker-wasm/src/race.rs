//! Which of two ways of computing a batch is faster for this model on this machine: one
//! core or all the cores lent (`cores.rs`), the CPU or the GPU (`worker.rs`). Each way's
//! time a sample is measured in turn until both are known, then the faster is used and the
//! slower tried again now and then (the machine's other load changes).
//!
//! The first batch each way is not counted (a warm-up: a helper loading its module, a GPU
//! compiling its pipelines). Trials come often at first, since a way's first batches can
//! be far slower than its steady state (code the browser has not optimised yet); their
//! spacing then doubles up to [`RETRY_EVERY`] batches.

/// One of the two ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Measured second (one core; the CPU).
    First,
    /// Measured first (all the cores lent; the GPU), and the one a pinned race keeps.
    Second,
}

impl Way {
    fn index(self) -> usize {
        match self {
            Self::First => 0,
            Self::Second => 1,
        }
    }

    fn other(self) -> Self {
        match self {
            Self::First => Self::Second,
            Self::Second => Self::First,
        }
    }
}

/// Batches between two trials of the slower way (at most; the first come after
/// [`FIRST_SPACING`]), and a trial's length.
pub(crate) const RETRY_EVERY: u64 = 400;
const FIRST_SPACING: u64 = 25;
pub(crate) const TRIAL: u64 = 8;
/// Weight of the newest batch in the smoothed times.
const SMOOTHING: f64 = 0.2;

#[derive(Debug, Default)]
pub struct Race {
    /// Always [`Way::Second`] (tests, benchmarks, a volunteer's explicit choice): nothing
    /// measured.
    pub pinned: bool,
    /// Milliseconds a sample, each way.
    times: [Option<f64>; 2],
    /// Whether the first batch each way (its warm-up) is behind us.
    warm: [bool; 2],
    /// The slower way is tried until this batch; the next trial starts at `next_trial`,
    /// `spacing` after this one's start.
    trial_until: u64,
    next_trial: u64,
    spacing: u64,
    /// Batches measured since the race (re)started.
    batches: u64,
}

impl Race {
    /// Forgets every measurement (what is compared changed), but not whether it is pinned.
    pub fn restart(&mut self) {
        *self = Self {
            pinned: self.pinned,
            ..Self::default()
        };
    }

    /// The way to compute the next batch.
    pub fn pick(&mut self) -> Way {
        if self.pinned {
            return Way::Second;
        }
        match self.times {
            [_, None] => Way::Second,
            [None, _] => Way::First,
            [Some(first), Some(second)] => {
                if self.batches >= self.next_trial {
                    self.spacing = (self.spacing * 2).clamp(FIRST_SPACING, RETRY_EVERY);
                    self.trial_until = self.batches + TRIAL;
                    self.next_trial = self.batches + self.spacing;
                }
                let faster = if second < first {
                    Way::Second
                } else {
                    Way::First
                };
                if self.batches < self.trial_until {
                    faster.other()
                } else {
                    faster
                }
            }
        }
    }

    /// A batch of `samples` took `ms` computed `way`.
    pub fn measured(&mut self, way: Way, ms: f64, samples: usize) {
        if samples == 0 || !ms.is_finite() || ms < 0.0 {
            return;
        }
        self.batches += 1;
        if !std::mem::replace(&mut self.warm[way.index()], true) {
            return;
        }
        let per_sample = ms / samples as f64;
        let slot = &mut self.times[way.index()];
        *slot = Some(match *slot {
            None => per_sample,
            Some(old) => SMOOTHING * per_sample + (1.0 - SMOOTHING) * old,
        });
    }

    /// The way in use outside trials, for the page: the faster once both are known.
    pub fn using(&self) -> Way {
        match self.times {
            [Some(first), Some(second)] if first <= second && !self.pinned => Way::First,
            _ => Way::Second,
        }
    }

    /// Milliseconds a sample measured `way`, smoothed.
    #[cfg(test)]
    pub fn time(&self, way: Way) -> Option<f64> {
        self.times[way.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU slower than the CPU (a small model: its readback costs more than the batch):
    /// measured first, then the CPU, which is used; pinned (the volunteer asked), the GPU
    /// whatever the times. A restart forgets the times, not the pin.
    #[test]
    fn the_faster_way_is_used_unless_pinned() {
        let mut race = Race::default();
        assert_eq!(race.pick(), Way::Second, "the GPU is measured first");
        race.measured(Way::Second, 500.0, 32); // its warm-up: pipelines compiled
        race.measured(Way::Second, 64.0, 32);
        assert_eq!(race.pick(), Way::First, "then the CPU");
        race.measured(Way::First, 50.0, 32);
        race.measured(Way::First, 16.0, 32);
        assert_eq!(race.using(), Way::First);
        // (A first trial of the slower way follows at once, then the faster.)
        for _ in 0..TRIAL {
            let way = race.pick();
            race.measured(way, if way == Way::First { 16.0 } else { 64.0 }, 32);
        }
        assert_eq!(race.pick(), Way::First);
        assert_eq!(race.time(Way::Second), Some(2.0));
        race.pinned = true;
        assert_eq!((race.pick(), race.using()), (Way::Second, Way::Second));
        race.restart();
        assert!(race.pinned);
        assert_eq!(race.time(Way::First), None);
        race.pinned = false;
        // A GPU faster than the CPU is kept.
        for (way, ms) in [
            (Way::Second, 90.0),
            (Way::Second, 8.0),
            (Way::First, 90.0),
            (Way::First, 32.0),
        ] {
            race.measured(way, ms, 32);
        }
        assert_eq!(race.using(), Way::Second);
    }
}

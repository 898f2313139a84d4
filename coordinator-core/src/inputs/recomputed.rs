//! Input: a recomputation the driver ran off the coordinator's task came back
//! (`checks/recompute.rs`). The checks judge it; the coordinator carries out their steps.

use std::time::Instant;

use crate::checks::recompute::Recomputed;
use crate::Coordinator;

impl Coordinator {
    /// A match goes on as if it had never waited; a mismatch drops the answer with a
    /// `Mismatch` error and a strike. A worker that left or reconnected meanwhile is not sent
    /// anything, and its answer goes nowhere; a mismatch still strikes its identity.
    pub fn recomputed(&mut self, done: Recomputed, now: Instant) {
        self.now = now;
        let (checks, mut cx) = self.checks();
        let steps = checks.recomputed(&mut cx, done, now);
        self.carry_out(steps, now);
        self.done(now);
    }
}

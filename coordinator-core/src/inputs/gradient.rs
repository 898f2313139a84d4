//! Input: a whole gradient that passed its session's checks (every chunk in order, the
//! model's length, finite values; its norm computed on the way). A replaced session's are
//! ignored. Its arrival counts (latency, bytes, the worker's activity) before
//! `checks` decides what it is worth.

use std::time::Instant;

use protocol::{gradient_wire_len, Gradient, WorkerId};

use crate::io::{Observation, Output, SessionId};
use crate::Coordinator;

impl Coordinator {
    /// `worker`'s session `session` delivered `gradient`, of L2 norm `norm` (computed in f64
    /// while its chunks were checked). The coordinator keeps what it needs of it (robust
    /// aggregators a copy): the caller may reuse its buffer once this returns.
    pub fn gradient(
        &mut self,
        worker: WorkerId,
        session: SessionId,
        gradient: &Gradient,
        norm: f64,
        now: Instant,
    ) {
        self.now = now;
        // A replaced session's gradients are ignored: the worker lives on elsewhere.
        if self.registry.is_current(worker, session) {
            self.arrived(worker, gradient, now);
            let (checks, mut cx) = self.checks();
            let steps = checks.answer(&mut cx, worker, session, gradient, norm, now);
            self.carry_out(steps, now);
        }
        self.done(now);
    }

    fn arrived(&mut self, worker: WorkerId, gradient: &Gradient, now: Instant) {
        let Some((sent, compression)) = self.registry.seen(
            worker,
            (gradient.samples, gradient.compute_us, gradient.parts),
            now,
        ) else {
            return;
        };
        if let Some(sent) = sent {
            let wall = now.saturating_duration_since(sent);
            self.outputs
                .push_back(Output::Observe(Observation::GradientLatency(
                    wall.as_secs_f64(),
                )));
            let pull = self.registry.pull(worker);
            let pull = pull.filter(|p| p.version == gradient.round.0);
            let phase = pull.and_then(|p| p.local.map(|l| (l.steps, p.timed)));
            if let (Some(plan), Some((steps, timed))) = (self.local.as_mut(), phase) {
                let compute = std::time::Duration::from_micros(gradient.compute_us.into());
                // Only an answer with nothing but weights before it measures the link.
                plan.answered(worker, steps, timed.then_some((compute, wall)));
            }
        }
        let bytes = gradient_wire_len(&gradient.grads, compression).unwrap_or(0);
        self.metrics.traffic(bytes as u64, 0);
    }
}

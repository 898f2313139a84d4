//! What a gradient's arrival tells the status and `/metrics`, before any check: its latency
//! since the weights were sent, its bytes on the wire, and the worker's activity.

use std::time::Instant;

use protocol::{gradient_wire_len, Gradient, WorkerId};

use super::Coordinator;

impl Coordinator {
    pub(super) fn arrived(&mut self, worker: WorkerId, gradient: &Gradient, now: Instant) {
        let Some((sent, compression)) = self.registry.seen(worker, gradient.samples, now) else {
            return;
        };
        if let Some(sent) = sent {
            self.metrics
                .gradient_latency(now.saturating_duration_since(sent));
        }
        let bytes = gradient_wire_len(gradient.grads.len(), compression).unwrap_or(0);
        self.metrics.traffic(bytes as u64, 0);
    }
}

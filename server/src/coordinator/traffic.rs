//! What a gradient's arrival tells the status and `/metrics`, before any check: its latency
//! since the weights were sent, its bytes on the wire, and the worker's activity.

use std::time::Instant;

use protocol::{Gradient, WorkerId};

use super::Coordinator;

impl Coordinator {
    pub(super) fn arrived(&mut self, worker: WorkerId, gradient: &Gradient, now: Instant) {
        if let Some(sent) = self.registry.weights_sent_at(worker) {
            self.metrics
                .gradient_latency(now.saturating_duration_since(sent));
        }
        let compression = self.registry.compression(worker).unwrap_or_default();
        let bytes = gradient_frame_len(gradient.grads.len(), compression);
        self.metrics.traffic(bytes, 0);
        self.registry.seen(worker, gradient.samples, now);
    }
}

/// The size of a gradient frame of `n` values in `compression`, as it came over the wire.
fn gradient_frame_len(n: usize, compression: protocol::Compression) -> u64 {
    let empty = protocol::Gradient {
        round: protocol::Round(0),
        samples: 0,
        loss: 0.0,
        grads: Vec::new(),
    };
    let header = protocol::encode_gradient(&empty, compression).len();
    (header + compression.payload_len(n).unwrap_or(0)) as u64
}

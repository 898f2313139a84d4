//! The worker table as the status shows it, and what it needs to know: when each worker
//! connected, when it was last heard from, how many samples it computed, and the bytes sent.

use std::ops::Range;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use protocol::{Compression, WorkerId, WorkerKind};

use super::Registry;
use crate::status::WorkerStatus;

impl Registry {
    /// A gradient of `samples` arrived from `id` at `now`, computed in `compute_us` on
    /// `cores`: returns when it was last sent weights, and its compression (for the
    /// latency and the bytes on the wire).
    pub fn seen(
        &mut self,
        id: WorkerId,
        (samples, compute_us, cores): (u32, u32, u8),
        now: Instant,
    ) -> Option<(Option<Instant>, Compression)> {
        let w = self.workers.get_mut(&id)?;
        w.cores = cores;
        w.last_seen = Some(now);
        w.samples += u64::from(samples);
        w.compute += std::time::Duration::from_micros(compute_us.into());
        Some((w.weights_sent_at, w.compression))
    }

    /// Bytes of frames queued to workers since the last call.
    pub fn take_bytes_out(&mut self) -> u64 {
        std::mem::take(&mut self.bytes_out)
    }

    /// The table, as of `now`: times as Unix milliseconds, samples a second since joining.
    /// `steps`: a worker's next local phase's length (`--local-steps`).
    pub fn list(
        &self,
        skipped: impl Fn(WorkerId) -> bool,
        steps: impl Fn(WorkerId) -> Option<u32>,
        now: Instant,
    ) -> Vec<WorkerStatus> {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let unix_ms = |at: Instant| {
            wall_ms.saturating_sub(now.saturating_duration_since(at).as_millis() as u64)
        };
        self.workers
            .iter()
            .map(|(&id, w)| WorkerStatus {
                id: id.0,
                kind: match w.kind {
                    WorkerKind::Browser => "browser",
                    WorkerKind::Native => "native",
                },
                fused: w.fused,
                compression: w.compression.name(),
                connected_at_ms: unix_ms(w.connected_at),
                last_seen_ms: w.last_seen.map(unix_ms),
                samples_per_sec: w.last_seen.and_then(|last| {
                    let secs = last.saturating_duration_since(w.connected_at).as_secs_f64();
                    (secs > 0.0).then(|| w.samples as f64 / secs)
                }),
                gradients: w.tally.accepted,
                clipped: w.tally.clipped,
                verified: w.tally.verified,
                rejected: w.tally.rejected.clone(),
                challenged: w.tally.challenged,
                bytes_revealed: w.tally.bytes_revealed,
                segments_replayed: w.tally.segments_replayed,
                replay_ms: w.tally.replay_ms,
                strikes: self.bans.strikes(id),
                shard_len: w.shard.as_ref().map_or(0, Range::len),
                skipped: skipped(id),
                local_steps: steps(id),
                probation_left: self.trust.left(id),
                cores: w.cores,
                compute_share: w.last_seen.and_then(|last| {
                    let secs = last.saturating_duration_since(w.connected_at).as_secs_f64();
                    (secs > 0.0).then(|| (w.compute.as_secs_f64() / secs).min(1.0))
                }),
            })
            .collect()
    }
}

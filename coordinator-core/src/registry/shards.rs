//! The registry's shards: who holds which part of the train split, what an answer was
//! computed on, and `--replicate`'s groups.

use std::collections::BTreeMap;
use std::ops::Range;

use model::{Dataset, Values};
use protocol::{
    encode_from_coordinator, CoordinatorToWorker, LocalPhase, Shard, ShardValues, WorkerId,
};

use super::{GroupKey, Pull, Registry};
use crate::broadcast::Held;
use crate::session::Outbound;

impl Registry {
    /// The samples `id`'s next gradient is computed on: its batch, as the coordinator
    /// assigned it (`batch_size`, or its whole shard if smaller). `None` before it has a
    /// shard.
    pub fn assigned_batch(&self, id: WorkerId, batch_size: u32) -> Option<u32> {
        let shard = self.workers.get(&id)?.shard.as_ref()?;
        Some(batch_size.min(u32::try_from(shard.len()).unwrap_or(u32::MAX)))
    }

    /// Samples in `id`'s shard (0 before it has one).
    pub fn shard_len(&self, id: WorkerId) -> usize {
        self.workers
            .get(&id)
            .and_then(|w| w.shard.as_ref())
            .map_or(0, Range::len)
    }

    /// The version of the int8 weights' chain `id`'s connection holds, if any.
    pub fn held(&self, id: WorkerId) -> Option<Held> {
        self.workers.get(&id).and_then(|w| w.held)
    }

    /// `id`'s connection is sent weights after which it holds `held`.
    pub fn hold(&mut self, id: WorkerId, held: Option<Held>) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.held = held;
        }
    }

    /// `id` is about to be sent the frozen tensors: whether its connection lacks them (then
    /// it holds them from now on).
    pub fn frozen_sent(&mut self, id: WorkerId) -> bool {
        match self.workers.get_mut(&id) {
            Some(w) if !w.has_frozen => {
                w.has_frozen = true;
                w.bulk_sent = true;
                true
            }
            _ => false,
        }
    }

    /// The frozen tensors changed (the operator replaced the weights): send them again.
    pub fn frozen_stale(&mut self) {
        for w in self.workers.values_mut() {
            w.has_frozen = false;
        }
    }

    /// `id` is being sent the weights of `version`: decides the batch its answer is computed
    /// on (`version`, or one past its previous batch if that is larger, so that the same
    /// weights sent twice never give the same batch), on the shard it holds now. Returns
    /// the batch index, for its `Task`.
    pub fn pulled(
        &mut self,
        id: WorkerId,
        version: u64,
        local: Option<LocalPhase>,
        now: std::time::Instant,
    ) -> Option<u64> {
        let w = self.workers.get_mut(&id)?;
        // A phase of H steps (1 without local steps) uses batches `batch..batch + H`, from
        // `version × H`: in sync mode each pull then follows the last, and a run resumed
        // from a checkpoint (which keeps no batch) picks the batches it would have.
        let steps = local.map_or(1, |l| u64::from(l.steps));
        let first = version.saturating_mul(steps);
        let batch = match w.last_batch {
            Some(last) => first.max(last.saturating_add(1)),
            None => first,
        };
        w.last_batch = Some(batch.saturating_add(steps - 1));
        let timed = !std::mem::take(&mut w.bulk_sent);
        w.pull = w.shard.clone().map(|shard| Pull {
            version,
            batch,
            shard,
            local,
            timed,
        });
        w.weights_sent_at = Some(now);
        Some(batch)
    }

    /// What `id`'s answer to its latest weights is computed on; `None` before it had a shard.
    pub fn pull(&self, id: WorkerId) -> Option<&Pull> {
        self.workers.get(&id)?.pull.as_ref()
    }

    /// Re-cuts `train` over the connected workers (ascending id); returns the `Shard`
    /// message for each worker whose shard changed. With `--replicate r`, workers of one
    /// compression go in groups of `r` (ascending id), and a group shares one shard.
    pub fn rebalance(&mut self, train: &Dataset) -> Vec<(WorkerId, Outbound)> {
        let mut messages = Vec::new();
        let groups: Vec<Vec<WorkerId>> = if self.replicate <= 1 {
            self.workers.keys().map(|&id| vec![id]).collect()
        } else {
            let mut by_compression: BTreeMap<u8, Vec<WorkerId>> = BTreeMap::new();
            for (&id, w) in &self.workers {
                by_compression
                    .entry(w.compression.to_u8())
                    .or_default()
                    .push(id);
            }
            let r = self.replicate;
            by_compression
                .values()
                .flat_map(|ids| ids.chunks(r).map(<[_]>::to_vec))
                .collect()
        };
        let shards = model::assign_shards(groups.len(), train.len());
        for (group, range) in groups.iter().zip(shards) {
            for &id in group {
                let worker = self.workers.get_mut(&id).expect("listed above");
                worker.replicas = group.len();
                if worker.shard.as_ref() == Some(&range) {
                    continue;
                }
                worker.shard = Some(range.clone());
                worker.bulk_sent = true;
                let (shape, values, labels, norm) = train.slice(range.clone()).into_parts();
                let frame = encode_from_coordinator(&CoordinatorToWorker::Shard(Shard {
                    first_index: range.start as u32,
                    shape: [shape.c, shape.h, shape.w].map(|d| d as u32),
                    labels,
                    values: match values {
                        Values::U8(v) => ShardValues::U8(v),
                        Values::F32(v) => ShardValues::F32(v),
                    },
                    mean: norm.mean().to_vec(),
                    std: norm.std().to_vec(),
                }));
                messages.push((id, Outbound::frame(frame)));
            }
        }
        messages
    }

    /// `--replicate`: what `id`'s current answer shares with its group (the shard it computed
    /// on, its compression), and the group's size; `None` if it has no partner.
    pub fn replica_group(&self, id: WorkerId) -> Option<(GroupKey, usize)> {
        let w = self.workers.get(&id)?;
        let shard = w.pull.as_ref()?.shard.clone();
        (w.replicas > 1).then_some(((shard, w.compression), w.replicas))
    }
}

//! What a checkpoint keeps of the registry: identities (so volunteers keep their ids across
//! a restart), the next id to issue, and the shard assignment.

use std::ops::Range;
use std::time::Instant;

use protocol::WorkerId;

use super::Registry;

impl Registry {
    /// Every identity as (resume token, accepted gradients).
    pub fn saved_identities(&self) -> Vec<(String, u64)> {
        self.identities
            .saved(|id| self.workers.get(&id).map(|w| w.tally.accepted))
    }

    /// Bans and strikes.
    pub fn saved_bans(&self) -> super::SavedBans {
        super::SavedBans {
            trusted: self.trust.saved(),
            ..self.bans.saved()
        }
    }

    pub fn restore_bans(&mut self, saved: &super::SavedBans) {
        self.bans.restore(saved);
        self.trust.restore(&saved.trusted);
        self.changed = true;
    }

    /// The id the next new worker gets.
    pub fn next_worker(&self) -> u32 {
        self.next_worker
    }

    /// Who holds which part of the train split now.
    pub fn assignment(&self) -> Vec<(WorkerId, Range<usize>)> {
        self.workers
            .iter()
            .filter_map(|(&id, w)| Some((id, w.shard.clone()?)))
            .collect()
    }

    /// Continues from a checkpoint: its identities can resume (departed as of `now`), and
    /// new workers get ids none of them has. Returns the malformed tokens skipped.
    pub fn restore(
        &mut self,
        identities: &[(String, u64)],
        next_worker: u32,
        now: Instant,
    ) -> usize {
        let skipped = self.identities.restore(identities, now);
        let highest = identities
            .iter()
            .filter_map(|(token, _)| token.split_once('.')?.0.parse::<u32>().ok())
            .max()
            .unwrap_or(0);
        self.next_worker = next_worker.max(highest.saturating_add(1)).max(1);
        skipped
    }
}

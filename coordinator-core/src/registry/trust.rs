//! Trust that is earned, after BOINC's adaptive replication: a new identity is on probation,
//! and every one of its answers is recomputed before it counts, until `--probation` answers
//! in a row have passed. From then on its answers are recomputed at the sampled rate
//! (`--verify-fraction`). A strike (an answer that did not match) puts it back on probation;
//! bans stay as they were (`--ban-after` strikes).
//!
//! Trust belongs to the identity, not the connection: a worker that resumes with its token
//! keeps it, and a checkpoint keeps it. A stranger who comes back under a fresh identity
//! starts again, with every answer checked.

use std::collections::HashMap;

use protocol::WorkerId;

#[derive(Debug)]
pub struct Trust {
    /// Clean answers in a row that end probation; 0: none (every identity is trusted).
    probation: u32,
    /// Clean answers in a row since the identity was issued or last struck (at most
    /// `probation`: past it, it is trusted).
    passed: HashMap<WorkerId, u32>,
}

impl Trust {
    pub fn new(probation: u32) -> Self {
        Self {
            probation,
            passed: HashMap::new(),
        }
    }

    /// The probation's length in clean answers.
    pub fn length(&self) -> u32 {
        self.probation
    }

    /// Whether every answer of `id` must be recomputed before it counts.
    pub fn on_probation(&self, id: WorkerId) -> bool {
        self.left(id) > 0
    }

    /// Clean answers `id` still owes before it is trusted.
    pub fn left(&self, id: WorkerId) -> u32 {
        self.probation
            .saturating_sub(self.passed.get(&id).copied().unwrap_or(0))
    }

    /// The coordinator recomputed an answer of `id` and it matched.
    pub fn passed(&mut self, id: WorkerId) {
        if self.probation == 0 {
            return;
        }
        let passed = self.passed.entry(id).or_insert(0);
        *passed = (*passed + 1).min(self.probation);
    }

    /// An answer of `id` did not match: back on probation, from the start.
    pub fn struck(&mut self, id: WorkerId) {
        self.passed.remove(&id);
    }

    /// (worker id, clean answers in a row) for a checkpoint, in id order.
    pub fn saved(&self) -> Vec<(u32, u32)> {
        let mut saved: Vec<(u32, u32)> = self.passed.iter().map(|(id, &n)| (id.0, n)).collect();
        saved.sort_unstable();
        saved
    }

    pub fn restore(&mut self, saved: &[(u32, u32)]) {
        for &(id, n) in saved {
            self.passed.insert(WorkerId(id), n.min(self.probation));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_trusted_after_its_probation_and_a_strike_starts_it_again() {
        let mut t = Trust::new(3);
        let (a, b) = (WorkerId(1), WorkerId(2));
        assert!(t.on_probation(a) && t.on_probation(b));
        for owed in [2, 1, 0] {
            t.passed(a);
            assert_eq!(t.left(a), owed);
        }
        assert!(!t.on_probation(a) && t.on_probation(b));
        t.passed(a);
        assert_eq!(t.saved(), [(1, 3)], "capped at the probation");
        t.struck(a);
        assert!(t.on_probation(a));
        assert_eq!(t.left(a), 3, "from the start");
        t.passed(b);
        let mut back = Trust::new(3);
        back.restore(&t.saved());
        assert_eq!((back.left(a), back.left(b)), (3, 2));
        // No probation: everyone is trusted, nothing is kept.
        let mut none = Trust::new(0);
        none.passed(a);
        assert!(!none.on_probation(a) && none.saved().is_empty());
    }
}

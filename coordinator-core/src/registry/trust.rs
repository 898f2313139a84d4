//! Trust that is earned, after BOINC's adaptive replication: how often the coordinator
//! recomputes an identity's answers depends on how many steps of work it has had accepted
//! since it was issued or last struck (`n`: an answer is one step, a local phase its `H`),
//! with `P` = `--probation` and `f` = `--verify-fraction`:
//!
//! - `n < P`: **probation**. Every answer is recomputed before it counts.
//! - then `max(f, P / n)`: half of them at `n = 2P`, a tenth at `10P`, and `f` from `P / f`
//!   on (200 answers at the defaults).
//! - a strike (an answer that did not match) sets `n` back to 0; bans stay as they were
//!   (`--ban-after` strikes).
//!
//! Why it decays and does not drop to `f` at once: an attacker who knows the rule answers
//! honestly through probation and then cheats. At a flat `f` each such identity would
//! slip about `1/f` poisoned answers in for `P` honest ones. Checked at `P / n`, one that
//! turns after `n` honest answers is caught after about `n / P` poisoned ones (the sum of
//! `P / k` over them reaches 1), so cheats stay about `1 / (P + 1)` of what it sends however
//! long it lies low, and at most `1 / f` per `P / f` honest ones. An honest identity costs
//! the coordinator about `P · (1 + ln(1 / f))` recomputations (40 at the defaults), then `f`.
//! Counting steps, not answers, keeps that true with local steps: a replayed phase costs the
//! coordinator its `H` steps, and a first phase of `H ≥ P` steps ends probation by itself.
//!
//! **Under load, the floor.** With local phases in sync rounds, a pull past probation is
//! sampled at `f` alone while the replays already asked for would keep the checks' cores
//! busy for a round (`Coordinator::check_for`): a sampled phase whose replay is far off
//! holds its round, and sixteen newcomers' decaying samples on one core held every round
//! (docs/BENCHMARKS.md, "The crowd"). The draw is the same, so what is sampled at `f` is a
//! subset of what `P / n` would have sampled. What that gives a cheat that turns after
//! probation while the coordinator is busy: caught after about `1 / f` poisoned answers
//! instead of `n / P`, the bound `--verify-fraction` names; crowding the coordinator's
//! checks to get there takes identities on probation, which are rationed per address and
//! network. Counted (`sampling_floored`).
//!
//! Trust belongs to the identity, not the connection: a worker that resumes with its token
//! keeps it, and a checkpoint keeps it. A stranger who comes back under a fresh identity
//! starts again.

use std::collections::HashMap;

use protocol::WorkerId;

#[derive(Debug)]
pub struct Trust {
    /// `P`: accepted answers before an identity leaves probation; 0: none (every identity
    /// is checked at the floor alone).
    probation: u32,
    /// `n`: steps accepted since the identity was issued or last struck.
    clean: HashMap<WorkerId, u64>,
}

impl Trust {
    pub fn new(probation: u32) -> Self {
        Self {
            probation,
            clean: HashMap::new(),
        }
    }

    fn clean(&self, id: WorkerId) -> u64 {
        self.clean.get(&id).copied().unwrap_or(0)
    }

    /// Whether every answer of `id` must be recomputed before it counts.
    pub fn on_probation(&self, id: WorkerId) -> bool {
        self.left(id) > 0
    }

    /// Accepted steps `id` still owes before its probation ends.
    pub fn left(&self, id: WorkerId) -> u32 {
        u64::from(self.probation).saturating_sub(self.clean(id)) as u32
    }

    /// The share of `id`'s answers to recompute, at least `floor` (`--verify-fraction`).
    pub fn rate(&self, id: WorkerId, floor: f64) -> f64 {
        if self.probation == 0 {
            return floor;
        }
        let n = self.clean(id);
        if n < u64::from(self.probation) {
            return 1.0;
        }
        (f64::from(self.probation) / n as f64).max(floor).min(1.0)
    }

    /// An answer of `id`, `steps` of work, was accepted.
    pub fn accepted(&mut self, id: WorkerId, steps: u64) {
        if self.probation > 0 {
            *self.clean.entry(id).or_insert(0) += steps;
        }
    }

    /// An answer of `id` did not match: back on probation, from the start.
    pub fn struck(&mut self, id: WorkerId) {
        self.clean.remove(&id);
    }

    /// (worker id, answers accepted since issued or struck) for a checkpoint, in id order.
    pub fn saved(&self) -> Vec<(u32, u64)> {
        let mut saved: Vec<(u32, u64)> = self.clean.iter().map(|(id, &n)| (id.0, n)).collect();
        saved.sort_unstable();
        saved
    }

    pub fn restore(&mut self, saved: &[(u32, u64)]) {
        if self.probation == 0 {
            return;
        }
        for &(id, n) in saved {
            self.clean.insert(WorkerId(id), n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probation_then_a_rate_that_decays_to_the_floor_and_a_strike_starts_again() {
        let mut t = Trust::new(10);
        let (a, b) = (WorkerId(1), WorkerId(2));
        assert!(t.on_probation(a));
        for owed in (0..10).rev() {
            assert_eq!(t.rate(a, 0.05), 1.0);
            t.accepted(a, 1);
            assert_eq!(t.left(a), owed);
        }
        assert!(!t.on_probation(a) && t.on_probation(b));
        assert_eq!(t.rate(a, 0.05), 1.0, "P / n at n = P");
        for _ in 10..40 {
            t.accepted(a, 1);
        }
        assert_eq!(t.rate(a, 0.05), 0.25, "P / n at n = 4P");
        for _ in 40..1000 {
            t.accepted(a, 1);
        }
        assert_eq!(t.rate(a, 0.05), 0.05, "the floor");
        assert_eq!(t.saved(), [(1, 1000)]);
        t.struck(a);
        assert!(t.on_probation(a));
        assert_eq!((t.left(a), t.rate(a, 0.05)), (10, 1.0), "from the start");
        t.accepted(b, 1);
        let mut back = Trust::new(10);
        back.restore(&t.saved());
        assert_eq!((back.left(a), back.left(b)), (10, 9));
        // A local phase of 40 steps is 40 steps of trust.
        let c = WorkerId(3);
        t.accepted(c, 40);
        assert_eq!((t.on_probation(c), t.rate(c, 0.05)), (false, 0.25));
        // No probation: the floor alone, nothing kept.
        let mut none = Trust::new(0);
        none.accepted(a, 1);
        assert!(!none.on_probation(a) && none.saved().is_empty());
        assert_eq!(none.rate(a, 0.05), 0.05);
    }

    /// An identity that lies low for `n` honest answers and then cheats on every one is
    /// caught, in expectation, after about `n / P` cheats: the rates `P / k` add up to 1
    /// there. Computed exactly, by the survival probabilities, with this rule's own rates.
    #[test]
    fn a_cheat_that_lies_low_gets_about_one_in_p_plus_one_answers_in() {
        let id = WorkerId(1);
        for lying_low in [20u64, 100, 1000] {
            let mut t = Trust::new(10);
            for _ in 0..lying_low {
                t.accepted(id, 1);
            }
            let (mut alive, mut cheats) = (1.0f64, 0.0f64);
            while alive > 1e-9 {
                alive *= 1.0 - t.rate(id, 0.0);
                cheats += alive;
                // Unchecked, a cheat is accepted like any answer.
                t.accepted(id, 1);
            }
            let share = cheats / (lying_low as f64 + cheats);
            assert!(
                (0.05..0.11).contains(&share),
                "lying low {lying_low}: {cheats:.1} cheats, {share:.3}"
            );
        }
    }
}

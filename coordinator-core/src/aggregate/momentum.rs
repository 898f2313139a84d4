//! Worker momentum (Karimireddy, He and Jaggi, "Learning from History for Byzantine Robust
//! Optimization", ICML 2021), kept by the coordinator: each worker's answers are blended
//! into its own `m ← β·m + (1 − β)·g` before the aggregator sees them, and the aggregator
//! combines the momenta, not the answers.
//!
//! Why it helps: an honest worker's momentum averages its batches' noise away, so honest
//! momenta lie close together, while an attack that hides inside the noise of one round
//! ("A Little Is Enough") must push the same way every round, which momentum adds up into
//! a difference the robust rule can see.
//!
//! Why on the coordinator: momentum on the worker would be state the coordinator cannot
//! replay from what it knows, and a tab that vanishes takes it along. Here every answer is
//! still checked as it came (recomputation is unchanged), and the momentum is built only
//! from answers the schedule accepted. A worker's momentum starts with its first accepted
//! answer (`m = g`), and is forgotten when it leaves: a fresh identity starts from nothing.
//!
//! Memory: 4·P bytes per connected worker, at most `--aggregator-memory` in all; a worker
//! beyond that passes its answers through unblended (counted).

use std::collections::HashMap;

use protocol::WorkerId;

#[derive(Debug)]
pub struct Momenta {
    beta: f32,
    /// Workers whose momentum fits in the memory bound.
    room: usize,
    map: HashMap<WorkerId, Vec<f32>>,
    /// Answers passed through unblended for lack of room.
    unblended: u64,
}

impl Momenta {
    /// `beta` in (0, 1); `memory` bytes for `param_count` values each.
    pub fn new(beta: f32, param_count: usize, memory: usize) -> Self {
        Self {
            beta,
            room: memory / (4 * param_count.max(1)),
            map: HashMap::new(),
            unblended: 0,
        }
    }

    /// What `id`'s momentum would be with `grads × scale` blended in (`None`: no room, the
    /// answer goes as it is). Nothing is kept until [`Momenta::keep`].
    pub fn blend(&mut self, id: WorkerId, grads: &[f32], scale: f32) -> Option<Vec<f32>> {
        let Some(m) = self.map.get(&id) else {
            if self.map.len() >= self.room {
                self.unblended += 1;
                return None;
            }
            return Some(grads.iter().map(|g| g * scale).collect());
        };
        let (b, a) = (self.beta, (1.0 - self.beta) * scale);
        Some(m.iter().zip(grads).map(|(&m, &g)| b * m + a * g).collect())
    }

    /// The answer behind `momentum` was accepted: it is `id`'s momentum now.
    pub fn keep(&mut self, id: WorkerId, momentum: Vec<f32>) {
        self.map.insert(id, momentum);
    }

    pub fn left(&mut self, id: WorkerId) {
        self.map.remove(&id);
    }

    pub fn unblended(&self) -> u64 {
        self.unblended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn momentum_starts_at_the_first_answer_and_blends_only_what_was_kept() {
        let mut m = Momenta::new(0.9, 2, 1 << 20);
        let id = WorkerId(1);
        let first = m.blend(id, &[1.0, -2.0], 0.5).expect("room");
        assert_eq!(first, [0.5, -1.0], "the first answer, clipped");
        // Not kept (refused by the schedule): the next starts afresh.
        assert_eq!(m.blend(id, &[4.0, 0.0], 1.0).expect("room"), [4.0, 0.0]);
        m.keep(id, first);
        let second = m.blend(id, &[1.5, 1.0], 1.0).expect("room");
        let expected = [0.9 * 0.5 + 0.1 * 1.5, -0.9 + 0.1 * 1.0];
        for (got, want) in second.iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{second:?}");
        }
        m.left(id);
        assert_eq!(m.blend(id, &[2.0, 2.0], 1.0).expect("room"), [2.0, 2.0]);
    }

    #[test]
    fn beyond_the_memory_bound_answers_pass_unblended() {
        // Room for two workers of 4 values.
        let mut m = Momenta::new(0.9, 4, 32);
        for id in 1..=2 {
            let v = m.blend(WorkerId(id), &[1.0; 4], 1.0).expect("room");
            m.keep(WorkerId(id), v);
        }
        assert_eq!(m.blend(WorkerId(3), &[1.0; 4], 1.0), None);
        assert_eq!(m.unblended(), 1);
        assert!(
            m.blend(WorkerId(1), &[1.0; 4], 1.0).is_some(),
            "kept ones go on"
        );
    }
}

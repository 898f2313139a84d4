//! BOINC-style redundancy (`--replicate r`, sync mode): the registry gives groups of `r`
//! workers of the same wire compression the same shard, so each round they compute the same
//! batch on the same decoded weights, and their answers must agree within twice the wire's
//! rounding (`verify::agree`).
//!
//! The first answer of a group is held until a second agrees; both then go on, as does every
//! later one that agrees with them. Answers that disagree are arbitrated by the coordinator
//! recomputing the batch itself: whoever is wrong gets a strike. An answer still alone when
//! the round's deadline comes, or when a worker leaves, is recomputed too, so replication
//! never lets an answer through unchecked and never makes an honest worker miss a deadline.
//!
//! Memory: one held answer (4·P bytes) per group whose members have not all answered.

use std::collections::BTreeMap;
use std::ops::Range;

use protocol::{Compression, Gradient, Round, WorkerId};

use super::verify::agree;

/// One answer, as the session validated it.
#[derive(Debug, Clone)]
pub struct Replica {
    pub worker: WorkerId,
    pub gradient: Gradient,
    pub norm: f64,
}

/// What a group shares: its shard and its wire compression.
pub type GroupKey = (Range<usize>, Compression);

/// What happens to an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Held until a partner answers (or the deadline).
    Held,
    /// It agrees with its group: on to the round.
    Agreed,
    /// It disagrees, or its round passed while it was held: recompute it.
    Disputed,
}

/// The fate of the answer that arrived, and of earlier held answers its arrival decided.
#[derive(Debug)]
pub struct Arrival {
    pub earlier: Vec<(Replica, Fate)>,
    pub this: Fate,
}

#[derive(Debug)]
struct Group {
    round: Round,
    reference: Replica,
    /// The reference went on (a partner agreed, or it was arbitrated).
    released: bool,
    /// Answers seen, and the group's size.
    seen: usize,
    size: usize,
}

#[derive(Debug, Default)]
pub struct Replicas {
    groups: BTreeMap<(usize, usize, u8), Group>,
    /// Counters for the log and the benchmarks.
    pub agreed: u64,
    pub disputed: u64,
}

impl Replicas {
    /// An answer from `worker` in a group of `size` that shares `key`. The answer is copied
    /// only when it is held.
    pub fn arrive(
        &mut self,
        key: &GroupKey,
        size: usize,
        worker: WorkerId,
        gradient: &Gradient,
        norm: f64,
    ) -> Arrival {
        let k = (key.0.start, key.0.end, key.1.to_u8());
        let mut earlier = Vec::new();
        let mut group = match self.groups.remove(&k) {
            Some(g) if g.round == gradient.round => g,
            older => {
                // A new round for this group: an older answer still held is recomputed (its
                // round has closed; the schedule refuses it as late, with no strike).
                if let Some(old) = older.filter(|g| !g.released) {
                    earlier.push((old.reference, Fate::Disputed));
                }
                if size <= 1 {
                    return Arrival {
                        earlier,
                        this: Fate::Agreed,
                    };
                }
                let reference = Replica {
                    worker,
                    gradient: gradient.clone(),
                    norm,
                };
                self.groups.insert(
                    k,
                    Group {
                        round: gradient.round,
                        reference,
                        released: false,
                        seen: 1,
                        size,
                    },
                );
                return Arrival {
                    earlier,
                    this: Fate::Held,
                };
            }
        };
        group.seen += 1;
        let ok = agree(&group.reference.gradient.grads, &gradient.grads, key.1).is_ok();
        let fate = if ok { Fate::Agreed } else { Fate::Disputed };
        let release = !group.released;
        group.released = true;
        let answers = 1 + u64::from(release);
        if group.seen < group.size {
            // Later members are compared with the reference too: it stays.
            if release {
                earlier.push((group.reference.clone(), fate));
            }
            self.groups.insert(k, group);
        } else if release {
            earlier.push((group.reference, fate));
        }
        if ok {
            self.agreed += answers;
        } else {
            self.disputed += 1;
        }
        Arrival {
            earlier,
            this: fate,
        }
    }

    /// Every answer still held alone (at the deadline, or when a worker left): each is to be
    /// recomputed.
    pub fn release_alone(&mut self) -> Vec<Replica> {
        let mut alone = Vec::new();
        self.groups.retain(|_, g| {
            if !g.released {
                g.released = true;
                alone.push(g.reference.clone());
            }
            g.seen < g.size
        });
        alone
    }

    /// Whether any answer is held.
    pub fn holding(&self) -> bool {
        self.groups.values().any(|g| !g.released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `worker`'s answer of `value` everywhere for `round`: the fates of the earlier answers
    /// it decided (by worker), and its own.
    fn arrive(
        r: &mut Replicas,
        key: &GroupKey,
        size: usize,
        (worker, round, value): (u32, u64, f32),
    ) -> (Vec<(u32, Fate)>, Fate) {
        let gradient = Gradient {
            compute_us: 0,
            parts: 1,
            round: Round(round),
            samples: 32,
            loss: 1.0,
            grads: vec![value; 4],
        };
        let a = r.arrive(
            key,
            size,
            WorkerId(worker),
            &gradient,
            2.0 * f64::from(value),
        );
        let earlier = a.earlier.iter().map(|(r, f)| (r.worker.0, *f)).collect();
        (earlier, a.this)
    }

    const KEY: GroupKey = (0..100, Compression::None);
    use Fate::*;

    #[test]
    fn the_first_answer_waits_for_an_agreeing_partner() {
        let mut r = Replicas::default();
        assert_eq!(arrive(&mut r, &KEY, 3, (1, 0, 0.5)), (vec![], Held));
        assert!(r.holding());
        assert_eq!(
            arrive(&mut r, &KEY, 3, (2, 0, 0.5)),
            (vec![(1, Agreed)], Agreed)
        );
        assert!(!r.holding());
        // The third compares with the reference too; a liar is disputed alone.
        assert_eq!(arrive(&mut r, &KEY, 3, (3, 0, 0.505)), (vec![], Disputed));
        assert_eq!((r.agreed, r.disputed), (2, 1));
        // The group is complete: nothing kept.
        assert!(r.groups.is_empty());
    }

    #[test]
    fn disagreement_sends_both_to_arbitration() {
        let mut r = Replicas::default();
        arrive(&mut r, &KEY, 2, (1, 0, 0.5));
        assert_eq!(
            arrive(&mut r, &KEY, 2, (2, 0, -5.0)),
            (vec![(1, Disputed)], Disputed)
        );
        assert!(
            r.groups.is_empty(),
            "a pair is complete: the reference moved out"
        );
    }

    #[test]
    fn an_answer_alone_is_released_for_recomputation() {
        let mut r = Replicas::default();
        arrive(&mut r, &KEY, 2, (1, 4, 0.5));
        let other = (100..200, Compression::None);
        arrive(&mut r, &other, 2, (3, 4, 0.5));
        let alone: Vec<u32> = r.release_alone().iter().map(|a| a.worker.0).collect();
        assert_eq!(alone, [1, 3]);
        assert!(r.release_alone().is_empty(), "once");
        // Its partner answering late is compared and goes on alone.
        assert_eq!(arrive(&mut r, &KEY, 2, (2, 4, 0.5)), (vec![], Agreed));
    }

    #[test]
    fn a_group_of_one_and_a_new_round_pass_through() {
        let mut r = Replicas::default();
        assert_eq!(arrive(&mut r, &KEY, 1, (1, 0, 0.5)), (vec![], Agreed));
        // A held answer of round 0 when round 1's first arrives: recomputed.
        arrive(&mut r, &KEY, 2, (1, 0, 0.5));
        assert_eq!(
            arrive(&mut r, &KEY, 2, (2, 1, 0.5)),
            (vec![(1, Disputed)], Held)
        );
        assert!(r.holding(), "round 1's first is held");
    }
}

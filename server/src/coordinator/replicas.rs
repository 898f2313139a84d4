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

/// What to do with an answer.
#[derive(Debug)]
pub enum Arrival {
    /// Held until a partner answers (or the deadline).
    Held,
    /// These agree: on to the round.
    Agreed(Vec<Replica>),
    /// These disagree: recompute and keep the ones that match.
    Disputed(Vec<Replica>),
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
    /// An answer from a worker in a group of `size` that shares `key`.
    pub fn arrive(&mut self, key: &GroupKey, size: usize, replica: Replica) -> Arrival {
        let round = replica.gradient.round;
        let k = (key.0.start, key.0.end, key.1.to_u8());
        let mut out = Vec::new();
        let group = match self.groups.remove(&k) {
            Some(g) if g.round == round => g,
            older => {
                // A new round for this group: an older answer still held goes to arbitration
                // (its round has closed; the schedule refuses it as late, with no strike).
                if let Some(old) = older.filter(|g| !g.released) {
                    out.push(old.reference);
                }
                if size <= 1 {
                    return done(out, vec![replica]);
                }
                self.groups.insert(
                    k,
                    Group {
                        round,
                        reference: replica,
                        released: false,
                        seen: 1,
                        size,
                    },
                );
                return if out.is_empty() {
                    Arrival::Held
                } else {
                    Arrival::Disputed(out)
                };
            }
        };
        let mut group = group;
        group.seen += 1;
        let ok = agree(
            &group.reference.gradient.grads,
            &replica.gradient.grads,
            key.1,
        )
        .is_ok();
        let mut answers = Vec::with_capacity(2);
        if !group.released {
            answers.push(group.reference.clone());
            group.released = true;
        }
        answers.push(replica);
        if group.seen < group.size {
            self.groups.insert(k, group);
        }
        if ok {
            self.agreed += answers.len() as u64;
            Arrival::Agreed(answers)
        } else {
            self.disputed += 1;
            Arrival::Disputed(answers)
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

fn done(disputed: Vec<Replica>, agreed: Vec<Replica>) -> Arrival {
    if disputed.is_empty() {
        Arrival::Agreed(agreed)
    } else {
        Arrival::Disputed([disputed, agreed].concat())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(worker: u32, round: u64, value: f32) -> Replica {
        Replica {
            worker: WorkerId(worker),
            gradient: Gradient {
                round: Round(round),
                samples: 32,
                loss: 1.0,
                grads: vec![value; 4],
            },
            norm: 2.0 * f64::from(value),
        }
    }

    fn workers(answers: &[Replica]) -> Vec<u32> {
        answers.iter().map(|r| r.worker.0).collect()
    }

    const KEY: GroupKey = (0..100, Compression::None);

    #[test]
    fn the_first_answer_waits_for_an_agreeing_partner() {
        let mut r = Replicas::default();
        assert!(matches!(
            r.arrive(&KEY, 3, replica(1, 0, 0.5)),
            Arrival::Held
        ));
        assert!(r.holding());
        let Arrival::Agreed(both) = r.arrive(&KEY, 3, replica(2, 0, 0.5)) else {
            panic!("agree")
        };
        assert_eq!(workers(&both), [1, 2]);
        assert!(!r.holding());
        // The third compares with the reference too; a liar is disputed alone.
        let Arrival::Disputed(liar) = r.arrive(&KEY, 3, replica(3, 0, 0.505)) else {
            panic!("disputed")
        };
        assert_eq!(workers(&liar), [3]);
        assert_eq!((r.agreed, r.disputed), (2, 1));
        // The group is complete: nothing kept.
        assert!(r.groups.is_empty());
    }

    #[test]
    fn disagreement_sends_both_to_arbitration() {
        let mut r = Replicas::default();
        r.arrive(&KEY, 2, replica(1, 0, 0.5));
        let Arrival::Disputed(both) = r.arrive(&KEY, 2, replica(2, 0, -5.0)) else {
            panic!("disputed")
        };
        assert_eq!(workers(&both), [1, 2]);
    }

    #[test]
    fn an_answer_alone_is_released_for_recomputation() {
        let mut r = Replicas::default();
        r.arrive(&KEY, 2, replica(1, 4, 0.5));
        let other = (100..200, Compression::None);
        r.arrive(&other, 2, replica(3, 4, 0.5));
        let alone = r.release_alone();
        assert_eq!(workers(&alone), [1, 3]);
        assert!(r.release_alone().is_empty(), "once");
        // Its partner answering late is compared and goes on alone.
        let Arrival::Agreed(late) = r.arrive(&KEY, 2, replica(2, 4, 0.5)) else {
            panic!("agree")
        };
        assert_eq!(workers(&late), [2]);
    }

    #[test]
    fn a_group_of_one_and_a_new_round_pass_through() {
        let mut r = Replicas::default();
        let Arrival::Agreed(one) = r.arrive(&KEY, 1, replica(1, 0, 0.5)) else {
            panic!("alone in its group")
        };
        assert_eq!(workers(&one), [1]);
        // A held answer of round 0 when round 1's first arrives: disputed (recomputed).
        r.arrive(&KEY, 2, replica(1, 0, 0.5));
        let Arrival::Disputed(old) = r.arrive(&KEY, 2, replica(2, 1, 0.5)) else {
            panic!("the old one is recomputed")
        };
        assert_eq!(workers(&old), [1]);
        assert!(r.holding(), "round 1's first is held");
    }
}

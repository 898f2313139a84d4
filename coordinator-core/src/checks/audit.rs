//! Which answers the coordinator recomputes (`--verify-fraction`), decided when the weights
//! are sent, in every mode.
//!
//! A sampled pull keeps what its answer must be checked against: the weights exactly as that
//! worker decoded them (shared with the trainer's per-version cache, so workers that pulled
//! the same version share one copy), the version, the shard it held and the batch its `Task`
//! named. Its answer, whenever
//! it arrives and however stale (async, hogwild), is recomputed on those. A worker cannot tell
//! a sampled pull from another.
//!
//! A pull to a worker on probation (`--probation`, `registry/trust.rs`) is always audited:
//! its answer counts only once it has been recomputed.
//!
//! Memory: at most [`MAX_VERSIONS`] distinct weights (a version in one compression) are kept
//! at once for sampled pulls, 4·P bytes each, and [`MAX_PROBATION_VERSIONS`] with those of
//! probation; a sampled pull while that many others are outstanding is not audited
//! (counted), and a probation pull's answer is then dropped unchecked, without a strike
//! (counted): it cannot count before it is checked.

use std::collections::BTreeMap;
use std::sync::Arc;

use model::SplitMix64;
use protocol::{Compression, WorkerId};

use crate::registry::Pull;

/// Distinct weights (version, compression) audits may keep alive at once.
pub const MAX_VERSIONS: usize = 4;
/// Distinct weights audits may keep alive at once when the pull is on probation.
pub const MAX_PROBATION_VERSIONS: usize = 16;

/// One sampled pull.
#[derive(Debug, Clone)]
pub struct Audit {
    /// The version, batch and shard the answer must be computed on.
    pub pull: Pull,
    pub compression: Compression,
    pub weights: Arc<[f32]>,
}

/// Distinct weights kept: (version, compression) → the weights and how many audits hold them.
type Kept = BTreeMap<(u64, u8), (Arc<[f32]>, usize)>;

/// How a pull's answer is to be checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Check {
    /// The chance it is recomputed.
    pub rate: f64,
    /// Its worker is on probation: recomputed, and dropped if it cannot be.
    pub probation: bool,
}

impl Check {
    /// Sampled at `rate`.
    pub fn sampled(rate: f64) -> Self {
        Self {
            rate,
            probation: false,
        }
    }

    pub const PROBATION: Self = Self {
        rate: 1.0,
        probation: true,
    };
}

#[derive(Debug)]
pub struct Audits {
    rng: SplitMix64,
    pending: BTreeMap<WorkerId, Audit>,
    /// Probation pulls that could not be audited: (worker, version) whose answer is dropped.
    unchecked: BTreeMap<WorkerId, u64>,
    kept: Kept,
    /// Sampled pulls not audited for lack of room.
    skipped: u64,
    /// The work (version, batch) each worker was last struck for (see [`Audits::strikes`]).
    struck: BTreeMap<WorkerId, (u64, u64)>,
}

/// Workers whose last struck work is remembered: beyond, the lowest identity is forgotten.
const STRUCK_REMEMBERED: usize = 4096;

impl Audits {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: SplitMix64::new(seed),
            pending: BTreeMap::new(),
            unchecked: BTreeMap::new(),
            kept: Kept::new(),
            skipped: 0,
            struck: BTreeMap::new(),
        }
    }

    /// The sampler's state (for a checkpoint), and continuing from one.
    pub fn rng_state(&self) -> u64 {
        self.rng.state()
    }

    pub fn restore_rng(&mut self, state: u64) {
        self.rng = SplitMix64::new(state);
    }

    /// `worker` was sent weights in `compression`, to answer `pull` (`None`: it holds no
    /// shard, so it will not answer): decides whether its answer is recomputed. `weights`
    /// gives the weights as it decodes them (called only if sampled, and not already kept).
    /// A newer pull replaces an older one's audit: its answer is the one expected. It is
    /// sampled at `check.rate` (`registry/trust.rs`), and audited whatever the draw on
    /// `check.probation`.
    pub fn sent(
        &mut self,
        worker: WorkerId,
        compression: Compression,
        pull: Option<Pull>,
        check: Check,
        weights: impl FnOnce() -> Arc<[f32]>,
    ) {
        self.left(worker);
        let Some(pull) = pull else { return };
        let probation = check.probation;
        // Drawn for every pull, so probation does not shift which later pulls are sampled.
        let drawn = self.rng.next_f64() < check.rate;
        if !drawn && !probation {
            return;
        }
        let key = (pull.version, compression.to_u8());
        let room = if probation {
            MAX_PROBATION_VERSIONS
        } else {
            MAX_VERSIONS
        };
        if !self.kept.contains_key(&key) && self.kept.len() >= room {
            self.skipped += 1;
            if probation {
                self.unchecked.insert(worker, pull.version);
            }
            return;
        }
        let (shared, holders) = self.kept.entry(key).or_insert_with(|| (weights(), 0));
        *holders += 1;
        let weights = Arc::clone(shared);
        self.pending.insert(
            worker,
            Audit {
                pull,
                compression,
                weights,
            },
        );
    }

    /// The audit for `worker`'s answer computed on `version`, if that pull was sampled.
    pub fn take(&mut self, worker: WorkerId, version: u64) -> Option<Audit> {
        match self.pending.get(&worker) {
            Some(a) if a.pull.version == version => self.remove(worker),
            _ => None,
        }
    }

    /// Audited pulls of `version` whose answers have not come yet: recomputations to come.
    pub fn outstanding(&self, version: u64) -> usize {
        let of = self.pending.values().filter(|a| a.pull.version == version);
        of.count()
    }

    /// Whether `worker`'s answer computed on `version` was on probation and could not be
    /// audited: it must be dropped (once).
    pub fn unchecked(&mut self, worker: WorkerId, version: u64) -> bool {
        match self.unchecked.get(&worker) {
            Some(&v) if v == version => self.unchecked.remove(&worker).is_some(),
            _ => false,
        }
    }

    /// Whether a mismatch of `worker`'s answer to `pull` is a strike: not if it was already
    /// struck for the very same work (version and batch). A sync round re-sends its weights
    /// and `Task` to a worker it excused while it waits for a quorum, and a deterministic
    /// worker computes the same answer again: one computation, judged once. An honest
    /// worker misjudged once must not be banned by its own repetition.
    pub fn strikes(&mut self, worker: WorkerId, pull: &Pull) -> bool {
        let work = (pull.version, pull.batch);
        if self.struck.get(&worker) == Some(&work) {
            return false;
        }
        if self.struck.len() >= STRUCK_REMEMBERED && !self.struck.contains_key(&worker) {
            self.struck.pop_first();
        }
        self.struck.insert(worker, work);
        true
    }

    pub fn left(&mut self, worker: WorkerId) {
        self.unchecked.remove(&worker);
        self.remove(worker);
    }

    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    fn remove(&mut self, worker: WorkerId) -> Option<Audit> {
        let audit = self.pending.remove(&worker)?;
        let key = (audit.pull.version, audit.compression.to_u8());
        if let Some((_, holders)) = self.kept.get_mut(&key) {
            *holders -= 1;
            if *holders == 0 {
                self.kept.remove(&key);
            }
        }
        Some(audit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: Compression = Compression::None;
    /// Every pull sampled, none on probation.
    const ALL: Check = Check {
        rate: 1.0,
        probation: false,
    };

    fn weights(v: f32) -> impl FnOnce() -> Arc<[f32]> {
        move || Arc::from(vec![v; 3])
    }

    /// A pull of `version` on `shard`, on the batch of index `version`.
    fn on(version: u64, shard: std::ops::Range<usize>) -> Option<Pull> {
        Some(Pull {
            timed: true,
            local: None,
            version,
            batch: version,
            shard,
        })
    }

    #[test]
    fn a_sampled_pull_is_checked_against_what_was_sent_whenever_it_answers() {
        let mut a = Audits::new(1);
        a.sent(WorkerId(1), F32, on(7, 0..10), ALL, weights(7.0));
        assert!(a.take(WorkerId(1), 6).is_none(), "another version's answer");
        let audit = a.take(WorkerId(1), 7).expect("sampled");
        assert_eq!(
            (audit.pull, &audit.weights[..]),
            (on(7, 0..10).expect("a pull"), &[7.0; 3][..])
        );
        assert!(a.take(WorkerId(1), 7).is_none(), "taken once");
        // A newer pull replaces the older audit; leaving forgets it.
        a.sent(WorkerId(2), F32, on(8, 0..10), ALL, weights(8.0));
        a.sent(WorkerId(2), F32, on(9, 0..10), ALL, weights(9.0));
        assert!(a.take(WorkerId(2), 8).is_none());
        a.left(WorkerId(2));
        assert!(a.take(WorkerId(2), 9).is_none());
        // No shard yet: nothing to recompute on.
        a.sent(WorkerId(3), F32, None, ALL, weights(9.0));
        assert!(a.take(WorkerId(3), 9).is_none());
    }

    #[test]
    fn the_audits_of_a_version_still_out_are_counted_until_answered_or_left() {
        let mut a = Audits::new(1);
        for w in 1..=3 {
            a.sent(WorkerId(w), F32, on(5, 0..10), ALL, weights(5.0));
        }
        a.sent(WorkerId(4), F32, on(4, 0..10), ALL, weights(4.0));
        assert_eq!((a.outstanding(5), a.outstanding(4)), (3, 1));
        a.take(WorkerId(1), 5).expect("sampled");
        a.left(WorkerId(2));
        assert_eq!((a.outstanding(5), a.outstanding(6)), (1, 0));
    }

    #[test]
    fn workers_on_one_version_share_its_weights_and_versions_are_bounded() {
        let mut a = Audits::new(1);
        a.sent(WorkerId(1), F32, on(1, 0..1), ALL, weights(1.0));
        a.sent(WorkerId(2), F32, on(1, 0..1), ALL, || {
            panic!("shared, not rebuilt")
        });
        // The same version in another compression is other weights: not shared.
        a.sent(
            WorkerId(11),
            Compression::Int8,
            on(1, 0..1),
            ALL,
            weights(1.5),
        );
        assert_eq!(
            &a.take(WorkerId(11), 1).expect("sampled").weights[..],
            &[1.5; 3]
        );
        for v in 2..=4 {
            a.sent(
                WorkerId(v as u32 + 1),
                F32,
                on(v, 0..1),
                ALL,
                weights(v as f32),
            );
        }
        // Four versions outstanding: a fifth is not audited, a kept one still is.
        a.sent(WorkerId(9), F32, on(5, 0..1), ALL, weights(5.0));
        assert!(a.take(WorkerId(9), 5).is_none());
        assert_eq!(a.skipped(), 1);
        a.sent(WorkerId(10), F32, on(4, 0..1), ALL, || panic!("shared"));
        assert!(a.take(WorkerId(10), 4).is_some());
        // Version 1's two holders answer, or leave: its weights are let go, and room is made.
        assert!(a.take(WorkerId(1), 1).is_some());
        a.sent(WorkerId(9), F32, on(5, 0..1), ALL, weights(5.0));
        assert!(
            a.take(WorkerId(9), 5).is_none(),
            "version 1 still held by worker 2"
        );
        a.left(WorkerId(2));
        a.sent(WorkerId(9), F32, on(5, 0..1), ALL, weights(5.0));
        assert_eq!(
            &a.take(WorkerId(9), 5).expect("room").weights[..],
            &[5.0; 3]
        );
        assert_eq!(a.skipped(), 2);
    }

    #[test]
    fn a_pull_on_probation_is_always_audited_and_dropped_when_it_cannot_be() {
        let mut a = Audits::new(1);
        a.sent(
            WorkerId(1),
            F32,
            on(3, 0..1),
            Check::PROBATION,
            weights(3.0),
        );
        assert!(a.take(WorkerId(1), 3).is_some(), "at fraction 0 too");
        // Sixteen versions kept by probation pulls: a seventeenth cannot be checked, so its
        // answer is dropped, once, and a newer pull forgets it.
        for v in 0..16 {
            a.sent(
                WorkerId(100 + v as u32),
                F32,
                on(v, 0..1),
                Check::PROBATION,
                weights(0.0),
            );
        }
        a.sent(
            WorkerId(1),
            F32,
            on(16, 0..1),
            Check::PROBATION,
            weights(0.0),
        );
        assert!(a.take(WorkerId(1), 16).is_none());
        assert!(!a.unchecked(WorkerId(1), 15), "another version");
        assert!(a.unchecked(WorkerId(1), 16));
        assert!(!a.unchecked(WorkerId(1), 16), "once");
        a.sent(
            WorkerId(2),
            F32,
            on(17, 0..1),
            Check::PROBATION,
            weights(0.0),
        );
        a.sent(
            WorkerId(2),
            F32,
            on(18, 0..1),
            Check::sampled(0.0),
            weights(0.0),
        );
        assert!(!a.unchecked(WorkerId(2), 17), "replaced by a newer pull");
        // A sampled pull is not let past four versions, where probation's are.
        let mut b = Audits::new(1);
        for v in 0..4 {
            b.sent(WorkerId(v as u32), F32, on(v, 0..1), ALL, weights(0.0));
        }
        b.sent(WorkerId(8), F32, on(4, 0..1), ALL, weights(0.0));
        assert!(b.take(WorkerId(8), 4).is_none() && !b.unchecked(WorkerId(8), 4));
        b.sent(
            WorkerId(9),
            F32,
            on(4, 0..1),
            Check::PROBATION,
            weights(0.0),
        );
        assert!(b.take(WorkerId(9), 4).is_some());
    }

    #[test]
    fn the_fraction_is_honoured() {
        let mut a = Audits::new(5);
        let mut sampled = 0;
        for v in 0..10_000u64 {
            a.sent(
                WorkerId(1),
                F32,
                on(v, 0..1),
                Check::sampled(0.2),
                weights(0.0),
            );
            sampled += usize::from(a.take(WorkerId(1), v).is_some());
        }
        assert!(
            (1_800..2_200).contains(&sampled),
            "{sampled} of 10,000 at 0.2"
        );
        let mut none = Audits::new(5);
        none.sent(WorkerId(1), F32, on(0, 0..1), Check::sampled(0.0), || {
            panic!("never sampled")
        });
    }

    #[test]
    fn the_same_work_is_struck_once() {
        let mut audits = Audits::new(1);
        let work = on(5, 0..10).expect("a pull");
        assert!(
            audits.strikes(WorkerId(1), &work),
            "the first mismatch strikes"
        );
        assert!(
            !audits.strikes(WorkerId(1), &work),
            "the same work again does not"
        );
        assert!(audits.strikes(WorkerId(2), &work), "another worker's does");
        let next = on(6, 0..10).expect("a pull");
        assert!(audits.strikes(WorkerId(1), &next), "new work does");
        assert!(
            audits.strikes(WorkerId(1), &work),
            "and so does the old one after it"
        );
    }
}

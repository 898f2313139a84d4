//! Strangers who come back: colluding attackers ("A Little Is Enough") who rejoin under a
//! fresh identity and address after every ban, against probation, the decaying check rate
//! and the ration of new identities; honest newcomers beside them.

use coordinator_core::aggregate::AggregatorKind;
use coordinator_core::Settings;
use protocol::Compression;

use crate::tests::{honest, ms, scenario, sync};
use crate::*;

/// A 10 ms, 100 Mbit/s link.
fn link() -> Link {
    Link::symmetric(ms(10), 100.0)
}

/// Six honest workers and two colluders (ALIE, `z`), sync, 32 hidden units.
fn attacked(settings: Settings, z: f32, lies_low: u32, rounds: u64) -> Report {
    let mut workers = honest(6, link(), ms(2));
    for _ in 0..2 {
        workers.push(
            WorkerSpec::new(link(), ms(2))
                .with_compression(Compression::Int8)
                .behaving(Behaviour::Alie(z))
                .coming_back_fresh()
                .lying_low(lies_low),
        );
    }
    let mut s = scenario(32, workers, settings);
    s.until.rounds = Some(rounds);
    run(s)
}

/// What the colluders came to: (identities, poisoned answers sent, poisoned answers that
/// counted, answers that counted).
fn colluders(r: &Report) -> (u32, u64, u64, u64) {
    let c = &r.workers[6..];
    let ids = c.iter().map(|w| w.identities).sum();
    let poisoned: u64 = c.iter().map(|w| w.poisoned).sum();
    let accepted = c.iter().map(|w| w.accepted).sum();
    // Every mismatch is theirs (asserted by the callers: honest workers are never struck).
    (
        ids,
        poisoned,
        poisoned - r.verification_mismatches,
        accepted,
    )
}

fn no_honest_worker_struck(r: &Report) {
    assert!(
        r.workers[..6].iter().all(|w| w.ended.is_none()),
        "{:?}",
        r.workers
    );
}

#[test]
fn colluders_who_come_back_fresh_never_count_while_on_probation() {
    let r = attacked(sync(6), 1.0, 0, 150);
    no_honest_worker_struck(&r);
    let (ids, poisoned, slipped, accepted) = colluders(&r);
    assert!(
        ids > 4 && poisoned > 20,
        "{ids} identities, {poisoned} poisoned"
    );
    assert_eq!((slipped, accepted), (0, 0), "every answer checked first");
    assert_eq!(r.verification_mismatches, poisoned);
    // Before probation (a flat 5 % sample), the same attack counted most of the time.
    let flat = Settings {
        probation: 0,
        ..sync(6)
    };
    let r = attacked(flat, 1.0, 0, 150);
    no_honest_worker_struck(&r);
    let (_, poisoned, slipped, _) = colluders(&r);
    assert!(
        slipped * 10 > poisoned * 8,
        "{slipped} of {poisoned} counted"
    );
}

#[test]
fn colluders_who_lie_low_through_probation_get_about_one_answer_in_p_plus_one_in() {
    // Honest for 50 answers under each identity and after each strike, then ALIE.
    let r = attacked(sync(6), 1.0, 50, 400);
    no_honest_worker_struck(&r);
    let (_, poisoned, slipped, accepted) = colluders(&r);
    println!("decaying: {slipped} poisoned of {accepted} counted ({poisoned} sent)");
    assert!(poisoned > 0);
    assert!(slipped * 100 <= accepted * 15, "{slipped} of {accepted}");
    // At a flat rate after probation, the same attacker gets far more in.
    let flat = Settings {
        probation: 0,
        ..sync(6)
    };
    let r = attacked(flat, 1.0, 50, 400);
    let (_, poisoned, slipped_flat, accepted) = colluders(&r);
    println!("flat: {slipped_flat} poisoned of {accepted} counted ({poisoned} sent)");
    assert!(
        slipped_flat > slipped * 3,
        "{slipped_flat} against {slipped}"
    );
}

#[test]
fn new_identities_from_one_network_are_rationed() {
    let rationed = Settings {
        new_identities_per_network: 5,
        ..sync(6)
    };
    let r = attacked(rationed, 1.0, 0, 150);
    no_honest_worker_struck(&r);
    let (ids, ..) = colluders(&r);
    // Their first two, then five from their network within the hour.
    assert_eq!(ids, 2 + 5, "{:?}", &r.workers[6..]);
    assert!(r.workers[6..]
        .iter()
        .any(|w| w.ended.as_deref() == Some("full")));
    // Unrationed, they come back as often as they are banned.
    let free = Settings {
        new_identities_per_network: u32::MAX,
        new_identities_per_address: u32::MAX,
        ..sync(6)
    };
    let (ids, ..) = colluders(&attacked(free, 1.0, 0, 150));
    assert!(ids > 7, "{ids}");
}

#[test]
fn honest_newcomers_count_from_their_first_answer_and_are_never_struck() {
    let mut workers = honest(4, link(), ms(2));
    for i in 0..4 {
        workers.push(
            WorkerSpec::new(link(), ms(2))
                .with_compression(Compression::Int8)
                .joining_at(ms(100 + 100 * i)),
        );
    }
    let settings = Settings {
        verify_fraction: 0.0,
        ..sync(4)
    };
    let mut s = scenario(32, workers, settings);
    s.until.rounds = Some(300);
    let r = run(s);
    assert_eq!(r.verification_mismatches, 0, "{r:?}");
    assert!(r.workers.iter().all(|w| w.ended.is_none()), "{r:?}");
    for w in &r.workers[4..] {
        // Every answer recomputed while on probation counted at once: none was dropped.
        assert!(w.accepted >= 10 && w.accepted == w.gradients_sent, "{w:?}");
    }
    // Ten each on probation, then P / n of them until the run ends, at `--verify-fraction 0`.
    assert!(r.probation_checks >= 80, "{}", r.probation_checks);
    assert!(r.accuracy.expect("evaluated") > 0.85, "{r:?}");
}

#[test]
fn worker_momentum_leaves_recomputation_whole() {
    let settings = Settings {
        aggregator: AggregatorKind {
            momentum: 0.9,
            ..AggregatorKind::default()
        },
        verify_fraction: 1.0,
        ..sync(4)
    };
    let mut s = scenario(32, honest(4, link(), ms(2)), settings);
    s.until.rounds = Some(200);
    let r = run(s);
    assert_eq!(r.verification_mismatches, 0, "{r:?}");
    assert!(r.gradients_accepted >= 790, "{r:?}");
    assert!(r.accuracy.expect("evaluated") > 0.8, "{r:?}");
}

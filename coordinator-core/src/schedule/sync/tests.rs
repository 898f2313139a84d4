//! The sync schedule on its own: actions out for events in, explicit time.

use std::time::{Duration, Instant};

use protocol::{ErrorCode, Gradient, WorkerId};

use super::*;
use crate::aggregate::AggregatorKind;
use crate::schedule::deadline::RoundTimeout;
use crate::schedule::testing::{self, view};
use crate::schedule::Contribution;

const PARAMS: usize = 3;

fn schedule(min_workers: usize, miss_limit: u32) -> SyncSchedule {
    let timeout = RoundTimeout::Fixed(Duration::from_millis(100));
    SyncSchedule::new(
        timeout,
        min_workers,
        miss_limit,
        AggregatorKind::default(),
        PARAMS,
    )
}

fn grad(round: u64, value: f32, samples: u32) -> Gradient {
    testing::gradient(round, value, samples, PARAMS)
}

const A: WorkerId = WorkerId(1);
const B: WorkerId = WorkerId(2);
const C: WorkerId = WorkerId(3);

/// Carries out `Weights` as the coordinator would (marks them sent) and returns the actions.
fn sent_all(s: &mut SyncSchedule, actions: Vec<Action>, version: u64) -> Vec<Action> {
    for a in &actions {
        if let Action::Weights(id) = a {
            s.sent(*id, version);
        }
    }
    actions
}

#[test]
fn a_round_opens_at_min_workers_and_its_update_is_the_sample_weighted_mean() {
    let t0 = Instant::now();
    let mut s = schedule(2, 3);
    assert!(s.joined(A, view(0)).is_empty());
    assert!(
        s.settle(view(0), t0).is_empty(),
        "one worker is below the quorum"
    );
    assert!(s.joined(B, view(0)).is_empty());
    let opened = s.settle(view(0), t0);
    assert_eq!(
        opened,
        [Action::Rebalance, Action::Weights(A), Action::Weights(B)]
    );
    assert_eq!(s.deadline(), Some(t0 + Duration::from_millis(100)));
    // A newcomer mid-round gets the weights, but is not waited for.
    assert_eq!(s.joined(C, view(0)), [Action::Weights(C)]);
    assert_eq!(s.standing().participants, 2);

    let ms = |n| t0 + Duration::from_millis(n);
    assert_eq!(
        s.gradient(A, &Contribution::of(&grad(0, 1.0, 8)), view(0), ms(10)),
        [Action::Accepted(A)]
    );
    assert!(s.settle(view(0), ms(10)).is_empty(), "waits for B");
    // The last answer closes the round: its update comes with it.
    let closed = s.gradient(B, &Contribution::of(&grad(0, 4.0, 24)), view(0), ms(30));
    let [Action::Accepted(B), Action::Apply(update)] = closed.as_slice() else {
        panic!("{closed:?}")
    };
    // (1·8 + 4·24) / 32 = 3.25, exactly.
    assert_eq!(update.gradient, vec![3.25; PARAMS]);
    assert_eq!((update.samples, update.answered, update.missed), (32, 2, 0));
    assert_eq!(update.mean_loss, 2.0);
    assert!(!update.deadline_hit);
    assert_eq!(update.duration, Duration::from_millis(30));
    // The next settle, after the update, opens round 1 for all three.
    let next = s.settle(view(1), ms(30));
    assert_eq!(next.len(), 4, "{next:?}");
    assert_eq!(s.standing().participants, 3);
}

#[test]
fn gradients_for_other_rounds_are_refused_with_their_reason() {
    let t0 = Instant::now();
    let mut s = schedule(1, 3);
    s.joined(A, view(5));
    s.joined(B, view(5));
    let refused = |actions: Vec<Action>| match actions.as_slice() {
        [.., Action::Refuse(_, r)] => r.code,
        other => panic!("{other:?}"),
    };
    // No round open yet.
    assert_eq!(
        refused(s.gradient(A, &Contribution::of(&grad(4, 1.0, 1)), view(5), t0)),
        ErrorCode::Late
    );
    assert_eq!(
        refused(s.gradient(A, &Contribution::of(&grad(6, 1.0, 1)), view(5), t0)),
        ErrorCode::RoundNotOpen
    );
    s.settle(view(5), t0);
    s.gradient(A, &Contribution::of(&grad(5, 1.0, 1)), view(5), t0);
    assert_eq!(
        refused(s.gradient(A, &Contribution::of(&grad(5, 1.0, 1)), view(5), t0)),
        ErrorCode::Duplicate
    );
}

#[test]
fn deadlines_close_with_quorum_skip_after_k_misses_and_an_answer_brings_back() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut s = schedule(2, 2);
    for w in [A, B, C] {
        s.joined(w, view(0));
    }
    let mut version = 0;
    let opened = s.settle(view(0), t0);
    let mut actions = sent_all(&mut s, opened, 0);
    assert_eq!(actions.len(), 4);
    for _ in 0..2 {
        let deadline = s.deadline().expect("open");
        s.gradient(
            A,
            &Contribution::of(&grad(version, 1.0, 1)),
            view(version),
            deadline,
        );
        s.gradient(
            B,
            &Contribution::of(&grad(version, 1.0, 1)),
            view(version),
            deadline,
        );
        assert!(s.tick(deadline).is_empty(), "quorum: no extension");
        actions = s.settle(view(version), deadline);
        assert!(
            matches!(actions.last(), Some(Action::Apply(u)) if u.deadline_hit && u.missed == 1),
            "{actions:?}"
        );
        version += 1;
        let opened = s.settle(view(version), deadline);
        actions = sent_all(&mut s, opened, version);
    }
    // The second miss skipped C (the Quorum action came with the second close), and C,
    // sitting on unanswered weights, was not sent the third round's.
    assert!(s.is_skipped(C));
    assert_eq!(s.standing().skipped, 1);
    assert!(!actions.contains(&Action::Weights(C)), "{actions:?}");
    assert_eq!(s.standing().participants, 2);
    // C answers (late for round 1): back in the quorum.
    let back = s.gradient(
        C,
        &Contribution::of(&grad(1, 1.0, 1)),
        view(version),
        ms(1000),
    );
    assert_eq!(back[0], Action::Quorum(C, true));
    assert!(matches!(&back[1], Action::Refuse(C, r) if r.code == ErrorCode::Late));
    assert!(!s.is_skipped(C));
}

#[test]
fn a_deadline_without_quorum_extends_and_admits_newcomers() {
    let t0 = Instant::now();
    let mut s = schedule(2, 3);
    s.joined(A, view(0));
    s.joined(B, view(0));
    s.settle(view(0), t0);
    s.joined(C, view(0));
    s.gradient(A, &Contribution::of(&grad(0, 1.0, 1)), view(0), t0);
    let deadline = s.deadline().expect("open");
    assert!(s.tick(deadline - Duration::from_millis(1)).is_empty());
    let extended = s.tick(deadline);
    assert_eq!(
        extended,
        [Action::Extended, Action::Rebalance, Action::Weights(C)]
    );
    assert_eq!(s.deadline(), Some(deadline + Duration::from_millis(100)));
    // C's answer now completes the quorum at the new deadline... but B is still awaited.
    s.gradient(C, &Contribution::of(&grad(0, 1.0, 1)), view(0), deadline);
    assert!(s.settle(view(0), deadline).is_empty());
    let later = deadline + Duration::from_millis(100);
    s.tick(later);
    assert!(matches!(
        s.settle(view(0), later).as_slice(),
        [Action::Apply(u)] if u.answered == 2 && u.deadline_hit
    ));
}

#[test]
fn a_round_everyone_left_is_abandoned_and_nothing_opens_when_finished() {
    let t0 = Instant::now();
    let mut s = schedule(1, 3);
    s.joined(A, view(0));
    s.settle(view(0), t0);
    s.left(A);
    assert!(s.settle(view(0), t0).is_empty());
    assert!(!s.standing().training, "abandoned, and no one to open for");
    s.joined(B, view(0));
    let finished = View {
        version: 0,
        finished: true,
        ..View::default()
    };
    assert!(s.settle(finished, t0).is_empty());
}

#[test]
fn an_excused_participant_is_not_waited_for() {
    let t0 = Instant::now();
    let mut s = schedule(2, 3);
    s.joined(A, view(0));
    s.joined(B, view(0));
    s.settle(view(0), t0);
    s.gradient(A, &Contribution::of(&grad(0, 1.0, 1)), view(0), t0);
    assert!(s.settle(view(0), t0).is_empty(), "waits for B");
    // B's answer failed verification: the round closes with A's alone.
    assert!(s.excuse(B).is_empty());
    assert!(matches!(
        s.settle(view(0), t0).as_slice(),
        [Action::Apply(u)] if u.answered == 1
    ));
}

#[test]
fn an_extension_admits_newcomers_but_not_the_participants_it_excused() {
    let t0 = Instant::now();
    let mut s = schedule(3, 3);
    for w in [A, B, C] {
        s.joined(w, view(0));
    }
    s.settle(view(0), t0);
    let d = WorkerId(4);
    s.joined(d, view(0));
    // B's phase was excused (a newcomer's, replayed later); A's answer is in, C's is not.
    assert!(s.excuse(B).is_empty());
    s.gradient(A, &Contribution::of(&grad(0, 1.0, 1)), view(0), t0);
    let deadline = s.deadline().expect("open");
    assert_eq!(
        s.tick(deadline),
        [Action::Extended, Action::Rebalance, Action::Weights(d)],
        "B is not sent the same weights again"
    );
    // C's and the newcomer's answers complete it: B is not waited for.
    s.gradient(C, &Contribution::of(&grad(0, 1.0, 1)), view(0), deadline);
    let last = s.gradient(d, &Contribution::of(&grad(0, 1.0, 1)), view(0), deadline);
    assert!(matches!(
        last.as_slice(),
        [Action::Accepted(_), Action::Apply(u)] if u.answered == 3
    ));
}

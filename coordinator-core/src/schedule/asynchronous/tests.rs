//! The async schedule on its own: pulls, staleness, buffers, hogwild.

use std::time::{Duration, Instant};

use protocol::{ErrorCode, Gradient, WorkerId};

use super::*;
use crate::aggregate::AggregatorKind;
use crate::schedule::testing::{self, view};
use crate::schedule::Contribution;

const PARAMS: usize = 2;
const A: WorkerId = WorkerId(1);
const B: WorkerId = WorkerId(2);

fn grad(round: u64, value: f32, samples: u32) -> Gradient {
    testing::gradient(round, value, samples, PARAMS)
}

fn code(actions: &[Action]) -> ErrorCode {
    match actions {
        [Action::Refuse(_, r), ..] => r.code,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pull_is_answered_once_then_refreshed_with_the_newest_weights() {
    let t0 = Instant::now();
    let mut s = AsyncSchedule::new(1, Some(8), AggregatorKind::default(), PARAMS, t0);
    assert_eq!(
        s.joined(A, view(0)),
        [Action::Rebalance, Action::Weights(A)]
    );
    s.sent(A, 0);
    let later = t0 + Duration::from_millis(7);
    let actions = s.gradient(A, &Contribution::of(&grad(0, 0.5, 4)), view(0), later);
    let [Action::Accepted(A), Action::Apply(u), Action::Weights(A)] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(u.gradient, vec![0.5; PARAMS]);
    assert_eq!(
        (u.answered, u.samples, u.duration),
        (1, 4, Duration::from_millis(7))
    );
    // Not sent anything new yet: the same version again is a duplicate, a newer one not open.
    assert_eq!(
        code(&s.gradient(A, &Contribution::of(&grad(0, 0.5, 4)), view(1), later)),
        ErrorCode::Duplicate
    );
    s.sent(A, 1);
    assert_eq!(
        code(&s.gradient(A, &Contribution::of(&grad(2, 0.5, 4)), view(1), later)),
        ErrorCode::RoundNotOpen
    );
}

#[test]
fn stale_gradients_are_down_weighted_or_refused_beyond_the_bound() {
    let t0 = Instant::now();
    let mut s = AsyncSchedule::new(2, Some(1), AggregatorKind::default(), PARAMS, t0);
    s.joined(A, view(0));
    s.joined(B, view(0));
    s.sent(A, 3);
    s.sent(B, 4);
    // At version 4: A is 1 behind (weight 8 / 2 = 4), B fresh (weight 4).
    assert_eq!(
        s.gradient(A, &Contribution::of(&grad(3, 1.0, 8)), view(4), t0)
            .len(),
        2
    );
    let actions = s.gradient(B, &Contribution::of(&grad(4, 4.0, 4)), view(4), t0);
    let Some(Action::Apply(u)) = actions.get(1) else {
        panic!("{actions:?}")
    };
    // (1.0·4 + 4.0·4) / 8 = 2.5, exactly.
    assert_eq!(u.gradient, vec![2.5; PARAMS]);
    // Two behind with a bound of 1: refused, and sent fresh weights.
    s.sent(A, 3);
    let actions = s.gradient(A, &Contribution::of(&grad(3, 1.0, 8)), view(5), t0);
    assert_eq!(code(&actions), ErrorCode::Stale);
    assert_eq!(actions[1], Action::Weights(A));
}

#[test]
fn hogwild_applies_everything_at_full_weight() {
    let t0 = Instant::now();
    let mut s = AsyncSchedule::hogwild(AggregatorKind::default(), PARAMS, t0);
    s.joined(A, view(0));
    s.sent(A, 0);
    let actions = s.gradient(A, &Contribution::of(&grad(0, 3.0, 2)), view(100), t0);
    assert!(
        matches!(&actions[1], Action::Apply(u) if u.gradient == vec![3.0; PARAMS]),
        "{actions:?}"
    );
}

#[test]
fn a_leave_re_cuts_the_shards_once_unless_finished() {
    let t0 = Instant::now();
    let mut s = AsyncSchedule::new(1, Some(8), AggregatorKind::default(), PARAMS, t0);
    s.joined(A, view(0));
    s.joined(B, view(0));
    assert!(s.standing().training);
    s.left(A);
    assert_eq!(s.settle(view(0), t0), [Action::Rebalance]);
    assert!(s.settle(view(0), t0).is_empty());
    s.left(B);
    let finished = View {
        version: 0,
        finished: true,
        ..View::default()
    };
    assert!(s.settle(finished, t0).is_empty());
    assert!(!s.standing().training);
    assert!(
        s.gradient(A, &Contribution::of(&grad(0, 1.0, 1)), view(0), t0)
            .is_empty(),
        "gone: ignored"
    );
}

#[test]
fn an_answer_dropped_by_verification_is_followed_by_fresh_weights() {
    let t0 = Instant::now();
    let mut s = AsyncSchedule::new(1, Some(8), AggregatorKind::default(), PARAMS, t0);
    s.joined(A, view(0));
    s.sent(A, 3);
    // Its answer to version 3 failed verification: the pull counts as answered, and the
    // worker is not left waiting.
    assert_eq!(s.excuse(A), [Action::Weights(A)]);
    assert_eq!(
        code(&s.gradient(A, &Contribution::of(&grad(3, 0.5, 4)), view(3), t0)),
        ErrorCode::Duplicate,
        "the dropped answer cannot be sent again"
    );
    assert!(s.excuse(B).is_empty(), "not connected");
}

use protocol::Gradient;

use super::*;
use crate::aggregate::AggregatorKind;
use crate::schedule::Contribution;

const TIMEOUT: Duration = Duration::from_millis(100);

fn grad(round: u64, value: f32, samples: u32) -> Gradient {
    Gradient {
        compute_us: 0,
        parts: 1,
        round: Round(round),
        samples,
        loss: value,
        grads: vec![value; 3],
    }
}

fn open(ids: &[u32], quorum: usize) -> (OpenRound, Instant) {
    let now = Instant::now();
    let agg = AggregatorKind::mean().build(3);
    let r = OpenRound::new(
        Round(4),
        ids.iter().map(|&i| WorkerId(i)),
        agg,
        now,
        TIMEOUT,
        quorum,
    );
    (r, now)
}

#[test]
fn accept_completes_when_every_participant_answered_weighted_by_samples() {
    let (mut r, t0) = open(&[1, 2], 1);
    assert_eq!(
        r.accept(WorkerId(1), &Contribution::of(&grad(4, 1.0, 1)), t0),
        Ok(Progress::Waiting)
    );
    let t1 = t0 + Duration::from_millis(30);
    assert_eq!(
        r.accept(WorkerId(2), &Contribution::of(&grad(4, 4.0, 3)), t1),
        Ok(Progress::Complete)
    );
    let closed = r.close(t0 + Duration::from_millis(40));
    assert_eq!(closed.gradient, Some(vec![3.25; 3])); // (1·1 + 4·3) / 4
    assert_eq!((closed.samples, closed.answered), (4, 2));
    assert_eq!(closed.mean_loss, 3.25);
    assert!(closed.missed.is_empty() && !closed.deadline_hit);
    assert_eq!(closed.duration, Duration::from_millis(40));
    assert_eq!(
        closed.latencies,
        [Duration::ZERO, Duration::from_millis(30)]
    );
}

#[test]
fn duplicate_is_refused_without_touching_the_sum() {
    let (mut r, t0) = open(&[1, 2], 1);
    r.accept(WorkerId(1), &Contribution::of(&grad(4, 1.0, 1)), t0)
        .expect("first");
    assert_eq!(
        r.accept(WorkerId(1), &Contribution::of(&grad(4, 9.0, 1)), t0),
        Err(RoundError::Duplicate(WorkerId(1)))
    );
    r.accept(WorkerId(2), &Contribution::of(&grad(4, 1.0, 1)), t0)
        .expect("second");
    assert_eq!(r.close(t0).gradient, Some(vec![1.0; 3]));
    assert_eq!(
        RoundError::Duplicate(WorkerId(1)).code(),
        ErrorCode::Duplicate
    );
}

#[test]
fn late_future_and_outsider_gradients_are_refused() {
    let (mut r, t0) = open(&[1], 1);
    let late = r.accept(WorkerId(1), &Contribution::of(&grad(3, 9.0, 1)), t0);
    assert_eq!(
        late,
        Err(RoundError::Late {
            got: Round(3),
            current: Round(4)
        })
    );
    assert_eq!(late.unwrap_err().code(), ErrorCode::Late);
    let future = r.accept(WorkerId(1), &Contribution::of(&grad(5, 9.0, 1)), t0);
    assert_eq!(
        future,
        Err(RoundError::NotOpen {
            got: Round(5),
            current: Round(4)
        })
    );
    assert_eq!(
        r.accept(WorkerId(9), &Contribution::of(&grad(4, 9.0, 1)), t0),
        Err(RoundError::NotParticipant(WorkerId(9)))
    );
    assert_eq!(r.answered(), 0);
}

#[test]
fn deadline_with_quorum_closes_and_reports_the_missing() {
    let (mut r, t0) = open(&[1, 2, 3], 2);
    r.accept(WorkerId(1), &Contribution::of(&grad(4, 1.0, 1)), t0)
        .expect("ok");
    r.accept(WorkerId(2), &Contribution::of(&grad(4, 3.0, 1)), t0)
        .expect("ok");
    assert_eq!(r.tick(t0 + TIMEOUT / 2, TIMEOUT), Progress::Waiting);
    assert_eq!(r.tick(t0 + TIMEOUT, TIMEOUT), Progress::Complete);
    assert_eq!(r.progress(), Progress::Complete);
    let closed = r.close(t0 + TIMEOUT);
    assert!(closed.deadline_hit);
    assert_eq!(closed.missed, [WorkerId(3)]);
    assert_eq!(closed.gradient, Some(vec![2.0; 3]));
}

#[test]
fn deadline_without_quorum_extends_and_never_applies_short() {
    let (mut r, t0) = open(&[1, 2, 3], 2);
    r.accept(WorkerId(1), &Contribution::of(&grad(4, 1.0, 1)), t0)
        .expect("ok");
    assert_eq!(r.tick(t0 + TIMEOUT, TIMEOUT), Progress::Extended);
    assert_eq!(r.deadline(), t0 + 2 * TIMEOUT);
    assert_eq!(r.tick(t0 + TIMEOUT * 3 / 2, TIMEOUT), Progress::Waiting);
    assert_eq!(r.tick(t0 + 2 * TIMEOUT, TIMEOUT), Progress::Extended);
    // The second answer brings quorum; the next deadline closes it.
    r.accept(
        WorkerId(3),
        &Contribution::of(&grad(4, 1.0, 1)),
        t0 + 2 * TIMEOUT,
    )
    .expect("ok");
    assert_eq!(r.tick(t0 + 3 * TIMEOUT, TIMEOUT), Progress::Complete);
    let closed = r.close(t0 + 3 * TIMEOUT);
    assert_eq!(
        (closed.extensions, closed.missed.as_slice()),
        (2, [WorkerId(2)].as_slice())
    );
}

#[test]
fn a_leaver_is_not_waited_for_but_its_answer_counts() {
    let (mut r, t0) = open(&[1, 2, 3], 1);
    r.accept(WorkerId(1), &Contribution::of(&grad(4, 2.0, 1)), t0)
        .expect("ok");
    assert_eq!(r.remove(WorkerId(1)), Progress::Waiting); // answered, then left
    assert_eq!(r.remove(WorkerId(3)), Progress::Waiting);
    assert_eq!(
        r.accept(WorkerId(2), &Contribution::of(&grad(4, 4.0, 1)), t0),
        Ok(Progress::Complete)
    );
    let closed = r.close(t0);
    assert_eq!(closed.gradient, Some(vec![3.0; 3]));
    assert!(closed.missed.is_empty(), "a leaver is not a miss");
}

#[test]
fn last_pending_leaving_completes_and_everyone_leaving_abandons() {
    let (mut r, t0) = open(&[1, 2], 1);
    r.accept(WorkerId(1), &Contribution::of(&grad(4, 1.0, 1)), t0)
        .expect("participant");
    assert_eq!(r.remove(WorkerId(2)), Progress::Complete);

    let (mut r, t0) = open(&[1, 2], 1);
    assert_eq!(r.remove(WorkerId(1)), Progress::Waiting);
    assert_eq!(r.remove(WorkerId(2)), Progress::Abandoned);
    assert_eq!(r.tick(t0 + TIMEOUT, TIMEOUT), Progress::Abandoned);
}

#[test]
fn an_admitted_worker_becomes_a_participant_once() {
    let (mut r, t0) = open(&[1], 1);
    r.admit(WorkerId(7));
    assert!(r.is_participant(WorkerId(7)));
    r.accept(WorkerId(7), &Contribution::of(&grad(4, 1.0, 1)), t0)
        .expect("admitted");
    r.admit(WorkerId(7)); // already answered: no effect
    assert_eq!(r.pending(), 1);
}

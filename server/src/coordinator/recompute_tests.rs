//! Recomputation off the coordinator's task (`--verify-cores`): the real core and real
//! [`WorkerCore`](worker_core::WorkerCore)s, the jobs the core asks for held and run by hand,
//! as the driver's blocking threads would run them.

use super::test_swarm::Swarm;

/// Three newcomers on probation, one core for recomputation: the core asks for one job at a
/// time, holds every answer until its verdict (the round waits, everything else goes on),
/// and each verdict starts the next job; every answer is accepted, nobody is struck.
#[test]
fn answers_wait_for_their_verdicts_and_jobs_run_within_the_budget_of_cores() {
    let flags = [
        "--min-workers",
        "3",
        "--verify-cores",
        "1",
        "--verify-fraction",
        "0",
    ];
    let mut swarm = Swarm::new(&flags, 3);
    swarm.hold_recomputations();
    for i in 0..3 {
        swarm.deliver(i);
        swarm.upload(i);
    }
    let held = |s: &Swarm| s.recomputations.as_ref().map_or(0, |r| r.len());
    assert_eq!(held(&swarm), 1, "one job at a time on one core");
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.round, s.recomputing, s.gradients_accepted),
        (0, 3, 0),
        "{s:?}"
    );
    // A fourth volunteer joins and is served while the three answers wait.
    let late = swarm.add();
    assert!(
        swarm.deliver(late),
        "the coordinator still serves newcomers"
    );
    for verdicts in 1..=3 {
        let done = swarm.run_recomputation();
        assert_eq!(done.verdict, Ok(Ok(())), "an honest answer matches");
        assert!(done.seconds > 0.0);
        let s = swarm.c.status().clone();
        assert_eq!(s.gradients_verified, verdicts, "{s:?}");
        assert_eq!(
            held(&swarm),
            usize::from(verdicts < 3),
            "the next job starts"
        );
    }
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.round, s.recomputing, s.gradients_accepted),
        (1, 0, 3),
        "{s:?}"
    );
    assert!(s.recompute_seconds > 0.0);
    assert_eq!(s.verification_mismatches, 0);
    // Two cores: two jobs at once.
    let flags = [
        "--min-workers",
        "3",
        "--verify-cores",
        "2",
        "--verify-fraction",
        "0",
    ];
    let mut swarm = Swarm::new(&flags, 3);
    swarm.hold_recomputations();
    for i in 0..3 {
        swarm.deliver(i);
        swarm.upload(i);
    }
    assert_eq!(held(&swarm), 2);
}

/// A cheat's verdict that comes back after it left and came back under the same identity:
/// its identity is struck, its new session is sent nothing for the old answer, and the
/// round does not count the answer.
#[test]
fn a_verdict_for_a_worker_that_reconnected_meanwhile_strikes_its_identity_and_goes_nowhere() {
    let flags = [
        "--min-workers",
        "1",
        "--verify-cores",
        "1",
        "--verify-fraction",
        "0",
    ];
    let mut swarm = Swarm::new(&flags, 1);
    swarm.hold_recomputations();
    swarm.deliver(0);
    // Scaled by 1.01 before it goes up: a cheat.
    scale(&mut swarm.volunteers[0].outgoing, 1.01);
    swarm.upload(0);
    // The same cheat, with its verdict due while it is connected: told.
    let mut told = Swarm::new(&flags, 1);
    told.hold_recomputations();
    told.deliver(0);
    scale(&mut told.volunteers[0].outgoing, 1.01);
    told.upload(0);
    told.run_recomputation();
    assert_eq!(told.queued_errors(0), [protocol::ErrorCode::Mismatch]);
    swarm.disconnect(0);
    swarm.connect(0);
    swarm.deliver(0);
    let done = swarm.run_recomputation();
    assert!(matches!(done.verdict, Ok(Err(_))), "{:?}", done.verdict);
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.verification_mismatches, s.gradients_accepted),
        (1, 0),
        "{s:?}"
    );
    assert_eq!(s.worker_list[0].strikes, 1, "{s:?}");
    assert!(
        swarm.queued_errors(0).is_empty(),
        "nothing for the old answer"
    );
}

/// A worker's computed answer (f32 chunk frames), every value multiplied by `factor`.
fn scale(frames: &mut Vec<Vec<u8>>, factor: f32) {
    let mut whole: Option<protocol::Gradient> = None;
    for frame in frames.iter() {
        let Ok(protocol::WorkerToCoordinator::Gradient(chunk)) =
            protocol::decode_from_worker(frame)
        else {
            panic!("a worker core sends gradient chunks")
        };
        let g = whole.get_or_insert_with(|| protocol::Gradient {
            round: chunk.round,
            samples: chunk.samples,
            loss: chunk.loss,
            compute_us: chunk.compute_us,
            parts: chunk.parts,
            grads: Vec::new(),
        });
        g.grads.extend(chunk.grads);
    }
    let mut g = whole.expect("an answer");
    g.grads.iter_mut().for_each(|v| *v *= factor);
    *frames = protocol::codec::encode_gradient(&g, protocol::Compression::None);
}

/// Ten newcomers, one core: one job runs, eight wait, and the tenth answer finds no room; on
/// probation it cannot count unchecked, so it is dropped without a strike and the round
/// goes on without it.
#[test]
fn an_answer_on_probation_with_no_room_to_wait_is_dropped_without_a_strike() {
    let flags = [
        "--min-workers",
        "10",
        "--verify-cores",
        "1",
        "--verify-fraction",
        "0",
    ];
    let mut swarm = Swarm::new(&flags, 10);
    swarm.hold_recomputations();
    for i in 0..10 {
        swarm.deliver(i);
        swarm.upload(i);
    }
    let s = swarm.c.status().clone();
    assert_eq!((s.recomputing, s.probation_unchecked), (9, 1), "{s:?}");
    for _ in 0..9 {
        swarm.run_recomputation();
    }
    let s = swarm.c.status().clone();
    assert_eq!((s.round, s.gradients_accepted), (1, 9), "{s:?}");
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
}

/// Local phases: a trusted worker's sampled phase counts at once (its round closes before
/// the replay comes back) and the verdict judges it afterwards: a cheat is struck and told.
/// A newcomer's phase (probation) still waits for its verdict.
#[test]
fn a_trusted_workers_sampled_phase_counts_at_once_and_is_judged_after() {
    let flags = [
        "--min-workers",
        "1",
        "--verify-cores",
        "1",
        "--verify-fraction",
        "1",
        "--local-steps",
        "4",
        "--probation",
        "0",
    ];
    let mut swarm = Swarm::new(&flags, 1);
    swarm.hold_recomputations();
    swarm.deliver(0);
    scale(&mut swarm.volunteers[0].outgoing, 1.01);
    swarm.upload(0);
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.round, s.gradients_accepted, s.recomputing),
        (1, 1, 1),
        "{s:?}"
    );
    let done = swarm.run_recomputation();
    assert!(matches!(done.verdict, Ok(Err(_))), "{:?}", done.verdict);
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.verification_mismatches, s.worker_list[0].strikes),
        (1, 1),
        "{s:?}"
    );
    assert!(swarm
        .queued_errors(0)
        .contains(&protocol::ErrorCode::Mismatch));
    // An honest one is judged the same way, and never struck.
    swarm.deliver(0);
    swarm.upload(0);
    assert_eq!(swarm.c.status().round, 2);
    assert_eq!(swarm.run_recomputation().verdict, Ok(Ok(())));
    assert_eq!(swarm.c.status().worker_list[0].strikes, 1);

    let flags = [
        "--min-workers",
        "1",
        "--verify-cores",
        "1",
        "--verify-fraction",
        "0",
        "--local-steps",
        "4",
    ];
    let mut newcomer = Swarm::new(&flags, 1);
    newcomer.hold_recomputations();
    newcomer.deliver(0);
    newcomer.upload(0);
    assert_eq!(
        newcomer.c.status().round,
        0,
        "on probation: waits for its verdict"
    );
    assert_eq!(newcomer.run_recomputation().verdict, Ok(Ok(())));
    assert_eq!(newcomer.c.status().round, 1);
}

//! Recomputation off the coordinator's task (`--verify-cores`): the real core and real
//! [`WorkerCore`](worker_core::WorkerCore)s, the jobs the core asks for held and run by hand,
//! as the driver's blocking threads would run them.

use super::test_swarm::Swarm;

/// `n` volunteers under the coordinator's `flags` (`--verify-fraction 0` unless they say
/// otherwise: newcomers on probation are what is recomputed), with `cores` for recomputation,
/// whose jobs are held until run by hand.
fn held(flags: &[&str], n: usize, cores: &str) -> Swarm {
    let min = n.to_string();
    let mut all = vec!["--min-workers", &min, "--verify-cores", cores];
    if !flags.contains(&"--verify-fraction") {
        all.extend(["--verify-fraction", "0"]);
    }
    all.extend_from_slice(flags);
    let mut swarm = Swarm::new(&all, n);
    swarm.hold_recomputations();
    swarm
}

/// Local phases of 4 steps, every one sampled, no probation: trusted from the start.
const EVERY_PHASE_SAMPLED: [&str; 6] = [
    "--verify-fraction",
    "1",
    "--local-steps",
    "4",
    "--probation",
    "0",
];

/// Volunteer `i` reads its weights, computes, and uploads its answer, scaled by 1.01 if it
/// `cheats`.
fn answer(swarm: &mut Swarm, i: usize, cheats: bool) {
    swarm.deliver(i);
    if cheats {
        scale(&mut swarm.volunteers[i].outgoing, 1.01);
    }
    swarm.upload(i);
}

/// Jobs asked for and not yet run.
fn jobs(swarm: &Swarm) -> usize {
    swarm.recomputations.as_ref().map_or(0, |r| r.len())
}

/// Three newcomers on probation, one core for recomputation: the core asks for one job at a
/// time, holds every answer until its verdict (the round waits, everything else goes on),
/// and each verdict starts the next job; every answer is accepted, nobody is struck.
#[test]
fn answers_wait_for_their_verdicts_and_jobs_run_within_the_budget_of_cores() {
    let mut swarm = held(&[], 3, "1");
    for i in 0..3 {
        answer(&mut swarm, i, false);
    }
    assert_eq!(jobs(&swarm), 1, "one job at a time on one core");
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.round, s.recomputing, s.counters.gradients_accepted),
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
        assert_eq!(s.counters.gradients_verified, verdicts, "{s:?}");
        assert_eq!(
            jobs(&swarm),
            usize::from(verdicts < 3),
            "the next job starts"
        );
    }
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.round, s.recomputing, s.counters.gradients_accepted),
        (1, 0, 3),
        "{s:?}"
    );
    assert!(s.recompute_seconds > 0.0);
    assert_eq!(s.counters.verification_mismatches, 0);
    // Two cores: two jobs at once.
    let mut swarm = held(&[], 3, "2");
    for i in 0..3 {
        answer(&mut swarm, i, false);
    }
    assert_eq!(jobs(&swarm), 2);
}

/// A cheat's verdict that comes back after it left and came back under the same identity:
/// its identity is struck, its new session is sent nothing for the old answer, and the
/// round does not count the answer.
#[test]
fn a_verdict_for_a_worker_that_reconnected_meanwhile_strikes_its_identity_and_goes_nowhere() {
    let mut swarm = held(&[], 1, "1");
    answer(&mut swarm, 0, true);
    // The same cheat, with its verdict due while it is connected: told.
    let mut told = held(&[], 1, "1");
    answer(&mut told, 0, true);
    told.run_recomputation();
    assert_eq!(told.queued_errors(0), [protocol::ErrorCode::Mismatch]);
    swarm.disconnect(0);
    swarm.connect(0);
    swarm.deliver(0);
    let done = swarm.run_recomputation();
    assert!(matches!(done.verdict, Ok(Err(_))), "{:?}", done.verdict);
    let s = swarm.c.status().clone();
    assert_eq!(
        (
            s.counters.verification_mismatches,
            s.counters.gradients_accepted
        ),
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
    let mut swarm = held(&[], 10, "1");
    for i in 0..10 {
        answer(&mut swarm, i, false);
    }
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.recomputing, s.counters.probation_unchecked),
        (9, 1),
        "{s:?}"
    );
    for _ in 0..9 {
        swarm.run_recomputation();
    }
    let s = swarm.c.status().clone();
    assert_eq!((s.round, s.counters.gradients_accepted), (1, 9), "{s:?}");
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
}

/// Local phases: a trusted worker's sampled phase counts at once (its round closes before
/// the replay comes back) and the verdict judges it afterwards: a cheat is struck and told.
/// A newcomer's phase (probation) still waits for its verdict.
#[test]
fn a_trusted_workers_sampled_phase_counts_at_once_and_is_judged_after() {
    let mut swarm = held(&EVERY_PHASE_SAMPLED, 1, "1");
    answer(&mut swarm, 0, true);
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.round, s.counters.gradients_accepted, s.recomputing),
        (1, 1, 1),
        "{s:?}"
    );
    let done = swarm.run_recomputation();
    assert!(matches!(done.verdict, Ok(Err(_))), "{:?}", done.verdict);
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.counters.verification_mismatches, s.worker_list[0].strikes),
        (1, 1),
        "{s:?}"
    );
    assert!(swarm
        .queued_errors(0)
        .contains(&protocol::ErrorCode::Mismatch));
    // An honest one is judged the same way, and never struck.
    answer(&mut swarm, 0, false);
    assert_eq!(swarm.c.status().round, 2);
    assert_eq!(swarm.run_recomputation().verdict, Ok(Ok(())));
    assert_eq!(swarm.c.status().worker_list[0].strikes, 1);

    let mut newcomer = held(&["--local-steps", "4"], 1, "1");
    answer(&mut newcomer, 0, false);
    assert_eq!(
        newcomer.c.status().round,
        0,
        "on probation: waits for its verdict"
    );
    assert_eq!(newcomer.run_recomputation().verdict, Ok(Ok(())));
    assert_eq!(newcomer.c.status().round, 1);
}

/// Local phases in a sync round of four: a trusted worker's sampled phase whose replay
/// would wait behind others (before any verdict came back, taken to outwait its share of
/// the round: `Recomputations::outwaits`) is set aside (excused from its round, replayed to
/// judge its worker) while another trusted participant carries the round, one answer in
/// four at most;
/// the next is held, as every one is in a round of two or three. A cheat set aside is still
/// struck, and nothing of its answer counts.
#[test]
fn a_sampled_phase_behind_other_replays_is_set_aside_while_others_carry_the_round() {
    let mut swarm = held(&EVERY_PHASE_SAMPLED, 4, "1");
    answer(&mut swarm, 0, false);
    answer(&mut swarm, 1, false);
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.counters.gradients_accepted, s.recomputing),
        (2, 2),
        "one replay runs and one waits: both counted at once"
    );
    // The core is busy and one replay waits: the cheat's phase is set aside, not counted.
    answer(&mut swarm, 2, true);
    let s = swarm.c.status().clone();
    assert_eq!(
        (
            s.round,
            s.counters.gradients_accepted,
            s.counters.sampled_aside
        ),
        (0, 2, 1),
        "{s:?}"
    );
    // A second would be more than one answer in four: held for its replay instead.
    answer(&mut swarm, 3, false);
    let s = swarm.c.status().clone();
    assert_eq!(
        (s.round, s.counters.sampled_aside, s.recomputing),
        (0, 1, 4),
        "{s:?}"
    );
    // The running replay ends; the held answer's goes before the two that only judge.
    assert_eq!(swarm.run_recomputation().verdict, Ok(Ok(())));
    assert_eq!(swarm.run_recomputation().verdict, Ok(Ok(())));
    let s = swarm.c.status().clone();
    assert_eq!((s.round, s.counters.gradients_accepted), (1, 3), "{s:?}");
    assert_eq!(swarm.run_recomputation().verdict, Ok(Ok(())));
    let done = swarm.run_recomputation();
    assert!(matches!(done.verdict, Ok(Err(_))), "{:?}", done.verdict);
    let s = swarm.c.status().clone();
    let strikes: Vec<u32> = s.worker_list.iter().map(|w| w.strikes).collect();
    assert_eq!(s.counters.verification_mismatches, 1, "{s:?}");
    assert_eq!(strikes, [0, 0, 1, 0], "{s:?}");
    assert!(swarm
        .queued_errors(2)
        .contains(&protocol::ErrorCode::Mismatch));

    // Two workers: the last answer that could carry the round is never set aside.
    let mut pair = held(&EVERY_PHASE_SAMPLED, 2, "1");
    for _ in 0..2 {
        answer(&mut pair, 0, false);
        answer(&mut pair, 1, false);
    }
    let s = pair.c.status().clone();
    assert_eq!((s.round, s.counters.sampled_aside), (1, 0), "{s:?}");
}

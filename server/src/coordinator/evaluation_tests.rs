//! Evaluations run off the coordinator's thread, with real workers training meanwhile.

use super::test_swarm::Swarm;

/// Rounds go on while an evaluation is out; its result lands on the round it scored.
#[test]
fn rounds_go_on_while_an_evaluation_runs_and_its_result_lands_on_its_round() {
    let mut swarm = Swarm::new(&["--min-workers", "2", "--eval-interval", "10"], 2);
    swarm.until("round 10", |s| s.round >= 10);
    assert_eq!(
        swarm.evaluations.len(),
        1,
        "round 10's evaluation is asked for"
    );
    assert_eq!(swarm.evaluations[0].version, 10);
    // Not scored in line: twelve more rounds while it is out, and round 20's waits.
    let s = swarm.until("round 22", |s| s.round >= 22);
    assert_eq!((s.test_accuracy, s.evaluated_round), (None, None));
    assert_eq!(swarm.evaluations.len(), 1, "one at a time");
    let done = swarm.run_evaluation();
    let scored = done.result.expect("scores");
    let s = swarm.c.status();
    assert_eq!(s.evaluated_round, Some(10));
    assert_eq!(s.test_accuracy, Some(scored.accuracy));
    let history = swarm.c.history();
    let evaluated: Vec<_> = history
        .iter()
        .filter(|p| p.test_accuracy.is_some())
        .collect();
    assert_eq!(evaluated.len(), 1);
    assert_eq!(
        (evaluated[0].round, evaluated[0].test_accuracy),
        (10, Some(scored.accuracy))
    );
    // Round 20's, which waited, is asked for as soon as round 10's is back.
    assert_eq!(swarm.evaluations.len(), 1);
    assert_eq!(swarm.evaluations[0].version, 20);
}

/// `--target-accuracy` (or `--target-loss`) stops the run when an evaluation that reaches it comes back;
/// `--max-rounds` scores the last round in line and stops at once.
#[test]
fn the_stop_conditions_hear_from_evaluations() {
    let flags = [
        "--min-workers",
        "2",
        "--eval-interval",
        "5",
        "--target-accuracy",
        "0.01",
    ];
    let mut swarm = Swarm::new(&flags, 2);
    swarm.until("round 7", |s| s.round >= 7);
    assert!(swarm.c.outcome().is_none());
    swarm.run_evaluation();
    let outcome = swarm.c.outcome().cloned().expect("finished");
    assert!(outcome.reached_target);
    assert_eq!(outcome.rounds, 7, "stopped where training was");

    // `--target-loss` as well: a loss at most the target stops the run, a higher one not.
    for (target, stops) in [("100", true), ("0.0001", false)] {
        let flags = [
            "--min-workers",
            "2",
            "--eval-interval",
            "5",
            "--target-loss",
            target,
        ];
        let mut swarm = Swarm::new(&flags, 2);
        swarm.until("round 7", |s| s.round >= 7);
        let scored = swarm.run_evaluation();
        assert!(scored.result.is_ok());
        let outcome = swarm.c.outcome().cloned();
        assert_eq!(outcome.is_some(), stops, "--target-loss {target}");
        assert!(outcome.is_none_or(|o| o.reached_target));
    }

    let flags = [
        "--min-workers",
        "2",
        "--eval-interval",
        "4",
        "--max-rounds",
        "6",
    ];
    let mut swarm = Swarm::new(&flags, 2);
    swarm.until("round 6", |s| s.round >= 6);
    let outcome = swarm.c.outcome().cloned().expect("finished at once");
    assert_eq!(outcome.rounds, 6);
    assert_eq!(swarm.c.status().evaluated_round, Some(6));
    assert!(outcome.evaluation.is_some());
}

/// `--patience`: evaluations that do not improve on the best by 0.1 % finish the run on the
/// best weights, published as a new version, and every worker is told that training is
/// finished (so that a tab stops rather than reconnect).
#[test]
fn a_run_that_stops_improving_finishes_on_its_best_weights() {
    // A learning rate this small cannot improve the loss: every evaluation after the first
    // is no better.
    let flags = [
        "--min-workers",
        "2",
        "--eval-interval",
        "1",
        "--patience",
        "2",
        "--optimizer",
        "sgd",
        "--lr",
        "1e-9",
    ];
    let mut swarm = Swarm::new(&flags, 2);
    swarm.until("round 1", |s| s.round >= 1);
    let best = swarm.run_evaluation();
    assert_eq!(best.version, 1);
    for round in [2, 3] {
        swarm.until("the next round", |s| s.round >= round);
        assert!(swarm.c.outcome().is_none(), "patience is 2 evaluations");
        let later = swarm.run_evaluation();
        assert!(later.version > best.version);
    }
    let outcome = swarm.c.outcome().cloned().expect("plateaued");
    assert!(outcome.plateaued && !outcome.reached_target);
    let best_eval = best.result.clone().expect("scored");
    assert_eq!(outcome.evaluation, Some(best_eval));
    // The model is the best version's weights, as a new version.
    let snapshot = swarm.c.snapshot();
    assert_eq!(snapshot.version, outcome.rounds);
    assert!(outcome.rounds > 3);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&snapshot.params), bits(&best.params));
    assert_eq!(swarm.c.status().test_loss, Some(best_eval.loss));
    for i in 0..2 {
        assert_eq!(swarm.queued_refusals(i), [protocol::ErrorCode::Finished]);
    }

    // `--patience 0` never stops.
    let flags = [
        "--min-workers",
        "2",
        "--eval-interval",
        "1",
        "--patience",
        "0",
        "--optimizer",
        "sgd",
        "--lr",
        "1e-9",
    ];
    let mut swarm = Swarm::new(&flags, 2);
    for round in 1..=6 {
        swarm.until("the next round", |s| s.round >= round);
        swarm.run_evaluation();
    }
    assert!(swarm.c.outcome().is_none());
}

//! Evaluation on the test split, off the coordinator's task.
//!
//! Scoring 2,000 test images with the CNN takes about half a second: done in line it stopped
//! every round for every worker. When an evaluation is due the coordinator copies that
//! version's weights into an [`EvalJob`]; the driver runs it on a blocking thread while
//! rounds go on, and its [`Evaluated`] comes back as an event. One runs at a time: one more
//! that falls due meanwhile waits, and a newer one replaces it, so a slow evaluation cannot
//! pile copies of the weights up. The evaluation that ends a run (`--max-rounds`) is done in
//! line: nothing is left to wait for it.

use std::sync::Arc;

use model::{evaluate, Dataset, Evaluation, Network};

/// One version's weights to score on the test split: a copy, so training goes on.
#[derive(Debug)]
pub struct EvalJob {
    pub version: u64,
    net: Network,
    params: Vec<f32>,
    test: Arc<Dataset>,
}

/// What an [`EvalJob`] came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluated {
    pub version: u64,
    pub result: Result<Evaluation, String>,
}

impl EvalJob {
    pub fn new(version: u64, net: Network, params: Vec<f32>, test: Arc<Dataset>) -> Self {
        Self {
            version,
            net,
            params,
            test,
        }
    }

    /// Scores the weights (seconds for a large model: run it off the coordinator's task). A
    /// panic inside becomes an error, so the coordinator always hears back.
    pub fn run(self) -> Evaluated {
        let Self {
            version,
            net,
            params,
            test,
        } = self;
        let scored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            evaluate(&net, &params, &test).map_err(|e| e.to_string())
        }));
        Evaluated {
            version,
            result: scored.unwrap_or_else(|_| Err("the evaluation panicked".into())),
        }
    }
}

/// The evaluation running, the one waiting for it, and the one ready for the driver.
#[derive(Debug, Default)]
pub struct Evaluations {
    running: Option<u64>,
    waiting: Option<EvalJob>,
    ready: Option<EvalJob>,
}

impl Evaluations {
    /// `job` is due: it runs next, or waits for the one running (replacing an older one
    /// waiting).
    pub fn due(&mut self, job: EvalJob) {
        if self.running.is_none() {
            self.running = Some(job.version);
            self.ready = Some(job);
        } else {
            self.waiting = Some(job);
        }
    }

    /// The job for the driver to run, once.
    pub fn poll(&mut self) -> Option<EvalJob> {
        self.ready.take()
    }

    /// The evaluation of `version` came back: the one waiting may run. Returns whether it
    /// was the one running (a stale answer is ignored).
    pub fn done(&mut self, version: u64) -> bool {
        if self.running != Some(version) {
            return false;
        }
        self.running = None;
        if let Some(next) = self.waiting.take() {
            self.due(next);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::Event;

    fn job(version: u64) -> EvalJob {
        let test = Dataset::new(4, vec![0, 255, 0, 255, 255, 0, 255, 0], vec![0, 1]).expect("ok");
        let spec = model::NetSpec::mlp(model::Shape::flat(4), &[3], 2);
        let net = Network::new(spec, 2).expect("model");
        let params = net.init(7);
        EvalJob::new(version, net, params, Arc::new(test))
    }

    #[test]
    fn one_runs_at_a_time_and_the_newest_due_waits() {
        let mut e = Evaluations::default();
        e.due(job(10));
        let first = e.poll().expect("ready");
        assert_eq!(first.version, 10);
        assert!(e.poll().is_none(), "handed out once");
        // Two more fall due while it runs: only the newer waits.
        e.due(job(20));
        e.due(job(30));
        assert!(e.poll().is_none(), "one at a time");
        assert!(!e.done(20), "not the one running");
        assert!(e.done(10));
        assert_eq!(e.poll().expect("next").version, 30);
        assert!(e.done(30));
        assert!(e.poll().is_none());
    }

    /// Rounds go on while an evaluation is out; its result lands on the round it scored.
    #[test]
    fn rounds_go_on_while_an_evaluation_runs_and_its_result_lands_on_its_round() {
        use crate::coordinator::test_swarm::Swarm;
        let mut swarm = Swarm::new(&["--min-workers", "2", "--eval-interval", "10"], 2);
        swarm.until("round 10", |s| s.round >= 10);
        let job = swarm
            .c
            .poll_evaluation()
            .expect("round 10's evaluation is due");
        assert_eq!(job.version, 10);
        assert!(swarm.c.poll_evaluation().is_none(), "handed out once");
        // Not scored in line: twelve more rounds while it is out, and round 20's waits.
        let s = swarm.until("round 22", |s| s.round >= 22);
        assert_eq!((s.test_accuracy, s.evaluated_round), (None, None));
        assert!(swarm.c.poll_evaluation().is_none(), "one at a time");
        let expected = evaluate(&job.net, &job.params, &job.test).expect("scores");
        let done = job.run();
        swarm.c.handle(Event::Evaluated(done), swarm.now);
        let s = swarm.c.status();
        assert_eq!(s.evaluated_round, Some(10));
        assert_eq!(s.test_accuracy, Some(expected.accuracy));
        let history = swarm.c.history.points();
        let scored: Vec<_> = history
            .iter()
            .filter(|p| p.test_accuracy.is_some())
            .collect();
        assert_eq!(scored.len(), 1);
        assert_eq!(
            (scored[0].round, scored[0].test_accuracy),
            (10, Some(expected.accuracy))
        );
        // Round 20's, which waited, is next.
        assert_eq!(swarm.c.poll_evaluation().expect("waiting").version, 20);
    }

    /// `--target-accuracy` stops the run when an evaluation that reaches it comes back;
    /// `--max-rounds` scores the last round in line and stops at once.
    #[test]
    fn the_stop_conditions_hear_from_evaluations() {
        use crate::coordinator::test_swarm::Swarm;
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
        assert!(swarm.c.outcome.is_none());
        let done = swarm.c.poll_evaluation().expect("due").run();
        swarm.c.handle(Event::Evaluated(done), swarm.now);
        let outcome = swarm.c.outcome.clone().expect("finished");
        assert!(outcome.reached_target);
        assert_eq!(outcome.rounds, 7, "stopped where training was");
        assert!(swarm.c.shutdown.is_cancelled());

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
        let outcome = swarm.c.outcome.clone().expect("finished at once");
        assert_eq!(outcome.rounds, 6);
        assert_eq!(swarm.c.status().evaluated_round, Some(6));
        assert!(outcome.evaluation.is_some());
    }

    #[test]
    fn a_job_scores_its_copy_of_the_weights() {
        let j = job(3);
        let expected = evaluate(&j.net, &j.params, &j.test).expect("scores");
        assert_eq!(
            j.run(),
            Evaluated {
                version: 3,
                result: Ok(expected)
            }
        );
    }
}

//! Evaluation on the test split, off the coordinator's thread.
//!
//! Scoring 2,000 test images with the CNN takes about half a second: done in line it stopped
//! every round for every worker. When an evaluation is due the coordinator copies that
//! version's weights into an [`EvalJob`] and asks its driver to run it
//! ([`Output::Evaluate`](crate::Output::Evaluate)) while rounds go on; its [`Evaluated`] comes
//! back as an input. One runs at a time: one more that falls due meanwhile waits, and a newer
//! one replaces it, so a slow evaluation cannot pile copies of the weights up (the status
//! says which runs and which waits, and counts those replaced). The evaluation
//! that ends a run (`--max-rounds`) is done in line: nothing is left to wait for it.

use std::sync::Arc;

use model::{evaluate, Dataset, Evaluation, Network};

/// One version's weights to score on the test split: a copy, so training goes on.
#[derive(Debug)]
pub struct EvalJob {
    pub version: u64,
    net: Network,
    params: Arc<[f32]>,
    test: Arc<Dataset>,
    /// A language model's prompt: the job also writes a sample from it.
    prompt: Option<Vec<usize>>,
}

/// What an [`EvalJob`] came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluated {
    pub version: u64,
    pub result: Result<Evaluation, String>,
    /// The tokens the model wrote after the prompt, if it was asked to.
    pub sample: Option<Vec<usize>>,
    /// The weights scored, handed back: the best are kept (`--patience`).
    pub params: Arc<[f32]>,
}

impl EvalJob {
    pub fn new(version: u64, net: Network, params: Arc<[f32]>, test: Arc<Dataset>) -> Self {
        Self {
            version,
            net,
            params,
            test,
            prompt: None,
        }
    }

    /// The job also writes a sample after `prompt` (a GPT only; others ignore it).
    #[must_use]
    pub fn with_prompt(mut self, prompt: Option<Vec<usize>>) -> Self {
        self.prompt = prompt;
        self
    }

    /// Scores the weights (seconds for a large model: run it off the coordinator's task). A
    /// panic inside becomes an error, so the coordinator always hears back.
    pub fn run(self) -> Evaluated {
        let Self {
            version,
            net,
            params,
            test,
            prompt,
        } = self;
        let scored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            evaluate(&net, &params, &test).map_err(|e| e.to_string())
        }));
        let sample = prompt.and_then(|prompt| {
            let how = crate::language::sampling(params.len(), net.positions(), version);
            let drawn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                net.generate(&params, &prompt, how)
            }));
            drawn.ok().flatten().and_then(Result::ok)
        });
        Evaluated {
            version,
            result: scored.unwrap_or_else(|_| Err("the evaluation panicked".into())),
            sample,
            params,
        }
    }
}

/// What became of an evaluation that fell due.
#[derive(Debug)]
pub enum Due {
    /// Nothing runs: it runs now.
    Run(Box<EvalJob>),
    /// It waits for the one running.
    Waits,
    /// It waits for the one running, in place of this older version's, which will not run.
    Replaced(u64),
}

/// The evaluation running, and the one waiting for it.
#[derive(Debug, Default)]
pub struct Evaluations {
    running: Option<u64>,
    waiting: Option<EvalJob>,
}

impl Evaluations {
    /// `job` is due: [`Due::Run`] if it may run now; otherwise it waits for the one running,
    /// replacing an older one waiting ([`Due::Replaced`]: that one's version).
    pub fn due(&mut self, job: EvalJob) -> Due {
        if self.running.is_none() {
            self.running = Some(job.version);
            Due::Run(Box::new(job))
        } else {
            match self.waiting.replace(job) {
                Some(older) => Due::Replaced(older.version),
                None => Due::Waits,
            }
        }
    }

    /// The version being evaluated now, and the one waiting for it.
    pub fn state(&self) -> (Option<u64>, Option<u64>) {
        (self.running, self.waiting.as_ref().map(|j| j.version))
    }

    /// The evaluation of `version` came back: whether it was the one running (a stale
    /// answer is ignored), and the one waiting, which may run now.
    pub fn done(&mut self, version: u64) -> (bool, Option<EvalJob>) {
        if self.running != Some(version) {
            return (false, None);
        }
        self.running = None;
        let next = self.waiting.take();
        self.running = next.as_ref().map(|job| job.version);
        (true, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(version: u64) -> EvalJob {
        let test = Dataset::new(4, vec![0, 255, 0, 255, 255, 0, 255, 0], vec![0, 1]).expect("ok");
        let spec = model::NetSpec::mlp(model::Shape::flat(4), &[3], 2);
        let net = Network::new(spec, 2).expect("model");
        let params: Vec<f32> = net.init(7);
        EvalJob::new(version, net, params.into(), Arc::new(test))
    }

    #[test]
    fn one_runs_at_a_time_and_the_newest_due_waits() {
        let mut e = Evaluations::default();
        assert!(matches!(e.due(job(10)), Due::Run(j) if j.version == 10));
        // Two more fall due while it runs: only the newer waits, in place of the older.
        assert!(matches!(e.due(job(20)), Due::Waits), "one at a time");
        assert!(matches!(e.due(job(30)), Due::Replaced(20)));
        assert_eq!(e.state(), (Some(10), Some(30)));
        assert!(!e.done(20).0, "not the one running");
        let (running, next) = e.done(10);
        assert!(running);
        assert_eq!(next.expect("the newest waiting").version, 30);
        let (running, next) = e.done(30);
        assert!(running && next.is_none());
    }

    #[test]
    fn a_job_scores_its_copy_of_the_weights() {
        let j = job(3);
        let expected = evaluate(&j.net, &j.params, &j.test).expect("scores");
        let params = Arc::clone(&j.params);
        assert_eq!(
            j.run(),
            Evaluated {
                version: 3,
                result: Ok(expected),
                sample: None,
                params,
            }
        );
    }
}

//! What applying an update means for the run: the optimizer step (refused if it would break
//! the model), the round's metrics and log line, evaluation when due (and its result when it
//! comes back), and the stop conditions (`--max-rounds`, `--target-accuracy`, `--target-loss`).

use tracing::{debug, info, warn};

use std::time::Instant;

use model::Evaluation;

use crate::evaluation::{Due, Evaluated};
use crate::history::Point;
use crate::io::{Observation, Outcome, Output};
use crate::metrics::LogValue;
use crate::schedule::Update;
use crate::Coordinator;

impl Coordinator {
    /// Steps the optimizer, evaluates when due, logs the round, and stops when a stop
    /// condition is met. Shared by every schedule.
    pub(crate) fn apply(&mut self, update: &Update) {
        if self.hand_to_root(update) {
            return;
        }
        if !self.trainer.apply(&update.gradient) {
            warn!(
                round = self.trainer.version(),
                answered = update.answered,
                "update not applied: it would have made a parameter non-finite"
            );
            self.metrics.update_refused();
            self.replace_pending();
            return;
        }
        self.applied(update);
    }

    /// What follows a new version, applied here or adopted from the root (`remote.rs`).
    pub(crate) fn applied(&mut self, update: &Update) {
        let version = self.trainer.version();
        self.registry.mark_changed();
        let since = self.metrics.updated(update, version - 1);
        if let Some(plan) = &mut self.local {
            plan.noise(self.metrics.noise_scale().as_ref());
        }
        let seconds = update.duration.as_secs_f64();
        self.outputs
            .push_back(Output::Observe(Observation::Round(seconds)));
        let last = self.settings.max_rounds.is_some_and(|max| version >= max);
        // The run's last evaluation is done here: nothing is left to wait for it. The others
        // run off this task while rounds go on (see `evaluation.rs`).
        let evaluation = if last {
            self.trainer.evaluate()
        } else {
            if version.is_multiple_of(self.settings.eval_interval) {
                let job = self.trainer.evaluation_job();
                let job = job.with_prompt(self.writer.as_ref().map(|w| w.prompt.clone()));
                match self.evaluations.due(job) {
                    Due::Run(job) => self.outputs.push_back(Output::Evaluate(*job)),
                    Due::Waits => {}
                    Due::Replaced(older) => {
                        debug!(
                            older,
                            version, "an evaluation still waiting is replaced by a newer one"
                        );
                        self.metrics.evaluation_replaced();
                    }
                }
            }
            None
        };
        self.record(update, version);
        if let Some(e) = evaluation {
            self.scored(version, e);
        }
        self.checkpoint_if_due();
        info!(
            round = version,
            mode = %self.settings.mode.name(),
            answered = update.answered,
            missed = update.missed,
            late = since.late,
            stale = since.stale,
            dup = since.duplicate,
            deadline_hit = update.deadline_hit,
            train_loss = format_args!("{:.4}", update.mean_loss),
            lr = self.trainer.lr(),
            round_ms = format_args!("{:.1}", update.duration.as_secs_f64() * 1e3),
            "round"
        );
        if last {
            self.finish(version, evaluation);
        }
        self.replace_pending();
    }

    /// Input: an evaluation the driver ran (see [`Output::Evaluate`]) came back.
    pub fn evaluated(&mut self, evaluated: Evaluated, now: Instant) {
        self.now = now;
        self.score(evaluated);
        self.done(now);
    }

    fn score(&mut self, evaluated: Evaluated) {
        let (running, next) = self.evaluations.done(evaluated.version);
        if let Some(job) = next {
            self.outputs.push_back(Output::Evaluate(job));
        }
        if !running {
            return;
        }
        if let Some((writer, ids)) = self.writer.as_ref().zip(evaluated.sample.as_deref()) {
            let sample = writer.sample(evaluated.version, ids);
            info!(round = evaluated.version, text = %sample.text.escape_debug(), "sampled");
            self.metrics.sampled(sample);
        }
        match evaluated.result {
            Ok(e) => {
                self.scored(evaluated.version, e);
                let plateaued = self.plateau.scored(evaluated.version, e, evaluated.params);
                if self.reached_target(&e) && self.outcome.is_none() {
                    self.finish(self.trainer.version(), Some(e));
                } else if plateaued && self.outcome.is_none() {
                    self.finish_on_best();
                }
            }
            Err(err) => warn!(round = evaluated.version, %err, "evaluation failed"),
        }
    }

    /// Whether `e` meets `--target-accuracy` or `--target-loss`.
    fn reached_target(&self, e: &Evaluation) -> bool {
        self.settings
            .target_accuracy
            .is_some_and(|t| e.accuracy >= t)
            || self.settings.target_loss.is_some_and(|t| e.loss <= t)
    }

    /// Version `version` scored `e` on the test split.
    fn scored(&mut self, version: u64, e: Evaluation) {
        self.metrics.evaluated(version, e);
        self.last_eval = Some(e);
        self.history.evaluated(version, e.accuracy, e.loss);
        info!(
            round = version,
            test_accuracy = %LogValue(Some(e.accuracy)),
            test_loss = %LogValue(Some(e.loss)),
            "evaluated"
        );
    }

    /// Training is over at `version` (`--max-rounds`, or an evaluation reached
    /// `--target-accuracy` or `--target-loss`).
    fn finish(&mut self, version: u64, evaluation: Option<Evaluation>) {
        let reached_target = evaluation.is_some_and(|e| self.reached_target(&e));
        info!(
            round = version,
            evaluated_round = ?self.metrics.saved().1.map(|(v, _)| v),
            reached_target,
            test_accuracy = ?self.last_eval.map(|e| e.accuracy),
            "training finished"
        );
        self.stop(Outcome {
            rounds: version,
            evaluation: self.last_eval,
            reached_target,
            plateaued: false,
            checkpoint_error: None,
        });
    }

    /// `--patience` evaluations without improving: the best weights become the model (a
    /// new version, so `/api/params`, the checkpoint on stopping and `export` serve them),
    /// and the run finishes.
    fn finish_on_best(&mut self) {
        let Some(best) = self.plateau.best().cloned() else {
            return;
        };
        let mut version = self.trainer.version();
        if best.version != version {
            match self.trainer.replace(best.params.to_vec()) {
                Ok(v) => version = v,
                Err(err) => warn!(%err, "the best weights could not be restored"),
            }
        }
        self.last_eval = Some(best.evaluation);
        self.metrics.evaluated(version, best.evaluation);
        info!(
            round = version,
            best_round = best.version,
            test_loss = %LogValue(Some(best.evaluation.loss)),
            test_accuracy = %LogValue(Some(best.evaluation.accuracy)),
            patience = self.settings.patience,
            "training finished: no better evaluation in --patience evaluations; the model is the best one's weights"
        );
        self.stop(Outcome {
            rounds: version,
            evaluation: Some(best.evaluation),
            reached_target: false,
            plateaued: true,
            checkpoint_error: None,
        });
    }

    /// A point of the run's history for this update.
    fn record(&mut self, update: &Update, version: u64) {
        let c = self.metrics.counters();
        let point = Point {
            round: version,
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            train_loss: update.mean_loss,
            test_accuracy: None,
            test_loss: None,
            workers: self.registry.len(),
            participants: update.answered + update.missed,
            skipped: self.schedule.standing().skipped,
            round_ms: update.duration.as_secs_f64() * 1e3,
            gradients_accepted: c.gradients_accepted,
            gradients_rejected: c.gradients_rejected,
            late: c.late,
            stale_rejected: c.stale_rejected,
            duplicate_rejected: c.duplicate_rejected,
            bytes_in: c.bytes_in,
            bytes_out: c.bytes_out,
        };
        self.history.record(point);
    }
}

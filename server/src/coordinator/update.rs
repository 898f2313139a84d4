//! What applying an update means for the run: the optimizer step (refused if it would break
//! the model), the round's metrics and log line, evaluation when due, and the stop
//! conditions (`--max-rounds`, `--target-accuracy`).

use tracing::{info, warn};

use super::handle::Outcome;
use super::history::Point;
use super::metrics::LogValue;
use super::schedule::Update;
use super::Coordinator;

impl Coordinator {
    /// Steps the optimizer, evaluates when due, logs the round, and stops when a stop
    /// condition is met. Shared by every schedule.
    pub(super) fn apply(&mut self, update: &Update) {
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
        let version = self.trainer.version();
        self.registry.mark_changed();
        let since = self.metrics.updated(update, version - 1);
        let last = self.config.max_rounds.is_some_and(|max| version >= max);
        let evaluation = if version.is_multiple_of(self.config.eval_interval) || last {
            self.trainer.evaluate()
        } else {
            None
        };
        if let Some(e) = evaluation {
            self.metrics.evaluated(version, e);
            self.last_eval = Some(e);
        }
        self.record(update, version, evaluation.map(|e| e.accuracy));
        self.checkpoint_if_due();
        info!(
            round = version,
            mode = %self.config.mode.name(),
            answered = update.answered,
            missed = update.missed,
            late = since.late,
            stale = since.stale,
            dup = since.duplicate,
            deadline_hit = update.deadline_hit,
            train_loss = format_args!("{:.4}", update.mean_loss),
            lr = self.config.optimizer.lr(),
            round_ms = format_args!("{:.1}", update.duration.as_secs_f64() * 1e3),
            test_accuracy = %LogValue(evaluation.map(|e| e.accuracy)),
            test_loss = %LogValue(evaluation.map(|e| e.loss)),
            "round"
        );
        let reached_target = match (evaluation, self.config.target_accuracy) {
            (Some(e), Some(target)) => e.accuracy >= target,
            _ => false,
        };
        if last || reached_target {
            info!(
                round = version,
                reached_target,
                test_accuracy = ?self.last_eval.map(|e| e.accuracy),
                "training finished"
            );
            self.outcome = Some(Outcome {
                rounds: version,
                evaluation: self.last_eval,
                reached_target,
                checkpoint_error: None,
            });
            self.shutdown.cancel();
        }
        self.replace_pending();
    }

    /// A point of the run's history for this update.
    fn record(&mut self, update: &Update, version: u64, test_accuracy: Option<f64>) {
        let c = self.metrics.counters();
        let point = Point {
            round: version,
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            train_loss: update.mean_loss,
            test_accuracy,
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

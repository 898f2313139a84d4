//! The run's history, for a dashboard opened mid-run (`/api/history`, and the first event of
//! `/api/events`) and the volunteer's page: the whole run, in bounded memory.
//!
//! Every update is recorded. When [`HISTORY_POINTS`] are held, the resolution of all but the
//! newest [`RECENT_POINTS`] halves: the stride doubles, and a point stays only on the new
//! stride's grid (`round % stride == 0`). Evaluated points stay off that grid, on a grid
//! of their own, whose stride doubles only when they alone would fill half the history: the
//! test curve keeps every evaluation of a short run, and evenly spaced ones of a long one. A run of 33,000 updates keeps its climb from 10 % to 95 % (issue
//! 34: the last 500 rounds alone showed a flat line) in at most about 2,000 points.

use serde::Serialize;

/// Points held at most (about, between two thinnings).
pub const HISTORY_POINTS: usize = 2000;
/// The newest points are always at full resolution: the dashboard's recent window.
pub const RECENT_POINTS: usize = 500;

/// One update, as the dashboard draws it. Counters are running totals, so rates come from
/// differences between points.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    pub round: u64,
    pub unix_ms: u64,
    pub train_loss: f64,
    /// Set on rounds that were evaluated, once the evaluation is back.
    pub test_accuracy: Option<f64>,
    pub test_loss: Option<f64>,
    pub workers: usize,
    /// The round's participants (answered + missed; async: the gradients in the update).
    pub participants: usize,
    pub skipped: usize,
    pub round_ms: f64,
    pub gradients_accepted: u64,
    pub gradients_rejected: u64,
    pub late: u64,
    pub stale_rejected: u64,
    pub duplicate_rejected: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

#[derive(Debug)]
pub struct History {
    /// In round order.
    points: Vec<Point>,
    /// Rounds between two kept points older than the recent window.
    stride: u64,
    /// The same for evaluated points.
    eval_stride: u64,
}

impl Default for History {
    fn default() -> Self {
        Self {
            points: Vec::new(),
            stride: 1,
            eval_stride: 1,
        }
    }
}

impl History {
    pub fn record(&mut self, point: Point) {
        self.points.push(point);
        if self.points.len() > HISTORY_POINTS {
            self.thin();
        }
    }

    /// Halves the resolution of all but the newest [`RECENT_POINTS`].
    fn thin(&mut self) {
        self.stride = self.stride.saturating_mul(2);
        let old = self.points.len().saturating_sub(RECENT_POINTS);
        let evaluated = self.points[..old]
            .iter()
            .filter(|p| p.test_accuracy.is_some())
            .count();
        if evaluated > HISTORY_POINTS / 2 {
            self.eval_stride = self.eval_stride.saturating_mul(2);
        }
        let (stride, eval_stride, mut index) = (self.stride, self.eval_stride, 0);
        self.points.retain(|p| {
            let recent = index >= old;
            index += 1;
            let evaluated = p.test_accuracy.is_some() && p.round.is_multiple_of(eval_stride);
            recent || p.round.is_multiple_of(stride) || evaluated
        });
    }

    /// The update of `round` scored `accuracy` and `loss` (evaluations come back after
    /// their update).
    pub fn evaluated(&mut self, round: u64, accuracy: f64, loss: f64) {
        if let Some(p) = self.points.iter_mut().rev().find(|p| p.round == round) {
            p.test_accuracy = Some(accuracy);
            p.test_loss = Some(loss);
        }
    }

    pub fn points(&self) -> Vec<Point> {
        self.points.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(round: u64) -> Point {
        Point {
            round,
            unix_ms: 0,
            train_loss: 1.0,
            test_accuracy: None,
            test_loss: None,
            workers: 1,
            participants: 1,
            skipped: 0,
            round_ms: 1.0,
            gradients_accepted: round,
            gradients_rejected: 0,
            late: 0,
            stale_rejected: 0,
            duplicate_rejected: 0,
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    /// 33,000 updates evaluated every 10, as the run issue 34 watched: the history still
    /// starts at the first round, holds at most about 2,000 points, keeps the newest 500 at
    /// full resolution, and keeps evaluations from the whole run, evenly.
    #[test]
    fn the_whole_run_is_kept_in_bounded_memory() {
        let mut h = History::default();
        let mut most = 0;
        for round in 1..=33_000u64 {
            h.record(point(round));
            if round % 10 == 0 {
                h.evaluated(round, round as f64 / 33_000.0, 1.0);
            }
            most = most.max(h.points.len());
        }
        let points = h.points();
        assert!(most <= HISTORY_POINTS + 1, "{most}");
        assert!(points.windows(2).all(|w| w[0].round < w[1].round));
        assert!(
            points[0].round <= 64,
            "the run's start: {}",
            points[0].round
        );
        let newest: Vec<u64> = points[points.len() - RECENT_POINTS..]
            .iter()
            .map(|p| p.round)
            .collect();
        assert_eq!(
            newest,
            (33_000 - RECENT_POINTS as u64 + 1..=33_000).collect::<Vec<_>>()
        );
        let evaluated: Vec<u64> = points
            .iter()
            .filter(|p| p.test_accuracy.is_some())
            .map(|p| p.round)
            .collect();
        assert!(evaluated.len() >= 500, "{}", evaluated.len());
        assert!(evaluated[0] <= 100, "from the start: {}", evaluated[0]);
        // Evenly: no gap between two kept evaluations is much wider than the typical one.
        let gaps: Vec<u64> = evaluated.windows(2).map(|w| w[1] - w[0]).collect();
        let widest = *gaps.iter().max().expect("gaps");
        assert!(
            widest <= 100,
            "the widest gap between evaluations: {widest} rounds"
        );
    }

    #[test]
    fn a_short_run_is_kept_whole() {
        let mut h = History::default();
        for round in 1..=HISTORY_POINTS as u64 {
            h.record(point(round));
        }
        h.evaluated(7, 0.5, 2.0);
        let points = h.points();
        assert_eq!(points.len(), HISTORY_POINTS);
        assert_eq!(
            (points[6].test_accuracy, points[6].test_loss),
            (Some(0.5), Some(2.0))
        );
    }
}

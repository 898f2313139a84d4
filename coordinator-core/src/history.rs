//! The run's recent history, one point per update, for a dashboard opened mid-run
//! (`/api/history`, and the first event of `/api/events`). Bounded: the newest
//! [`HISTORY_POINTS`] are kept.

use std::collections::VecDeque;

use serde::Serialize;

/// Updates remembered.
pub const HISTORY_POINTS: usize = 2000;

/// One update, as the dashboard draws it. Counters are running totals, so rates come from
/// differences between points.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    pub round: u64,
    pub unix_ms: u64,
    pub train_loss: f64,
    /// Set on rounds that were evaluated, once the evaluation is back.
    pub test_accuracy: Option<f64>,
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

#[derive(Debug, Default)]
pub struct History(VecDeque<Point>);

impl History {
    pub fn record(&mut self, point: Point) {
        if self.0.len() == HISTORY_POINTS {
            self.0.pop_front();
        }
        self.0.push_back(point);
    }

    /// The update of `round` scored `accuracy` (evaluations come back after their update).
    pub fn evaluated(&mut self, round: u64, accuracy: f64) {
        if let Some(p) = self.0.iter_mut().rev().find(|p| p.round == round) {
            p.test_accuracy = Some(accuracy);
        }
    }

    pub fn points(&self) -> Vec<Point> {
        self.0.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_points_are_kept() {
        let mut h = History::default();
        for round in 0..HISTORY_POINTS as u64 + 5 {
            h.record(Point {
                round,
                unix_ms: 0,
                train_loss: 1.0,
                test_accuracy: None,
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
            });
        }
        let points = h.points();
        assert_eq!(points.len(), HISTORY_POINTS);
        assert_eq!(
            (points[0].round, points[HISTORY_POINTS - 1].round),
            (5, HISTORY_POINTS as u64 + 4)
        );
    }
}

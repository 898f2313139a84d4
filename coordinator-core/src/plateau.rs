//! `--patience`: a run whose validation loss has stopped improving finishes, keeping its
//! best weights. A volunteer lends compute on trust; a converged run that goes on spends it
//! on nothing (issue 34: 33,000 rounds at a flat 95.5 %, two tabs at full speed).
//!
//! An evaluation improves on the best when its loss is at least [`MIN_IMPROVEMENT`] lower
//! (relatively): one evaluation's noise on a few thousand samples is about that, so a run
//! creeping down by less is not counted as learning. After `patience` evaluations in a row
//! without one, the run has plateaued.

use std::sync::Arc;

use model::Evaluation;

/// `--patience`'s default: 20 evaluations, 200 updates at the default `--eval-interval` of
/// 10. A language model's validation loss still falls by more than 0.1 % in 200 steps
/// while it learns (nanoGPT's CPU run: 2.5 to 1.9 over 2,000 steps, about 2.7 % every 200);
/// the digits' runs reach their plateau within a few hundred updates and then ran for
/// tens of thousands.
pub const PATIENCE: u32 = 20;

/// Relative improvement of the loss that counts as one.
pub const MIN_IMPROVEMENT: f64 = 1e-3;

/// The best evaluation so far, with the weights that scored it.
#[derive(Debug, Clone)]
pub struct Best {
    pub version: u64,
    pub evaluation: Evaluation,
    pub params: Arc<[f32]>,
}

#[derive(Debug)]
pub(crate) struct Plateau {
    patience: u32,
    best: Option<Best>,
    /// Evaluations since the best.
    since: u32,
}

impl Plateau {
    /// `patience` 0: never plateaus (the best is still kept).
    pub fn new(patience: u32) -> Self {
        Self {
            patience,
            best: None,
            since: 0,
        }
    }

    /// Version `version`'s weights `params` scored `evaluation`: whether the run has now
    /// gone `patience` evaluations without improving.
    pub fn scored(&mut self, version: u64, evaluation: Evaluation, params: Arc<[f32]>) -> bool {
        let improved = self.best.as_ref().is_none_or(|b| {
            evaluation.loss < b.evaluation.loss * (1.0 - MIN_IMPROVEMENT)
                || (b.evaluation.loss.is_nan() && evaluation.loss.is_finite())
        });
        if improved {
            self.best = Some(Best {
                version,
                evaluation,
                params,
            });
            self.since = 0;
        } else {
            self.since += 1;
        }
        self.patience > 0 && self.since >= self.patience
    }

    pub fn best(&self) -> Option<&Best> {
        self.best.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(loss: f64) -> Evaluation {
        Evaluation {
            loss,
            accuracy: 0.5,
        }
    }

    #[test]
    fn patience_counts_evaluations_without_a_real_improvement() {
        let mut p = Plateau::new(3);
        let params = |v: f32| -> Arc<[f32]> { Arc::from(vec![v]) };
        assert!(!p.scored(10, e(2.0), params(1.0)));
        assert!(!p.scored(20, e(1.5), params(2.0)), "better: the new best");
        // Lower by less than 0.1 %: noise, not learning.
        assert!(!p.scored(30, e(1.4995), params(3.0)));
        assert!(!p.scored(40, e(1.6), params(4.0)));
        assert!(
            p.scored(50, e(1.55), params(5.0)),
            "three without improving"
        );
        let best = p.best().expect("kept");
        assert_eq!((best.version, best.evaluation.loss), (20, 1.5));
        assert_eq!(&best.params[..], [2.0]);
    }

    #[test]
    fn an_improvement_starts_the_count_again_and_zero_never_stops() {
        let mut p = Plateau::new(2);
        let w: Arc<[f32]> = Arc::from(vec![0.0]);
        assert!(!p.scored(1, e(2.0), w.clone()));
        assert!(!p.scored(2, e(2.5), w.clone()));
        assert!(!p.scored(3, e(1.0), w.clone()));
        assert!(!p.scored(4, e(1.0), w.clone()));
        assert!(p.scored(5, e(1.0), w.clone()));
        let mut never = Plateau::new(0);
        assert!((0..100).all(|v| !never.scored(v, e(1.0), w.clone())));
    }
}

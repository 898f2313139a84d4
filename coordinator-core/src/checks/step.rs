//! What the checks ask of the coordinator ([`Step`]), and what they may read of it while
//! they decide ([`Context`]). The checks own their state ([`super::Checks`]); the
//! coordinator owns the rest (the schedule, the registry's strikes, the sessions) and
//! carries the steps out in order, as quinn-proto's driver carries out a `Connection`'s
//! transmits.

use std::ops::{Deref, RangeInclusive};
use std::sync::Arc;

use model::Dataset;
use protocol::{Challenge, Gradient, WorkerId, LOG_WORDS};

use super::job::RecomputeJob;
use crate::local::LocalPlan;
use crate::metrics::Metrics;
use crate::refusal::Refusal;
use crate::registry::tally::Note;
use crate::registry::Registry;
use crate::schedule::Schedule;
use crate::trainer::Trainer;

/// An answer the checks let through: the one that just arrived (borrowed from the
/// caller's buffer), or one they held.
#[derive(Debug)]
pub(crate) enum Answer<'g> {
    Arrived(&'g Gradient),
    Held(Arc<Gradient>),
}

impl Deref for Answer<'_> {
    type Target = Gradient;

    fn deref(&self) -> &Gradient {
        match self {
            Self::Arrived(g) => g,
            Self::Held(g) => g,
        }
    }
}

impl Answer<'_> {
    /// An owned handle, to hold it (copied only if it had just arrived).
    pub fn held(&self) -> Arc<Gradient> {
        match self {
            Self::Arrived(g) => Arc::new((*g).clone()),
            Self::Held(g) => Arc::clone(g),
        }
    }
}

/// One thing the checks ask the coordinator to do, in order.
#[derive(Debug)]
pub(crate) enum Step<'g> {
    /// Checked, or not to be: on to the norm bound, its weight and the schedule.
    Admit {
        worker: WorkerId,
        gradient: Answer<'g>,
        norm: f64,
    },
    /// Run this off the coordinator's task; its verdict comes back as
    /// `Coordinator::recomputed`.
    Recompute(Box<RecomputeJob>),
    /// Ask `worker` for the states of its challenged phase.
    Ask(WorkerId, Challenge),
    /// Dropped without a strike: the schedule goes on without this worker's answer.
    Excuse(WorkerId),
    /// A newcomer's excused phase of `steps` steps matched its replay: they count towards
    /// the end of its probation, as an accepted answer's do.
    Vouch { worker: WorkerId, steps: u32 },
    /// A line in the worker's tally (the worker list).
    Note(WorkerId, Note),
    /// Refused. `strike`: it counts against the worker (at `--ban-after`, a ban: its
    /// session is closed, saying why); `excuse`: its round goes on without it; `tell`: its
    /// session is sent the refusal (if not closed).
    Refuse {
        worker: WorkerId,
        refusal: Refusal,
        strike: bool,
        excuse: bool,
        tell: bool,
    },
}

/// What the checks read of the coordinator while they decide (the registry, the trainer's
/// weights and model), and the counters they move.
pub(crate) struct Context<'a> {
    pub registry: &'a Registry,
    pub metrics: &'a mut Metrics,
    pub trainer: &'a mut Trainer,
    pub train: &'a Arc<Dataset>,
    pub local: Option<&'a LocalPlan>,
    pub batch_size: u32,
    /// Rounds wait for every answer (sync mode).
    pub rounds: bool,
    /// Who takes part in the open sync round is read from it only where a decision needs
    /// it ([`Schedule::roster`]), not for every input.
    pub schedule: &'a dyn Schedule,
    /// Training is over: verdicts judge nobody.
    pub finished: bool,
}

impl Context<'_> {
    /// Values in one revealed state: the weights and the inner optimizer's tensors.
    pub fn state_len(&self) -> usize {
        state_len(self.trainer, self.local)
    }

    /// Values a revealed state may have: its state's length, then a model with
    /// branches may append whole log entries, [`model::MAX_BRANCHES`] a step at most.
    pub fn reveal_len(&self) -> RangeInclusive<usize> {
        let state = self.state_len();
        let log = match (self.trainer.net().has_branches(), self.local) {
            (true, Some(plan)) => {
                plan.settings().segment as usize * model::MAX_BRANCHES * LOG_WORDS
            }
            _ => 0,
        };
        state..=state + log
    }
}

/// Values in one revealed state of `trainer`'s model under `local`'s inner optimizer.
pub(crate) fn state_len(trainer: &Trainer, local: Option<&LocalPlan>) -> usize {
    let len = trainer.net().param_count();
    let tensors = local.map_or(0, |plan| {
        let kind = plan.settings().inner;
        kind.build_masked(1, Vec::new()).state().tensors.len()
    });
    len * (1 + tensors)
}

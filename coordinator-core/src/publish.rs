//! Publishing the status: the state, the worker list (rebuilt only when it changed), the
//! bans, and everything the metrics count.

use std::sync::Arc;

use crate::metrics::Live;
use crate::remote::Remote;
use crate::status::{State, Status};
use crate::Coordinator;

impl Coordinator {
    /// Builds the status the driver publishes next.
    pub(crate) fn publish(&mut self) {
        let sent = self.registry.take_bytes_out();
        self.metrics.traffic(0, sent);
        let standing = self.schedule.standing();
        let state = match (&self.outcome, standing.training) {
            (Some(_), _) => State::Done,
            (None, _) if self.paused.is_some() => State::Paused,
            (None, true) => State::Training,
            // An edge's round is with the root.
            (None, false) if self.remote.as_ref().is_some_and(Remote::at_root) => State::Training,
            (None, false) => State::Waiting,
        };
        if self.registry.take_changed() {
            let (schedule, local) = (&self.schedule, &self.local);
            let steps = |id| local.as_ref().map(|plan| plan.steps(id));
            let list = self
                .registry
                .list(|id| schedule.is_skipped(id), steps, self.now);
            // With the list, not per input: it reads every worker.
            let (sum, n) = list
                .iter()
                .filter_map(|w| w.compute_share)
                .fold((0.0, 0usize), |(sum, n), share| (sum + share, n + 1));
            self.utilisation = (n > 0).then(|| sum / n as f64);
            self.on_probation = list.iter().filter(|w| w.probation_left > 0).count();
            self.worker_list = Arc::new(list);
        }
        if self.registry.bans().len() != self.bans.len() {
            self.bans = Arc::new(
                self.registry
                    .bans()
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            );
        }
        let status = self.metrics.snapshot(Live {
            state,
            round: self.trainer.version(),
            workers: self.registry.len(),
            standing,
            worker_list: self.worker_list.clone(),
            grad_norm_bound: self.bound.bound(),
            bans: self.bans.clone(),
            replicas: (self.checks.replicas.agreed, self.checks.replicas.disputed),
            local_steps: self.local.as_ref().map(crate::local::LocalPlan::mean_steps),
            utilisation: self.utilisation,
            probation: (self.settings.probation, self.on_probation),
            evaluations: self.evaluations.state(),
        });
        self.status = Status {
            cluster: self.remote.as_ref().and_then(Remote::view),
            ..status
        };
        self.status_fresh = true;
    }
}

//! Publishing the status: the state, the worker list (rebuilt only when it changed), the
//! bans, and everything the metrics count.

use std::sync::Arc;

use super::metrics::Live;
use super::{Checkpoints, Coordinator};
use crate::status::State;

impl Coordinator {
    pub(super) fn publish(&mut self) {
        let sent = self.registry.take_bytes_out();
        self.metrics.traffic(0, sent);
        let standing = self.schedule.standing();
        let state = match (&self.outcome, standing.training) {
            (Some(_), _) => State::Done,
            (None, _) if self.paused.is_some() => State::Paused,
            (None, true) => State::Training,
            (None, false) => State::Waiting,
        };
        if self.registry.take_changed() {
            let schedule = &self.schedule;
            self.worker_list = Arc::new(self.registry.list(|id| schedule.is_skipped(id), self.now));
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
            replicas: (self.replicas.agreed, self.replicas.disputed),
            checkpoints: self.checkpoints.as_ref().map(Checkpoints::report),
        });
        self.status_tx.send_replace(status);
    }
}

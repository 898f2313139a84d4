//! A worker joins: admission by the registry, the `Welcome` frame, and the schedule's turn.

use std::time::Instant;

use protocol::{
    encode_from_coordinator, CoordinatorToWorker, ErrorCode, Hello, ModelSpec, Welcome,
};
use tokio::sync::mpsc;
use tracing::info;

use super::handle::{Joined, Outbound};
use super::Coordinator;
use crate::refusal::Refusal;

impl Coordinator {
    pub(super) fn join(
        &mut self,
        hello: &Hello,
        outbox: mpsc::Sender<Outbound>,
        peer: std::net::IpAddr,
        now: Instant,
    ) -> Result<Joined, Refusal> {
        if self.outcome.is_some() {
            return Err(Refusal::new(
                ErrorCode::ShuttingDown,
                "training is finished",
            ));
        }
        let admission = self.registry.admit(hello, outbox, peer, now)?;
        let id = admission.id;
        if admission.replaced {
            self.schedule.left(id);
        }
        if admission.resumed {
            self.metrics.resumed();
        }
        let welcome = encode_from_coordinator(&CoordinatorToWorker::Welcome(Welcome {
            worker_id: id,
            resume_token: admission.token,
            model: ModelSpec {
                text: self.trainer.net().spec().to_string(),
                fingerprint: self.trainer.net().spec().fingerprint(),
            },
            batch_size: self.config.batch_size,
            compression: hello.compression,
        }));
        self.registry.send(id, Outbound::frame(welcome));
        let actions = self.schedule.joined(id, self.view());
        self.execute(actions);
        info!(worker = %id, kind = ?admission.kind, resumed = admission.resumed, workers = self.registry.len(), "worker joined");
        Ok(Joined {
            worker: id,
            session: admission.session,
            // A gradient carries the trained tensors only.
            param_count: self.trainer.net().trainable_count(),
            batch_size: self.config.batch_size,
        })
    }
}

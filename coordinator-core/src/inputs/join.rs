//! Input: a worker says `Hello`. Admission by the registry, the `Welcome` frame, and the
//! schedule's turn.

use std::time::Instant;

use protocol::{
    encode_from_coordinator, CoordinatorToWorker, ErrorCode, Hello, ModelSpec, Welcome,
};
use tracing::info;

use crate::io::{Joined, Outbound};
use crate::refusal::Refusal;
use crate::Coordinator;

impl Coordinator {
    /// A connection from `peer` said `hello`: let in (a new identity, or the one its resume
    /// token proves, replacing a connection that still holds it) or refused. Its `Welcome`
    /// (and, mid-round, its weights) are queued to the session this returns.
    pub fn join(
        &mut self,
        hello: &Hello,
        peer: std::net::IpAddr,
        now: Instant,
    ) -> Result<Joined, Refusal> {
        self.now = now;
        let joined = self.let_in(hello, peer, now);
        self.done(now);
        joined
    }

    fn let_in(
        &mut self,
        hello: &Hello,
        peer: std::net::IpAddr,
        now: Instant,
    ) -> Result<Joined, Refusal> {
        if let Some(outcome) = &self.outcome {
            return Err(crate::coordinator::finished(outcome));
        }
        // What it answers in is the run's to confirm (`Settings::answer_encoding`).
        let compression = self.settings.answer_encoding(hello.compression);
        let confirmed;
        let hello = if compression == hello.compression {
            hello
        } else {
            confirmed = Hello {
                compression,
                ..hello.clone()
            };
            &confirmed
        };
        let admission = self.registry.admit(hello, peer, now)?;
        let id = admission.id;
        if let Some(old) = admission.replaced {
            self.schedule.left(id);
            let msg = "this worker resumed on another connection";
            let close = Outbound::Close(Refusal::new(ErrorCode::Replaced, msg));
            self.outputs.push_back(crate::io::Output::Send {
                worker: id,
                session: old,
                message: close,
            });
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
            batch_size: self.settings.batch_size,
            compression: hello.compression,
        }));
        self.send(id, Outbound::frame(welcome));
        let actions = self.schedule.joined(id, self.view());
        self.execute(actions);
        info!(worker = %id, kind = ?admission.kind, resumed = admission.resumed, workers = self.registry.len(), "worker joined");
        Ok(Joined {
            worker: id,
            session: admission.session,
            // A gradient carries the trained tensors only.
            param_count: self.trainer.net().trainable_count(),
            // A local phase's answer counts the samples of all its steps.
            batch_size: self
                .settings
                .batch_size
                .saturating_mul(self.settings.local.map_or(1, |l| l.max_steps())),
        })
    }
}

//! Inputs: a session ended, the driver could not reach one, or one was closed for bad input.

use std::net::IpAddr;
use std::time::Instant;

use protocol::WorkerId;
use tracing::info;

use crate::checks::strikes_an_address;
use crate::refusal::Refusal;
use crate::session::SessionId;
use crate::Coordinator;

impl Coordinator {
    /// `worker`'s session `session` ended (the socket closed). An older session's end is
    /// nothing: the worker lives on in its newer one.
    pub fn leave(&mut self, worker: WorkerId, session: SessionId, now: Instant) {
        self.now = now;
        if self.registry.is_current(worker, session) {
            self.registry.drop_worker(worker);
        }
        self.done(now);
    }

    /// The driver could not queue a message to `worker`'s session `session` (it left its
    /// frames unread, or it is gone): the worker is dropped rather than let anything block
    /// or buffer without bound.
    pub fn unreachable(&mut self, worker: WorkerId, session: SessionId, now: Instant) {
        self.now = now;
        if self.registry.is_current(worker, session) {
            info!(%worker, "worker is not reading its frames; dropping it");
            self.registry.drop_worker(worker);
        }
        self.done(now);
    }

    /// A session from `peer` was closed for bad input, before or after joining. Counted;
    /// the worker itself leaves with its own [`Coordinator::leave`].
    pub fn rejected(&mut self, refusal: &Refusal, peer: IpAddr, now: Instant) {
        self.now = now;
        info!(%peer, %refusal, "session closed for bad input");
        self.metrics.session_rejected();
        if strikes_an_address(refusal.code) {
            self.registry.strike_address(peer);
        }
        self.done(now);
    }
}

//! Inputs: a GPU phase's commitments, sent before its answer, and the chunks of the states
//! a challenge asked for. The checks decide (`checks/machine.rs`: either, where nothing
//! called for it, is refused with an error; repeated, each is a strike); the coordinator
//! carries out their steps.

use std::time::Instant;

use protocol::{Commitments, RevealChunk, WorkerId};

use crate::session::SessionId;
use crate::Coordinator;

impl Coordinator {
    /// `worker`'s session `session` committed to its phase's states; kept for its answer.
    pub fn commitments(
        &mut self,
        worker: WorkerId,
        session: SessionId,
        commitments: Commitments,
        now: Instant,
    ) {
        self.now = now;
        if self.registry.is_current(worker, session) {
            let (checks, mut cx) = self.checks();
            let steps = checks.commitments(&mut cx, worker, commitments);
            self.carry_out(steps, now);
        }
        self.done(now);
    }

    /// One chunk of a state `worker` reveals. Once every state asked for is in, its
    /// segments are replayed off the coordinator's task.
    pub fn revealed(
        &mut self,
        worker: WorkerId,
        session: SessionId,
        chunk: RevealChunk,
        now: Instant,
    ) {
        self.now = now;
        let (checks, mut cx) = self.checks();
        let steps = checks.revealed(&mut cx, worker, session, chunk, now);
        self.carry_out(steps, now);
        self.done(now);
    }
}

//! Inputs: a GPU phase's commitments, sent before its answer, and the chunks of the states
//! a challenge asked for (`checks::challenge`).

use std::time::Instant;

use protocol::{Commitments, RevealChunk, WorkerId};
use tracing::debug;

use crate::checks::recompute::Refuted;
use crate::io::SessionId;
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
            self.challenges.commit(worker, commitments);
        }
        self.done(now);
    }

    /// One chunk of a state `worker` reveals. A chunk for no open challenge (one that
    /// expired while it travelled) is dropped; one other than the chunk asked for, or a state
    /// that is not its hash, is a mismatch. Once every state asked for is in, its segments
    /// are replayed off the coordinator's task.
    pub fn revealed(
        &mut self,
        worker: WorkerId,
        session: SessionId,
        chunk: RevealChunk,
        now: Instant,
    ) {
        self.now = now;
        let expected = self.reveal_len();
        let open = self
            .challenges
            .open
            .get_mut(&worker)
            .filter(|o| o.session == session && o.held.is_some());
        let Some(open) = open else {
            debug!(%worker, round = %chunk.round, "a revealed state for no open challenge; dropped");
            return self.done(now);
        };
        match open.take(chunk, expected) {
            Ok(false) => {}
            Ok(true) => self.replay_segments(worker, now),
            Err(why) => {
                let held = self
                    .challenges
                    .open
                    .remove(&worker)
                    .and_then(|o| o.held)
                    .expect("open, with its answer");
                self.refute(held, Refuted::Mismatch(why), now);
            }
        }
        self.done(now);
    }
}

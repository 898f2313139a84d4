//! Inputs: a GPU phase's commitments, sent before its answer, and the chunks of the states
//! a challenge asked for (`checks::challenge`). Either, where nothing called for it, is
//! refused with an error; repeated, each is a strike.

use std::time::Instant;

use protocol::{Commitments, ErrorCode, RevealChunk, WorkerId};
use tracing::{debug, warn};

use crate::checks::recompute::Refuted;
use crate::refusal::Refusal;
use crate::registry::tally::Note;
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
            match self.calls_for(worker, &commitments) {
                Ok(true) => self.challenges.commit(worker, commitments),
                Ok(false) => {
                    debug!(%worker, round = %commitments.round, "commitments for an older task; dropped");
                }
                Err(why) => self.unsolicited(worker, "Commitments", why),
            }
        }
        self.done(now);
    }

    /// Whether `worker`'s task calls for `commitments`: a committed phase of that round, one
    /// hash a segment. `Ok(false)`: for an older task (a late phase's, which its answer will
    /// find late too); `Err`: nothing called for them. A second set for the same task
    /// replaces the first (a task sent again, as after a reconnect, is computed again): one
    /// set a worker is kept, whatever it sends.
    fn calls_for(&self, worker: WorkerId, commitments: &Commitments) -> Result<bool, String> {
        let round = commitments.round;
        let Some(pull) = self.registry.pull(worker) else {
            return Err("it has no task".into());
        };
        let Some(local) = pull.local.filter(|l| l.segment > 0) else {
            return Err("its task is not a phase committed by segments".into());
        };
        if round.0 < pull.version {
            return Ok(false);
        }
        if round.0 > pull.version {
            return Err(format!(
                "they are for {round}, its task for round {}",
                pull.version
            ));
        }
        let n = protocol::commit::boundaries(local.steps, local.segment) as usize;
        if commitments.hashes.len() != n {
            return Err(format!(
                "{} hashes, where its phase of {} steps has {n} segments",
                commitments.hashes.len(),
                local.steps
            ));
        }
        Ok(true)
    }

    /// `worker` sent a frame its task did not call for: refused with an error saying why,
    /// and from the second on, each a strike (at `--ban-after`, a ban).
    fn unsolicited(&mut self, worker: WorkerId, frame: &str, why: String) {
        let n = self.challenges.unsolicited(worker);
        let message = format!("a {frame} frame nothing asked for: {why}");
        warn!(%worker, n, %message, "refused");
        self.registry
            .note(worker, Note::Rejected(ErrorCode::UnexpectedMessage));
        if n > 1 {
            let (strikes, banned) = self.registry.strike(worker);
            if banned {
                return self.ban_close(worker);
            }
            warn!(%worker, strikes, "struck for repeated frames nothing asked for");
        }
        self.send_error(worker, Refusal::new(ErrorCode::UnexpectedMessage, message));
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
            if !self.registry.is_current(worker, session) {
                return self.done(now);
            }
            if self.challenges.was_challenged(worker, chunk.round) {
                debug!(%worker, round = %chunk.round, "a revealed state for a challenge that ended; dropped");
            } else {
                let why = format!("no challenge asked for a state of {}", chunk.round);
                self.unsolicited(worker, "Reveal", why);
            }
            return self.done(now);
        };
        let bytes = chunk.values.len() as u64 * 4;
        self.metrics.revealed(bytes);
        self.registry.note(worker, Note::Revealed(bytes));
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

//! What each worker's gradients came to: the per-worker counts in `/api/status`, and in the
//! log line when it leaves.

use std::collections::BTreeMap;

use protocol::ErrorCode;

/// Something that happened to one of a worker's gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// It went into an update (or the async buffer).
    Accepted,
    /// It was scaled down by the norm bound.
    Clipped,
    /// The coordinator recomputed it and found it equal.
    Verified,
    /// It was dropped, for this reason.
    Rejected(ErrorCode),
    /// Its GPU phase was challenged for its committed states.
    Challenged,
    /// These bytes of a challenged phase's states came in.
    Revealed(u64),
    /// Segments of its phase were replayed, in these milliseconds of a core.
    Replayed { segments: u32, ms: u64 },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub accepted: u64,
    pub clipped: u64,
    pub verified: u64,
    /// By reason: `late`, `stale`, `mismatch`, ...
    pub rejected: BTreeMap<&'static str, u64>,
    /// Its GPU phases challenged, the bytes of states it revealed, the segments replayed
    /// and the milliseconds of a core they took.
    pub challenged: u64,
    pub bytes_revealed: u64,
    pub segments_replayed: u64,
    pub replay_ms: u64,
}

impl Tally {
    pub fn note(&mut self, note: Note) {
        match note {
            Note::Accepted => self.accepted += 1,
            Note::Clipped => self.clipped += 1,
            Note::Verified => self.verified += 1,
            Note::Rejected(code) => *self.rejected.entry(code.name()).or_default() += 1,
            Note::Challenged => self.challenged += 1,
            Note::Revealed(bytes) => self.bytes_revealed += bytes,
            Note::Replayed { segments, ms } => {
                self.segments_replayed += u64::from(segments);
                self.replay_ms += ms;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_note_and_rejections_by_reason() {
        let mut t = Tally::default();
        for note in [
            Note::Accepted,
            Note::Accepted,
            Note::Clipped,
            Note::Verified,
            Note::Rejected(ErrorCode::Late),
            Note::Rejected(ErrorCode::Mismatch),
            Note::Rejected(ErrorCode::Late),
        ] {
            t.note(note);
        }
        assert_eq!((t.accepted, t.clipped, t.verified), (2, 1, 1));
        let rejected: Vec<_> = t.rejected.into_iter().collect();
        assert_eq!(rejected, [("late", 2), ("mismatch", 1)]);
    }
}

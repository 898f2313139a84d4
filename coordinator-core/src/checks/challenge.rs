//! A GPU's local phase, checked by segments (docs/DESIGN.md, "A GPU's local phase,
//! checked"). A worker that took a phase in its own order (`Gradient::parts` 0, a `Task`
//! whose phase names a segment length `k`) sent the hashes of its state every `k` steps
//! before its answer ([`protocol::Commitments`]). When the answer is to be checked (sampled,
//! or on probation), the coordinator holds it and asks ([`protocol::Challenge`]) for the
//! states at both ends of [`SEGMENTS`] segments drawn at random, and for the last state,
//! whose weights must give the answer exactly. Each revealed state must match its hash; the
//! segments are then replayed off the coordinator's task ([`Revealed::check`], run by a
//! `RecomputeJob`), each from the worker's own start state ([`super::segment`]).
//!
//! - A state that is not its hash, an answer that is not the last state's weights, a
//!   segment beyond `segment::MARGINAL` times its tolerance, or a reveal other than the
//!   one asked for: a mismatch, a strike.
//! - A marginal segment asks for the segments beside it, once; if they match, the answer
//!   goes on, and if one is marginal again it is dropped without a strike.
//! - No reveal within [`reveal_time`], or a worker that left: the answer is dropped, no
//!   strike (the round never waited on it: it had not reached the schedule).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use model::SplitMix64;
use protocol::chunk::Assembly;
use protocol::commit::{boundaries, boundary_step};
use protocol::{Commitments, Compression, LocalPhase, Round, WorkerId, LOG_WORDS};

use super::job::Held;
use super::segment::Revealed;
use crate::registry::Pull;
use crate::session::SessionId;

/// Segments drawn for each challenged phase (more if one is marginal).
pub const SEGMENTS: usize = 2;
/// A reveal may take at least this long.
const REVEAL_FLOOR: Duration = Duration::from_secs(60);
/// The slowest a reveal may come, in bytes a second (a gradient's floor, as the sessions'
/// `MIN_UPLOAD_RATE`).
const REVEAL_RATE: f64 = 64.0 * 1024.0;

/// How long `values` values may take to reveal.
pub fn reveal_time(values: usize) -> Duration {
    Duration::from_secs_f64(values as f64 * 4.0 / REVEAL_RATE).max(REVEAL_FLOOR)
}

/// The commitments received, the challenges open, and the draw; per worker, each freed
/// when the worker leaves ([`Challenges::left`]).
#[derive(Debug)]
pub(crate) struct Challenges {
    commitments: HashMap<WorkerId, Commitments>,
    pub(crate) open: HashMap<WorkerId, Open>,
    /// The round of each worker's latest challenge: chunks of its reveal that arrive after
    /// the challenge ended (expired, or judged) are dropped, not refused.
    challenged: HashMap<WorkerId, Round>,
    /// `Commitments` and `Reveal` frames each worker sent that nothing called for.
    unsolicited: HashMap<WorkerId, u32>,
    rng: SplitMix64,
}

/// A challenged answer: what its check needs, the states in so far, and the answer itself
/// while its states are awaited (`None` while its segments replay).
#[derive(Debug)]
pub(crate) struct Open {
    pub round: Round,
    pub session: SessionId,
    pub start: Arc<[f32]>,
    pub compression: Compression,
    pub local: LocalPhase,
    hashes: Vec<[u8; 32]>,
    /// The segments to replay next (from 1: segment `s` runs from boundary `s − 1` to `s`).
    pub replay: Vec<u32>,
    /// Every segment asked for so far.
    asked_segments: BTreeSet<u32>,
    /// States revealed, each matching its hash.
    states: BTreeMap<u32, Arc<[f32]>>,
    /// Boundaries asked for and not in yet, in the order they come.
    pub asked: VecDeque<u32>,
    assembly: Assembly,
    /// The values of the state under way, as its first chunk said (a log may follow it).
    expecting: Option<usize>,
    incoming: Vec<f32>,
    pub held: Option<Held>,
    pub escalated: bool,
    pub due: Instant,
}

impl Challenges {
    pub fn new(seed: u64) -> Self {
        Self {
            commitments: HashMap::new(),
            open: HashMap::new(),
            challenged: HashMap::new(),
            unsolicited: HashMap::new(),
            rng: SplitMix64::new(seed ^ 0x6368_616c_6c65_6e67),
        }
    }

    /// Keeps `worker`'s commitments for its next answer (a newer replaces an older).
    pub fn commit(&mut self, worker: WorkerId, commitments: Commitments) {
        self.commitments.insert(worker, commitments);
    }

    /// Whether `worker`'s latest challenge was for `round` (its reveal may still be arriving
    /// after the challenge ended).
    pub fn was_challenged(&self, worker: WorkerId, round: Round) -> bool {
        self.challenged.get(&worker) == Some(&round)
    }

    /// `worker` sent a frame nothing called for: how many it has sent in this session.
    pub fn unsolicited(&mut self, worker: WorkerId) -> u32 {
        let n = self.unsolicited.entry(worker).or_default();
        *n += 1;
        *n
    }

    /// `worker` left: everything kept for it goes. (An open challenge's held answer is
    /// dropped, unstruck, by the next [`Challenges::expire`].)
    pub fn left(&mut self, worker: WorkerId) {
        self.commitments.remove(&worker);
        self.challenged.remove(&worker);
        self.unsolicited.remove(&worker);
    }

    /// Workers with commitments kept (for tests of what leaving frees).
    #[cfg(test)]
    pub fn committed_workers(&self) -> usize {
        self.commitments.len() + self.challenged.len() + self.unsolicited.len()
    }

    /// The commitments `worker` sent for `round`, if any, and if they are one a boundary.
    pub fn take(
        &mut self,
        worker: WorkerId,
        round: Round,
        local: LocalPhase,
    ) -> Option<Vec<[u8; 32]>> {
        let c = self.commitments.remove(&worker)?;
        let n = boundaries(local.steps, local.segment) as usize;
        (c.round == round && c.hashes.len() == n).then_some(c.hashes)
    }

    /// Opens a challenge for `held`'s phase: [`SEGMENTS`] segments drawn at random (all of
    /// them in a shorter phase), and the last boundary. Returns the boundaries to ask for.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        held: Held,
        start: Arc<[f32]>,
        compression: Compression,
        local: LocalPhase,
        hashes: Vec<[u8; 32]>,
        state_len: usize,
        now: Instant,
    ) -> Vec<u32> {
        self.challenged.insert(held.worker, held.gradient.round);
        let n = hashes.len() as u32;
        let mut drawn = BTreeSet::new();
        while drawn.len() < SEGMENTS.min(n as usize) {
            drawn.insert(1 + self.rng.below(n as usize) as u32);
        }
        let mut open = Open {
            round: held.gradient.round,
            session: held.session,
            start,
            compression,
            local,
            hashes,
            replay: Vec::new(),
            asked_segments: BTreeSet::new(),
            states: BTreeMap::new(),
            asked: VecDeque::new(),
            assembly: Assembly::default(),
            expecting: None,
            incoming: Vec::new(),
            held: None,
            escalated: false,
            due: now,
        };
        let worker = held.worker;
        let asked = open.ask(held, drawn.into_iter().collect(), state_len, now);
        self.open.insert(worker, open);
        asked
    }

    /// When the first open challenge's states are due.
    pub fn due(&self) -> Option<Instant> {
        self.open
            .values()
            .filter(|o| o.held.is_some())
            .map(|o| o.due)
            .min()
    }

    /// Challenges whose worker left (or reconnected), or whose states did not come in
    /// time: their answers, to drop without a strike.
    pub fn expire(
        &mut self,
        now: Instant,
        current: impl Fn(WorkerId, SessionId) -> bool,
    ) -> Vec<Held> {
        let gone: Vec<WorkerId> = self
            .open
            .iter()
            .filter(|(&w, o)| !current(w, o.session) || (o.held.is_some() && now > o.due))
            .map(|(&w, _)| w)
            .collect();
        gone.into_iter()
            .filter_map(|w| self.open.remove(&w).and_then(|o| o.held))
            .collect()
    }
}

impl Open {
    /// Asks for `segments` (and the last boundary, once): the boundaries not revealed yet.
    pub fn ask(
        &mut self,
        held: Held,
        segments: Vec<u32>,
        state_len: usize,
        now: Instant,
    ) -> Vec<u32> {
        let n = self.hashes.len() as u32;
        let mut wanted = BTreeSet::from([n]);
        for &s in &segments {
            wanted.extend([s - 1, s]);
        }
        wanted.remove(&0);
        let asked: Vec<u32> = wanted
            .into_iter()
            .filter(|b| !self.states.contains_key(b))
            .collect();
        self.asked_segments.extend(&segments);
        self.replay = segments;
        self.asked = asked.iter().copied().collect();
        self.assembly = Assembly::default();
        self.expecting = None;
        self.incoming = Vec::new();
        self.held = Some(held);
        self.due = now + reveal_time(state_len * asked.len());
        asked
    }

    /// The segments beside `segment` not asked for yet.
    pub fn neighbours(&self, segment: u32) -> Vec<u32> {
        let n = self.hashes.len() as u32;
        [segment.wrapping_sub(1), segment + 1]
            .into_iter()
            .filter(|s| (1..=n).contains(s) && !self.asked_segments.contains(s))
            .collect()
    }

    /// Takes one chunk of the state under way (`expected` values: the state, and as many
    /// whole log entries as a segment may log): `Ok(true)` once every boundary asked for
    /// is in and matches its hash; `Err` says why the reveal is refused.
    pub fn take(
        &mut self,
        chunk: protocol::RevealChunk,
        expected: RangeInclusive<usize>,
    ) -> Result<bool, String> {
        let Some(&boundary) = self.asked.front() else {
            return Err("a state nobody asked for".into());
        };
        if chunk.round != self.round || chunk.boundary != boundary {
            return Err(format!(
                "state {} of {} where state {boundary} of {} was asked for",
                chunk.boundary, chunk.round, self.round
            ));
        }
        let pos = protocol::ChunkPos {
            total: chunk.total,
            offset: chunk.offset,
            count: chunk.values.len() as u32,
        };
        let expected = *self.expecting.get_or_insert_with(|| {
            let total = chunk.total as usize;
            let whole = (total.wrapping_sub(*expected.start())).is_multiple_of(LOG_WORDS);
            match expected.contains(&total) && whole {
                true => total,
                false => *expected.start(),
            }
        });
        let last = self
            .assembly
            .accept(pos, expected)
            .map_err(|e| format!("state {boundary}: {e}"))?;
        self.incoming.extend_from_slice(&chunk.values);
        if !last {
            return Ok(false);
        }
        let values = std::mem::take(&mut self.incoming);
        let step = boundary_step(boundary, self.local.segment, self.local.steps);
        if protocol::state_hash(step, &values) != self.hashes[boundary as usize - 1] {
            return Err(format!(
                "state {boundary} is not the one its hash committed to"
            ));
        }
        self.states.insert(boundary, values.into());
        self.asked.pop_front();
        self.assembly = Assembly::default();
        self.expecting = None;
        Ok(self.asked.is_empty())
    }

    /// The replay's job, once every state is in.
    pub fn revealed(&self) -> Revealed {
        let mut states = BTreeMap::new();
        let n = self.hashes.len() as u32;
        for &s in &self.replay {
            for b in [s - 1, s] {
                if let Some(state) = self.states.get(&b) {
                    states.insert(b, Arc::clone(state));
                }
            }
        }
        if let Some(last) = self.states.get(&n) {
            states.insert(n, Arc::clone(last));
        }
        Revealed {
            states,
            replay: self.replay.clone(),
            segment: self.local.segment,
        }
    }
}

/// A committed phase's answer (a GPU's, in its own order, to the task it was sent), to be
/// checked by a challenge. `None`: checked as any other answer.
pub(crate) fn committed(pull: Option<&Pull>, gradient: &protocol::Gradient) -> Option<LocalPhase> {
    if gradient.parts != protocol::UNORDERED {
        return None;
    }
    let pull = pull?;
    pull.local
        .filter(|l| l.segment > 0 && pull.version == gradient.round.0)
}

/// Whether a worker's task (`pull`) calls for `commitments`: a committed phase of that round, one
/// hash a segment. `Ok(false)`: for an older task (a late phase's, which its answer will
/// find late too); `Err`: nothing called for them. A second set for the same task replaces
/// the first (a task sent again, as after a reconnect, is computed again): one set a worker
/// is kept, whatever it sends.
pub(crate) fn calls_for(pull: Option<&Pull>, commitments: &Commitments) -> Result<bool, String> {
    let round = commitments.round;
    let Some(pull) = pull else {
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

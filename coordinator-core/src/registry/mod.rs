//! Who is connected: workers and their identities (join, resume, leave), the shard each one
//! holds, and the session its frames go to.
//!
//! Identities outlive connections: a resume token maps back to its worker id, and each
//! connection is a [`SessionId`], so inputs from a replaced connection are ignored. A worker
//! the driver cannot reach is marked dropped; the coordinator removes it when it settles.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::Range;
use std::time::Instant;

use protocol::{Compression, ErrorCode, Hello, WorkerId, WorkerKind};
use subtle::ConstantTimeEq;
use tracing::{info, warn};

use self::bans::Bans;
pub use self::bans::{Banned, SavedBans};
use self::identities::Identities;
use self::newcomers::Newcomers;
use self::tally::{Note, Tally};
use self::trust::Trust;
use crate::broadcast::Held;
use crate::checks::replicas::GroupKey;
use crate::refusal::Refusal;
use crate::session::SessionId;

pub mod bans;
pub mod identities;
mod list;
pub mod newcomers;
mod saved;
mod shards;
pub mod tally;
pub mod trust;

#[derive(Debug)]
struct Worker {
    kind: WorkerKind,
    /// It said in Hello that its products fuse (a tab whose relaxed SIMD fuses).
    fused: bool,
    session: SessionId,
    /// Negotiated in Hello: how its weights and gradients travel.
    compression: Compression,
    /// The shard this connection holds (what was last sent on it).
    shard: Option<Range<usize>>,
    /// What its answer to the weights it was last sent is computed on, even if an extension
    /// re-cut the shards since.
    pull: Option<Pull>,
    /// The batch index of its latest pull: the next one is `max(version, this + 1)`.
    last_batch: Option<u64>,
    /// What its gradients came to.
    tally: Tally,
    /// Workers sharing its shard (`--replicate`), itself included.
    replicas: usize,
    /// The address it connected from.
    peer: IpAddr,
    /// When it was last sent weights (for `/metrics`' gradient latency).
    weights_sent_at: Option<Instant>,
    /// For the worker table: when it connected, its last gradient, samples it computed.
    connected_at: Instant,
    last_seen: Option<Instant>,
    samples: u64,
    /// The compute time its answers reported.
    compute: std::time::Duration,
    /// The parts its latest answer was computed in: the cores it lends.
    cores: u8,
    /// Whether this connection holds the frozen tensors' current values.
    has_frozen: bool,
    /// The version of the int8 weights' chain it was last sent (`broadcast.rs`).
    held: Option<Held>,
    /// A shard or the frozen tensors went to it since its last pull: its next answer's
    /// time does not measure its link alone.
    bulk_sent: bool,
}

/// What a worker's answer to one pull is computed on: the weights of `version`, and the
/// batch of index `batch` of `shard` (told to it in the pull's `Task`).
#[derive(Debug, Clone, PartialEq)]
pub struct Pull {
    pub version: u64,
    pub batch: u64,
    pub shard: Range<usize>,
    /// The local phase its `Task` asked for (`--local-steps`).
    pub local: Option<protocol::LocalPhase>,
    /// Only weights went before its answer (no shard, no frozen tensors): the answer's
    /// time measures the worker's link and speed (`--local-steps auto`).
    pub timed: bool,
}

/// A worker let in by [`Registry::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub id: WorkerId,
    pub session: SessionId,
    pub token: String,
    pub kind: WorkerKind,
    /// It came back with its resume token.
    pub resumed: bool,
    /// Its identity was still connected on this other session, which must be closed.
    pub replaced: Option<SessionId>,
}

/// Identities kept per `--max-workers` slot (at least 256 slots): room for every connected
/// worker and for that many more who left and may come back.
const IDENTITIES_PER_WORKER_SLOT: usize = 4;

#[derive(Debug)]
pub struct Registry {
    workers: BTreeMap<WorkerId, Worker>,
    identities: Identities,
    next_worker: u32,
    next_session: u64,
    join_token: Option<String>,
    max_workers: usize,
    bans: Bans,
    /// `--probation`: who has earned the sampled rate of checks.
    trust: Trust,
    /// `--new-identities-per-address` and `-per-network`.
    newcomers: Newcomers,
    /// `--replicate`: workers per shard.
    replicate: usize,
    /// Bytes of frames queued to workers since last taken.
    bytes_out: u64,
    /// Workers whose outbox failed while sending, or who left; removed when settling.
    dropped: Vec<WorkerId>,
    /// The published worker list is out of date (membership, skips or counts changed at a
    /// round or update). Per-gradient counts alone do not set it: that would make every
    /// event O(workers).
    changed: bool,
}

impl Registry {
    pub fn new(join_token: Option<String>, max_workers: usize, ban_after: u32) -> Self {
        Self {
            bans: Bans::new(ban_after),
            trust: Trust::new(0),
            newcomers: Newcomers::new(u32::MAX, u32::MAX),
            workers: BTreeMap::new(),
            identities: Identities::new(IDENTITIES_PER_WORKER_SLOT * max_workers.max(256)),
            next_worker: 1,
            next_session: 1,
            join_token,
            max_workers,
            replicate: 1,
            bytes_out: 0,
            dropped: Vec::new(),
            changed: true,
        }
    }

    /// `--replicate r`: groups of `r` workers of one compression share a shard.
    pub fn with_replicate(mut self, r: usize) -> Self {
        self.replicate = r.max(1);
        self
    }

    /// `--probation n`: a new identity's answers are all recomputed until `n` steps of its
    /// work were accepted (`trust.rs`).
    pub fn with_probation(mut self, n: u32) -> Self {
        self.trust = Trust::new(n);
        self
    }

    /// New identities per hour that an address, and its network, may be issued.
    pub fn with_newcomers(mut self, per_address: u32, per_network: u32) -> Self {
        self.newcomers = Newcomers::new(per_address, per_network);
        self
    }

    /// Lets a worker in: checks the join token and the worker limit, and resumes the
    /// identity its token names (replacing a connection that still holds it).
    pub fn admit(
        &mut self,
        hello: &Hello,
        peer: IpAddr,
        now: Instant,
    ) -> Result<Admission, Refusal> {
        if self.bans.is_address_banned(peer) {
            let msg = format!("{peer} is banned from this run");
            return Err(Refusal::new(ErrorCode::Banned, msg));
        }
        if let Some(expected) = &self.join_token {
            let given = hello.join_token.as_deref().unwrap_or_default();
            if !bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
                let msg = "missing or wrong join token";
                return Err(Refusal::new(ErrorCode::Unauthorized, msg));
            }
        }
        let resumed = hello
            .resume_token
            .as_ref()
            .and_then(|token| Some((token.clone(), self.identities.resume(token, now)?)));
        if resumed.is_none() && self.workers.len() >= self.max_workers {
            let msg = format!(
                "the coordinator accepts at most {} workers",
                self.max_workers
            );
            return Err(Refusal::new(ErrorCode::Full, msg));
        }
        if let Some((_, (id, _))) = &resumed {
            if self.bans.is_banned(*id) {
                let msg = format!("{id} is banned from this run");
                return Err(Refusal::new(ErrorCode::Banned, msg));
            }
        }
        let (token, (id, gradients), resumed) = match resumed {
            Some((token, identity)) => (token, identity, true),
            None => {
                if let Err(spent) = self.newcomers.issue(peer, now) {
                    info!(%peer, %spent, "new identity refused");
                    return Err(Refusal::new(ErrorCode::Full, spent.to_string()));
                }
                let id = WorkerId(self.next_worker);
                let token = self.identities.issue(id, now).map_err(|e| {
                    warn!(%e, "cannot issue a resume token");
                    Refusal::new(
                        ErrorCode::Full,
                        "the coordinator cannot issue identities now",
                    )
                })?;
                self.next_worker += 1;
                (token, (id, 0), false)
            }
        };
        let mut tally = Tally {
            accepted: gradients,
            ..Tally::default()
        };
        let mut last_batch = None;
        // Still connected (the old socket has not noticed it is dead): replace it.
        let replaced = self.workers.remove(&id).map(|old| {
            tally = old.tally;
            last_batch = old.last_batch;
            old.session
        });
        let session = SessionId(self.next_session);
        self.next_session += 1;
        let kind = hello.kind.unwrap_or(WorkerKind::Native);
        self.workers.insert(
            id,
            Worker {
                kind,
                fused: hello.fused,
                session,
                compression: hello.compression,
                shard: None,
                has_frozen: false,
                held: None,
                bulk_sent: false,
                pull: None,
                last_batch,
                tally,
                replicas: 1,
                peer,
                weights_sent_at: None,
                connected_at: now,
                last_seen: None,
                samples: 0,
                compute: std::time::Duration::ZERO,
                cores: 1,
            },
        );
        self.changed = true;
        Ok(Admission {
            id,
            session,
            token,
            kind,
            resumed,
            replaced,
        })
    }

    /// `session` is the worker's current connection (not one it resumed away from).
    pub fn is_current(&self, id: WorkerId, session: SessionId) -> bool {
        self.workers.get(&id).is_some_and(|w| w.session == session)
    }

    /// The worker's current connection.
    pub fn session(&self, id: WorkerId) -> Option<SessionId> {
        self.workers.get(&id).map(|w| w.session)
    }

    /// The connected workers, in id order.
    pub fn ids(&self) -> Vec<WorkerId> {
        self.workers.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether a connected worker is past its probation: its answers may carry a round.
    pub fn any_trusted(&self) -> bool {
        self.workers.keys().any(|&id| !self.trust.on_probation(id))
    }

    /// Whether `id` is connected.
    pub fn contains(&self, id: WorkerId) -> bool {
        self.workers.contains_key(&id)
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// What `id` said it is in its `Hello` (a hint, never trusted).
    pub fn kind(&self, id: WorkerId) -> Option<WorkerKind> {
        self.workers.get(&id).map(|w| w.kind)
    }

    /// The float order `id` most likely computes in, by what its `Hello` said (a hint: the
    /// checks try another order where this one does not match).
    pub fn order(&self, id: WorkerId) -> Option<model::Order> {
        self.workers
            .get(&id)
            .map(|w| crate::checks::verify::likely_order(w.kind, w.fused))
    }

    pub fn compression(&self, id: WorkerId) -> Option<Compression> {
        self.workers.get(&id).map(|w| w.compression)
    }

    /// The strikes against `id` so far.
    pub fn strikes(&self, id: WorkerId) -> u32 {
        self.bans.strikes(id)
    }

    /// A strike against `id` (its gradient did not match). At `--ban-after` strikes the
    /// worker is banned, by identity and by address. Returns the strikes it has now, and
    /// whether that banned it (its session must then be closed).
    pub fn strike(&mut self, id: WorkerId) -> (u32, bool) {
        let (strikes, ban) = self.bans.strike(id);
        self.trust.struck(id);
        let banned = ban && self.ban(id);
        self.changed = true;
        (strikes, banned)
    }

    /// A session from `peer` was closed for bad input; at `--ban-after` such sessions the
    /// address is banned (never loopback).
    pub fn strike_address(&mut self, peer: IpAddr) {
        if self.bans.strike_address(peer) {
            warn!(%peer, "address banned after repeated bad input");
        }
    }

    /// Whether `id` is banned.
    pub fn is_banned(&self, id: WorkerId) -> bool {
        self.bans.is_banned(id)
    }

    /// Bans `id` for the run (and its address, unless loopback). Returns whether it was not
    /// banned already: its session must then be closed.
    pub fn ban(&mut self, id: WorkerId) -> bool {
        let worker = self.workers.get(&id);
        if !self.bans.ban(id, worker.map(|w| w.peer)) {
            return false;
        }
        if let Some(w) = worker {
            warn!(worker = %id, peer = %w.peer, "worker banned");
        }
        self.changed = true;
        true
    }

    /// Gradients accepted from `id` in all its sessions (0 if unknown).
    pub fn accepted(&self, id: WorkerId) -> u64 {
        match self.workers.get(&id) {
            Some(w) => w.tally.accepted,
            None => self.identities.gradients(id).unwrap_or(0),
        }
    }

    /// Whether every answer of `id` is recomputed before it counts (`--probation`).
    pub fn on_probation(&self, id: WorkerId) -> bool {
        self.trust.on_probation(id)
    }

    /// The share of `id`'s answers to recompute, at least `floor` (`trust.rs`).
    pub fn check_rate(&self, id: WorkerId, floor: f64) -> f64 {
        self.trust.rate(id, floor)
    }

    /// Every ban so far.
    pub fn bans(&self) -> &[Banned] {
        self.bans.list()
    }

    /// A phase of `id`'s, `steps` long, matched its replay but was excused from its round
    /// (`checks/machine.rs`): its steps count towards the end of probation all the same.
    pub fn vouch(&mut self, id: WorkerId, steps: u32) {
        self.trust.accepted(id, u64::from(steps));
    }

    /// Something happened to one of `id`'s gradients.
    pub fn note(&mut self, id: WorkerId, note: Note) {
        if note == Note::Accepted {
            // A local phase's answer is its steps' worth of work (and of trust).
            let steps = self
                .workers
                .get(&id)
                .and_then(|w| w.pull.as_ref()?.local)
                .map_or(1, |l| l.steps);
            self.trust.accepted(id, u64::from(steps));
        }
        if let Some(w) = self.workers.get_mut(&id) {
            w.tally.note(note);
            // Rejections show at once; counts at the next round (see `changed`).
            self.changed |= matches!(note, Note::Rejected(_));
        }
    }

    /// Frames of `bytes` were queued to a worker.
    pub fn sent_bytes(&mut self, bytes: usize) {
        self.bytes_out += bytes as u64;
    }

    /// Marks `id` for removal at the next settle.
    pub fn drop_worker(&mut self, id: WorkerId) {
        self.dropped.push(id);
    }

    /// The next worker marked for removal.
    pub fn next_dropped(&mut self) -> Option<WorkerId> {
        self.dropped.pop()
    }

    pub fn has_dropped(&self) -> bool {
        !self.dropped.is_empty()
    }

    /// Removes a worker; its identity keeps its gradient count for a later resume.
    /// Returns whether it was connected.
    pub fn remove(&mut self, id: WorkerId, now: Instant) -> bool {
        let Some(w) = self.workers.remove(&id) else {
            return false;
        };
        info!(
            worker = %id,
            workers = self.workers.len(),
            accepted = w.tally.accepted,
            clipped = w.tally.clipped,
            verified = w.tally.verified,
            strikes = self.bans.strikes(id),
            rejected = ?w.tally.rejected,
            "worker left"
        );
        self.identities.left(id, w.tally.accepted, now);
        self.changed = true;
        true
    }

    /// The published list is out of date.
    pub fn mark_changed(&mut self) {
        self.changed = true;
    }

    /// Whether the list changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }
}

#[cfg(test)]
mod tests;

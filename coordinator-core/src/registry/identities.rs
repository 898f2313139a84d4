//! Who a worker is across connections: its id, and the resume token that proves it.
//!
//! A token is `<worker id>.<secret>`, the secret 128 bits from the operating system's CSPRNG,
//! so one token says nothing about another. The id only finds the entry; the secret is
//! compared in constant time. Identities of workers that left expire after [`IDENTITY_TTL`],
//! and at most `capacity` are kept: the oldest departed ones go first. Connected workers'
//! identities are never evicted.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use protocol::WorkerId;
use subtle::ConstantTimeEq;

/// How long a departed worker can come back as itself.
pub const IDENTITY_TTL: Duration = Duration::from_secs(6 * 3600);

const SECRET_BYTES: usize = 16;

#[derive(Debug, Clone)]
struct Identity {
    secret: [u8; SECRET_BYTES],
    /// Accepted gradients, kept for when it comes back.
    gradients: u64,
    /// When it left; `None` while connected.
    left_at: Option<Instant>,
}

#[derive(Debug)]
pub struct Identities {
    map: HashMap<WorkerId, Identity>,
    /// Departures, oldest first (an entry is stale if the identity came back since).
    departed: VecDeque<(Instant, WorkerId)>,
    capacity: usize,
}

/// The operating system's random source failed: no token can be issued safely.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the operating system's random source failed: {0}")]
pub struct NoRandomness(String);

impl Identities {
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            departed: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Issues a new identity for `id`, connected, and returns its token.
    pub fn issue(&mut self, id: WorkerId, now: Instant) -> Result<String, NoRandomness> {
        self.prune(now);
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::fill(&mut secret).map_err(|e| NoRandomness(e.to_string()))?;
        self.map.insert(
            id,
            Identity {
                secret,
                gradients: 0,
                left_at: None,
            },
        );
        Ok(token(id, &secret))
    }

    /// The identity `token` proves, marked connected again, with its gradient count. A
    /// malformed, unknown, expired or wrong token proves nothing.
    pub fn resume(&mut self, token: &str, now: Instant) -> Option<(WorkerId, u64)> {
        let (id, secret) = parse(token)?;
        let identity = self.map.get_mut(&id)?;
        if !bool::from(identity.secret.ct_eq(&secret)) {
            return None;
        }
        if identity
            .left_at
            .is_some_and(|left| now.saturating_duration_since(left) > IDENTITY_TTL)
        {
            return None;
        }
        identity.left_at = None;
        Some((id, identity.gradients))
    }

    /// Accepted gradients of `id` as of its last departure.
    pub fn gradients(&self, id: WorkerId) -> Option<u64> {
        self.map.get(&id).map(|i| i.gradients)
    }

    /// `id` disconnected having `gradients` accepted in all.
    pub fn left(&mut self, id: WorkerId, gradients: u64, now: Instant) {
        if let Some(identity) = self.map.get_mut(&id) {
            identity.gradients = gradients;
            identity.left_at = Some(now);
            self.departed.push_back((now, id));
        }
    }

    /// Every identity as its token and accepted gradients (for a checkpoint). `connected`
    /// gives the live count of a connected worker, whose identity only learns it on leaving.
    pub fn saved(&self, connected: impl Fn(WorkerId) -> Option<u64>) -> Vec<(String, u64)> {
        let mut saved: Vec<(String, u64)> = self
            .map
            .iter()
            .map(|(&id, i)| (token(id, &i.secret), connected(id).unwrap_or(i.gradients)))
            .collect();
        saved.sort();
        saved
    }

    /// Takes back a checkpoint's identities, all departed at `now` (their TTL starts again).
    /// Malformed tokens are skipped and counted.
    pub fn restore(&mut self, saved: &[(String, u64)], now: Instant) -> usize {
        let mut malformed = 0;
        for (token, gradients) in saved {
            let Some((id, secret)) = parse(token) else {
                malformed += 1;
                continue;
            };
            self.map.insert(
                id,
                Identity {
                    secret,
                    gradients: *gradients,
                    left_at: Some(now),
                },
            );
            self.departed.push_back((now, id));
        }
        self.prune(now);
        malformed
    }

    /// Drops departed identities past their TTL, and the oldest departed ones while over
    /// capacity.
    fn prune(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.departed.front() {
            let expired = now.saturating_duration_since(at) > IDENTITY_TTL;
            if !expired && self.map.len() < self.capacity {
                break;
            }
            self.departed.pop_front();
            // Stale if it came back (connected) or left again later (a newer entry).
            if self.map.get(&id).is_some_and(|i| i.left_at == Some(at)) {
                self.map.remove(&id);
            }
        }
    }
}

fn token(id: WorkerId, secret: &[u8; SECRET_BYTES]) -> String {
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}.{hex}", id.0)
}

fn parse(token: &str) -> Option<(WorkerId, [u8; SECRET_BYTES])> {
    let (id, hex) = token.split_once('.')?;
    let id = WorkerId(id.parse().ok()?);
    if hex.len() != SECRET_BYTES * 2 || !hex.is_ascii() {
        return None;
    }
    let mut secret = [0u8; SECRET_BYTES];
    for (i, byte) in secret.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some((id, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_proves_its_identity_and_nothing_else() {
        let now = Instant::now();
        let mut ids = Identities::new(10);
        let a = ids.issue(WorkerId(1), now).expect("random");
        let b = ids.issue(WorkerId(2), now).expect("random");
        assert_eq!(a.len(), "1.".len() + 32, "{a}");
        assert_ne!(a[2..], b[2..], "independent secrets");
        ids.left(WorkerId(1), 5, now);
        assert_eq!(ids.resume(&a, now), Some((WorkerId(1), 5)));
        // Another worker's id with a secret that is not its own; garbage; wrong lengths.
        let forged = format!("2.{}", &a[2..]);
        for bad in [
            forged.as_str(),
            "",
            "1.",
            "x.00",
            "1.zz",
            &a[..a.len() - 1],
            "99.00000000000000000000000000000000",
        ] {
            assert_eq!(ids.resume(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn saved_identities_resume_after_a_restore() {
        let now = Instant::now();
        let mut ids = Identities::new(10);
        let a = ids.issue(WorkerId(1), now).expect("random");
        let b = ids.issue(WorkerId(7), now).expect("random");
        ids.left(WorkerId(7), 3, now);
        let saved = ids.saved(|id| (id == WorkerId(1)).then_some(9));
        assert_eq!(saved, vec![(a.clone(), 9), (b.clone(), 3)]);
        let mut back = Identities::new(10);
        let bad = ("7.nothex".to_string(), 0);
        assert_eq!(
            back.restore(&[saved[0].clone(), saved[1].clone(), bad], now),
            1
        );
        assert_eq!(back.resume(&a, now), Some((WorkerId(1), 9)));
        assert_eq!(back.resume(&b, now), Some((WorkerId(7), 3)));
        let forged = format!("1.{}", &b[2..]);
        assert_eq!(back.resume(&forged, now), None);
    }

    #[test]
    fn departed_identities_expire_and_are_bounded() {
        let t0 = Instant::now();
        let mut ids = Identities::new(3);
        let a = ids.issue(WorkerId(1), t0).expect("random");
        ids.left(WorkerId(1), 0, t0);
        let later = t0 + IDENTITY_TTL + Duration::from_secs(1);
        assert_eq!(ids.resume(&a, later), None, "expired");
        // Capacity: the oldest departed identity goes first; connected ones stay.
        let mut ids = Identities::new(3);
        let tokens: Vec<String> = (1..=3)
            .map(|i| ids.issue(WorkerId(i), t0).expect("random"))
            .collect();
        ids.left(WorkerId(1), 0, t0);
        ids.left(WorkerId(2), 0, t0 + Duration::from_secs(1));
        ids.issue(WorkerId(4), t0 + Duration::from_secs(2))
            .expect("random");
        assert_eq!(ids.len(), 3);
        assert_eq!(
            ids.resume(&tokens[0], t0),
            None,
            "evicted: the oldest departed"
        );
        assert!(ids.resume(&tokens[1], t0).is_some());
        assert!(ids.resume(&tokens[2], t0).is_some(), "connected: kept");
        // 2,000 visitors who never come back leave at most `capacity` identities behind.
        let mut ids = Identities::new(100);
        for i in 0..2000 {
            ids.issue(WorkerId(i), t0).expect("random");
            ids.left(WorkerId(i), 0, t0);
        }
        assert!(ids.len() <= 100, "{}", ids.len());
    }
}

//! Strikes and bans: who has misbehaved how often, and who may not come back this run.
//!
//! A worker gets a strike for each gradient that failed verification; an address, for each
//! session closed for bad input. At `--ban-after` the worker is banned by identity and by
//! the address it connected from, or the address alone. Loopback is never banned by address:
//! it is the operator's own machine (and every test's).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use protocol::WorkerId;

/// What a checkpoint keeps of the bans, so a banned worker or address stays out across a
/// restart, and strikes count on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedBans {
    pub workers: Vec<u32>,
    pub addresses: Vec<IpAddr>,
    /// (worker id, strikes).
    pub strikes: Vec<(u32, u32)>,
    pub address_strikes: Vec<(IpAddr, u32)>,
    /// (worker id, answers accepted since it was issued or last struck): how much trust
    /// each identity has earned (`trust.rs`; filled in by the registry).
    pub trusted: Vec<(u32, u64)>,
}

/// One ban, for the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Banned {
    Worker(WorkerId),
    Address(IpAddr),
}

impl std::fmt::Display for Banned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Worker(id) => write!(f, "{id}"),
            Self::Address(ip) => write!(f, "address {ip}"),
        }
    }
}

#[derive(Debug)]
pub struct Bans {
    after: u32,
    strikes: HashMap<WorkerId, u32>,
    address_strikes: HashMap<IpAddr, u32>,
    workers: HashSet<WorkerId>,
    addresses: HashSet<IpAddr>,
    /// Every ban, in order.
    list: Vec<Banned>,
}

impl Bans {
    pub fn new(after: u32) -> Self {
        Self {
            after: after.max(1),
            strikes: HashMap::new(),
            address_strikes: HashMap::new(),
            workers: HashSet::new(),
            addresses: HashSet::new(),
            list: Vec::new(),
        }
    }

    pub fn is_banned(&self, id: WorkerId) -> bool {
        self.workers.contains(&id)
    }

    pub fn is_address_banned(&self, ip: IpAddr) -> bool {
        self.addresses.contains(&ip)
    }

    pub fn strikes(&self, id: WorkerId) -> u32 {
        self.strikes.get(&id).copied().unwrap_or(0)
    }

    /// A strike against `id`; returns its strikes and whether that earned a ban.
    pub fn strike(&mut self, id: WorkerId) -> (u32, bool) {
        let strikes = self.strikes.entry(id).or_insert(0);
        *strikes += 1;
        (*strikes, *strikes >= self.after)
    }

    /// A session from `ip` was closed for bad input; returns whether the address is now
    /// banned.
    pub fn strike_address(&mut self, ip: IpAddr) -> bool {
        if ip.is_loopback() || self.addresses.contains(&ip) {
            return false;
        }
        let strikes = self.address_strikes.entry(ip).or_insert(0);
        *strikes += 1;
        if *strikes < self.after {
            return false;
        }
        self.addresses.insert(ip);
        self.list.push(Banned::Address(ip));
        true
    }

    /// Bans `id` and, unless loopback, `ip`. Returns false if it already was.
    pub fn ban(&mut self, id: WorkerId, ip: Option<IpAddr>) -> bool {
        if !self.workers.insert(id) {
            return false;
        }
        self.list.push(Banned::Worker(id));
        if let Some(ip) = ip.filter(|ip| !ip.is_loopback()) {
            if self.addresses.insert(ip) {
                self.list.push(Banned::Address(ip));
            }
        }
        true
    }

    pub fn list(&self) -> &[Banned] {
        &self.list
    }

    pub fn saved(&self) -> SavedBans {
        let mut saved = SavedBans {
            workers: self.workers.iter().map(|id| id.0).collect(),
            addresses: self.addresses.iter().copied().collect(),
            strikes: self.strikes.iter().map(|(id, &n)| (id.0, n)).collect(),
            address_strikes: self
                .address_strikes
                .iter()
                .map(|(&ip, &n)| (ip, n))
                .collect(),
            trusted: Vec::new(),
        };
        saved.workers.sort_unstable();
        saved.addresses.sort_unstable();
        saved.strikes.sort_unstable();
        saved.address_strikes.sort_unstable();
        saved
    }

    /// Adds a checkpoint's bans and strikes to these.
    pub fn restore(&mut self, saved: &SavedBans) {
        for &id in &saved.workers {
            if self.workers.insert(WorkerId(id)) {
                self.list.push(Banned::Worker(WorkerId(id)));
            }
        }
        for &ip in &saved.addresses {
            if self.addresses.insert(ip) {
                self.list.push(Banned::Address(ip));
            }
        }
        for &(id, n) in &saved.strikes {
            self.strikes.insert(WorkerId(id), n);
        }
        self.address_strikes
            .extend(saved.address_strikes.iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bans_and_strikes_survive_a_save_and_restore() {
        let mut bans = Bans::new(2);
        let ip: IpAddr = "203.0.113.7".parse().expect("ip");
        bans.strike(WorkerId(4));
        assert!(bans.ban(WorkerId(9), Some(ip)));
        bans.strike_address("198.51.100.1".parse().expect("ip"));
        let saved = bans.saved();
        let mut back = Bans::new(2);
        back.restore(&saved);
        assert!(back.is_banned(WorkerId(9)) && back.is_address_banned(ip));
        assert_eq!(back.strikes(WorkerId(4)), 1);
        assert_eq!(back.list(), bans.list());
        let (strikes, ban) = back.strike(WorkerId(4));
        assert_eq!((strikes, ban), (2, true), "strikes count on");
        assert!(
            back.strike_address("198.51.100.1".parse().expect("ip")),
            "so do addresses'"
        );
    }
}

//! New identities cost something: how many an address, and the network around it, may be
//! issued per hour (`--new-identities-per-address`, `--new-identities-per-network`).
//!
//! Each is a token bucket that holds an hour's allowance and refills evenly over the hour, so
//! a household's tabs, or a lab's, join at once, while a stranger who is banned and comes
//! back under fresh identities soon waits. An address is what the server's admission counts (an
//! IPv4 address; an IPv6 address as its /64, one subscriber's usual share), and a network is
//! an IPv4 /24 or an IPv6 /48 (the most one site is usually delegated): an attacker who holds
//! a whole prefix gets one network's allowance, not one per address in it. A worker resuming with its token is not a
//! new identity, and loopback (the operator's own machine, every test's) is not limited.
//!
//! Memory: at most [`MAX_BUCKETS`] buckets; when full, buckets that have refilled are
//! forgotten (they say nothing), and if none has, the address is refused until one does:
//! an attacker with very many networks cannot grow the map, only wait.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Buckets kept at most (addresses and networks together).
pub const MAX_BUCKETS: usize = 100_000;

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Identities still allowed, fractional while refilling.
    tokens: f64,
    at: Instant,
}

/// The allowance per hour of one kind of key.
#[derive(Debug)]
struct Buckets {
    per_hour: u32,
    map: HashMap<IpAddr, Bucket>,
}

impl Buckets {
    fn new(per_hour: u32) -> Self {
        Self {
            per_hour,
            map: HashMap::new(),
        }
    }

    fn tokens(&self, key: IpAddr, now: Instant) -> f64 {
        let full = f64::from(self.per_hour);
        self.map.get(&key).map_or(full, |b| {
            let refill = now.saturating_duration_since(b.at).as_secs_f64() / HOUR.as_secs_f64();
            (b.tokens + refill * full).min(full)
        })
    }

    /// How long until `key` has a whole token.
    fn wait(&self, key: IpAddr, now: Instant) -> Option<Duration> {
        let tokens = self.tokens(key, now);
        (tokens < 1.0).then(|| {
            let per_second = f64::from(self.per_hour.max(1)) / HOUR.as_secs_f64();
            Duration::from_secs_f64((1.0 - tokens) / per_second)
        })
    }

    fn take(&mut self, key: IpAddr, now: Instant) {
        let tokens = self.tokens(key, now) - 1.0;
        self.map.insert(key, Bucket { tokens, at: now });
    }

    /// Forgets buckets that are full again.
    fn prune(&mut self, now: Instant) {
        let full = f64::from(self.per_hour);
        let stale: Vec<IpAddr> = self
            .map
            .keys()
            .copied()
            .filter(|&k| self.tokens(k, now) >= full)
            .collect();
        for k in stale {
            self.map.remove(&k);
        }
    }
}

/// The network an address belongs to: its /24 (IPv4) or /48 (IPv6).
pub fn network(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            IpAddr::from([a, b, c, 0])
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 80) - 1);
            IpAddr::V6(bits.into())
        }
    }
}

/// Why a new identity was not issued: which allowance is spent, and when the next is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spent {
    /// The network's allowance (else the address's).
    pub network: bool,
    pub per_hour: u32,
    pub wait: Duration,
}

impl std::fmt::Display for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (whose, flag) = if self.network {
            ("your network", "--new-identities-per-network")
        } else {
            ("your address", "--new-identities-per-address")
        };
        write!(
            f,
            "{whose} was issued its {} new worker identities for this hour ({flag}); \
             the next one is due in {} s (a page reload keeps its identity, a new tab does not)",
            self.per_hour,
            self.wait.as_secs().max(1)
        )
    }
}

#[derive(Debug)]
pub struct Newcomers {
    address: Buckets,
    network: Buckets,
}

impl Newcomers {
    pub fn new(per_address: u32, per_network: u32) -> Self {
        Self {
            address: Buckets::new(per_address),
            network: Buckets::new(per_network),
        }
    }

    /// A new identity for `ip`: allowed (and counted), or why not.
    pub fn issue(&mut self, ip: IpAddr, now: Instant) -> Result<(), Spent> {
        if ip.is_loopback() {
            return Ok(());
        }
        let net = network(ip);
        if let Some(wait) = self.address.wait(ip, now) {
            let per_hour = self.address.per_hour;
            return Err(Spent {
                network: false,
                per_hour,
                wait,
            });
        }
        if let Some(wait) = self.network.wait(net, now) {
            let per_hour = self.network.per_hour;
            return Err(Spent {
                network: true,
                per_hour,
                wait,
            });
        }
        if self.address.map.len() + self.network.map.len() + 2 > MAX_BUCKETS {
            self.address.prune(now);
            self.network.prune(now);
            if self.address.map.len() + self.network.map.len() + 2 > MAX_BUCKETS {
                // Every bucket is in use: wait until one refills.
                let per_hour = self.network.per_hour;
                let wait = HOUR / per_hour.max(1);
                return Err(Spent {
                    network: true,
                    per_hour,
                    wait,
                });
            }
        }
        self.address.take(ip, now);
        self.network.take(net, now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn an_address_gets_its_allowance_at_once_then_one_as_it_refills() {
        let t0 = Instant::now();
        let mut n = Newcomers::new(3, 100);
        for _ in 0..3 {
            assert_eq!(n.issue(ip("203.0.113.9"), t0), Ok(()));
        }
        let spent = n.issue(ip("203.0.113.9"), t0).expect_err("spent");
        assert!(!spent.network);
        assert_eq!(spent.wait, Duration::from_secs(1200), "an hour / 3");
        assert!(spent.to_string().contains("--new-identities-per-address"));
        // Its neighbour is another address; loopback is never limited.
        assert_eq!(n.issue(ip("203.0.113.10"), t0), Ok(()));
        for _ in 0..10 {
            assert_eq!(n.issue(ip("127.0.0.1"), t0), Ok(()));
        }
        // Twenty minutes on, one more.
        let later = t0 + Duration::from_secs(1200);
        assert_eq!(n.issue(ip("203.0.113.9"), later), Ok(()));
        assert!(n.issue(ip("203.0.113.9"), later).is_err());
    }

    #[test]
    fn a_network_is_a_v4_24_or_a_v6_48_and_has_its_own_allowance() {
        assert_eq!(network(ip("198.51.100.77")), ip("198.51.100.0"));
        assert_eq!(
            network(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
            ip("2001:db8:1::")
        );
        let t0 = Instant::now();
        let mut n = Newcomers::new(2, 4);
        // Fresh /64s in one /48 (an attacker's whole prefix): four, then the network's
        // allowance is spent.
        for i in 1..=4 {
            assert_eq!(n.issue(ip(&format!("2001:db8:0:{i}::")), t0), Ok(()));
        }
        let spent = n
            .issue(ip("2001:db8:0:99::"), t0)
            .expect_err("network spent");
        assert!(spent.network && spent.to_string().contains("your network"));
        // Another /48 is another network; so is another /24.
        assert_eq!(n.issue(ip("2001:db8:1::"), t0), Ok(()));
        for i in 1..=4 {
            assert_eq!(n.issue(ip(&format!("198.51.100.{i}")), t0), Ok(()));
        }
        assert!(n.issue(ip("198.51.100.200"), t0).is_err());
        assert_eq!(n.issue(ip("198.51.101.1"), t0), Ok(()));
    }
}

//! Who may open a WebSocket at all, decided at the HTTP upgrade, before a session exists:
//! the page's origin, and how many connections one address holds.
//!
//! - **Origin.** Browsers send the page's origin with every WebSocket upgrade. By default
//!   only the coordinator's own origin (the `Host` the request was sent to) is accepted, so
//!   another site cannot make its visitors' tabs join; `--allowed-origin` adds origins, `*`
//!   accepts any. Native workers send no `Origin` and are not affected.
//! - **Connections per address.** At most `--max-per-ip` sockets from one IP at once. A
//!   guard counts a connection from its upgrade to the end of its session.
//! - **What an address is.** An IPv4 address; for IPv6, its /64 network ([`address_of`]):
//!   one subscriber usually gets a whole /64, so counting single IPv6 addresses would give
//!   one client 2^64 of them. Every per-address rule uses this: connections, upload slots,
//!   strikes and bans.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use axum::http::{header, HeaderMap, StatusCode};

/// Which page origins may open a WebSocket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origins {
    /// Only the coordinator's own origin, plus these (`scheme://host[:port]`).
    Own(Vec<String>),
    /// Any origin (`--allowed-origin '*'`).
    Any,
}

/// The address a peer counts as: an IPv4 address (also when it arrives IPv4-mapped on a
/// dual-stack socket), IPv6 loopback as itself, any other IPv6 address as its /64 network.
pub fn address_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            if v6.is_loopback() {
                return ip;
            }
            let network = u128::from(v6) & !u128::from(u64::MAX);
            IpAddr::V6(Ipv6Addr::from(network))
        }
    }
}

/// An address as [`address_of`] gave it, for messages: an IPv6 network with its `/64`.
fn shown(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) if !v6.is_loopback() => format!("{v6}/64"),
        _ => ip.to_string(),
    }
}

/// A refused upgrade: the HTTP status and the sentence the client reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: StatusCode,
    pub message: String,
}

/// Edge pages whose tabs an edge accepts, at most.
const MAX_PEER_ORIGINS: usize = 4096;

#[derive(Debug)]
pub struct Admission {
    origins: Origins,
    /// `--role edge`: the pages of the run's edges (their origins, from the leases), whose
    /// tabs move here when their own edge dies. Only added to: a tab whose edge died still
    /// comes from that edge's page.
    peers: std::sync::RwLock<std::collections::BTreeSet<String>>,
    max_per_ip: usize,
    /// Open connections per address. A std mutex: held for a map update, never across an
    /// await, and touched once per connect and disconnect.
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// Counts one connection until dropped.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .admission
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

impl Admission {
    pub fn new(origins: Origins, max_per_ip: usize) -> Self {
        Self {
            origins,
            peers: std::sync::RwLock::default(),
            max_per_ip,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Checks an upgrade's origin and takes a slot for its address.
    pub fn admit(self: &Arc<Self>, headers: &HeaderMap, ip: IpAddr) -> Result<Slot, Refused> {
        self.check_origin(headers)?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        self.check_count(*n, ip)?;
        *n += 1;
        Ok(Slot {
            admission: Arc::clone(self),
            ip,
        })
    }

    /// What [`Admission::admit`] would answer now, taking nothing: for a page whose socket
    /// was refused, which a browser does not say why (`/api/join-check`).
    pub fn check(&self, headers: &HeaderMap, ip: IpAddr) -> Result<(), Refused> {
        self.check_origin(headers)?;
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        self.check_count(open.get(&ip).copied().unwrap_or(0), ip)
    }

    fn check_count(&self, open: usize, ip: IpAddr) -> Result<(), Refused> {
        if open < self.max_per_ip {
            return Ok(());
        }
        Err(Refused {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "{} already has {} connections open (--max-per-ip {})",
                shown(ip),
                open,
                self.max_per_ip
            ),
        })
    }

    /// Connections open from `ip`.
    #[cfg(test)]
    pub fn open_from(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&ip).copied().unwrap_or(0)
    }

    /// `--role edge`: accept tabs from these edges' pages too (`scheme://host[:port]`).
    pub fn add_peer_origins(&self, origins: impl IntoIterator<Item = String>) {
        let mut peers = self.peers.write().unwrap_or_else(|e| e.into_inner());
        for origin in origins {
            // At most a run's edges; a bound all the same.
            if peers.len() < MAX_PEER_ORIGINS {
                peers.insert(origin);
            }
        }
    }

    fn check_origin(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(()); // not a browser
        };
        let origin = origin.to_str().unwrap_or("").trim_end_matches('/');
        let allowed = match &self.origins {
            Origins::Any => true,
            Origins::Own(extra) => {
                let host = headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("");
                let own = origin.split_once("://").is_some_and(|(scheme, rest)| {
                    matches!(scheme, "http" | "https") && !host.is_empty() && rest == host
                });
                let peer = || {
                    let peers = self.peers.read().unwrap_or_else(|e| e.into_inner());
                    peers.contains(origin)
                };
                own || extra.iter().any(|o| o.trim_end_matches('/') == origin) || peer()
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(Refused {
                status: StatusCode::FORBIDDEN,
                message: format!(
                    "WebSocket from a page at {origin:?} refused: this coordinator accepts its own page (add origins with --allowed-origin)"
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(origin: Option<&str>, host: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_str(host).expect("ascii"));
        if let Some(o) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(o).expect("ascii"));
        }
        h
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn a_peer_edges_page_is_accepted_once_known() {
        let a = Arc::new(Admission::new(Origins::Own(Vec::new()), 100));
        let h = headers(Some("http://10.0.0.7:8081"), "10.0.0.5:8080");
        assert!(a.admit(&h, IP).is_err(), "unknown: refused");
        a.add_peer_origins(["http://10.0.0.7:8081".to_string()]);
        assert!(a.admit(&h, IP).is_ok(), "another edge's page");
    }

    #[test]
    fn the_own_origin_and_listed_ones_pass_others_are_refused() {
        let a = Arc::new(Admission::new(
            Origins::Own(vec!["https://volunteers.example.org".into()]),
            100,
        ));
        let host = "10.0.0.5:8080";
        for ok in [
            None,
            Some("http://10.0.0.5:8080"),
            Some("https://10.0.0.5:8080/"),
            Some("https://volunteers.example.org"),
        ] {
            assert!(a.admit(&headers(ok, host), IP).is_ok(), "{ok:?}");
        }
        for bad in [
            "http://evil.example",
            "http://10.0.0.5:9999",
            "null",
            "file://10.0.0.5:8080",
        ] {
            let refused = a.admit(&headers(Some(bad), host), IP).expect_err(bad);
            assert_eq!(refused.status, StatusCode::FORBIDDEN);
            assert!(
                refused.message.contains("--allowed-origin"),
                "{}",
                refused.message
            );
        }
        let any = Arc::new(Admission::new(Origins::Any, 100));
        assert!(any
            .admit(&headers(Some("http://evil.example"), host), IP)
            .is_ok());
    }

    #[test]
    fn connections_per_address_are_capped_and_released_on_drop() {
        let a = Arc::new(Admission::new(Origins::Any, 2));
        let h = headers(None, "x");
        let first = a.admit(&h, IP).expect("1");
        let _second = a.admit(&h, IP).expect("2");
        let refused = a.admit(&h, IP).expect_err("3");
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        let other: IpAddr = "192.0.2.1".parse().expect("ip");
        assert!(
            a.admit(&h, other).is_ok(),
            "another address has its own count"
        );
        drop(first);
        assert_eq!(a.open_from(IP), 1);
        assert!(a.admit(&h, IP).is_ok());
    }

    #[test]
    fn an_ipv6_address_counts_as_its_64_and_ipv4_as_itself() {
        let ip = |s: &str| s.parse::<IpAddr>().expect(s);
        assert_eq!(address_of(ip("203.0.113.7")), ip("203.0.113.7"));
        assert_eq!(address_of(ip("::ffff:203.0.113.7")), ip("203.0.113.7"));
        assert_eq!(
            address_of(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
            ip("2001:db8:1:2::")
        );
        assert_eq!(
            address_of(ip("2001:db8:1:2::1")),
            address_of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            address_of(ip("2001:db8:1:2::1")),
            address_of(ip("2001:db8:1:3::1"))
        );
        // Loopback stays loopback (never banned).
        assert_eq!(address_of(ip("::1")), ip("::1"));
        assert!(address_of(ip("::1")).is_loopback());
        // A refusal names the network.
        let a = Arc::new(Admission::new(Origins::Any, 1));
        let net = address_of(ip("2001:db8:1:2::1"));
        let _held = a.admit(&headers(None, "x"), net).expect("first");
        let refused = a.admit(&headers(None, "x"), net).expect_err("second");
        assert!(
            refused
                .message
                .starts_with("2001:db8:1:2::/64 already has 1 connections open"),
            "{}",
            refused.message
        );
    }
}

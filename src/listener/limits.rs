//! How many connections the service holds open: in all, and per peer.
//!
//! Every open connection costs a file descriptor and some memory. Without a cap, one client
//! that opens sockets until the process runs out of descriptors locks every other client out
//! until it lets go. The overall cap keeps the process below its descriptor limit (with room
//! for the database, logs and files); the per-peer cap keeps one address from taking the
//! whole of it. A trusted proxy (`LEASEGATE_TRUSTED_PROXIES`) carries many clients on few
//! connections' addresses, so only the overall cap applies to it. IPv6 peers are counted by
//! their /64, which one host usually holds whole.
//!
//! The forge gate counts its forwarded requests with a `ConnectionLimits` of its own
//! (`forge_gate/connections.rs`), saying itself whether a peer is a trusted proxy (`admit_as`).

use ipnet::IpNet;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

/// The caps; see `ServeArgs::connection_settings` for the defaults.
#[derive(Clone, Debug)]
pub struct ConnectionCaps {
    pub max_total: usize,
    pub max_per_peer: usize,
}

/// Why a connection was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The service holds as many connections as it may.
    Total,
    /// This peer holds as many connections as one peer may.
    Peer,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Total => "limit_total",
            Refused::Peer => "limit_peer",
        }
    }
}

/// The open connections, counted. Cheap to clone.
#[derive(Clone)]
pub struct ConnectionLimits {
    inner: Arc<Inner>,
}

struct Inner {
    caps: ConnectionCaps,
    trusted: Vec<IpNet>,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// One admitted connection; dropping it frees its place.
pub struct Permit {
    limits: ConnectionLimits,
    peer: Option<IpAddr>,
}

/// The address a peer's connections are counted under.
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl ConnectionLimits {
    pub fn new(caps: ConnectionCaps, trusted: Vec<IpNet>) -> Self {
        ConnectionLimits {
            inner: Arc::new(Inner {
                caps,
                trusted,
                open: Mutex::default(),
            }),
        }
    }

    /// A place for a connection from `peer`, or why there is none.
    pub fn admit(&self, peer: IpAddr) -> Result<Permit, Refused> {
        let trusted = self.inner.trusted.iter().any(|net| net.contains(&peer));
        self.admit_as(peer, trusted)
    }

    /// A place for `peer`, which the caller already knows to be a trusted proxy (held to the
    /// overall cap only) or not.
    pub fn admit_as(&self, peer: IpAddr, trusted: bool) -> Result<Permit, Refused> {
        let counted = !trusted;
        let key = peer_key(peer);
        let mut open = self.inner.open.lock().expect("connection counts");
        if open.total >= self.inner.caps.max_total {
            return Err(Refused::Total);
        }
        if counted {
            let n = open.by_peer.entry(key).or_insert(0);
            if *n >= self.inner.caps.max_per_peer {
                return Err(Refused::Peer);
            }
            *n += 1;
        }
        open.total += 1;
        Ok(Permit {
            limits: self.clone(),
            peer: counted.then_some(key),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner.open.lock().expect("connection counts").total
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut open = self.limits.inner.open.lock().expect("connection counts");
        open.total -= 1;
        if let Some(peer) = self.peer
            && let Some(n) = open.by_peer.get_mut(&peer)
        {
            *n -= 1;
            if *n == 0 {
                open.by_peer.remove(&peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_peer: usize, trusted: &[&str]) -> ConnectionLimits {
        ConnectionLimits::new(
            ConnectionCaps {
                max_total: total,
                max_per_peer: per_peer,
            },
            trusted.iter().map(|t| t.parse().unwrap()).collect(),
        )
    }

    #[test]
    fn one_peer_cannot_take_every_place() {
        let l = limits(10, 3, &[]);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let held: Vec<Permit> = (0..3).map(|_| l.admit(a).unwrap()).collect();
        assert_eq!(l.admit(a).err(), Some(Refused::Peer));
        let other = l.admit(b).unwrap();
        drop(held);
        assert!(l.admit(a).is_ok());
        drop(other);
        assert_eq!(l.open(), 0);
    }

    #[test]
    fn the_total_cap_holds_for_trusted_proxies_too() {
        let l = limits(4, 1, &["10.1.0.0/16"]);
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        let held: Vec<Permit> = (0..4).map(|_| l.admit(proxy).unwrap()).collect();
        assert_eq!(l.admit(proxy).err(), Some(Refused::Total));
        assert_eq!(
            l.admit("10.9.9.9".parse().unwrap()).err(),
            Some(Refused::Total)
        );
        drop(held);
    }

    #[test]
    fn ipv6_peers_count_by_their_64() {
        let l = limits(10, 2, &[]);
        let _a = l.admit("2001:db8::1".parse().unwrap()).unwrap();
        let _b = l.admit("2001:db8::ffff:2".parse().unwrap()).unwrap();
        assert_eq!(
            l.admit("2001:db8::3".parse().unwrap()).err(),
            Some(Refused::Peer)
        );
        assert!(l.admit("2001:db8:0:1::1".parse().unwrap()).is_ok());
    }
}

//! Throttling credential guessing: failed credential checks are counted per client, and a
//! client past its allowance is answered 429 before any credential of its is checked.
//!
//! Each client has a bucket of `limit` failures that refills at `limit` per `window`. A failure
//! takes one; an empty bucket means 429 with `Retry-After` until one is back. Only failures
//! count, and only the client's own: another client's guessing never slows a correct
//! credential. The buckets live in memory, per replica; clients are keyed by address (an IPv6
//! /64), and a full table forgets the buckets that have refilled, so guessing from many
//! addresses cannot grow it without bound.

use crate::domain::time::Millis;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;

/// The most clients tracked at once.
const MAX_TRACKED: usize = 100_000;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Failures still allowed (fractional while refilling).
    left: f64,
    at: Millis,
}

pub struct AuthThrottle {
    limit: f64,
    /// Failures forgiven per millisecond.
    refill_per_ms: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        IpAddr::V6(v6) => IpAddr::V4(v6.to_ipv4_mapped().expect("checked")),
        v4 => v4,
    }
}

impl AuthThrottle {
    pub fn new(limit: u32, window_s: u64) -> Self {
        let limit = f64::from(limit.max(1));
        AuthThrottle {
            limit,
            refill_per_ms: limit / (window_s.max(1) as f64 * 1000.0),
            buckets: Mutex::default(),
        }
    }

    fn refilled(&self, b: Bucket, now: Millis) -> Bucket {
        let elapsed = (now.0 - b.at.0).max(0) as f64;
        Bucket {
            left: (b.left + elapsed * self.refill_per_ms).min(self.limit),
            at: now,
        }
    }

    /// `Some(seconds)` to wait when `client` has no failures left; `None` when it may try.
    pub fn blocked(&self, client: IpAddr, now: Millis) -> Option<i64> {
        let buckets = self.buckets.lock().expect("throttle");
        let b = self.refilled(*buckets.get(&key(client))?, now);
        (b.left < 1.0).then(|| ((1.0 - b.left) / self.refill_per_ms / 1000.0).ceil() as i64)
    }

    /// Counts a failed credential check by `client`; `true` when it used the client's last
    /// allowed failure (so that the moment is logged once, not every refused guess).
    pub fn failed(&self, client: IpAddr, now: Millis) -> bool {
        let mut buckets = self.buckets.lock().expect("throttle");
        if buckets.len() >= MAX_TRACKED && !buckets.contains_key(&key(client)) {
            buckets.retain(|_, b| self.refilled(*b, now).left < self.limit);
            if buckets.len() >= MAX_TRACKED {
                return false;
            }
        }
        let fresh = Bucket {
            left: self.limit,
            at: now,
        };
        let b = buckets.entry(key(client)).or_insert(fresh);
        let mut refilled = self.refilled(*b, now);
        let had = refilled.left >= 1.0;
        refilled.left = (refilled.left - 1.0).max(0.0);
        *b = refilled;
        had && refilled.left < 1.0
    }

    pub fn tracked(&self) -> usize {
        self.buckets.lock().expect("throttle").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    #[test]
    fn a_burst_of_failures_blocks_the_client_until_one_is_forgiven() {
        let t = AuthThrottle::new(5, 60);
        let now = Millis(1_000_000);
        for i in 0..5 {
            assert_eq!(t.blocked(A, now), None);
            assert_eq!(
                t.failed(A, now),
                i == 4,
                "the fifth failure is the last allowed"
            );
        }
        // One failure is forgiven every 12 s.
        assert_eq!(t.blocked(A, now), Some(12));
        assert_eq!(t.blocked(A, now.plus_secs(6)), Some(6));
        assert_eq!(t.blocked(A, now.plus_secs(12)), None);
        // Another client is untouched.
        assert_eq!(t.blocked(B, now), None);
    }

    #[test]
    fn a_full_table_forgets_clients_whose_allowance_came_back() {
        let t = AuthThrottle::new(5, 60);
        let now = Millis(0);
        for i in 0..MAX_TRACKED as u32 {
            t.failed(IpAddr::V4(i.into()), now);
        }
        assert_eq!(t.tracked(), MAX_TRACKED);
        // A minute on, every bucket has refilled: a new client makes room.
        t.failed(A, now.plus_secs(60));
        assert_eq!(t.tracked(), 1);
    }

    #[test]
    fn ipv6_clients_share_their_64() {
        let t = AuthThrottle::new(1, 60);
        let now = Millis(0);
        t.failed("2001:db8::1".parse().unwrap(), now);
        assert!(t.blocked("2001:db8::2".parse().unwrap(), now).is_some());
        assert!(t.blocked("2001:db8:0:1::2".parse().unwrap(), now).is_none());
    }
}

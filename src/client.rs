//! Who is asking: the client's address and whether it came over TLS, as far as the service
//! can believe them.
//!
//! The peer of the connection is the client, unless the peer is a trusted proxy
//! (`LEASEGATE_TRUSTED_PROXIES`). Then `X-Forwarded-For` is read from the right, past every
//! trusted proxy, to the first address that is not one: anything to the left of it was written
//! by the client and proves nothing. `X-Forwarded-Proto` is believed from a trusted proxy only.
//! Nobody else's forwarding headers count, so a client cannot dodge the throttle or earn a
//! `Secure` cookie by writing them.
//!
//! The API (an extractor in `http::client`) and the forge gate both ask, so it lives beside
//! neither.

use axum::http::HeaderMap;
use ipnet::IpNet;
use std::net::IpAddr;

/// The client as the service believes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client {
    pub ip: IpAddr,
    /// The request came over TLS to a trusted proxy that said so.
    pub https: bool,
}

/// The client behind a connection from `peer` that sent `headers`.
pub fn client_of(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> Client {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return Client {
            ip: peer,
            https: false,
        };
    }
    let forwarded: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut ip = peer;
    for hop in forwarded.iter().rev() {
        let Ok(hop) = hop.parse::<IpAddr>() else {
            break;
        };
        ip = hop;
        if !is_trusted(&hop) {
            break;
        }
    }
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"));
    Client { ip, https }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn forwarding_headers_count_only_from_a_trusted_proxy() {
        let h = headers(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
        ]);
        let peer: IpAddr = "198.51.100.7".parse().unwrap();
        assert_eq!(
            client_of(peer, &h, &[]),
            Client {
                ip: peer,
                https: false
            }
        );
        let c = client_of(peer, &h, &nets(&["198.51.100.0/24"]));
        assert_eq!(c.ip, "203.0.113.9".parse::<IpAddr>().unwrap());
        assert!(c.https);
    }

    #[test]
    fn the_client_is_the_first_untrusted_hop_from_the_right() {
        // The client wrote 1.1.1.1 itself; 203.0.113.9 reached the outer proxy (10.0.0.2).
        let h = headers(&[
            ("x-forwarded-for", "1.1.1.1, 203.0.113.9"),
            ("x-forwarded-for", "10.0.0.2"),
        ]);
        let c = client_of("10.0.0.1".parse().unwrap(), &h, &nets(&["10.0.0.0/8"]));
        assert_eq!(c.ip, "203.0.113.9".parse::<IpAddr>().unwrap());
        assert!(!c.https);
    }

    #[test]
    fn a_garbled_hop_stops_the_walk() {
        let h = headers(&[("x-forwarded-for", "203.0.113.9, not-an-ip")]);
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(client_of(peer, &h, &nets(&["10.0.0.1/32"])).ip, peer);
    }
}

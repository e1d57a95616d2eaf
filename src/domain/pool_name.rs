//! A pool's name, apart from the pool: jobs, leases, GitHub registrations and the fleet's
//! tallies name the pool they belong to without needing what a pool holds (its images, its
//! policies), so the name sits below all of them and `pool` builds on it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A pool name: 1–63 characters of `a-z 0-9 - _ .`, starting with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PoolName(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "`{0}` is not a valid pool name (1-63 characters of a-z 0-9 - _ ., starting with a letter or digit)"
)]
pub struct BadPoolName(pub String);

impl PoolName {
    pub fn parse(s: &str) -> Result<Self, BadPoolName> {
        let first_ok = s
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let all_ok = s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        });
        if first_ok && all_ok && s.len() <= 63 {
            Ok(PoolName(s.to_string()))
        } else {
            Err(BadPoolName(s.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// For values read back from the store, which only ever holds parsed names.
    pub fn from_trusted(s: String) -> Self {
        PoolName(s)
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_protocol() {
        assert!(PoolName::parse("linux-x86_64.big").is_ok());
        assert!(PoolName::parse("0pool").is_ok());
        assert!(PoolName::parse(&"a".repeat(63)).is_ok());
        for bad in ["", "-x", "_x", ".x", "Upper", "a b", "a/b", &"a".repeat(64)] {
            assert!(PoolName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}

//! Time as the service sees it: milliseconds since the Unix epoch.
//!
//! Both engines store instants as 64-bit integers of milliseconds, which keeps the SQL identical
//! across engines and gives the sub-second precision the quarantine rule needs. Responses render
//! them as RFC 3339 UTC strings.

use serde::{Serialize, Serializer};
use std::fmt;

/// An instant, in milliseconds since the Unix epoch (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub i64);

impl Millis {
    pub fn now() -> Self {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Millis(since.as_millis() as i64)
    }

    pub fn from_secs(secs: i64) -> Self {
        Millis(secs.saturating_mul(1000))
    }

    /// A JWT NumericDate (seconds, possibly fractional) as milliseconds.
    pub fn from_numeric_date(secs: f64) -> Self {
        Millis((secs * 1000.0).round() as i64)
    }

    pub fn plus_secs(self, secs: i64) -> Self {
        Millis(self.0.saturating_add(secs.saturating_mul(1000)))
    }

    pub fn minus_secs(self, secs: i64) -> Self {
        Millis(self.0.saturating_sub(secs.saturating_mul(1000)))
    }

    /// Whole seconds from `earlier` to `self`, rounded down; negative when `earlier` is later.
    pub fn secs_since(self, earlier: Millis) -> i64 {
        (self.0 - earlier.0).div_euclid(1000)
    }

    /// An RFC 3339 instant (`2026-12-01T09:00:00Z`, any offset) as milliseconds; `None` for
    /// anything else.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let t =
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
        i64::try_from(t.unix_timestamp_nanos() / 1_000_000)
            .ok()
            .map(Millis)
    }

    pub fn rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(t) => t
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_else(|_| self.0.to_string()),
            Err(_) => self.0.to_string(),
        }
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rfc3339())
    }
}

/// Instants serialize as RFC 3339 strings: the wire format of every timestamp in a response.
impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_rfc3339_with_millis() {
        assert_eq!(
            Millis(1_700_000_000_123).rfc3339(),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(Millis(0).rfc3339(), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn parses_what_it_renders() {
        let m = Millis(1_700_000_000_123);
        assert_eq!(Millis::parse_rfc3339(&m.rfc3339()), Some(m));
        assert_eq!(
            Millis::parse_rfc3339("2023-11-14T23:13:20.123+01:00"),
            Some(m)
        );
        assert_eq!(Millis::parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn numeric_dates_keep_sub_second_precision() {
        assert_eq!(Millis::from_numeric_date(1.5).0, 1500);
        assert_eq!(Millis(2500).secs_since(Millis(1000)), 1);
        assert_eq!(Millis(1000).secs_since(Millis(2500)), -2);
    }
}

//! The runner's clock against the service's: measured from the `Date` header of every answer,
//! warned about when they disagree, and used to tell a refusal for the clock from one for the
//! key.
//!
//! Why: the service judges an attestation's `iat`, `exp` and `probe.checked_at` by its own
//! clock, give or take a leeway (30 s by default). A runner whose clock is minutes off is
//! refused, `401 clock_skew` from services that say so, and from older ones `401
//! attestation_invalid` or `attestation_expired` with a detail about the future or expiry.
//! That is a machine to fix (NTP), not a wrong key: the agent keeps trying, says by how much
//! it is off, and lets time sync catch up. The agent does not shift its own timestamps: the
//! service would then record a probe time that the machine never saw.

use super::problem::Problem;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The service's default clock-skew leeway (`LEASEGATE_CLOCK_SKEW_S`), for refusals that do
/// not say theirs.
pub const DEFAULT_LEEWAY_S: u64 = 30;

/// An offset larger than this is logged. `Date` has whole seconds, and a request takes some
/// time, so a measurement is only good to about a second.
pub const WARN_BEYOND: Duration = Duration::from_secs(5);

/// How far the runner's clock is from the service's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockOffset {
    /// Positive: the runner's clock is ahead of the service's.
    pub runner_ahead_ms: i64,
}

impl ClockOffset {
    /// The offset in whole seconds, rounded, without its sign.
    pub fn abs_secs(self) -> u64 {
        (self.runner_ahead_ms.unsigned_abs() + 500) / 1000
    }

    pub fn exceeds(self, limit: Duration) -> bool {
        u128::from(self.runner_ahead_ms.unsigned_abs()) > limit.as_millis()
    }
}

impl fmt::Display for ClockOffset {
    /// `612 s ahead of the server's`, `3 s behind the server's`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let way = if self.runner_ahead_ms >= 0 {
            "ahead of"
        } else {
            "behind"
        };
        write!(f, "{} s {way} the server's", self.abs_secs())
    }
}

/// The offset that an answer dated `date` (an HTTP-date) implies, for a request sent at `sent`
/// and answered at `received` (local time). The service's clock read somewhere in the second
/// `date` names, during the request: its middle is compared with the request's.
pub fn measure(date: &str, sent: SystemTime, received: SystemTime) -> Option<ClockOffset> {
    let server =
        time::OffsetDateTime::parse(date.trim(), &time::format_description::well_known::Rfc2822)
            .ok()?;
    let server_ms = server.unix_timestamp().checked_mul(1000)? + 500;
    let ms = |t: SystemTime| -> Option<i64> {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).ok(),
            Err(e) => i64::try_from(e.duration().as_millis()).ok().map(|v| -v),
        }
    };
    let local_ms = (ms(sent)? + ms(received)?) / 2;
    Some(ClockOffset {
        runner_ahead_ms: local_ms - server_ms,
    })
}

/// The last offset measured by a client, shared by its clones, and whether it was warned about.
#[derive(Clone, Debug, Default)]
pub struct ClockWatch {
    inner: Arc<Mutex<Watched>>,
}

#[derive(Debug, Default)]
struct Watched {
    last: Option<ClockOffset>,
    warned: Option<ClockOffset>,
}

impl ClockWatch {
    /// The offset of the latest answer that had a readable `Date`.
    pub fn last(&self) -> Option<ClockOffset> {
        self.inner.lock().map_or(None, |w| w.last)
    }

    /// Records an answer's offset. Warns when it is beyond [`WARN_BEYOND`], once per change of
    /// more than that, so that a steady offset is one line and not one per heartbeat; says so
    /// when the clocks agree again.
    pub fn observe(&self, offset: ClockOffset) {
        let Ok(mut w) = self.inner.lock() else {
            return;
        };
        w.last = Some(offset);
        if offset.exceeds(WARN_BEYOND) {
            let moved = w.warned.is_none_or(|before| {
                ClockOffset {
                    runner_ahead_ms: offset.runner_ahead_ms - before.runner_ahead_ms,
                }
                .exceeds(WARN_BEYOND)
            });
            if moved {
                w.warned = Some(offset);
                tracing::warn!(
                    offset_s = offset.runner_ahead_ms as f64 / 1000.0,
                    "clock is {offset} (by its Date header); fix this machine's time sync (NTP)"
                );
            }
        } else if w.warned.take().is_some() {
            tracing::info!(
                offset_s = offset.runner_ahead_ms as f64 / 1000.0,
                "clock agrees with the server's again ({offset})"
            );
        }
    }
}

/// Is `p` a refusal for this machine's clock rather than for its key or state? Always for
/// `clock_skew`; for `attestation_expired` and `attestation_invalid`, when the detail is
/// about time and the offset measured on that very answer is beyond the leeway.
pub fn is_clock_refusal(p: &Problem, measured: Option<ClockOffset>) -> bool {
    match p.code.as_str() {
        "clock_skew" => true,
        "attestation_expired" | "attestation_invalid" => {
            speaks_of_time(&p.detail)
                && measured.is_some_and(|o| o.exceeds(Duration::from_secs(leeway_s(p))))
        }
        _ => false,
    }
}

/// The leeway the refusal states (`… (leeway 30 s)`, or a `leeway_s` member), else the
/// service's default.
pub fn leeway_s(p: &Problem) -> u64 {
    if let Some(n) = p.raw.get("leeway_s").and_then(serde_json::Value::as_u64) {
        return n;
    }
    p.detail
        .split("leeway")
        .nth(1)
        .and_then(|rest| {
            let digits: String = rest
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .unwrap_or(DEFAULT_LEEWAY_S)
}

/// The service's details for time-based refusals: `… is in the future`, `… has expired`,
/// `… is older than 60 s`, `… not valid yet (nbf)`.
fn speaks_of_time(detail: &str) -> bool {
    let d = detail.to_ascii_lowercase();
    [
        "in the future",
        "expired",
        "older than",
        "not valid yet",
        "clock",
    ]
    .iter()
    .any(|w| d.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(unix_ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(unix_ms)
    }

    fn problem(code: &str, detail: &str) -> Problem {
        Problem {
            status: 401,
            code: code.into(),
            detail: detail.into(),
            retry_after_s: None,
            raw: json!({"code": code, "detail": detail}),
        }
    }

    #[test]
    fn the_offset_compares_the_middle_of_the_dated_second_with_the_requests() {
        // 1_700_000_000 is Tue, 14 Nov 2023 22:13:20 GMT.
        let date = "Tue, 14 Nov 2023 22:13:20 GMT";
        let server_mid = 1_700_000_000_500;
        // The runner's clock 612 s ahead, a 200 ms request.
        let sent = at(server_mid + 612_000 - 100);
        let received = at(server_mid + 612_000 + 100);
        let o = measure(date, sent, received).unwrap();
        assert_eq!(o.runner_ahead_ms, 612_000);
        assert_eq!(o.to_string(), "612 s ahead of the server's");

        let behind = measure(date, at(server_mid - 3_400), at(server_mid - 3_400)).unwrap();
        assert_eq!(behind.to_string(), "3 s behind the server's");
        assert!(!behind.exceeds(WARN_BEYOND));

        assert_eq!(measure("yesterday", sent, received), None);
    }

    #[test]
    fn clock_skew_is_always_the_clock_and_old_codes_only_when_measured_beyond_the_leeway() {
        let far = Some(ClockOffset {
            runner_ahead_ms: 612_000,
        });
        let near = Some(ClockOffset {
            runner_ahead_ms: 2_000,
        });
        let skew = problem(
            "clock_skew",
            "the runner's clock is 612 s ahead of the server's (leeway 30 s)",
        );
        assert!(is_clock_refusal(&skew, None));
        assert_eq!(leeway_s(&skew), 30);

        let future = problem("attestation_invalid", "probe.checked_at is in the future");
        assert!(is_clock_refusal(&future, far));
        assert!(
            !is_clock_refusal(&future, near),
            "a small offset: not the clock"
        );
        assert!(!is_clock_refusal(&future, None));

        let expired = problem("attestation_expired", "the attestation has expired");
        assert!(is_clock_refusal(&expired, far));

        let key = problem(
            "attestation_invalid",
            "the attestation is not a valid EdDSA JWS from a registered runner",
        );
        assert!(!is_clock_refusal(&key, far), "a key problem stays one");
        assert!(!is_clock_refusal(
            &problem("runner_revoked", "revoked"),
            far
        ));
    }

    #[test]
    fn the_stated_leeway_is_used() {
        let p = problem(
            "clock_skew",
            "the runner's clock is 12 s behind the server's (leeway 10 s)",
        );
        assert_eq!(leeway_s(&p), 10);
        let mut q = problem("attestation_invalid", "iat is in the future");
        assert_eq!(leeway_s(&q), DEFAULT_LEEWAY_S);
        q.raw["leeway_s"] = json!(5);
        assert_eq!(leeway_s(&q), 5);
        let o = Some(ClockOffset {
            runner_ahead_ms: 8_000,
        });
        assert!(is_clock_refusal(&q, o));
    }
}

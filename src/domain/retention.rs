//! How long the store keeps what no longer matters to the gate, and where each horizon lies.
//!
//! Finished jobs (with their events and leases) are kept `jobs_days`; refusals, attestation
//! samples, status changes and the audit trail `history_days`; used or expired registration
//! tokens a day. Nothing unfinished is ever old enough: a queued, leased or running job stays
//! whatever its age. The pruner (`crate::retention`) deletes past these horizons in batches.

use super::time::Millis;

pub const DEFAULT_JOBS_DAYS: i64 = 30;
pub const DEFAULT_HISTORY_DAYS: i64 = 14;
/// Used or expired registration tokens are kept this long (for "why did my token fail?").
pub const TOKENS_KEPT_S: i64 = 86_400;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub jobs_days: i64,
    pub history_days: i64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            jobs_days: DEFAULT_JOBS_DAYS,
            history_days: DEFAULT_HISTORY_DAYS,
        }
    }
}

/// The instants before which each kind of row may go, at some `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Horizons {
    /// Jobs finished (their last update) before this.
    pub jobs: Millis,
    /// Refusals, attestation samples, status changes and audit entries from before this.
    pub history: Millis,
    /// Registration tokens used or expired before this.
    pub tokens: Millis,
    /// Pools' timeline samples from before this (`timeline::SAMPLES_KEPT_S`).
    pub samples: Millis,
}

impl Retention {
    pub fn horizons(self, now: Millis) -> Horizons {
        Horizons {
            jobs: now.minus_secs(self.jobs_days.saturating_mul(86_400)),
            history: now.minus_secs(self.history_days.saturating_mul(86_400)),
            tokens: now.minus_secs(TOKENS_KEPT_S),
            samples: now.minus_secs(super::timeline::SAMPLES_KEPT_S),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizons_lie_their_span_before_now() {
        let now = Millis::from_secs(100 * 86_400);
        let h = Retention::default().horizons(now);
        assert_eq!(h.jobs, Millis::from_secs(70 * 86_400));
        assert_eq!(h.history, Millis::from_secs(86 * 86_400));
        assert_eq!(h.tokens, Millis::from_secs(99 * 86_400));
    }
}

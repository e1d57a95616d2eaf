//! `Problem`: an RFC 9457 problem the service answered with, as a runner sees it.
//!
//! It has its own module because two sides read it: `client` builds it from an answer, and
//! `clock` judges whether it is a refusal for this machine's clock. Neither owns the other.

use serde_json::Value;

/// An RFC 9457 problem the service answered with.
#[derive(Clone, Debug)]
pub struct Problem {
    pub status: u16,
    /// The stable code to branch on, e.g. `probe_failed`, `runner_revoked`.
    pub code: String,
    pub detail: String,
    pub retry_after_s: Option<u64>,
    /// The problem document as received.
    pub raw: Value,
}

impl Problem {
    /// Worth trying again later unchanged: the service is down or busy.
    pub fn is_server_side(&self) -> bool {
        self.status >= 500 || self.status == 429
    }
}

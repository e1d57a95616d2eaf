//! The colour a runner's status shows in, wherever the page shows one: a runner's row, a
//! pool's tally, a timeline's bars.

use crate::domain::status::RunnerStatus;

/// The CSS class of a status: its colour. The word is always shown beside it.
pub fn status_class(status: RunnerStatus) -> &'static str {
    match status {
        RunnerStatus::Healthy => "ok",
        RunnerStatus::ProbeFailed
        | RunnerStatus::Drifted
        | RunnerStatus::ImageUnreported
        | RunnerStatus::PoolImageUnresolved
        | RunnerStatus::Quarantined
        | RunnerStatus::Ejected => "bad",
        RunnerStatus::ProbeStale
        | RunnerStatus::Stale
        | RunnerStatus::Cordoned
        | RunnerStatus::Unknown => "warn",
        RunnerStatus::Revoked => "off",
    }
}

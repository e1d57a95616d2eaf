//! A runner's status: the names the heartbeat, the admin views, the metrics and the timeline
//! give its health.
//!
//! Only the vocabulary lives here. What decides a status is the verdict (`verdict::judge`, a
//! refusal's `status`) and the runner's observation (`runner::Runner::observe`); what only
//! names or counts statuses (ejection's share of a pool, the fleet's tallies, the metrics)
//! imports this and not those rules.

/// A runner's health, as the heartbeat and the admin views name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunnerStatus {
    Ejected,
    ProbeFailed,
    Drifted,
    ImageUnreported,
    PoolImageUnresolved,
    Quarantined,
    ProbeStale,
    Stale,
    Cordoned,
    #[default]
    Unknown,
    Revoked,
    Healthy,
}

impl RunnerStatus {
    pub const ALL: [RunnerStatus; 12] = [
        RunnerStatus::Healthy,
        RunnerStatus::ProbeFailed,
        RunnerStatus::ProbeStale,
        RunnerStatus::PoolImageUnresolved,
        RunnerStatus::ImageUnreported,
        RunnerStatus::Drifted,
        RunnerStatus::Cordoned,
        RunnerStatus::Quarantined,
        RunnerStatus::Ejected,
        RunnerStatus::Revoked,
        RunnerStatus::Stale,
        RunnerStatus::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunnerStatus::Healthy => "healthy",
            RunnerStatus::ProbeFailed => "probe_failed",
            RunnerStatus::ProbeStale => "probe_stale",
            RunnerStatus::PoolImageUnresolved => "pool_image_unresolved",
            RunnerStatus::ImageUnreported => "image_unreported",
            RunnerStatus::Drifted => "drifted",
            RunnerStatus::Cordoned => "cordoned",
            RunnerStatus::Quarantined => "quarantined",
            RunnerStatus::Ejected => "ejected",
            RunnerStatus::Revoked => "revoked",
            RunnerStatus::Stale => "stale",
            RunnerStatus::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

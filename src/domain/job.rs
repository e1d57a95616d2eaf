//! Jobs: their states and the events that tell their story.
//!
//! `attempts` counts the times a job began running a step (a lease `start`); `returns` counts
//! the times it went back to the queue without using one. The transitions themselves are in
//! `domain::lease`, because every change to a leased job goes through its lease.

use super::ids::{JobId, LeaseId, RunnerId};
use super::pool_name::PoolName;
use super::time::Millis;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobState {
    Queued,
    Leased,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Leased => "leased",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            JobState::Queued,
            JobState::Leased,
            JobState::Running,
            JobState::Succeeded,
            JobState::Failed,
            JobState::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

/// The bounds on `max_attempts` a forge may ask for.
pub const MAX_ATTEMPTS_RANGE: std::ops::RangeInclusive<i64> = 1..=100;
pub const DEFAULT_MAX_ATTEMPTS: i64 = 3;

/// A job as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub id: JobId,
    pub pool: PoolName,
    pub payload: serde_json::Value,
    pub state: JobState,
    pub attempts: i64,
    pub max_attempts: i64,
    pub returns: i64,
    pub last_error: Option<String>,
    pub idempotency_key: Option<String>,
    /// The live lease, when the job is `leased` or `running`.
    pub lease_id: Option<LeaseId>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// What happened to a job, in the words of its story.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Enqueued,
    Leased,
    Started,
    /// Back to the queue without using an attempt.
    Returned,
    /// Back to the queue after an attempt was used (errored, or expired after start).
    Requeued,
    Completed,
    Failed,
    Cancelled,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Enqueued => "enqueued",
            EventKind::Leased => "leased",
            EventKind::Started => "started",
            EventKind::Returned => "returned",
            EventKind::Requeued => "requeued",
            EventKind::Completed => "completed",
            EventKind::Failed => "failed",
            EventKind::Cancelled => "cancelled",
        }
    }
}

/// One line of a job's story.
#[derive(Clone, Debug, PartialEq)]
pub struct JobEvent {
    pub at: Millis,
    pub kind: String,
    pub runner_id: Option<RunnerId>,
    pub lease_id: Option<LeaseId>,
    /// A short machine-readable reason (`abandoned`, `lease_expired`, `errored`, …).
    pub reason: Option<String>,
    pub detail: Option<String>,
}

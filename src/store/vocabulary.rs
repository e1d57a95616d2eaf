//! The store's vocabulary: what its calls take and answer, and how they fail.
//!
//! Kept apart from the `Store` trait (`service.rs`) and from the statements (`sql/`), so that
//! both can name these without naming each other: the statements build and return them, the
//! trait only lists them.

use crate::domain::attestation::RunningImage;
use crate::domain::forge::{ForgeIdentity, ForgeRunner};
use crate::domain::github::registration::Registration as GithubRegistration;
use crate::domain::ids::{JobId, LeaseId, RunnerId};
use crate::domain::job::Job;
use crate::domain::lease::{Lease, LeaseCallError};
use crate::domain::operator::Operator;
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use std::collections::BTreeMap;

pub use crate::domain::record::{
    ATTESTATION_HISTORY, AttestationRecord, REFUSAL_HISTORY, Rejection, STATUS_CHANGE_HISTORY,
};

/// A failure of the database itself, never of the caller.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or did not answer in time: 503 `unavailable`.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The database aborted the transaction for a conflict with another one (PostgreSQL's
    /// deadlock or serialization failure). Retried a few times (`retry::retrying`), then
    /// 503 `unavailable`: another try will do.
    #[error("database conflict: {0}")]
    Conflict(String),
    #[error("database error: {0}")]
    Internal(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
            sqlx::Error::Database(db) if is_unavailable(db.code().as_deref(), db.message()) => {
                StoreError::Unavailable(e.to_string())
            }
            sqlx::Error::Database(db)
                if matches!(db.code().as_deref(), Some("40P01" | "40001")) =>
            {
                StoreError::Conflict(e.to_string())
            }
            _ => StoreError::Internal(e.to_string()),
        }
    }
}

/// Errors that say "the database cannot serve now", not "this request is wrong": SQLite's
/// busy, locked, read-only, I/O, full-disk and cannot-open errors (primary and extended codes),
/// and
/// PostgreSQL's connection (08), operator intervention and timeout (57) and resource (53)
/// classes, its `lock_timeout` (55P03: a lock held elsewhere for longer than a statement may
/// wait, which a request sent again later may find free) and the end of a session left idle
/// in its transaction (25P03, `idle_in_transaction_session_timeout`: the connection is gone).
pub(crate) fn is_unavailable(code: Option<&str>, message: &str) -> bool {
    const SQLITE: [&str; 9] = ["5", "6", "8", "10", "13", "14", "261", "517", "1032"];
    if let Some(code) = code {
        let postgres = ["08", "57", "53"].iter().any(|c| code.starts_with(c))
            || ["55P03", "25P03"].contains(&code);
        if postgres || SQLITE.contains(&code) {
            return true;
        }
    }
    let m = message.to_ascii_lowercase();
    [
        "database is locked",
        "readonly",
        "read-only",
        "disk i/o",
        "disk is full",
        "unable to open",
    ]
    .iter()
    .any(|s| m.contains(s))
}

impl StoreError {
    /// A conflict with another transaction: worth another try (`retry`).
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict(_))
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A runner about to be registered.
#[derive(Clone, Debug)]
pub struct NewRunner {
    pub id: RunnerId,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub public_key_x: String,
    /// The forge runners on its machine, bound with it.
    pub forge_runners: Vec<ForgeRunner>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("the registration token is unknown, used or expired")]
    TokenInvalid,
    #[error("a runner with this name is already registered in the pool")]
    NameTaken,
    #[error("forge runner {} {} is bound to another runner", .0.kind.as_str(), .0.key)]
    ForgeRunnerTaken(ForgeIdentity),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("forge runner {} {} is bound to another runner", .0.kind.as_str(), .0.key)]
    Taken(ForgeIdentity),
    #[error("the runner is revoked")]
    Revoked,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a claim needs: who claims, from which pool, and the new lease's identity.
#[derive(Clone, Debug)]
pub struct Claim {
    pub runner_id: RunnerId,
    pub pool: PoolName,
    pub lease_id: LeaseId,
    pub token_hash: String,
    pub ttl_s: i64,
    pub now: Millis,
}

/// A lease call made: the lease and job as it left them, and what it did to the runner's
/// standing (`domain::ejection`).
#[derive(Clone, Debug)]
pub struct LeaseCallDone {
    pub lease: Lease,
    pub job: Job,
    pub ejection: crate::domain::ejection::Effect,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseCallFailure {
    /// Unknown lease or wrong token: 401 `lease_token_invalid`.
    #[error("the lease token is not valid for this lease")]
    TokenInvalid,
    #[error(transparent)]
    Rejected(#[from] LeaseCallError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error("unknown pool")]
    UnknownPool,
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("the job is already {0}")]
    Finished(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An operator's named token, as listed (the token itself is never kept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorToken {
    pub operator: Operator,
    pub created_at: Millis,
    /// Who created it.
    pub created_by: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("an operator token with this name exists; revoke it first")]
    NameTaken,
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum PoolDeleteError {
    #[error("no such pool")]
    NotFound,
    #[error(
        "the pool has {live} live runners and {unfinished} unfinished jobs; revoke its runners \
         and let its jobs finish (or cancel them) first"
    )]
    InUse { live: i64, unfinished: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Which audit entries to list: every given filter must hold; newest first, from before the
/// cursor `before` (an entry's `seq`), at most `limit`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub target: Option<String>,
    pub actor: Option<String>,
    pub since: Option<Millis>,
    pub until: Option<Millis>,
    pub before: Option<i64>,
    pub limit: i64,
}

/// Rows pruned, by kind (`jobs`, `job_events`, `leases`, `refusals`, …).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub kinds: BTreeMap<&'static str, u64>,
}

impl PruneReport {
    pub fn add(&mut self, kind: &'static str, n: u64) {
        if n > 0 {
            *self.kinds.entry(kind).or_insert(0) += n;
        }
    }

    pub fn merge(&mut self, other: PruneReport) {
        for (kind, n) in other.kinds {
            self.add(kind, n);
        }
    }

    pub fn total(&self) -> u64 {
        self.kinds.values().sum()
    }
}

/// A job to enqueue.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub id: JobId,
    pub pool: PoolName,
    pub payload: serde_json::Value,
    pub max_attempts: i64,
    pub idempotency_key: Option<String>,
}

/// Queue depth of one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    pub queued: i64,
    pub oldest_queued_at: Option<Millis>,
}

/// One recorded attestation, as history shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct AttestationEntry {
    pub received_at: Millis,
    pub probe_ok: bool,
    pub runtime: String,
    pub runtime_version: Option<String>,
    pub checked_at: Millis,
    pub error: Option<String>,
    pub image: RunningImage,
    pub status: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StatusChange {
    pub at: Millis,
    pub from: Option<String>,
    pub to: String,
    pub detail: Option<String>,
}

/// A run of refusals with one code: the ring keeps one entry per run, not one per refusal.
#[derive(Clone, Debug, PartialEq)]
pub struct RefusalEntry {
    /// The run's place in the runner's refusal ring (increasing).
    pub seq: i64,
    /// The run's first refusal.
    pub first_at: Millis,
    /// Its latest refusal.
    pub at: Millis,
    /// How many refusals the run holds.
    pub count: i64,
    pub code: String,
    /// The latest refusal's detail.
    pub detail: String,
}

/// What the runner detail view shows beyond the runner itself, newest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunnerHistory {
    pub attestations: Vec<AttestationEntry>,
    pub status_changes: Vec<StatusChange>,
    pub refusals: Vec<RefusalEntry>,
    pub leases: Vec<Lease>,
    /// Its latest GitHub registrations, each with the steps it went through.
    pub github_registrations: Vec<GithubRegistration>,
    /// The latest pauses leasegate made on its Buildkite agents, and its notes on them.
    pub buildkite_pauses: Vec<crate::domain::buildkite::Pause>,
    pub buildkite_agents: Vec<crate::domain::buildkite::AgentWatch>,
}

/// A session of the runner-health page, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageSession {
    /// The SHA-256 of the cookie's token.
    pub token_hash: String,
    /// Who logged in.
    pub actor: String,
    /// The SHA-256 of the credential the session was opened with.
    pub credential_hash: String,
    pub created_at: Millis,
    pub expires_at: Millis,
}

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub leases_expired: u64,
    pub jtis_purged: u64,
    /// What became of the jobs of the leases that ended.
    pub ended: Vec<EndedLease>,
}

/// A live lease ended by expiry or revocation, and what became of its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedLease {
    pub pool: PoolName,
    /// Ended before `start`: the job went back to the queue without using an attempt.
    pub before_start: bool,
    /// The job's state afterwards (`queued` or, when attempts ran out, `failed`).
    pub job_state: crate::domain::job::JobState,
}

/// One request's share of a round: an attestation to accept and record, a claim, or both (a
/// lease: the claim happens only when the attestation is accepted).
#[derive(Clone, Debug, Default)]
pub struct RoundItem {
    pub attestation: Option<AttestationRecord>,
    pub claim: Option<Claim>,
}

impl RoundItem {
    /// The runners the item names: its attestation's, then its claim's (the same runner when
    /// it has both).
    pub fn runners(&self) -> impl Iterator<Item = &RunnerId> {
        let attested = self.attestation.as_ref().map(|a| &a.runner_id);
        attested
            .into_iter()
            .chain(self.claim.as_ref().map(|c| &c.runner_id))
    }
}

/// What a round did for one item.
#[derive(Clone, Debug, Default)]
pub struct RoundOutcome {
    /// `None` when the item carried no attestation.
    pub attestation: Option<Result<(), Rejection>>,
    /// The lease and job granted to the item's claim, if any.
    pub granted: Option<(Lease, Job)>,
    /// Its attestation, accepted, was judged by gate facts its runner's row no longer holds
    /// (`Plan::stale`).
    pub judged_stale: bool,
}

#[cfg(test)]
mod tests {
    use super::is_unavailable;

    #[test]
    fn the_database_saying_not_now_is_unavailable_and_a_bad_statement_is_not() {
        for code in [
            "08006", "57014", "57P01", "53300", "55P03", "25P03", "5", "517", "13",
        ] {
            assert!(is_unavailable(Some(code), ""), "{code}");
        }
        // An extended I/O code known by its message, as SQLite words it.
        assert!(is_unavailable(Some("1034"), "disk I/O error"));
        assert!(is_unavailable(None, "database or disk is full"));
        // A syntax error, a unique violation, a serialization failure (a conflict), SQLite's
        // constraint: the request's or the round's, not the database's availability.
        for code in ["42601", "23505", "40001", "25P02", "55000", "19"] {
            assert!(!is_unavailable(Some(code), "some message"), "{code}");
        }
    }
}

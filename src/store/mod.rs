//! Persistence: the service's `Store`, its one implementation, and the two engines under it.
//!
//! This is the only place SQL lives and the only place that knows which engine is in use.
//! Handlers hold an `Arc<dyn Store>`: the service's API, nothing of how it is written. Under
//! it, `gated::GatedStore` is group commit and the gate's cache over an `engine::Engine`;
//! every statement is a function of `sql/`, once, over the engine interface; `sqlite.rs` and
//! `postgres.rs` are that interface over each engine. Every rule that decides what a write
//! should be comes from `domain`; the store only loads, fences and writes, each call in one
//! transaction. `docs/ARCHITECTURE.md` draws the map.

pub mod engine;
mod gated;
mod group_commit;
pub mod location;
pub mod migrations;
mod pg_connect;
pub mod postgres;
pub mod retry;
pub mod signal;
pub mod sql;
pub mod sqlite;
pub mod verdict_cache;

pub use crate::domain::lease::Lease;
pub use signal::JobSignal;
pub use sql::buildkite::BuildkiteState;
pub use sql::queue::{CLAIM_BATCH_SQL, CLAIM_CANDIDATE_SQL};
pub use sql::round::{Rejection, RoundItem, RoundOutcome};
pub use sql::runners::Followed;
pub use verdict_cache::GateRunner;

use crate::domain::attestation::RunningImage;
use crate::domain::audit::{Entry, Recorded};
use crate::domain::forge::{ForgeBinding, ForgeIdentity, ForgeRunner};
use crate::domain::github::registration::{
    Registration as GithubRegistration, State as GithubState,
};
use crate::domain::ids::{JobId, LeaseId, RegistrationId, RunnerId};
use crate::domain::image_set::ResolutionOutcome;
use crate::domain::job::{Job, JobEvent};
use crate::domain::lease::{LeaseCall, LeaseCallError};
use crate::domain::operator::{Operator, OperatorName};
use crate::domain::pool::{Pool, PoolSpec};
use crate::domain::pool_name::PoolName;
use crate::domain::retention::Horizons;
use crate::domain::runner::{Runner, RunnerSummary, StatusRules};
use crate::domain::status::RunnerStatus;
use crate::domain::time::Millis;
use crate::domain::verdict::AttestedState;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How many attestations and refusals are kept per runner (rings), and status changes.
pub const ATTESTATION_HISTORY: i64 = 20;
pub const REFUSAL_HISTORY: i64 = 50;
pub const STATUS_CHANGE_HISTORY: i64 = 100;

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
/// busy, locked, read-only, I/O and cannot-open errors (primary and extended codes), and
/// PostgreSQL's connection (08), operator intervention and timeout (57) and resource (53)
/// classes.
pub(crate) fn is_unavailable(code: Option<&str>, message: &str) -> bool {
    const SQLITE: [&str; 8] = ["5", "6", "8", "10", "14", "261", "517", "1032"];
    if let Some(code) = code {
        let pg_class = ["08", "57", "53"].iter().any(|c| code.starts_with(c));
        if pg_class || SQLITE.contains(&code) {
            return true;
        }
    }
    let m = message.to_ascii_lowercase();
    [
        "database is locked",
        "readonly",
        "read-only",
        "disk i/o",
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

/// An attestation that passed rules 1–4, with the verdict it earned, to be recorded.
#[derive(Clone, Debug)]
pub struct AttestationRecord {
    pub runner_id: RunnerId,
    pub jti: String,
    /// Until when the jti must be remembered.
    pub replay_until: Millis,
    pub received_at: Millis,
    pub state: AttestedState,
    pub agent: Option<serde_json::Value>,
    /// The status this attestation gives the runner (for history and status changes).
    pub status: RunnerStatus,
    /// The refusal to record, for a lease or gate check refused under rules 7–13.
    pub refusal: Option<(String, String)>,
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

/// The service's store. One implementation (`gated::GatedStore`) over either engine; every
/// write is committed before it is answered.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `sqlite` or `postgres`, for logs and metrics.
    fn engine(&self) -> &'static str;

    /// Wakes long polls when a job is enqueued or returned (in-process or across replicas).
    fn job_signal(&self) -> &JobSignal;

    /// Does the database answer (and, for SQLite, may it be written)?
    async fn ping(&self) -> StoreResult<()>;

    /// Creates or replaces the pool; `audit` is recorded with it.
    async fn put_pool(
        &self,
        name: &PoolName,
        spec: PoolSpec,
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<(Pool, bool)>;
    /// `put_pool`, only if the pool is still exactly `base` (as read before): `None`, with
    /// nothing written or audited, when it changed meanwhile or is gone. A read, a change and
    /// this make a read-modify-write that loses no concurrent write (`PATCH`).
    async fn replace_pool(
        &self,
        name: &PoolName,
        spec: PoolSpec,
        base: &Pool,
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<Option<Pool>>;
    /// Deletes the pool and everything of it, when nothing of it is live (`PoolDeleteError`).
    async fn delete_pool(&self, name: &PoolName, audit: &Entry) -> Result<(), PoolDeleteError>;
    async fn get_pool(&self, name: &PoolName) -> StoreResult<Option<Pool>>;
    /// Every pool, by name, with its resolver record (`resolution_failures`, the last
    /// resolution, what it resolved to), for views, metrics and the health page.
    async fn list_pools(&self) -> StoreResult<Vec<Pool>>;

    /// Claims the registry pool `name` for a background resolution until `until`, if it is
    /// due at `now` (`next_resolve_at` passed) and no replica holds an unexpired claim. The
    /// due check and the claim are one atomic statement, so that replicas never stampede.
    /// `None` when the pool is not due, is claimed, resolves nothing (neither a registry pool
    /// nor one with a registry entry), or does not exist.
    async fn claim_resolution(
        &self,
        name: &PoolName,
        now: Millis,
        until: Millis,
    ) -> StoreResult<Option<Pool>>;

    /// Records what resolving `image_ref` came to, in one transaction: the pool as
    /// `Pool::apply_resolution` makes it (a success rolls the sets with the grace, a failure
    /// leaves them exactly as they were and is counted), and the claim released. `None` when
    /// the outcome no longer applies (the pool is gone, manual, or has another `image_ref`).
    async fn record_resolution(
        &self,
        name: &PoolName,
        image_ref: &str,
        outcome: &ResolutionOutcome,
        now: Millis,
    ) -> StoreResult<Option<Pool>>;

    /// Records what resolving the pool's registry entries came to (`(ref, outcome)`), in one
    /// transaction: the pool as `Pool::apply_image_resolutions` makes it, and the claim
    /// released. `None` when the pool is gone.
    async fn record_image_resolutions(
        &self,
        name: &PoolName,
        outcomes: &[(String, ResolutionOutcome)],
        now: Millis,
    ) -> StoreResult<Option<Pool>>;
    async fn queue_depths(&self) -> StoreResult<BTreeMap<PoolName, QueueDepth>>;

    /// Stores a registration token for `pool`, audited; `false` (nothing stored, nothing
    /// audited) when there is no such pool, also when its delete commits first.
    async fn create_registration_token(
        &self,
        pool: &PoolName,
        token_hash: &str,
        expires_at: Millis,
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<bool>;
    /// Consumes the token and inserts the runner atomically; neither happens on failure.
    async fn register_runner(
        &self,
        token_hash: &str,
        runner: NewRunner,
        now: Millis,
    ) -> Result<Runner, RegisterError>;

    async fn get_runner(&self, id: &RunnerId) -> StoreResult<Option<Runner>>;
    /// Every runner (or a pool's) as judging needs it, with its labels and host for the
    /// operators' search when `with_search`, by pool and name: what the fleet's views read for
    /// every runner.
    async fn runner_summaries(
        &self,
        pool: Option<&PoolName>,
        with_search: bool,
    ) -> StoreResult<Vec<RunnerSummary>>;
    /// The runners of `ids` that exist, whole, in no particular order.
    async fn runners_by_id(&self, ids: &[RunnerId]) -> StoreResult<Vec<Runner>>;
    async fn runner_history(&self, id: &RunnerId) -> StoreResult<RunnerHistory>;
    /// Refusals since `since`, per runner: the runs of refusals that went on since then,
    /// counted whole (bounded by the refusal ring).
    async fn refusal_counts_since(&self, since: Millis) -> StoreResult<BTreeMap<RunnerId, i64>>;
    /// `None` (and nothing recorded) for an unknown runner.
    async fn set_cordoned(
        &self,
        id: &RunnerId,
        cordoned: bool,
        audit: &Entry,
    ) -> StoreResult<Option<Runner>>;
    /// Revokes the runner and ends its live leases as an expiry would.
    async fn revoke_runner(
        &self,
        id: &RunnerId,
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<Option<(Runner, Vec<EndedLease>)>>;

    /// Whether `jti` was already accepted from this runner (rule 5 as a read, without a write).
    async fn jti_seen(&self, runner: &RunnerId, jti: &str, now: Millis) -> StoreResult<bool>;

    /// One request's share of a round (group commit): rules 5 and 6 and the record of its
    /// attestation, then its claim. Answered once the round that holds it has committed.
    async fn submit(&self, item: RoundItem) -> StoreResult<RoundOutcome>;

    /// The runner as the gate judges it: key (decoded), pool, cordon, quarantine, revocation.
    /// May come from a cache kept true by invalidation; views use `get_runner`.
    async fn gate_runner(&self, id: &RunnerId) -> StoreResult<Option<GateRunner>>;

    /// The pool as the gate judges with it (from the same cache).
    async fn gate_pool(&self, name: &PoolName) -> StoreResult<Option<Pool>>;

    async fn enqueue_job(&self, job: NewJob, now: Millis) -> Result<(Job, bool), EnqueueError>;
    async fn job_by_idempotency_key(&self, key: &str) -> StoreResult<Option<Job>>;
    async fn get_job(&self, id: &JobId) -> StoreResult<Option<(Job, Vec<JobEvent>)>>;
    async fn cancel_job(&self, id: &JobId, now: Millis) -> Result<Option<Job>, CancelError>;

    /// Takes the pool's oldest queued job for the runner (a round with a claim and no
    /// attestation); `None` when there is none, or the runner was revoked or cordoned.
    async fn claim_job(&self, claim: &Claim) -> StoreResult<Option<(Lease, Job)>>;
    /// A runner's call on its lease, checked against the token hash and fenced by the lease.
    /// A call that ends the job counts for or against the runner (`domain::ejection`), judged
    /// by `rules` when it may eject it.
    async fn lease_call(
        &self,
        lease_id: &LeaseId,
        token_hash: &str,
        call: &LeaseCall,
        now: Millis,
        rules: StatusRules,
    ) -> Result<LeaseCallDone, LeaseCallFailure>;

    /// A job's end seen through the forge gate (`key` names the forge's job) counted against
    /// `runner`, once however often it is seen: the runner's pool and what the end did, `None`
    /// for a repeat or an unknown runner.
    async fn forge_job_ended(
        &self,
        key: &str,
        runner: &RunnerId,
        end: crate::domain::ejection::JobEnd,
        now: Millis,
        rules: StatusRules,
    ) -> StoreResult<Option<(PoolName, crate::domain::ejection::Effect)>>;

    /// Notes that `runner` took the forge's job `key` (the gate relayed the forge's answer
    /// handing it out); the first runner named keeps it.
    async fn forge_job_taken(&self, key: &str, runner: &RunnerId, now: Millis) -> StoreResult<()>;

    /// The runner that took the forge's job `key`, if the gate saw it taken.
    async fn forge_job_runner(&self, key: &str) -> StoreResult<Option<RunnerId>>;

    /// An operator's reinstatement of an ejected (or would-be ejected) runner: out at once,
    /// its failures in a row forgotten; `None` (nothing recorded) for an unknown runner.
    async fn reinstate_runner(&self, id: &RunnerId, audit: &Entry) -> StoreResult<Option<Runner>>;

    /// Replaces the forge runners bound to `runner` (keeping when each was last seen). Refused
    /// as a whole when one of them is bound to another runner; `None` for an unknown runner.
    async fn set_forge_runners(
        &self,
        runner: &RunnerId,
        wanted: &[ForgeRunner],
        now: Millis,
        audit: &Entry,
    ) -> Result<Option<Runner>, BindError>;
    /// Rebinds `runner` to exactly the forge runners its agent claimed, those another runner
    /// holds excepted and noted on it; `audit` recorded when something changed. `None` (nothing
    /// written) for an unknown or revoked runner.
    async fn follow_forge_runners(
        &self,
        runner: &RunnerId,
        claimed: &[ForgeRunner],
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<Option<Followed>>;
    /// The binding that judges a fetch from `identity` (a GitLab fetch's `system_id`'s binding,
    /// else the token's alone), and its runner.
    async fn forge_runner(
        &self,
        identity: &ForgeIdentity,
    ) -> StoreResult<Option<(RunnerId, ForgeBinding)>>;
    /// Notes that the binding `identity` names exactly asked for work at `now`.
    async fn note_forge_fetch(&self, identity: &ForgeIdentity, now: Millis) -> StoreResult<()>;
    /// Notes on the runner an attestation its key signed that rules 3–4 refused (`code`, why).
    async fn record_rejection(
        &self,
        runner: &RunnerId,
        code: &str,
        detail: &str,
        now: Millis,
    ) -> StoreResult<()>;
    /// Reserves a GitHub registration (`reg`, state `minting`) before GitHub is asked for it;
    /// `Some` of the runner's registration that has not ended instead (nothing written), since
    /// a runner holds at most one, whatever replicas race.
    async fn reserve_github_registration(
        &self,
        reg: &GithubRegistration,
    ) -> StoreResult<Option<GithubRegistration>>;
    /// A reservation's new name, before GitHub is asked again (it had the first).
    async fn rename_github_registration(&self, id: &RegistrationId, name: &str) -> StoreResult<()>;
    /// A reservation GitHub did not mint: gone, as if never made.
    async fn release_github_registration(&self, id: &RegistrationId) -> StoreResult<()>;
    /// Writes `reg` over its row as it was in `prior`, with `audit` (a step of its life) when
    /// given; whether it was written (another replica may have moved it first).
    async fn record_github_registration(
        &self,
        reg: &GithubRegistration,
        prior: GithubState,
        audit: Option<&Entry>,
    ) -> StoreResult<bool>;
    /// Every GitHub registration that has not ended, by scope.
    async fn outstanding_github_registrations(&self) -> StoreResult<Vec<GithubRegistration>>;

    /// The bound Buildkite agent names, leasegate's pauses that have not ended, and the
    /// watcher's notes: what the Buildkite watcher reads at each look.
    async fn buildkite_state(&self) -> StoreResult<BuildkiteState>;
    /// Records a pause leasegate made, or how it ended.
    async fn record_buildkite_pause(
        &self,
        pause: &crate::domain::buildkite::Pause,
    ) -> StoreResult<()>;
    /// Writes the watcher's notes on an agent name.
    async fn record_buildkite_watch(
        &self,
        watch: &crate::domain::buildkite::AgentWatch,
    ) -> StoreResult<()>;
    /// Forgets the notes on an agent name no longer bound.
    async fn forget_buildkite_watch(&self, agent_name: &str) -> StoreResult<()>;

    /// Records a refusal on the runner: a forge fetch the gate answered itself.
    async fn record_refusal(
        &self,
        runner: &RunnerId,
        code: &str,
        detail: &str,
        now: Millis,
    ) -> StoreResult<()>;

    async fn create_page_session(&self, session: &PageSession, audit: &Entry) -> StoreResult<()>;
    /// The unexpired session whose token hashes to `token_hash`.
    async fn page_session(&self, token_hash: &str, now: Millis)
    -> StoreResult<Option<PageSession>>;
    /// Ends the session (logging out): gone at once for every replica.
    /// `audit` is recorded when there was such a session.
    async fn end_page_session(&self, token_hash: &str, audit: &Entry) -> StoreResult<()>;

    /// Creates an operator's named token (stored as `token_hash`).
    async fn create_operator_token(
        &self,
        operator: &Operator,
        token_hash: &str,
        audit: &Entry,
    ) -> Result<OperatorToken, TokenError>;
    async fn list_operator_tokens(&self) -> StoreResult<Vec<OperatorToken>>;
    /// Revokes the named token and ends the page sessions opened with it; whether it existed.
    async fn delete_operator_token(&self, name: &OperatorName, audit: &Entry) -> StoreResult<bool>;
    /// The operator whose token hashes to `token_hash` (read from the database each time, so
    /// that a revocation holds at once on every replica).
    async fn operator_by_token(&self, token_hash: &str) -> StoreResult<Option<Operator>>;

    /// Records an entry of a change made elsewhere (a resolution, whose write is the
    /// resolver's).
    async fn record_audit(&self, entry: &Entry) -> StoreResult<()>;
    /// The audit entries `filter` selects, newest first.
    async fn audit_trail(&self, filter: &AuditFilter) -> StoreResult<Vec<Recorded>>;

    /// Takes the background task `task` (`prune`) until `until` unless another replica holds
    /// it; `release_task` lets it go.
    async fn claim_task(&self, task: &str, now: Millis, until: Millis) -> StoreResult<bool>;
    /// Lets the task go if the claim is still the one made until `until` (not another
    /// replica's, taken after it lapsed), noting `now` as its last run.
    async fn release_task(&self, task: &str, until: Millis, now: Millis) -> StoreResult<()>;
    /// Records pools' timeline samples (one per pool and instant; a repeat is ignored).
    async fn record_pool_samples(
        &self,
        samples: &[crate::domain::timeline::PoolSample],
    ) -> StoreResult<()>;
    /// Every pool's timeline samples since `since`, by pool, oldest first.
    async fn pool_samples(
        &self,
        since: Millis,
    ) -> StoreResult<Vec<crate::domain::timeline::PoolSample>>;
    /// Deletes what lies past `horizons`, in at most `max_batches` short transactions of
    /// each kind; what it deleted.
    async fn prune(&self, horizons: &Horizons, max_batches: u32) -> StoreResult<PruneReport>;

    /// Expires overdue leases and purges replay state and sessions that can no longer matter.
    async fn sweep(&self, now: Millis) -> StoreResult<SweepReport>;
}

pub type DynStore = Arc<dyn Store>;

/// What `DATABASE_URL` names: the one place its scheme is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// `sqlite://PATH` or `sqlite:PATH`: the file (created if missing).
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…`, as given.
    Postgres(String),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DatabaseUrlError {
    #[error("DATABASE_URL must start with sqlite:// (a file) or postgres:// (a server), not {0:?}")]
    Scheme(String),
    #[error("DATABASE_URL names no SQLite file: write sqlite://PATH, as sqlite://leasegate.db")]
    NoPath,
    #[error(
        "DATABASE_URL: an in-memory SQLite database would be lost at every restart and is not \
         shared between connections; name a file"
    )]
    InMemory,
    #[error("DATABASE_URL: a SQLite URL takes no options (found ?{0}); name the file only")]
    SqliteOptions(String),
}

impl DatabaseUrl {
    pub fn parse(url: &str) -> Result<Self, DatabaseUrlError> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(DatabaseUrl::Postgres(url.to_string()));
        }
        let Some(rest) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        else {
            // Only the scheme is shown: the rest may hold a password.
            let scheme = url.split_once(':').map_or(url, |(s, _)| s);
            return Err(DatabaseUrlError::Scheme(scheme.chars().take(32).collect()));
        };
        let (path, options) = rest.split_once('?').unwrap_or((rest, ""));
        if path.contains(":memory:") || options.contains("mode=memory") {
            return Err(DatabaseUrlError::InMemory);
        }
        if !options.is_empty() {
            return Err(DatabaseUrlError::SqliteOptions(options.to_string()));
        }
        if path.is_empty() {
            return Err(DatabaseUrlError::NoPath);
        }
        Ok(DatabaseUrl::Sqlite(PathBuf::from(path)))
    }

    /// `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        match self {
            DatabaseUrl::Sqlite(_) => "sqlite",
            DatabaseUrl::Postgres(_) => "postgres",
        }
    }

    /// Whether replicas may share the database (and so must share their secrets).
    pub fn is_shared(&self) -> bool {
        matches!(self, DatabaseUrl::Postgres(_))
    }

    /// The SQLite file's directory (`.` for a bare file name); `None` for PostgreSQL.
    pub fn sqlite_dir(&self) -> Option<&Path> {
        match self {
            DatabaseUrl::Sqlite(path) => Some(match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            }),
            DatabaseUrl::Postgres(_) => None,
        }
    }
}

/// Opens the store that `url` names, migrated, behind group commit and the gate's cache.
pub async fn open(
    url: &DatabaseUrl,
    pg: &postgres::PgSettings,
    sync: sqlite::Synchronous,
) -> anyhow::Result<DynStore> {
    Ok(match url {
        DatabaseUrl::Sqlite(path) => {
            // Wake-ups are not lost in one process, but one may be swallowed by a waiter that
            // was cordoned while it waited: re-check now and then all the same.
            let held = gated::Held::new(JobSignal::with_recheck(sqlite::RECHECK_INTERVAL));
            let engine = sqlite::SqliteEngine::open(path, sync)?;
            // One writer: a second round could only wait for the first.
            Arc::new(gated::GatedStore::new(Arc::new(engine), held, 1))
        }
        DatabaseUrl::Postgres(url) => {
            let held = gated::Held::new(JobSignal::with_recheck(postgres::RECHECK_INTERVAL));
            let listener = held.clone();
            let announced = Arc::new(move |a: postgres::Announced| match a {
                postgres::Announced::Change(change) => listener.apply(&change),
                postgres::Announced::Lost => listener.lost(),
            });
            let engine = postgres::PgEngine::open(url, pg, announced).await?;
            Arc::new(gated::GatedStore::new(
                Arc::new(engine),
                held,
                pg.round_workers(),
            ))
        }
    })
}

/// An engine opened bare, without group commit, caches or wake-ups: the bench's baseline
/// (`bench/baseline.rs`) runs the store's own statements (`sql::queue`) on it.
pub enum Bare {
    Sqlite(sqlite::Direct),
    Postgres(postgres::PgEngine),
}

impl Bare {
    pub async fn open(url: &DatabaseUrl, connections: u32) -> anyhow::Result<Bare> {
        Ok(match url {
            DatabaseUrl::Sqlite(path) => Bare::Sqlite(sqlite::Direct::open(path)?),
            DatabaseUrl::Postgres(url) => {
                let settings = postgres::PgSettings {
                    max_connections: connections.max(1),
                    ..Default::default()
                };
                Bare::Postgres(postgres::PgEngine::connect(url, &settings).await?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_name_their_engine_or_say_what_is_wrong() {
        assert_eq!(
            DatabaseUrl::parse("sqlite:///var/lib/leasegate/leasegate.db"),
            Ok(DatabaseUrl::Sqlite(
                "/var/lib/leasegate/leasegate.db".into()
            ))
        );
        let relative = DatabaseUrl::parse("sqlite:leasegate.db").unwrap();
        assert_eq!(relative.sqlite_dir(), Some(Path::new(".")));
        assert_eq!(
            DatabaseUrl::parse("sqlite:///var/lib/x.db")
                .unwrap()
                .sqlite_dir(),
            Some(Path::new("/var/lib"))
        );
        let pg = DatabaseUrl::parse("postgresql://u:secret@db/leasegate").unwrap();
        assert!(pg.is_shared() && pg.engine() == "postgres" && pg.sqlite_dir().is_none());
        let wrong = DatabaseUrl::parse("mysql://u:secret@db/x").unwrap_err();
        assert_eq!(wrong, DatabaseUrlError::Scheme("mysql".into()));
        assert!(!wrong.to_string().contains("secret"));
        assert_eq!(
            DatabaseUrl::parse("sqlite://"),
            Err(DatabaseUrlError::NoPath)
        );
        assert_eq!(
            DatabaseUrl::parse("sqlite::memory:"),
            Err(DatabaseUrlError::InMemory)
        );
        assert_eq!(
            DatabaseUrl::parse("sqlite://x.db?mode=ro"),
            Err(DatabaseUrlError::SqliteOptions("mode=ro".into()))
        );
    }
}

//! The service's API over its database: the `Store` trait, all that handlers hold of it.
//!
//! What its calls take and answer is `vocabulary.rs`; the one implementation is
//! `gated::GatedStore`, opened by `open::open`.

use super::signal::JobSignal;
use super::sql::buildkite::BuildkiteState;
use super::sql::runners::Followed;
use super::verdict_cache::GateRunner;
use super::vocabulary::*;
use crate::domain::audit::{Entry, Recorded};
use crate::domain::forge::{ForgeBinding, ForgeIdentity, ForgeRunner};
use crate::domain::github::registration::{
    Registration as GithubRegistration, State as GithubState,
};
use crate::domain::ids::{JobId, LeaseId, RegistrationId, RunnerId};
use crate::domain::image_set::ResolutionOutcome;
use crate::domain::job::{Job, JobEvent};
use crate::domain::lease::{Lease, LeaseCall};
use crate::domain::operator::{Operator, OperatorName};
use crate::domain::pool::{Pool, PoolSpec};
use crate::domain::pool_name::PoolName;
use crate::domain::retention::Horizons;
use crate::domain::runner::{Runner, RunnerSummary, StatusRules};
use crate::domain::time::Millis;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;

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

    /// `gate_runner` read from the database, and kept: for a verdict the cache may hold an
    /// older attestation for (one recorded by another replica, with the same facts).
    async fn gate_runner_now(&self, id: &RunnerId) -> StoreResult<Option<GateRunner>>;

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
    /// else the token's alone), and its runner, as the forge gate judges with it (from the
    /// same cache as `gate_runner`).
    async fn gate_forge_runner(
        &self,
        identity: &ForgeIdentity,
    ) -> StoreResult<Option<(RunnerId, ForgeBinding)>>;
    /// Notes that `binding` (exactly: as `gate_forge_runner` answered it for a fetch from
    /// `fetched`) asked for work at `now`.
    async fn note_forge_fetch(
        &self,
        fetched: &ForgeIdentity,
        binding: &ForgeIdentity,
        now: Millis,
    ) -> StoreResult<()>;
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

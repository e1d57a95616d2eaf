//! The one `Store`: an engine behind group commit and the gate's cache of its inputs.
//!
//! Every call is one piece of work over the engine (`sql/`), written in one transaction or
//! read over one connection. Around that, three things only:
//! - a round's request (`submit`, `claim_job`) joins the next group commit (`group_commit`);
//! - the gate's reads of a runner and its pool come from the cache (`verdict_cache`), and what
//!   a committed write says it `changed` is applied to that cache and to the long polls'
//!   wake-ups (`Held::apply`), the same list other replicas apply from PostgreSQL's `NOTIFY`;
//! - a write the database aborted for a conflict is run again (`retry`).

use super::engine::{Db, Engine, Work, WorkFuture};
use super::group_commit::{GroupCommit, RoundShape};
use super::held::Held;
use super::retry::retrying;
use super::signal::JobSignal;
use super::sql;
use super::verdict_cache::GateRunner;
use super::*;
use crate::domain::audit::{Entry, Recorded};
use crate::domain::buildkite::{AgentWatch, Pause};
use crate::domain::ejection::{Effect, JobEnd};
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
use crate::domain::timeline::PoolSample;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A statement function of `sql/` with its arguments: work an engine can run (and run again).
type Step<D, A, T> = for<'a> fn(&'a mut D, &'a A) -> WorkFuture<'a, T>;

fn step<D: Db + 'static, A, T>(args: A, f: Step<D, A, T>) -> Work<D, T>
where
    A: Send + Sync + 'static,
    T: Send + 'static,
{
    Box::new(move |db| Box::pin(async move { f(db, &args).await }))
}

/// `step`, then `entry` recorded in the same transaction when `done` says the step changed
/// something: a change is never committed without its author, nor an author without it.
fn audited_step<D: Db + 'static, A, T>(
    args: A,
    entry: Entry,
    done: fn(&T) -> bool,
    f: Step<D, A, T>,
) -> Work<D, T>
where
    A: Send + Sync + 'static,
    T: Send + 'static,
{
    Box::new(move |db| {
        Box::pin(async move {
            let value = f(db, &args).await?;
            if done(&value) {
                sql::audit::record(db, &entry).await?;
            }
            Ok(value)
        })
    })
}

/// The audit entry in the logs, once its change has committed.
fn log_audit(e: &Entry) {
    tracing::info!(
        target: "leasegate::audit",
        actor = %e.actor,
        action = e.action.as_str(),
        target_kind = e.action.target_kind().as_str(),
        target_id = %e.target,
        detail = e.detail.as_deref().unwrap_or(""),
        client = %e.client,
        "operator change"
    );
}

fn always<T>(_: &T) -> bool {
    true
}

fn yes(v: &bool) -> bool {
    *v
}

fn some<T>(v: &Option<T>) -> bool {
    v.is_some()
}

fn ok<T, E>(v: &Result<T, E>) -> bool {
    v.is_ok()
}

fn ok_some<T, E>(v: &Result<Option<T>, E>) -> bool {
    matches!(v, Ok(Some(_)))
}

fn followed(v: &Option<Followed>) -> bool {
    v.as_ref().is_some_and(|f| f.changed)
}

/// Runs `write` (a write, then the applying of what it changed) on a task of its own, so that
/// it ends as it would have had its caller waited: a request dropped while it waited (its
/// client went away) must not leave a committed write's changes unapplied, which would leave
/// the cache judging from what the write changed (a cordon, a revocation, a pool's images)
/// until the entry's time ran out. SQLite's writer runs a write it has queued whatever becomes
/// of its caller; on PostgreSQL the write now always ends rather than sometimes rolling back,
/// so an operator's action never half-happens with the timing of a client's timeout.
async fn to_the_end<T: Send + 'static>(
    write: impl Future<Output = StoreResult<T>> + Send + 'static,
) -> StoreResult<T> {
    use tracing::Instrument;
    // In the request's span, so that what the write logs (its audit line) still names it.
    tokio::spawn(write.instrument(tracing::Span::current()))
        .await
        .unwrap_or_else(|e| {
            Err(StoreError::Internal(format!(
                "a write's task ended before its answer: {e}"
            )))
        })
}

pub struct GatedStore<E: Engine> {
    engine: Arc<E>,
    rounds: GroupCommit,
    held: Held,
}

impl<E: Engine> GatedStore<E>
where
    E::Db: 'static,
{
    /// `held` is the one the engine's listener (if any) applies other replicas' changes to;
    /// `rounds` how the engine's rounds are written.
    pub fn new(engine: Arc<E>, held: Held, rounds: RoundShape) -> Self {
        let rounds = GroupCommit::start(engine.clone(), held.clone(), rounds);
        GatedStore {
            engine,
            rounds,
            held,
        }
    }

    /// Runs `f(args)` in one write transaction (again, on a conflict), then applies what it
    /// changed; to its end whatever becomes of the caller (`to_the_end`).
    async fn write<A, T>(&self, args: A, f: Step<E::Db, A, T>) -> StoreResult<T>
    where
        A: Clone + Send + Sync + 'static,
        T: Send + 'static,
    {
        let (engine, held) = (self.engine.clone(), self.held.clone());
        to_the_end(async move {
            let (value, changes) = retrying(|| engine.write(step(args.clone(), f))).await?;
            for change in &changes {
                held.apply(change);
            }
            Ok(value)
        })
        .await
    }

    /// `write`, recording `audit` with it when `done` says the write changed something, and
    /// logging it once committed.
    async fn audited<A, T>(
        &self,
        args: A,
        audit: &Entry,
        done: fn(&T) -> bool,
        f: Step<E::Db, A, T>,
    ) -> StoreResult<T>
    where
        A: Clone + Send + Sync + 'static,
        T: Send + 'static,
    {
        let (engine, held, audit) = (self.engine.clone(), self.held.clone(), audit.clone());
        to_the_end(async move {
            let (value, changes) =
                retrying(|| engine.write(audited_step(args.clone(), audit.clone(), done, f)))
                    .await?;
            for change in &changes {
                held.apply(change);
            }
            if done(&value) {
                log_audit(&audit);
            }
            Ok(value)
        })
        .await
    }

    async fn read<A, T>(&self, args: A, f: Step<E::Db, A, T>) -> StoreResult<T>
    where
        A: Clone + Send + Sync + 'static,
        T: Send + 'static,
    {
        // Made again, as a retried write is, when it is run again on another connection.
        self.engine.read(|| step(args.clone(), f)).await
    }

    /// `write` of a call that may refuse on its own (`Ok(Err(_))`, committed or discarded)
    /// beside the database's failure.
    async fn write_or<A, T, Refusal>(
        &self,
        args: A,
        f: Step<E::Db, A, Result<T, Refusal>>,
    ) -> Result<T, Refusal>
    where
        A: Clone + Send + Sync + 'static,
        T: Send + 'static,
        Refusal: From<StoreError> + Send + 'static,
    {
        self.write(args, f).await?
    }

    /// `audited`, for a call that may refuse on its own.
    async fn audited_or<A, T, Refusal>(
        &self,
        args: A,
        audit: &Entry,
        done: fn(&Result<T, Refusal>) -> bool,
        f: Step<E::Db, A, Result<T, Refusal>>,
    ) -> Result<T, Refusal>
    where
        A: Clone + Send + Sync + 'static,
        T: Send + 'static,
        Refusal: From<StoreError> + Send + 'static,
    {
        self.audited(args, audit, done, f).await?
    }
}

/// The `Store` over `GatedStore`. Most calls are one statement function of `sql/`, listed
/// below in one line each: `how fn name(args) [audit: done] -> answer = |db| statement;`.
/// Each argument is copied (`to_owned`) so that the work owns it (an engine may run it on a
/// thread of its own, and a retry runs it again), then lent back to the statement; `how` is
/// `read`, `write`, `audited` (with the audit entry, recorded when `done` says the write
/// changed something) or their `_or` forms (a refusal of the call's own beside the
/// database's failure). What is more than that is written out in the braces after them.
macro_rules! gated_store {
    (
        $(
            $how:ident fn $name:ident($($arg:ident: $ty:ty),*) $([$audit:ident: $done:expr])?
                -> $answer:ty = |$db:ident| $statement:expr;
        )*
        { $($by_hand:tt)* }
    ) => {
        #[async_trait]
        impl<E: Engine> Store for GatedStore<E>
        where
            E::Db: 'static,
        {
            $(
                async fn $name(&self, $($arg: $ty,)* $($audit: &Entry)?) -> $answer {
                    self.$how(
                        ($($arg.to_owned(),)*),
                        $($audit, $done,)?
                        |$db, ($($arg,)*)| Box::pin($statement),
                    )
                    .await
                }
            )*
            $($by_hand)*
        }
    };
}

gated_store! {
    audited fn put_pool(name: &PoolName, spec: PoolSpec, now: Millis) [audit: always]
        -> StoreResult<(Pool, bool)> = |db| sql::pools::put(db, name, spec.clone(), *now);
    audited fn replace_pool(name: &PoolName, spec: PoolSpec, base: &Pool, now: Millis)
        [audit: some] -> StoreResult<Option<Pool>>
        = |db| sql::pools::replace(db, name, spec.clone(), base, *now);
    audited_or fn delete_pool(name: &PoolName) [audit: ok] -> Result<(), PoolDeleteError>
        = |db| sql::pools::delete(db, name);
    read fn get_pool(name: &PoolName) -> StoreResult<Option<Pool>>
        = |db| sql::pools::get(db, name);
    read fn list_pools() -> StoreResult<Vec<Pool>> = |db| sql::pools::list(db);
    write fn claim_resolution(name: &PoolName, now: Millis, until: Millis)
        -> StoreResult<Option<Pool>>
        = |db| sql::pools::claim_resolution(db, name, *now, *until);
    write fn record_resolution(
        name: &PoolName,
        image_ref: &str,
        outcome: &ResolutionOutcome,
        now: Millis
    ) -> StoreResult<Option<Pool>>
        = |db| sql::pools::record_resolution(db, name, image_ref, outcome, *now);
    write fn record_image_resolutions(
        name: &PoolName,
        outcomes: &[(String, ResolutionOutcome)],
        now: Millis
    ) -> StoreResult<Option<Pool>>
        = |db| sql::pools::record_image_resolutions(db, name, outcomes, *now);
    read fn queue_depths() -> StoreResult<BTreeMap<PoolName, QueueDepth>>
        = |db| sql::jobs::queue_depths(db);

    audited fn create_registration_token(
        pool: &PoolName,
        token_hash: &str,
        expires_at: Millis,
        now: Millis
    ) [audit: yes] -> StoreResult<bool>
        = |db| sql::runners::create_registration_token(db, pool, token_hash, *expires_at, *now);
    write_or fn register_runner(token_hash: &str, runner: NewRunner, now: Millis)
        -> Result<Runner, RegisterError> = |db| sql::runners::register(db, token_hash, runner, *now);
    read fn get_runner(id: &RunnerId) -> StoreResult<Option<Runner>>
        = |db| sql::runners::get(db, id);
    read fn runners_by_id(ids: &[RunnerId]) -> StoreResult<Vec<Runner>>
        = |db| sql::runners::by_ids(db, ids);
    read fn runner_history(id: &RunnerId) -> StoreResult<RunnerHistory>
        = |db| sql::history::of(db, id);
    read fn refusal_counts_since(since: Millis) -> StoreResult<BTreeMap<RunnerId, i64>>
        = |db| sql::history::refusal_counts_since(db, *since);
    audited fn set_cordoned(id: &RunnerId, cordoned: bool) [audit: some]
        -> StoreResult<Option<Runner>> = |db| sql::runners::set_cordoned(db, id, *cordoned);
    audited fn revoke_runner(id: &RunnerId, now: Millis) [audit: some]
        -> StoreResult<Option<(Runner, Vec<EndedLease>)>> = |db| sql::leases::revoke(db, id, *now);
    read fn jti_seen(runner: &RunnerId, jti: &str, now: Millis) -> StoreResult<bool>
        = |db| sql::replay::seen(db, runner, jti, *now);

    write_or fn enqueue_job(job: NewJob, now: Millis) -> Result<(Job, bool), EnqueueError>
        = |db| sql::jobs::enqueue(db, job, *now);
    read fn job_by_idempotency_key(key: &str) -> StoreResult<Option<Job>>
        = |db| sql::jobs::by_idempotency_key(db, key);
    read fn get_job(id: &JobId) -> StoreResult<Option<(Job, Vec<JobEvent>)>>
        = |db| sql::jobs::get(db, id);
    write_or fn cancel_job(id: &JobId, now: Millis) -> Result<Option<Job>, CancelError>
        = |db| sql::leases::cancel(db, id, *now);
    write_or fn lease_call(
        lease_id: &LeaseId,
        token_hash: &str,
        call: &LeaseCall,
        now: Millis,
        rules: StatusRules
    ) -> Result<LeaseCallDone, LeaseCallFailure>
        = |db| sql::leases::call(db, lease_id, token_hash, call, *now, *rules);

    write fn forge_job_ended(
        key: &str,
        runner: &RunnerId,
        end: JobEnd,
        now: Millis,
        rules: StatusRules
    ) -> StoreResult<Option<(PoolName, Effect)>>
        = |db| sql::ejection::forge_job_ended(db, key, runner, *end, *now, *rules);
    write fn forge_job_taken(key: &str, runner: &RunnerId, now: Millis) -> StoreResult<()>
        = |db| sql::ejection::forge_job_taken(db, key, runner, *now);
    read fn forge_job_runner(key: &str) -> StoreResult<Option<RunnerId>>
        = |db| sql::ejection::forge_job_runner(db, key);
    audited_or fn set_forge_runners(runner: &RunnerId, wanted: &[ForgeRunner], now: Millis)
        [audit: ok_some] -> Result<Option<Runner>, BindError>
        = |db| sql::runners::set_forge_runners(db, runner, wanted, *now);
    audited fn follow_forge_runners(runner: &RunnerId, claimed: &[ForgeRunner], now: Millis)
        [audit: followed] -> StoreResult<Option<Followed>>
        = |db| sql::runners::follow_forge_runners(db, runner, claimed, *now);
    write fn record_rejection(runner: &RunnerId, code: &str, detail: &str, now: Millis)
        -> StoreResult<()> = |db| sql::runners::note_rejection(db, runner, code, detail, *now);

    write fn reserve_github_registration(reg: &GithubRegistration)
        -> StoreResult<Option<GithubRegistration>> = |db| sql::github::reserve(db, reg);
    write fn rename_github_registration(id: &RegistrationId, name: &str) -> StoreResult<()>
        = |db| sql::github::rename(db, id, name);
    write fn release_github_registration(id: &RegistrationId) -> StoreResult<()>
        = |db| sql::github::release(db, id);
    read fn outstanding_github_registrations() -> StoreResult<Vec<GithubRegistration>>
        = |db| sql::github::outstanding(db);

    read fn buildkite_state() -> StoreResult<BuildkiteState> = |db| sql::buildkite::state(db);
    write fn record_buildkite_pause(pause: &Pause) -> StoreResult<()>
        = |db| sql::buildkite::record_pause(db, pause);
    write fn record_buildkite_watch(watch: &AgentWatch) -> StoreResult<()>
        = |db| sql::buildkite::record_watch(db, watch);
    write fn forget_buildkite_watch(agent_name: &str) -> StoreResult<()>
        = |db| sql::buildkite::forget_watch(db, agent_name);

    write fn record_refusal(runner: &RunnerId, code: &str, detail: &str, now: Millis)
        -> StoreResult<()> = |db| sql::history::record_refusal(db, runner, code, detail, *now);

    audited fn create_page_session(session: &PageSession) [audit: always] -> StoreResult<()>
        = |db| sql::sessions::create(db, session);
    read fn page_session(token_hash: &str, now: Millis) -> StoreResult<Option<PageSession>>
        = |db| sql::sessions::get(db, token_hash, *now);
    read fn list_operator_tokens() -> StoreResult<Vec<OperatorToken>>
        = |db| sql::operators::list(db);
    audited fn delete_operator_token(name: &OperatorName) [audit: yes] -> StoreResult<bool>
        = |db| sql::operators::delete(db, name);
    read fn operator_by_token(token_hash: &str) -> StoreResult<Option<Operator>>
        = |db| sql::operators::by_hash(db, token_hash);

    read fn audit_trail(filter: &AuditFilter) -> StoreResult<Vec<Recorded>>
        = |db| sql::audit::list(db, filter);
    write fn claim_task(task: &str, now: Millis, until: Millis) -> StoreResult<bool>
        = |db| sql::retention::claim(db, task, *now, *until);
    write fn release_task(task: &str, until: Millis, now: Millis) -> StoreResult<()>
        = |db| sql::retention::release(db, task, *until, *now);
    write fn record_pool_samples(samples: &[PoolSample]) -> StoreResult<()>
        = |db| sql::samples::record(db, samples);
    read fn pool_samples(since: Millis) -> StoreResult<Vec<PoolSample>>
        = |db| sql::samples::since(db, *since);

    // The calls that are more than that, written out:
    {

    fn engine(&self) -> &'static str {
        self.engine.name()
    }

    fn job_signal(&self) -> &JobSignal {
        &self.held.signal
    }

    async fn ping(&self) -> StoreResult<()> {
        self.engine.ping().await
    }

    async fn runner_summaries(
        &self,
        pool: Option<&PoolName>,
        with_search: bool,
    ) -> StoreResult<Vec<RunnerSummary>> {
        self.read((pool.cloned(), with_search), |db, (pool, with_search)| {
            Box::pin(sql::runners::summaries(db, pool.as_ref(), *with_search))
        })
        .await
    }

    async fn submit(&self, item: RoundItem) -> StoreResult<RoundOutcome> {
        self.rounds.submit(item).await
    }

    async fn gate_runner(&self, id: &RunnerId) -> StoreResult<Option<GateRunner>> {
        if let Some(runner) = self.held.cache.runner(id) {
            return Ok(Some(runner));
        }
        self.gate_runner_now(id).await
    }

    async fn gate_runner_now(&self, id: &RunnerId) -> StoreResult<Option<GateRunner>> {
        let generation = self.held.cache.generation();
        let Some(runner) = self.get_runner(id).await? else {
            return Ok(None);
        };
        let runner = GateRunner::new(runner);
        self.held.cache.keep_runner(generation, &runner);
        Ok(Some(runner))
    }

    async fn gate_forge_runner(
        &self,
        identity: &ForgeIdentity,
    ) -> StoreResult<Option<(RunnerId, ForgeBinding)>> {
        if let Some(bound) = self.held.cache.binding(identity) {
            return Ok(bound);
        }
        let generation = self.held.cache.generation();
        let bound = self
            .read(identity.clone(), |db, identity| {
                Box::pin(sql::runners::forge_runner(db, identity))
            })
            .await?;
        self.held.cache.keep_binding(generation, identity, &bound);
        Ok(bound)
    }

    async fn note_forge_fetch(
        &self,
        fetched: &ForgeIdentity,
        binding: &ForgeIdentity,
        now: Millis,
    ) -> StoreResult<()> {
        self.write((binding.clone(), now), |db, (binding, now)| {
            Box::pin(sql::runners::note_forge_fetch(db, binding, *now))
        })
        .await?;
        self.held.cache.noted_fetch(fetched, now);
        Ok(())
    }

    async fn gate_pool(&self, name: &PoolName) -> StoreResult<Option<Pool>> {
        if let Some(pool) = self.held.cache.pool(name) {
            return Ok(Some(pool));
        }
        let generation = self.held.cache.generation();
        let pool = self.get_pool(name).await?;
        if let Some(p) = &pool {
            self.held.cache.keep_pool(generation, p);
        }
        Ok(pool)
    }

    async fn claim_job(&self, claim: &Claim) -> StoreResult<Option<(Lease, Job)>> {
        let item = RoundItem {
            attestation: None,
            claim: Some(claim.clone()),
        };
        Ok(self.rounds.submit(item).await?.granted)
    }

    async fn reinstate_runner(&self, id: &RunnerId, audit: &Entry) -> StoreResult<Option<Runner>> {
        let done = self
            .audited(
                id.clone(),
                audit,
                |v: &Option<(bool, Runner)>| matches!(v, Some((true, _))),
                |db, id| Box::pin(sql::ejection::reinstate(db, id)),
            )
            .await?;
        Ok(done.map(|(_, runner)| runner))
    }

    async fn record_github_registration(
        &self,
        reg: &GithubRegistration,
        prior: GithubState,
        audit: Option<&Entry>,
    ) -> StoreResult<bool> {
        let args = (reg.clone(), prior);
        let step: Step<E::Db, (GithubRegistration, GithubState), bool> =
            |db, (reg, prior)| Box::pin(sql::github::update(db, reg, *prior));
        match audit {
            Some(audit) => self.audited(args, audit, yes, step).await,
            None => self.write(args, step).await,
        }
    }

    async fn end_page_session(&self, token_hash: &str, audit: &Entry) -> StoreResult<()> {
        self.audited(
            token_hash.to_string(),
            audit,
            |ended| *ended,
            |db, hash| Box::pin(sql::sessions::end(db, hash)),
        )
        .await?;
        Ok(())
    }

    async fn create_operator_token(
        &self,
        operator: &Operator,
        token_hash: &str,
        audit: &Entry,
    ) -> Result<OperatorToken, TokenError> {
        let args = (
            operator.clone(),
            token_hash.to_string(),
            audit.actor.clone(),
            audit.at,
        );
        self.audited_or(args, audit, ok, |db, (operator, hash, by, now)| {
            Box::pin(sql::operators::create(db, operator, hash, by, *now))
        })
        .await
    }

    async fn record_audit(&self, entry: &Entry) -> StoreResult<()> {
        self.audited((), entry, always, |_, ()| Box::pin(async { Ok(()) }))
            .await
    }

    async fn prune(&self, horizons: &Horizons, max_batches: u32) -> StoreResult<PruneReport> {
        let mut report = PruneReport::default();
        let batch = sql::retention::BATCH as u64;
        for _ in 0..max_batches {
            let jobs = self
                .write(*horizons, |db, h| {
                    Box::pin(sql::retention::jobs_batch(db, h))
                })
                .await?;
            let more = jobs.kinds.get("jobs").copied().unwrap_or(0) >= batch;
            report.merge(jobs);
            if !more {
                break;
            }
        }
        for _ in 0..max_batches {
            let history = self
                .write(*horizons, |db, h| {
                    Box::pin(sql::retention::history_batch(db, h))
                })
                .await?;
            let more = history.kinds.values().any(|n| *n >= batch);
            report.merge(history);
            if !more {
                break;
            }
        }
        Ok(report)
    }

    async fn sweep(&self, now: Millis) -> StoreResult<SweepReport> {
        let mut report = SweepReport::default();
        loop {
            let (ended, full) = self
                .write(now, |db, now| Box::pin(sql::leases::sweep_batch(db, *now)))
                .await?;
            let progressed = !ended.is_empty();
            report.leases_expired += ended.len() as u64;
            report.ended.extend(ended);
            // A short batch was the last; a batch whose fences all failed would only select
            // the same rows again.
            if !full || !progressed {
                break;
            }
        }
        // By the clock rounds are planned by, when it is ahead (a clock stepped back).
        let forgetting = now.max(crate::domain::record::forgetting_now());
        report.jtis_purged = self
            .write(forgetting, |db, now| Box::pin(sql::replay::purge(db, *now)))
            .await?;
        self.write(now, |db, now| Box::pin(sql::sessions::purge(db, *now)))
            .await?;
        Ok(report)
    }
}
}

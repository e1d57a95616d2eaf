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
use super::group_commit::GroupCommit;
use super::held::Held;
use super::retry::retrying;
use super::signal::JobSignal;
use super::sql;
use super::verdict_cache::GateRunner;
use super::*;
use crate::domain::audit::{Entry, Recorded};
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
    /// `round_lanes` how many rounds may be written at once.
    pub fn new(engine: Arc<E>, held: Held, round_lanes: usize) -> Self {
        let rounds = GroupCommit::start(engine.clone(), held.clone(), round_lanes);
        GatedStore {
            engine,
            rounds,
            held,
        }
    }

    /// Runs `f(args)` in one write transaction (again, on a conflict), then applies what it
    /// changed.
    async fn write<A, T>(&self, args: A, f: Step<E::Db, A, T>) -> StoreResult<T>
    where
        A: Clone + Send + Sync + 'static,
        T: Send + 'static,
    {
        let (value, changes) = retrying(|| self.engine.write(step(args.clone(), f))).await?;
        for change in &changes {
            self.held.apply(change);
        }
        Ok(value)
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
        let (value, changes) = retrying(|| {
            self.engine
                .write(audited_step(args.clone(), audit.clone(), done, f))
        })
        .await?;
        for change in &changes {
            self.held.apply(change);
        }
        if done(&value) {
            log_audit(audit);
        }
        Ok(value)
    }

    async fn read<A, T>(&self, args: A, f: Step<E::Db, A, T>) -> StoreResult<T>
    where
        A: Send + Sync + 'static,
        T: Send + 'static,
    {
        self.engine.read(step(args, f)).await
    }
}

/// A write's own refusal (`Ok(Err(_))`, committed or discarded) or the database's failure.
fn flatten<T, E: From<StoreError>>(r: StoreResult<Result<T, E>>) -> Result<T, E> {
    r?
}

#[async_trait]
impl<E: Engine> Store for GatedStore<E>
where
    E::Db: 'static,
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

    async fn put_pool(
        &self,
        name: &PoolName,
        spec: PoolSpec,
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<(Pool, bool)> {
        self.audited(
            (name.clone(), spec, now),
            audit,
            always,
            |db, (name, spec, now)| Box::pin(sql::pools::put(db, name, spec.clone(), *now)),
        )
        .await
    }

    async fn replace_pool(
        &self,
        name: &PoolName,
        spec: PoolSpec,
        base: &Pool,
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<Option<Pool>> {
        self.audited(
            (name.clone(), spec, base.clone(), now),
            audit,
            some,
            |db, (name, spec, base, now)| {
                Box::pin(sql::pools::replace(db, name, spec.clone(), base, *now))
            },
        )
        .await
    }

    async fn delete_pool(&self, name: &PoolName, audit: &Entry) -> Result<(), PoolDeleteError> {
        flatten(
            self.audited(name.clone(), audit, ok, |db, name| {
                Box::pin(sql::pools::delete(db, name))
            })
            .await,
        )
    }

    async fn get_pool(&self, name: &PoolName) -> StoreResult<Option<Pool>> {
        self.read(name.clone(), |db, name| Box::pin(sql::pools::get(db, name)))
            .await
    }

    async fn list_pools(&self) -> StoreResult<Vec<Pool>> {
        self.read((), |db, ()| Box::pin(sql::pools::list(db))).await
    }

    async fn claim_resolution(
        &self,
        name: &PoolName,
        now: Millis,
        until: Millis,
    ) -> StoreResult<Option<Pool>> {
        self.write((name.clone(), now, until), |db, (name, now, until)| {
            Box::pin(sql::pools::claim_resolution(db, name, *now, *until))
        })
        .await
    }

    async fn record_resolution(
        &self,
        name: &PoolName,
        image_ref: &str,
        outcome: &ResolutionOutcome,
        now: Millis,
    ) -> StoreResult<Option<Pool>> {
        let args = (name.clone(), image_ref.to_string(), outcome.clone(), now);
        self.write(args, |db, (name, image_ref, outcome, now)| {
            Box::pin(sql::pools::record_resolution(
                db, name, image_ref, outcome, *now,
            ))
        })
        .await
    }

    async fn record_image_resolutions(
        &self,
        name: &PoolName,
        outcomes: &[(String, ResolutionOutcome)],
        now: Millis,
    ) -> StoreResult<Option<Pool>> {
        let args = (name.clone(), outcomes.to_vec(), now);
        self.write(args, |db, (name, outcomes, now)| {
            Box::pin(sql::pools::record_image_resolutions(
                db, name, outcomes, *now,
            ))
        })
        .await
    }

    async fn queue_depths(&self) -> StoreResult<BTreeMap<PoolName, QueueDepth>> {
        self.read((), |db, ()| Box::pin(sql::jobs::queue_depths(db)))
            .await
    }

    async fn create_registration_token(
        &self,
        pool: &PoolName,
        token_hash: &str,
        expires_at: Millis,
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<bool> {
        let args = (pool.clone(), token_hash.to_string(), expires_at, now);
        self.audited(args, audit, yes, |db, (pool, hash, expires_at, now)| {
            Box::pin(sql::runners::create_registration_token(
                db,
                pool,
                hash,
                *expires_at,
                *now,
            ))
        })
        .await
    }

    async fn register_runner(
        &self,
        token_hash: &str,
        runner: NewRunner,
        now: Millis,
    ) -> Result<Runner, RegisterError> {
        let args = (token_hash.to_string(), runner, now);
        flatten(
            self.write(args, |db, (hash, runner, now)| {
                Box::pin(sql::runners::register(db, hash, runner, *now))
            })
            .await,
        )
    }

    async fn get_runner(&self, id: &RunnerId) -> StoreResult<Option<Runner>> {
        self.read(id.clone(), |db, id| Box::pin(sql::runners::get(db, id)))
            .await
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

    async fn runners_by_id(&self, ids: &[RunnerId]) -> StoreResult<Vec<Runner>> {
        self.read(ids.to_vec(), |db, ids| {
            Box::pin(sql::runners::by_ids(db, ids))
        })
        .await
    }

    async fn runner_history(&self, id: &RunnerId) -> StoreResult<RunnerHistory> {
        self.read(id.clone(), |db, id| Box::pin(sql::history::of(db, id)))
            .await
    }

    async fn refusal_counts_since(&self, since: Millis) -> StoreResult<BTreeMap<RunnerId, i64>> {
        self.read(since, |db, since| {
            Box::pin(sql::history::refusal_counts_since(db, *since))
        })
        .await
    }

    async fn set_cordoned(
        &self,
        id: &RunnerId,
        cordoned: bool,
        audit: &Entry,
    ) -> StoreResult<Option<Runner>> {
        self.audited((id.clone(), cordoned), audit, some, |db, (id, cordoned)| {
            Box::pin(sql::runners::set_cordoned(db, id, *cordoned))
        })
        .await
    }

    async fn revoke_runner(
        &self,
        id: &RunnerId,
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<Option<(Runner, Vec<EndedLease>)>> {
        self.audited((id.clone(), now), audit, some, |db, (id, now)| {
            Box::pin(sql::leases::revoke(db, id, *now))
        })
        .await
    }

    async fn jti_seen(&self, runner: &RunnerId, jti: &str, now: Millis) -> StoreResult<bool> {
        self.read(
            (runner.clone(), jti.to_string(), now),
            |db, (runner, jti, now)| Box::pin(sql::replay::seen(db, runner, jti, *now)),
        )
        .await
    }

    async fn submit(&self, item: RoundItem) -> StoreResult<RoundOutcome> {
        self.rounds.submit(item).await
    }

    async fn gate_runner(&self, id: &RunnerId) -> StoreResult<Option<GateRunner>> {
        if let Some(runner) = self.held.cache.runner(id) {
            return Ok(Some(runner));
        }
        let generation = self.held.cache.generation();
        let Some(runner) = self.get_runner(id).await? else {
            return Ok(None);
        };
        let runner = GateRunner::new(runner);
        self.held.cache.keep_runner(generation, &runner);
        Ok(Some(runner))
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

    async fn enqueue_job(&self, job: NewJob, now: Millis) -> Result<(Job, bool), EnqueueError> {
        flatten(
            self.write((job, now), |db, (job, now)| {
                Box::pin(sql::jobs::enqueue(db, job, *now))
            })
            .await,
        )
    }

    async fn job_by_idempotency_key(&self, key: &str) -> StoreResult<Option<Job>> {
        self.read(key.to_string(), |db, key| {
            Box::pin(sql::jobs::by_idempotency_key(db, key))
        })
        .await
    }

    async fn get_job(&self, id: &JobId) -> StoreResult<Option<(Job, Vec<JobEvent>)>> {
        self.read(id.clone(), |db, id| Box::pin(sql::jobs::get(db, id)))
            .await
    }

    async fn cancel_job(&self, id: &JobId, now: Millis) -> Result<Option<Job>, CancelError> {
        flatten(
            self.write((id.clone(), now), |db, (id, now)| {
                Box::pin(sql::leases::cancel(db, id, *now))
            })
            .await,
        )
    }

    async fn claim_job(&self, claim: &Claim) -> StoreResult<Option<(Lease, Job)>> {
        let item = RoundItem {
            attestation: None,
            claim: Some(claim.clone()),
        };
        Ok(self.rounds.submit(item).await?.granted)
    }

    async fn lease_call(
        &self,
        lease_id: &LeaseId,
        token_hash: &str,
        call: &LeaseCall,
        now: Millis,
        rules: StatusRules,
    ) -> Result<LeaseCallDone, LeaseCallFailure> {
        let args = (
            lease_id.clone(),
            token_hash.to_string(),
            call.clone(),
            now,
            rules,
        );
        flatten(
            self.write(args, |db, (lease_id, hash, call, now, rules)| {
                Box::pin(sql::leases::call(db, lease_id, hash, call, *now, *rules))
            })
            .await,
        )
    }

    async fn forge_job_ended(
        &self,
        key: &str,
        runner: &RunnerId,
        end: JobEnd,
        now: Millis,
        rules: StatusRules,
    ) -> StoreResult<Option<(PoolName, Effect)>> {
        let args = (key.to_string(), runner.clone(), end, now, rules);
        self.write(args, |db, (key, runner, end, now, rules)| {
            Box::pin(sql::ejection::forge_job_ended(
                db, key, runner, *end, *now, *rules,
            ))
        })
        .await
    }

    async fn forge_job_taken(&self, key: &str, runner: &RunnerId, now: Millis) -> StoreResult<()> {
        let args = (key.to_string(), runner.clone(), now);
        self.write(args, |db, (key, runner, now)| {
            Box::pin(sql::ejection::forge_job_taken(db, key, runner, *now))
        })
        .await
    }

    async fn forge_job_runner(&self, key: &str) -> StoreResult<Option<RunnerId>> {
        self.read(key.to_string(), |db, key| {
            Box::pin(sql::ejection::forge_job_runner(db, key))
        })
        .await
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

    async fn set_forge_runners(
        &self,
        runner: &RunnerId,
        wanted: &[ForgeRunner],
        now: Millis,
        audit: &Entry,
    ) -> Result<Option<Runner>, BindError> {
        let args = (runner.clone(), wanted.to_vec(), now);
        flatten(
            self.audited(args, audit, ok_some, |db, (runner, identities, now)| {
                Box::pin(sql::runners::set_forge_runners(
                    db, runner, identities, *now,
                ))
            })
            .await,
        )
    }

    async fn follow_forge_runners(
        &self,
        runner: &RunnerId,
        claimed: &[ForgeRunner],
        now: Millis,
        audit: &Entry,
    ) -> StoreResult<Option<Followed>> {
        let args = (runner.clone(), claimed.to_vec(), now);
        self.audited(args, audit, followed, |db, (runner, claimed, now)| {
            Box::pin(sql::runners::follow_forge_runners(
                db, runner, claimed, *now,
            ))
        })
        .await
    }

    async fn forge_runner(
        &self,
        identity: &ForgeIdentity,
    ) -> StoreResult<Option<(RunnerId, ForgeBinding)>> {
        self.read(identity.clone(), |db, identity| {
            Box::pin(sql::runners::forge_runner(db, identity))
        })
        .await
    }

    async fn note_forge_fetch(&self, identity: &ForgeIdentity, now: Millis) -> StoreResult<()> {
        self.write((identity.clone(), now), |db, (identity, now)| {
            Box::pin(sql::runners::note_forge_fetch(db, identity, *now))
        })
        .await
    }

    async fn record_rejection(
        &self,
        runner: &RunnerId,
        code: &str,
        detail: &str,
        now: Millis,
    ) -> StoreResult<()> {
        let args = (runner.clone(), code.to_string(), detail.to_string(), now);
        self.write(args, |db, (runner, code, detail, now)| {
            Box::pin(sql::runners::note_rejection(db, runner, code, detail, *now))
        })
        .await
    }

    async fn reserve_github_registration(
        &self,
        reg: &GithubRegistration,
    ) -> StoreResult<Option<GithubRegistration>> {
        self.write(reg.clone(), |db, reg| {
            Box::pin(sql::github::reserve(db, reg))
        })
        .await
    }

    async fn rename_github_registration(&self, id: &RegistrationId, name: &str) -> StoreResult<()> {
        self.write((id.clone(), name.to_string()), |db, (id, name)| {
            Box::pin(sql::github::rename(db, id, name))
        })
        .await
    }

    async fn release_github_registration(&self, id: &RegistrationId) -> StoreResult<()> {
        self.write(id.clone(), |db, id| Box::pin(sql::github::release(db, id)))
            .await
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

    async fn outstanding_github_registrations(&self) -> StoreResult<Vec<GithubRegistration>> {
        self.read((), |db, ()| Box::pin(sql::github::outstanding(db)))
            .await
    }

    async fn buildkite_state(&self) -> StoreResult<BuildkiteState> {
        self.read((), |db, ()| Box::pin(sql::buildkite::state(db)))
            .await
    }

    async fn record_buildkite_pause(
        &self,
        pause: &crate::domain::buildkite::Pause,
    ) -> StoreResult<()> {
        self.write(pause.clone(), |db, pause| {
            Box::pin(sql::buildkite::record_pause(db, pause))
        })
        .await
    }

    async fn record_buildkite_watch(
        &self,
        watch: &crate::domain::buildkite::AgentWatch,
    ) -> StoreResult<()> {
        self.write(watch.clone(), |db, watch| {
            Box::pin(sql::buildkite::record_watch(db, watch))
        })
        .await
    }

    async fn forget_buildkite_watch(&self, agent_name: &str) -> StoreResult<()> {
        self.write(agent_name.to_string(), |db, name| {
            Box::pin(sql::buildkite::forget_watch(db, name))
        })
        .await
    }

    async fn record_refusal(
        &self,
        runner: &RunnerId,
        code: &str,
        detail: &str,
        now: Millis,
    ) -> StoreResult<()> {
        let args = (runner.clone(), code.to_string(), detail.to_string(), now);
        self.write(args, |db, (runner, code, detail, now)| {
            Box::pin(sql::history::record_refusal(db, runner, code, detail, *now))
        })
        .await
    }

    async fn create_page_session(&self, session: &PageSession, audit: &Entry) -> StoreResult<()> {
        self.audited(session.clone(), audit, always, |db, session| {
            Box::pin(sql::sessions::create(db, session))
        })
        .await
    }

    async fn page_session(
        &self,
        token_hash: &str,
        now: Millis,
    ) -> StoreResult<Option<PageSession>> {
        self.read((token_hash.to_string(), now), |db, (hash, now)| {
            Box::pin(sql::sessions::get(db, hash, *now))
        })
        .await
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
        flatten(
            self.audited(args, audit, ok, |db, (operator, hash, by, now)| {
                Box::pin(sql::operators::create(db, operator, hash, by, *now))
            })
            .await,
        )
    }

    async fn list_operator_tokens(&self) -> StoreResult<Vec<OperatorToken>> {
        self.read((), |db, ()| Box::pin(sql::operators::list(db)))
            .await
    }

    async fn delete_operator_token(&self, name: &OperatorName, audit: &Entry) -> StoreResult<bool> {
        self.audited(
            name.clone(),
            audit,
            |deleted| *deleted,
            |db, name| Box::pin(sql::operators::delete(db, name)),
        )
        .await
    }

    async fn operator_by_token(&self, token_hash: &str) -> StoreResult<Option<Operator>> {
        self.read(token_hash.to_string(), |db, hash| {
            Box::pin(sql::operators::by_hash(db, hash))
        })
        .await
    }

    async fn record_audit(&self, entry: &Entry) -> StoreResult<()> {
        self.audited((), entry, always, |_, ()| Box::pin(async { Ok(()) }))
            .await
    }

    async fn audit_trail(&self, filter: &AuditFilter) -> StoreResult<Vec<Recorded>> {
        self.read(filter.clone(), |db, filter| {
            Box::pin(sql::audit::list(db, filter))
        })
        .await
    }

    async fn claim_task(&self, task: &str, now: Millis, until: Millis) -> StoreResult<bool> {
        self.write((task.to_string(), now, until), |db, (task, now, until)| {
            Box::pin(sql::retention::claim(db, task, *now, *until))
        })
        .await
    }

    async fn release_task(&self, task: &str, until: Millis, now: Millis) -> StoreResult<()> {
        self.write((task.to_string(), until, now), |db, (task, until, now)| {
            Box::pin(sql::retention::release(db, task, *until, *now))
        })
        .await
    }

    async fn record_pool_samples(
        &self,
        samples: &[crate::domain::timeline::PoolSample],
    ) -> StoreResult<()> {
        self.write(samples.to_vec(), |db, samples| {
            Box::pin(sql::samples::record(db, samples))
        })
        .await
    }

    async fn pool_samples(
        &self,
        since: Millis,
    ) -> StoreResult<Vec<crate::domain::timeline::PoolSample>> {
        self.read(since, |db, since| Box::pin(sql::samples::since(db, *since)))
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
        report.jtis_purged = self
            .write(now, |db, now| Box::pin(sql::replay::purge(db, *now)))
            .await?;
        self.write(now, |db, now| Box::pin(sql::sessions::purge(db, *now)))
            .await?;
        Ok(report)
    }
}

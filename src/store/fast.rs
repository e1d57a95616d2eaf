//! The store the service runs on: an engine behind group commit and the verdict-input cache.
//!
//! Everything passes straight through to the engine except four things: a round's request
//! (`submit`) joins the next group commit; the gate's reads of a runner and its pool come from
//! the cache; the writes that change those inputs forget them from the cache once they have
//! committed; and a write the database aborted for a conflict is tried again (`retry`). The engines send the same changes to other replicas themselves (PostgreSQL
//! `NOTIFY`), inside the writing transaction.

use super::group_commit::GroupCommit;
use super::retry::retrying;
use super::verdict_cache::VerdictCache;
use super::*;
use crate::domain::lease::LeaseCall;

pub struct FastStore {
    engine: DynStore,
    rounds: GroupCommit,
    cache: VerdictCache,
}

impl FastStore {
    /// `cache` is the one the engine's change feed (if any) forgets entries from.
    pub fn new(engine: DynStore, cache: VerdictCache, round_workers: usize) -> Self {
        let rounds = GroupCommit::start(engine.clone(), round_workers);
        FastStore {
            engine,
            rounds,
            cache,
        }
    }
}

#[async_trait]
impl Store for FastStore {
    fn engine(&self) -> &'static str {
        self.engine.engine()
    }

    fn job_signal(&self) -> &JobSignal {
        self.engine.job_signal()
    }

    async fn ping(&self) -> StoreResult<()> {
        self.engine.ping().await
    }

    async fn put_pool(
        &self,
        name: &PoolName,
        spec: PoolSpec,
        now: Millis,
    ) -> StoreResult<(Pool, bool)> {
        let result = retrying(|| self.engine.put_pool(name, spec.clone(), now)).await;
        self.cache.forget_pool(name);
        result
    }

    async fn get_pool(&self, name: &PoolName) -> StoreResult<Option<Pool>> {
        self.engine.get_pool(name).await
    }

    async fn list_pools(&self) -> StoreResult<Vec<Pool>> {
        self.engine.list_pools().await
    }

    async fn claim_resolution(
        &self,
        name: &PoolName,
        now: Millis,
        until: Millis,
    ) -> StoreResult<Option<Pool>> {
        retrying(|| self.engine.claim_resolution(name, now, until)).await
    }

    async fn record_resolution(
        &self,
        name: &PoolName,
        image_ref: &str,
        outcome: &ResolutionOutcome,
        now: Millis,
    ) -> StoreResult<Option<Pool>> {
        let result =
            retrying(|| self.engine.record_resolution(name, image_ref, outcome, now)).await;
        self.cache.forget_pool(name);
        result
    }

    async fn queue_depths(&self) -> StoreResult<BTreeMap<PoolName, QueueDepth>> {
        self.engine.queue_depths().await
    }

    async fn create_registration_token(
        &self,
        pool: &PoolName,
        token_hash: &str,
        expires_at: Millis,
        now: Millis,
    ) -> StoreResult<()> {
        retrying(|| {
            self.engine
                .create_registration_token(pool, token_hash, expires_at, now)
        })
        .await
    }

    async fn register_runner(
        &self,
        token_hash: &str,
        runner: NewRunner,
        now: Millis,
    ) -> Result<Runner, RegisterError> {
        retrying(|| self.engine.register_runner(token_hash, runner.clone(), now)).await
    }

    async fn get_runner(&self, id: &RunnerId) -> StoreResult<Option<Runner>> {
        self.engine.get_runner(id).await
    }

    async fn list_runners(&self, pool: Option<&PoolName>) -> StoreResult<Vec<Runner>> {
        self.engine.list_runners(pool).await
    }

    async fn runner_history(&self, id: &RunnerId) -> StoreResult<RunnerHistory> {
        self.engine.runner_history(id).await
    }

    async fn refusal_counts_since(&self, since: Millis) -> StoreResult<BTreeMap<RunnerId, i64>> {
        self.engine.refusal_counts_since(since).await
    }

    async fn set_cordoned(
        &self,
        id: &RunnerId,
        cordoned: bool,
        now: Millis,
    ) -> StoreResult<Option<Runner>> {
        let result = retrying(|| self.engine.set_cordoned(id, cordoned, now)).await;
        self.cache.forget_runner(id);
        result
    }

    async fn revoke_runner(
        &self,
        id: &RunnerId,
        now: Millis,
    ) -> StoreResult<Option<(Runner, Vec<EndedLease>)>> {
        let result = retrying(|| self.engine.revoke_runner(id, now)).await;
        self.cache.forget_runner(id);
        result
    }

    async fn jti_seen(&self, runner: &RunnerId, jti: &str) -> StoreResult<bool> {
        self.engine.jti_seen(runner, jti).await
    }

    async fn write_round(&self, items: &[RoundItem]) -> RoundResult {
        self.engine.write_round(items).await
    }

    async fn submit(&self, item: RoundItem) -> StoreResult<RoundOutcome> {
        self.rounds.submit(item).await
    }

    async fn gate_runner(&self, id: &RunnerId) -> StoreResult<Option<Runner>> {
        if let Some(runner) = self.cache.runner(id) {
            return Ok(Some(runner));
        }
        let generation = self.cache.generation();
        let runner = self.engine.get_runner(id).await?;
        if let Some(r) = &runner {
            self.cache.keep_runner(generation, r);
        }
        Ok(runner)
    }

    async fn gate_pool(&self, name: &PoolName) -> StoreResult<Option<Pool>> {
        if let Some(pool) = self.cache.pool(name) {
            return Ok(Some(pool));
        }
        let generation = self.cache.generation();
        let pool = self.engine.get_pool(name).await?;
        if let Some(p) = &pool {
            self.cache.keep_pool(generation, p);
        }
        Ok(pool)
    }

    async fn enqueue_job(&self, job: NewJob, now: Millis) -> Result<(Job, bool), EnqueueError> {
        retrying(|| self.engine.enqueue_job(job.clone(), now)).await
    }

    async fn job_by_idempotency_key(&self, key: &str) -> StoreResult<Option<Job>> {
        self.engine.job_by_idempotency_key(key).await
    }

    async fn get_job(&self, id: &JobId) -> StoreResult<Option<(Job, Vec<JobEvent>)>> {
        self.engine.get_job(id).await
    }

    async fn cancel_job(&self, id: &JobId, now: Millis) -> Result<Option<Job>, CancelError> {
        retrying(|| self.engine.cancel_job(id, now)).await
    }

    async fn lease_call(
        &self,
        lease_id: &LeaseId,
        token_hash: &str,
        call: &LeaseCall,
        now: Millis,
    ) -> Result<(Lease, Job), LeaseCallFailure> {
        let result = retrying(|| self.engine.lease_call(lease_id, token_hash, call, now)).await;
        // Abandoning a lease quarantines its runner.
        if let (Ok((lease, _)), LeaseCall::Abandon { .. }) = (&result, call) {
            self.cache.forget_runner(&lease.runner_id);
        }
        result
    }

    async fn set_forge_runners(
        &self,
        runner: &RunnerId,
        identities: &[ForgeIdentity],
        now: Millis,
    ) -> Result<Option<Runner>, BindError> {
        retrying(|| self.engine.set_forge_runners(runner, identities, now)).await
    }

    async fn forge_runner(
        &self,
        identity: &ForgeIdentity,
    ) -> StoreResult<Option<(RunnerId, ForgeBinding)>> {
        self.engine.forge_runner(identity).await
    }

    async fn note_forge_fetch(&self, identity: &ForgeIdentity, now: Millis) -> StoreResult<()> {
        retrying(|| self.engine.note_forge_fetch(identity, now)).await
    }

    async fn record_refusal(
        &self,
        runner: &RunnerId,
        code: &str,
        detail: &str,
        now: Millis,
    ) -> StoreResult<()> {
        retrying(|| self.engine.record_refusal(runner, code, detail, now)).await
    }

    async fn create_page_session(&self, session: &PageSession) -> StoreResult<()> {
        retrying(|| self.engine.create_page_session(session)).await
    }

    async fn page_session(
        &self,
        token_hash: &str,
        now: Millis,
    ) -> StoreResult<Option<PageSession>> {
        self.engine.page_session(token_hash, now).await
    }

    async fn end_page_session(&self, token_hash: &str) -> StoreResult<()> {
        retrying(|| self.engine.end_page_session(token_hash)).await
    }

    async fn sweep(&self, now: Millis) -> StoreResult<SweepReport> {
        retrying(|| self.engine.sweep(now)).await
    }
}

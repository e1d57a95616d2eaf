//! The body of the `Store` implementation, written once and instantiated per engine.
//!
//! Both engines speak nearly the same SQL (`$n` parameters, `ON CONFLICT`, `RETURNING`, partial
//! indexes). What differs is passed in as literals (row locks, which only PostgreSQL has) and
//! as a few inherent methods each engine defines: `begin` (SQLite begins `IMMEDIATE`, so a
//! transaction that reads then writes never fails with `SQLITE_BUSY_SNAPSHOT`), `reader`, and
//! `announce_job` (in-process wake-up for SQLite, `NOTIFY` for PostgreSQL). A macro rather than
//! generics over `sqlx::Database`: the bounds that generic sqlx code needs would drown the SQL.

/// Columns of a runner joined with its newest live lease, for the runner views. A runner may
/// hold several live leases (nothing stops it leasing again), but it is one row here.
macro_rules! runner_select {
    () => {
        "SELECT r.*, l.id AS lease_id, l.job_id AS lease_job_id, l.state AS lease_state, \
         l.expires_at AS lease_expires_at \
         FROM runners r LEFT JOIN leases l ON l.id = (SELECT id FROM leases \
         WHERE runner_id = r.id AND state IN ('leased', 'running') ORDER BY granted_at DESC, id DESC LIMIT 1) "
    };
}
pub(crate) use runner_select;

/// The claim's choice of job, the pool's oldest queued one, as text: for plan tests and the
/// raw-claim baseline.
pub const CLAIM_CANDIDATE_SQL: &str = concat!(super::round_sql::queued_in_order!("$3"), " LIMIT 1");

macro_rules! impl_sql_store {
    (
        store: $store:ty,
        db: $db:ty,
        engine: $engine:literal,
        row_lock: $row_lock:literal,
        claim_lock: $claim_lock:literal
    ) => {
        use $crate::domain::forge::{ForgeBinding, ForgeIdentity};
        use $crate::domain::ids::{JobId, LeaseId, RunnerId};
        use $crate::domain::job::{EventKind, Job, JobEvent, JobState};
        use $crate::domain::lease::{self as lease_rules, EndCause, LeaseCall, LeaseState, Snapshot, Transition};
        use $crate::domain::pool::{Pool, PoolName, PoolSpec, ResolutionOutcome};
        use $crate::domain::runner::Runner;
        use $crate::domain::time::Millis;
        use $crate::store::rows::{Decoders, digests_json, get};
        use $crate::store::sql_store::runner_select;
        use $crate::store::*;
        use $crate::store::signal::WAKE_ALL;
        use std::collections::BTreeMap;

        type Tx = sqlx::Transaction<'static, $db>;

        /// One line of a job's story, as written.
        struct Event<'a> {
            kind: EventKind,
            runner_id: Option<&'a RunnerId>,
            lease_id: Option<&'a LeaseId>,
            reason: Option<&'a str>,
            detail: Option<&'a str>,
        }

        impl<'a> Event<'a> {
            fn new(kind: EventKind) -> Self {
                Event { kind, runner_id: None, lease_id: None, reason: None, detail: None }
            }

            fn by(mut self, runner_id: &'a RunnerId, lease_id: &'a LeaseId) -> Self {
                self.runner_id = Some(runner_id);
                self.lease_id = Some(lease_id);
                self
            }
        }

        async fn add_event(tx: &mut Tx, job_id: &JobId, at: Millis, e: Event<'_>) -> StoreResult<()> {
            sqlx::query(
                "INSERT INTO job_events (job_id, at, kind, runner_id, lease_id, reason, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(job_id.as_str())
            .bind(at.0)
            .bind(e.kind.as_str())
            .bind(e.runner_id.map(|r| r.as_str().to_string()))
            .bind(e.lease_id.map(|l| l.as_str().to_string()))
            .bind(e.reason)
            .bind(e.detail)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        async fn load_job(tx: &mut Tx, id: &JobId) -> StoreResult<Option<Job>> {
            let row = sqlx::query(concat!("SELECT * FROM jobs WHERE id = $1", $row_lock))
                .bind(id.as_str())
                .fetch_optional(&mut **tx)
                .await?;
            row.map(|r| r.job()).transpose()
        }

        async fn load_lease(tx: &mut Tx, id: &LeaseId) -> StoreResult<Option<(Lease, String)>> {
            let row = sqlx::query(concat!("SELECT * FROM leases WHERE id = $1", $row_lock))
                .bind(id.as_str())
                .fetch_optional(&mut **tx)
                .await?;
            match row {
                Some(r) => Ok(Some((r.lease()?, get::<_, String>(&r, "token_hash")?))),
                None => Ok(None),
            }
        }

        /// Writes a lease transition, fenced by the lease's prior state and the job's lease.
        async fn write_transition(
            tx: &mut Tx,
            lease: &Lease,
            job: &Job,
            t: &Transition,
            now: Millis,
        ) -> StoreResult<bool> {
            let ended_at = (!t.lease_state.is_live()).then_some(now.0);
            let started_at = (lease.state == LeaseState::Leased && t.lease_state == LeaseState::Running)
                .then_some(now.0)
                .or(lease.started_at.map(|m| m.0));
            let fenced = sqlx::query(
                "UPDATE leases SET state = $1, expires_at = $2, ended_at = $3, started_at = $4 \
                 WHERE id = $5 AND state = $6",
            )
            .bind(t.lease_state.as_str())
            .bind(t.expires_at.0)
            .bind(ended_at)
            .bind(started_at)
            .bind(lease.id.as_str())
            .bind(lease.state.as_str())
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if fenced != 1 {
                return Ok(false);
            }
            let job_lease = (!t.releases_job()).then(|| lease.id.as_str().to_string());
            let fenced = sqlx::query(
                "UPDATE jobs SET state = $1, attempts = $2, returns = $3, \
                 last_error = COALESCE($4, last_error), lease_id = $5, updated_at = $6 \
                 WHERE id = $7 AND lease_id = $8",
            )
            .bind(t.job_state.as_str())
            .bind(t.attempts)
            .bind(t.returns)
            .bind(t.last_error.as_deref())
            .bind(job_lease)
            .bind(now.0)
            .bind(job.id.as_str())
            .bind(lease.id.as_str())
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if fenced != 1 {
                return Ok(false);
            }
            if let Some((kind, reason, detail)) = &t.event {
                let mut event = Event::new(*kind).by(&lease.runner_id, &lease.id);
                event.reason = reason.as_deref();
                event.detail = detail.as_deref();
                add_event(tx, &job.id, now, event).await?;
            }
            if t.quarantine_runner {
                sqlx::query("UPDATE runners SET quarantined_at = $1 WHERE id = $2")
                    .bind(now.0)
                    .bind(lease.runner_id.as_str())
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(true)
        }

        /// Ends a live lease by expiry or revocation; `None` when it moved on meanwhile. The
        /// caller holds the job's row lock, then the lease's (the one lock order).
        async fn end_lease(tx: &mut Tx, lease: &Lease, job: &Job, cause: EndCause, now: Millis) -> StoreResult<Option<EndedLease>> {
            let snapshot = Snapshot {
                lease_state: lease.state,
                expires_at: lease.expires_at,
                attempts: job.attempts,
                max_attempts: job.max_attempts,
                returns: job.returns,
            };
            let t = lease_rules::end(cause, snapshot, now);
            let written = write_transition(tx, lease, job, &t, now).await?;
            Ok(written.then(|| EndedLease {
                pool: lease.pool.clone(),
                before_start: lease.state == LeaseState::Leased,
                job_state: t.job_state,
            }))
        }

        /// Locks a lease's job, then the lease (the one lock order of job and lease writes on
        /// PostgreSQL), and reads both as they are now. `None` when either is gone, or, with
        /// `skip_locked`, when another transaction holds the job.
        async fn lock_job_and_lease(
            tx: &mut Tx,
            job_id: &JobId,
            lease_id: &LeaseId,
            skip_locked: bool,
        ) -> StoreResult<Option<(Job, Lease)>> {
            let job = if skip_locked {
                let row = sqlx::query(concat!("SELECT * FROM jobs WHERE id = $1", $claim_lock))
                    .bind(job_id.as_str())
                    .fetch_optional(&mut **tx)
                    .await?;
                row.map(|r| r.job()).transpose()?
            } else {
                load_job(tx, job_id).await?
            };
            let Some(job) = job else { return Ok(None) };
            let lease = load_lease(tx, lease_id).await?.map(|(l, _)| l);
            Ok(lease.map(|l| (job, l)))
        }

        /// A runner's live leases as `(lease, job)` ids, read without locks: each is then
        /// locked in the one order.
        async fn live_leases_of(tx: &mut Tx, runner: &RunnerId) -> StoreResult<Vec<(LeaseId, JobId)>> {
            let rows = sqlx::query("SELECT id, job_id FROM leases WHERE runner_id = $1 AND state IN ('leased', 'running')")
                .bind(runner.as_str())
                .fetch_all(&mut **tx)
                .await?;
            rows.iter()
                .map(|r| Ok((LeaseId(get(r, "id")?), JobId(get(r, "job_id")?))))
                .collect()
        }

        async fn fetch_runner(exec: &mut <$db as sqlx::Database>::Connection, id: &RunnerId) -> StoreResult<Option<Runner>> {
            let row = sqlx::query(concat!(runner_select!(), "WHERE r.id = $1"))
                .bind(id.as_str())
                .fetch_optional(&mut *exec)
                .await?;
            let Some(mut runner) = row.map(|r| r.runner()).transpose()? else {
                return Ok(None);
            };
            let bindings = sqlx::query("SELECT * FROM forge_runners WHERE runner_id = $1 ORDER BY kind, identity")
                .bind(id.as_str())
                .fetch_all(&mut *exec)
                .await?;
            runner.forge_runners = bindings.iter().map(|r| r.forge_binding()).collect::<StoreResult<_>>()?;
            Ok(Some(runner))
        }

        /// Binds `identities` to `runner` inside `tx`, keeping those it already has; the first
        /// one bound to another runner, if any.
        async fn bind_forge_runners(
            tx: &mut Tx,
            runner: &RunnerId,
            identities: &[ForgeIdentity],
            now: Millis,
        ) -> StoreResult<Option<ForgeIdentity>> {
            for identity in identities {
                sqlx::query(
                    "INSERT INTO forge_runners (kind, identity, runner_id, bound_at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (kind, identity) DO NOTHING",
                )
                .bind(identity.kind.as_str())
                .bind(&identity.key)
                .bind(runner.as_str())
                .bind(now.0)
                .execute(&mut **tx)
                .await?;
                let row = sqlx::query("SELECT runner_id FROM forge_runners WHERE kind = $1 AND identity = $2")
                    .bind(identity.kind.as_str())
                    .bind(&identity.key)
                    .fetch_one(&mut **tx)
                    .await?;
                let owner: String = get(&row, "runner_id")?;
                if owner != runner.as_str() {
                    return Ok(Some(identity.clone()));
                }
            }
            Ok(None)
        }

        impl $store {
            /// Commits `tx`, in which jobs of `pools` went back to the queue, and wakes the
            /// waiters of those pools on every replica.
            async fn commit_requeues(&self, mut tx: Tx, pools: &[PoolName]) -> StoreResult<()> {
                let mut unique: Vec<&PoolName> = pools.iter().collect();
                unique.sort();
                unique.dedup();
                for pool in &unique {
                    self.announce_job(&mut tx, &format!("{WAKE_ALL}{pool}")).await?;
                }
                tx.commit().await?;
                for pool in unique {
                    self.signal.notify(pool.as_str());
                }
                Ok(())
            }
        }

        #[async_trait::async_trait]
        impl Store for $store {
            fn engine(&self) -> &'static str {
                $engine
            }

            fn job_signal(&self) -> &JobSignal {
                &self.signal
            }

            async fn ping(&self) -> StoreResult<()> {
                self.health_check().await
            }

            async fn put_pool(&self, name: &PoolName, spec: PoolSpec, now: Millis) -> StoreResult<(Pool, bool)> {
                let mut tx = self.begin().await?;
                let current = sqlx::query(concat!("SELECT * FROM pools WHERE name = $1", $row_lock))
                    .bind(name.as_str())
                    .fetch_optional(&mut *tx)
                    .await?
                    .map(|r| r.pool())
                    .transpose()?;
                let pool = Pool::apply(name.clone(), current.as_ref(), spec, now);
                sqlx::query(
                    "INSERT INTO pools (name, image_ref, image_policy, image_source, expected_image_ids, \
                     previous_image_ids, previous_valid_until, drift_grace_s, resolve_interval_s, \
                     resolution_failures, resolved_digest, resolved_image_id, next_resolve_at, created_at, updated_at, \
                     gate_mode) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
                     ON CONFLICT (name) DO UPDATE SET image_ref = excluded.image_ref, \
                     image_policy = excluded.image_policy, image_source = excluded.image_source, \
                     gate_mode = excluded.gate_mode, \
                     expected_image_ids = excluded.expected_image_ids, previous_image_ids = excluded.previous_image_ids, \
                     previous_valid_until = excluded.previous_valid_until, drift_grace_s = excluded.drift_grace_s, \
                     resolve_interval_s = excluded.resolve_interval_s, resolution_failures = excluded.resolution_failures, \
                     resolved_digest = excluded.resolved_digest, resolved_image_id = excluded.resolved_image_id, \
                     next_resolve_at = excluded.next_resolve_at, updated_at = excluded.updated_at",
                )
                .bind(pool.name.as_str())
                .bind(pool.image_ref.as_deref())
                .bind(pool.image_policy.as_str())
                .bind(pool.image_source.as_str())
                .bind(digests_json(&pool.expected_image_ids))
                .bind(digests_json(&pool.previous_image_ids))
                .bind(pool.previous_valid_until.map(|m| m.0))
                .bind(pool.drift_grace_s)
                .bind(pool.resolve_interval_s)
                .bind(pool.resolution_failures)
                .bind(pool.resolved_digest.as_ref().map(|d| d.to_string()))
                .bind(pool.resolved_image_id.as_ref().map(|d| d.to_string()))
                .bind(pool.next_resolve_at.map(|m| m.0))
                .bind(pool.created_at.0)
                .bind(pool.updated_at.0)
                .bind(pool.gate_mode.as_str())
                .execute(&mut *tx)
                .await?;
                self.announce_change(&mut tx, &verdict_cache::pool_key(&pool.name)).await?;
                tx.commit().await?;
                Ok((pool, current.is_none()))
            }

            async fn claim_resolution(&self, name: &PoolName, now: Millis, until: Millis) -> StoreResult<Option<Pool>> {
                // The due check and the claim are one statement: of several replicas that find
                // the pool due at once, exactly one gets a row back.
                let row = sqlx::query(
                    "UPDATE pools SET resolve_claimed_until = $3 \
                     WHERE name = $1 AND image_source = 'registry' \
                     AND (next_resolve_at IS NULL OR next_resolve_at <= $2) \
                     AND (resolve_claimed_until IS NULL OR resolve_claimed_until <= $2) \
                     RETURNING *",
                )
                .bind(name.as_str())
                .bind(now.0)
                .bind(until.0)
                .fetch_optional(self.writer())
                .await?;
                row.map(|r| r.pool()).transpose()
            }

            async fn record_resolution(
                &self,
                name: &PoolName,
                image_ref: &str,
                outcome: &ResolutionOutcome,
                now: Millis,
            ) -> StoreResult<Option<Pool>> {
                let mut tx = self.begin().await?;
                let current = sqlx::query(concat!("SELECT * FROM pools WHERE name = $1", $row_lock))
                    .bind(name.as_str())
                    .fetch_optional(&mut *tx)
                    .await?
                    .map(|r| r.pool())
                    .transpose()?;
                let next = current.and_then(|pool| pool.apply_resolution(image_ref, outcome, now));
                let Some(pool) = next else {
                    sqlx::query("UPDATE pools SET resolve_claimed_until = NULL WHERE name = $1")
                        .bind(name.as_str())
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    return Ok(None);
                };
                let last = pool.last_resolution.as_ref();
                sqlx::query(
                    "UPDATE pools SET expected_image_ids = $2, previous_image_ids = $3, previous_valid_until = $4, \
                     last_resolution_at = $5, last_resolution_ok = $6, last_resolution_error = $7, \
                     resolution_failures = $8, resolved_digest = $9, resolved_image_id = $10, \
                     next_resolve_at = $11, resolve_claimed_until = NULL, updated_at = $12 WHERE name = $1",
                )
                .bind(pool.name.as_str())
                .bind(digests_json(&pool.expected_image_ids))
                .bind(digests_json(&pool.previous_image_ids))
                .bind(pool.previous_valid_until.map(|m| m.0))
                .bind(last.map(|l| l.at.0))
                .bind(last.map(|l| i64::from(l.ok)))
                .bind(last.and_then(|l| l.error.as_deref()))
                .bind(pool.resolution_failures)
                .bind(pool.resolved_digest.as_ref().map(|d| d.to_string()))
                .bind(pool.resolved_image_id.as_ref().map(|d| d.to_string()))
                .bind(pool.next_resolve_at.map(|m| m.0))
                .bind(pool.updated_at.0)
                .execute(&mut *tx)
                .await?;
                self.announce_change(&mut tx, &verdict_cache::pool_key(&pool.name)).await?;
                tx.commit().await?;
                Ok(Some(pool))
            }

            async fn get_pool(&self, name: &PoolName) -> StoreResult<Option<Pool>> {
                let row = sqlx::query("SELECT * FROM pools WHERE name = $1")
                    .bind(name.as_str())
                    .fetch_optional(self.reader())
                    .await?;
                row.map(|r| r.pool()).transpose()
            }

            async fn list_pools(&self) -> StoreResult<Vec<Pool>> {
                let rows = sqlx::query("SELECT * FROM pools ORDER BY name").fetch_all(self.reader()).await?;
                rows.iter().map(|r| r.pool()).collect()
            }

            async fn queue_depths(&self) -> StoreResult<BTreeMap<PoolName, QueueDepth>> {
                let rows = sqlx::query(
                    "SELECT pool, COUNT(*) AS queued, MIN(created_at) AS oldest FROM jobs \
                     WHERE state = 'queued' GROUP BY pool",
                )
                .fetch_all(self.reader())
                .await?;
                rows.iter()
                    .map(|r| {
                        Ok((
                            PoolName::from_trusted(get(r, "pool")?),
                            QueueDepth {
                                queued: get(r, "queued")?,
                                oldest_queued_at: get::<_, Option<i64>>(r, "oldest")?.map(Millis),
                            },
                        ))
                    })
                    .collect()
            }

            async fn create_registration_token(
                &self,
                pool: &PoolName,
                token_hash: &str,
                expires_at: Millis,
                now: Millis,
            ) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO registration_tokens (token_hash, pool, created_at, expires_at) VALUES ($1, $2, $3, $4)",
                )
                .bind(token_hash)
                .bind(pool.as_str())
                .bind(now.0)
                .bind(expires_at.0)
                .execute(self.writer())
                .await?;
                Ok(())
            }

            async fn register_runner(&self, token_hash: &str, runner: NewRunner, now: Millis) -> Result<Runner, RegisterError> {
                let mut tx = self.begin().await?;
                let pool: Option<String> = sqlx::query(
                    "UPDATE registration_tokens SET used_at = $1, used_by = $2 \
                     WHERE token_hash = $3 AND used_at IS NULL AND expires_at > $1 RETURNING pool",
                )
                .bind(now.0)
                .bind(runner.id.as_str())
                .bind(token_hash)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?
                .map(|r| get(&r, "pool"))
                .transpose()?;
                let Some(pool) = pool else {
                    return Err(RegisterError::TokenInvalid);
                };
                let inserted = sqlx::query(
                    "INSERT INTO runners (id, name, pool, labels, public_key_x, registered_at) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (pool, name) DO NOTHING",
                )
                .bind(runner.id.as_str())
                .bind(&runner.name)
                .bind(&pool)
                .bind(serde_json::to_string(&runner.labels).expect("labels serialize"))
                .bind(&runner.public_key_x)
                .bind(now.0)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?
                .rows_affected();
                if inserted != 1 {
                    return Err(RegisterError::NameTaken);
                }
                if let Some(taken) = bind_forge_runners(&mut tx, &runner.id, &runner.forge_runners, now).await? {
                    return Err(RegisterError::ForgeRunnerTaken(taken));
                }
                let stored = fetch_runner(&mut tx, &runner.id).await?;
                tx.commit().await.map_err(StoreError::from)?;
                stored.ok_or_else(|| StoreError::Internal("runner vanished after insert".into()).into())
            }

            async fn get_runner(&self, id: &RunnerId) -> StoreResult<Option<Runner>> {
                let mut conn = self.reader().acquire().await?;
                fetch_runner(&mut conn, id).await
            }

            async fn list_runners(&self, pool: Option<&PoolName>) -> StoreResult<Vec<Runner>> {
                let rows = match pool {
                    Some(p) => sqlx::query(concat!(runner_select!(), "WHERE r.pool = $1 ORDER BY r.pool, r.name"))
                        .bind(p.as_str())
                        .fetch_all(self.reader())
                        .await?,
                    None => sqlx::query(concat!(runner_select!(), "ORDER BY r.pool, r.name"))
                        .fetch_all(self.reader())
                        .await?,
                };
                let mut runners: Vec<Runner> = rows.iter().map(|r| r.runner()).collect::<StoreResult<_>>()?;
                let bindings = sqlx::query("SELECT * FROM forge_runners ORDER BY kind, identity")
                    .fetch_all(self.reader())
                    .await?;
                let mut by_runner: BTreeMap<String, Vec<_>> = BTreeMap::new();
                for row in &bindings {
                    by_runner.entry(get(row, "runner_id")?).or_default().push(row.forge_binding()?);
                }
                for runner in &mut runners {
                    if let Some(b) = by_runner.remove(runner.id.as_str()) {
                        runner.forge_runners = b;
                    }
                }
                Ok(runners)
            }

            async fn runner_history(&self, id: &RunnerId) -> StoreResult<RunnerHistory> {
                let reader = self.reader();
                let attestations = sqlx::query("SELECT * FROM attestation_history WHERE runner_id = $1 ORDER BY seq DESC")
                    .bind(id.as_str())
                    .fetch_all(reader)
                    .await?;
                let changes = sqlx::query("SELECT * FROM status_changes WHERE runner_id = $1 ORDER BY id DESC LIMIT 100")
                    .bind(id.as_str())
                    .fetch_all(reader)
                    .await?;
                let refusals = sqlx::query("SELECT * FROM refusals WHERE runner_id = $1 ORDER BY seq DESC")
                    .bind(id.as_str())
                    .fetch_all(reader)
                    .await?;
                let leases = sqlx::query("SELECT * FROM leases WHERE runner_id = $1 ORDER BY granted_at DESC LIMIT 50")
                    .bind(id.as_str())
                    .fetch_all(reader)
                    .await?;
                Ok(RunnerHistory {
                    attestations: attestations.iter().map(|r| r.attestation_entry()).collect::<StoreResult<_>>()?,
                    status_changes: changes.iter().map(|r| r.status_change()).collect::<StoreResult<_>>()?,
                    refusals: refusals.iter().map(|r| r.refusal()).collect::<StoreResult<_>>()?,
                    leases: leases.iter().map(|r| r.lease()).collect::<StoreResult<_>>()?,
                })
            }

            async fn refusal_counts_since(&self, since: Millis) -> StoreResult<BTreeMap<RunnerId, i64>> {
                let rows = sqlx::query("SELECT runner_id, COUNT(*) AS n FROM refusals WHERE at >= $1 GROUP BY runner_id")
                    .bind(since.0)
                    .fetch_all(self.reader())
                    .await?;
                rows.iter().map(|r| Ok((RunnerId(get(r, "runner_id")?), get(r, "n")?))).collect()
            }

            async fn set_cordoned(&self, id: &RunnerId, cordoned: bool, _now: Millis) -> StoreResult<Option<Runner>> {
                let mut tx = self.begin().await?;
                sqlx::query("UPDATE runners SET cordoned = $1 WHERE id = $2")
                    .bind(i64::from(cordoned))
                    .bind(id.as_str())
                    .execute(&mut *tx)
                    .await?;
                let runner = fetch_runner(&mut tx, id).await?;
                self.announce_change(&mut tx, &verdict_cache::runner_key(id)).await?;
                tx.commit().await?;
                Ok(runner)
            }

            async fn revoke_runner(&self, id: &RunnerId, now: Millis) -> StoreResult<Option<(Runner, Vec<EndedLease>)>> {
                let mut tx = self.begin().await?;
                sqlx::query("UPDATE runners SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2")
                    .bind(now.0)
                    .bind(id.as_str())
                    .execute(&mut *tx)
                    .await?;
                // The runner's row is locked by the update above: no round can claim for it now.
                // Then each live lease's job and lease, in the one order.
                let live = live_leases_of(&mut tx, id).await?;
                let mut ended = Vec::new();
                for (lease_id, job_id) in &live {
                    if let Some((job, lease)) = lock_job_and_lease(&mut tx, job_id, lease_id, false).await?
                        && lease.state.is_live()
                    {
                        ended.extend(end_lease(&mut tx, &lease, &job, EndCause::RunnerRevoked, now).await?);
                    }
                }
                // A revoked runner's forge runners are free to be bound again.
                sqlx::query("DELETE FROM forge_runners WHERE runner_id = $1")
                    .bind(id.as_str())
                    .execute(&mut *tx)
                    .await?;
                let runner = fetch_runner(&mut tx, id).await?;
                self.announce_change(&mut tx, &verdict_cache::runner_key(id)).await?;
                let pools: Vec<PoolName> = ended.iter().map(|e| e.pool.clone()).collect();
                self.commit_requeues(tx, &pools).await?;
                Ok(runner.map(|r| (r, ended)))
            }

            async fn jti_seen(&self, runner: &RunnerId, jti: &str) -> StoreResult<bool> {
                let seen = sqlx::query("SELECT 1 FROM seen_jtis WHERE runner_id = $1 AND jti = $2")
                    .bind(runner.as_str())
                    .bind(jti)
                    .fetch_optional(self.reader())
                    .await?;
                Ok(seen.is_some())
            }

            async fn write_round(&self, items: &[round::RoundItem]) -> round::RoundResult {
                self.run_round(items).await
            }

            async fn enqueue_job(&self, job: NewJob, now: Millis) -> Result<(Job, bool), EnqueueError> {
                let mut tx = self.begin().await?;
                if let Some(key) = &job.idempotency_key {
                    let existing = sqlx::query("SELECT * FROM jobs WHERE idempotency_key = $1")
                        .bind(key)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(StoreError::from)?;
                    if let Some(row) = existing {
                        return Ok((row.job()?, false));
                    }
                }
                let pool_exists = sqlx::query("SELECT 1 FROM pools WHERE name = $1")
                    .bind(job.pool.as_str())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::from)?;
                if pool_exists.is_none() {
                    return Err(EnqueueError::UnknownPool);
                }
                let row = sqlx::query(
                    "INSERT INTO jobs (id, pool, payload, state, max_attempts, idempotency_key, created_at, updated_at) \
                     VALUES ($1, $2, $3, 'queued', $4, $5, $6, $6) ON CONFLICT (idempotency_key) DO NOTHING RETURNING *",
                )
                .bind(job.id.as_str())
                .bind(job.pool.as_str())
                .bind(job.payload.to_string())
                .bind(job.max_attempts)
                .bind(job.idempotency_key.as_deref())
                .bind(now.0)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                let Some(row) = row else {
                    // A concurrent enqueue with the same key won the race: answer with its job.
                    tx.rollback().await.map_err(StoreError::from)?;
                    let existing = sqlx::query("SELECT * FROM jobs WHERE idempotency_key = $1")
                        .bind(job.idempotency_key.as_deref())
                        .fetch_one(self.writer())
                        .await
                        .map_err(StoreError::from)?;
                    return Ok((existing.job()?, false));
                };
                let stored = row.job()?;
                add_event(&mut tx, &stored.id, now, Event::new(EventKind::Enqueued)).await?;
                self.announce_job(&mut tx, stored.pool.as_str()).await?;
                tx.commit().await.map_err(StoreError::from)?;
                self.signal.notify_one(stored.pool.as_str());
                Ok((stored, true))
            }

            async fn job_by_idempotency_key(&self, key: &str) -> StoreResult<Option<Job>> {
                let row = sqlx::query("SELECT * FROM jobs WHERE idempotency_key = $1")
                    .bind(key)
                    .fetch_optional(self.reader())
                    .await?;
                row.map(|r| r.job()).transpose()
            }

            async fn get_job(&self, id: &JobId) -> StoreResult<Option<(Job, Vec<JobEvent>)>> {
                let Some(row) = sqlx::query("SELECT * FROM jobs WHERE id = $1")
                    .bind(id.as_str())
                    .fetch_optional(self.reader())
                    .await?
                else {
                    return Ok(None);
                };
                let events = sqlx::query("SELECT * FROM job_events WHERE job_id = $1 ORDER BY id")
                    .bind(id.as_str())
                    .fetch_all(self.reader())
                    .await?;
                let events = events.iter().map(|r| r.job_event()).collect::<StoreResult<_>>()?;
                Ok(Some((row.job()?, events)))
            }

            async fn cancel_job(&self, id: &JobId, now: Millis) -> Result<Option<Job>, CancelError> {
                let mut tx = self.begin().await?;
                let Some(job) = load_job(&mut tx, id).await? else {
                    return Ok(None);
                };
                if job.state.is_final() {
                    return Err(CancelError::Finished(job.state.as_str()));
                }
                if let Some(lease_id) = &job.lease_id {
                    sqlx::query("UPDATE leases SET state = 'cancelled', ended_at = $1 WHERE id = $2 AND state IN ('leased', 'running')")
                        .bind(now.0)
                        .bind(lease_id.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(StoreError::from)?;
                }
                sqlx::query("UPDATE jobs SET state = 'cancelled', lease_id = NULL, updated_at = $1 WHERE id = $2")
                    .bind(now.0)
                    .bind(id.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::from)?;
                let mut event = Event::new(EventKind::Cancelled);
                event.lease_id = job.lease_id.as_ref();
                event.reason = Some("cancelled_by_forge");
                add_event(&mut tx, id, now, event).await?;
                let job = load_job(&mut tx, id).await?;
                tx.commit().await.map_err(StoreError::from)?;
                Ok(job)
            }

            async fn lease_call(
                &self,
                lease_id: &LeaseId,
                token_hash: &str,
                call: &LeaseCall,
                now: Millis,
            ) -> Result<(Lease, Job), LeaseCallFailure> {
                use subtle::ConstantTimeEq;
                let mut tx = self.begin().await?;
                // The token first, before any lock: a wrong token holds nothing up.
                let ids = sqlx::query("SELECT job_id, runner_id, token_hash FROM leases WHERE id = $1")
                    .bind(lease_id.as_str())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::from)?;
                let Some(ids) = ids else {
                    return Err(LeaseCallFailure::TokenInvalid);
                };
                let stored_hash: String = get(&ids, "token_hash")?;
                if !bool::from(stored_hash.as_bytes().ct_eq(token_hash.as_bytes())) {
                    return Err(LeaseCallFailure::TokenInvalid);
                }
                // The one lock order: the runner (only for a call that may quarantine it, as
                // revocation takes it first too), the job, the lease.
                if call.may_quarantine() {
                    sqlx::query(concat!("SELECT id FROM runners WHERE id = $1", $row_lock))
                        .bind(get::<_, String>(&ids, "runner_id")?)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(StoreError::from)?;
                }
                let job_id = JobId(get(&ids, "job_id")?);
                let (job, lease) = lock_job_and_lease(&mut tx, &job_id, lease_id, false)
                    .await?
                    .ok_or_else(|| StoreError::Internal("lease without its job".into()))?;
                let snapshot = Snapshot {
                    lease_state: lease.state,
                    expires_at: lease.expires_at,
                    attempts: job.attempts,
                    max_attempts: job.max_attempts,
                    returns: job.returns,
                };
                let t = lease_rules::apply_call(call, snapshot, now)?;
                if !write_transition(&mut tx, &lease, &job, &t, now).await? {
                    return Err(StoreError::Internal("lease moved during its own transaction".into()).into());
                }
                if t.quarantine_runner {
                    self.announce_change(&mut tx, &verdict_cache::runner_key(&lease.runner_id)).await?;
                }
                let requeued = if t.job_state == JobState::Queued { vec![lease.pool.clone()] } else { vec![] };
                let lease = load_lease(&mut tx, lease_id).await?.map(|(l, _)| l);
                let job = load_job(&mut tx, &job.id).await?;
                self.commit_requeues(tx, &requeued).await?;
                match (lease, job) {
                    (Some(l), Some(j)) => Ok((l, j)),
                    _ => Err(StoreError::Internal("lease or job vanished".into()).into()),
                }
            }

            async fn set_forge_runners(
                &self,
                runner: &RunnerId,
                identities: &[ForgeIdentity],
                now: Millis,
            ) -> Result<Option<Runner>, BindError> {
                let mut tx = self.begin().await?;
                let Some(current) = fetch_runner(&mut tx, runner).await? else {
                    return Ok(None);
                };
                if current.is_revoked() {
                    return Err(BindError::Revoked);
                }
                for kept in &current.forge_runners {
                    if !identities.contains(&kept.identity) {
                        sqlx::query("DELETE FROM forge_runners WHERE kind = $1 AND identity = $2")
                            .bind(kept.identity.kind.as_str())
                            .bind(&kept.identity.key)
                            .execute(&mut *tx)
                            .await
                            .map_err(StoreError::from)?;
                    }
                }
                if let Some(taken) = bind_forge_runners(&mut tx, runner, identities, now).await? {
                    return Err(BindError::Taken(taken));
                }
                let stored = fetch_runner(&mut tx, runner).await?;
                tx.commit().await.map_err(StoreError::from)?;
                Ok(stored)
            }

            async fn forge_runner(&self, identity: &ForgeIdentity) -> StoreResult<Option<(RunnerId, ForgeBinding)>> {
                let row = sqlx::query("SELECT * FROM forge_runners WHERE kind = $1 AND identity = $2")
                    .bind(identity.kind.as_str())
                    .bind(&identity.key)
                    .fetch_optional(self.reader())
                    .await?;
                row.map(|r| Ok((RunnerId(get(&r, "runner_id")?), r.forge_binding()?))).transpose()
            }

            async fn note_forge_fetch(&self, identity: &ForgeIdentity, now: Millis) -> StoreResult<()> {
                sqlx::query("UPDATE forge_runners SET last_fetch_at = $3 WHERE kind = $1 AND identity = $2")
                    .bind(identity.kind.as_str())
                    .bind(&identity.key)
                    .bind(now.0)
                    .execute(self.writer())
                    .await?;
                Ok(())
            }

            async fn record_refusal(&self, runner: &RunnerId, code: &str, detail: &str, now: Millis) -> StoreResult<()> {
                let mut tx = self.begin().await?;
                let row = sqlx::query("UPDATE runners SET refusal_seq = refusal_seq + 1 WHERE id = $1 RETURNING refusal_seq")
                    .bind(runner.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(row) = row else { return Ok(()) };
                let seq: i64 = get(&row, "refusal_seq")?;
                sqlx::query(
                    "INSERT INTO refusals (runner_id, slot, seq, at, code, detail) VALUES ($1, $2, $3, $4, $5, $6) \
                     ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, at = excluded.at, \
                     code = excluded.code, detail = excluded.detail",
                )
                .bind(runner.as_str())
                .bind(seq % REFUSAL_HISTORY)
                .bind(seq)
                .bind(now.0)
                .bind(code)
                .bind(detail)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn create_page_session(&self, s: &PageSession) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO page_sessions (token_hash, actor, credential_hash, created_at, expires_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&s.token_hash)
                .bind(&s.actor)
                .bind(&s.credential_hash)
                .bind(s.created_at.0)
                .bind(s.expires_at.0)
                .execute(self.writer())
                .await?;
                Ok(())
            }

            async fn page_session(&self, token_hash: &str, now: Millis) -> StoreResult<Option<PageSession>> {
                let row = sqlx::query("SELECT * FROM page_sessions WHERE token_hash = $1 AND expires_at > $2")
                    .bind(token_hash)
                    .bind(now.0)
                    .fetch_optional(self.reader())
                    .await?;
                row.map(|r| {
                    Ok(PageSession {
                        token_hash: get(&r, "token_hash")?,
                        actor: get(&r, "actor")?,
                        credential_hash: get(&r, "credential_hash")?,
                        created_at: Millis(get(&r, "created_at")?),
                        expires_at: Millis(get(&r, "expires_at")?),
                    })
                })
                .transpose()
            }

            async fn end_page_session(&self, token_hash: &str) -> StoreResult<()> {
                sqlx::query("DELETE FROM page_sessions WHERE token_hash = $1")
                    .bind(token_hash)
                    .execute(self.writer())
                    .await?;
                Ok(())
            }

            async fn sweep(&self, now: Millis) -> StoreResult<SweepReport> {
                let mut report = SweepReport::default();
                loop {
                    let mut tx = self.begin().await?;
                    let overdue = sqlx::query(
                        "SELECT id, job_id FROM leases WHERE state IN ('leased', 'running') AND expires_at <= $1 \
                         ORDER BY expires_at LIMIT 200",
                    )
                    .bind(now.0)
                    .fetch_all(&mut *tx)
                    .await?;
                    let batch = overdue.len();
                    let mut pools = Vec::new();
                    for row in &overdue {
                        let (lease_id, job_id) = (LeaseId(get(row, "id")?), JobId(get(row, "job_id")?));
                        // The job first, skipped when another transaction holds it (a lease call,
                        // a cancel, another replica's sweeper): the next tick sees what it did.
                        let Some((job, lease)) = lock_job_and_lease(&mut tx, &job_id, &lease_id, true).await? else {
                            continue;
                        };
                        if !lease.state.is_live() || lease.expires_at > now {
                            continue;
                        }
                        if let Some(ended) = end_lease(&mut tx, &lease, &job, EndCause::Expired, now).await? {
                            report.leases_expired += 1;
                            pools.push(ended.pool.clone());
                            report.ended.push(ended);
                        }
                    }
                    let progressed = !pools.is_empty();
                    self.commit_requeues(tx, &pools).await?;
                    // A short batch was the last; a batch whose fences all failed would only
                    // select the same rows again.
                    if batch < 200 || !progressed {
                        break;
                    }
                }
                report.jtis_purged = sqlx::query("DELETE FROM seen_jtis WHERE expires_at < $1")
                    .bind(now.0)
                    .execute(self.writer())
                    .await?
                    .rows_affected();
                sqlx::query("DELETE FROM page_sessions WHERE expires_at <= $1")
                    .bind(now.0)
                    .execute(self.writer())
                    .await?;
                Ok(report)
            }
        }

    };
}
pub(crate) use impl_sql_store;

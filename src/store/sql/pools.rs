//! Pools: written by operators (`put`) and by registry resolutions, read by the gate.

use super::rows::{self, digests_json};
use crate::domain::image_set::ResolutionOutcome;
use crate::domain::pool::{Pool, PoolSpec};
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::store::engine::{Change, Db, Statement, Tail, fetch_one, fetch_optional};
use crate::store::{PoolDeleteError, StoreResult};

fn by_name(name: &PoolName) -> Statement<'_> {
    Statement::new("SELECT * FROM pools WHERE name = $1").bind(name.as_str())
}

pub async fn get<D: Db>(db: &mut D, name: &PoolName) -> StoreResult<Option<Pool>> {
    fetch_optional(db, by_name(name))
        .await?
        .map(|r| rows::pool(&r))
        .transpose()
}

pub async fn list<D: Db>(db: &mut D) -> StoreResult<Vec<Pool>> {
    let found = db
        .fetch(Statement::new("SELECT * FROM pools ORDER BY name"))
        .await?;
    found.iter().map(rows::pool).collect()
}

/// Whether the pool `name` exists, held so until the transaction ends (`Tail::KeyShareLock`):
/// what every insert of a row that names a pool asks first, so that racing the pool's delete
/// ends in "no such pool" or in the delete's `InUse`, never in a foreign-key error.
pub async fn held<D: Db>(db: &mut D, name: &str) -> StoreResult<bool> {
    let found = fetch_optional(
        db,
        Statement::new("SELECT 1 AS one FROM pools WHERE name = $1")
            .bind(name)
            .tail(Tail::KeyShareLock),
    )
    .await?;
    Ok(found.is_some())
}

/// The pool, its row locked until the transaction ends: taken before any runner of it, as
/// registration and the pool's delete take it.
pub async fn locked<D: Db>(db: &mut D, name: &PoolName) -> StoreResult<Option<Pool>> {
    fetch_optional(db, by_name(name).tail(Tail::RowLock))
        .await?
        .map(|r| rows::pool(&r))
        .transpose()
}

/// The pool `spec` makes of `name` (created or replaced, as `Pool::apply` says); and whether
/// it is new.
pub async fn put<D: Db>(
    db: &mut D,
    name: &PoolName,
    spec: PoolSpec,
    now: Millis,
) -> StoreResult<(Pool, bool)> {
    let current = locked(db, name).await?;
    write(db, name, current, spec, now).await
}

/// The pool `spec` makes of `name`, when the pool is still exactly `base`; `None` (nothing
/// written) when it changed since `base` was read, or is gone.
pub async fn replace<D: Db>(
    db: &mut D,
    name: &PoolName,
    spec: PoolSpec,
    base: &Pool,
    now: Millis,
) -> StoreResult<Option<Pool>> {
    let current = locked(db, name).await?;
    if current.as_ref() != Some(base) {
        return Ok(None);
    }
    let (pool, _) = write(db, name, current, spec, now).await?;
    Ok(Some(pool))
}

/// Writes the pool `spec` makes of `current` (`None`: a new pool); the pool, and whether it
/// is new.
async fn write<D: Db>(
    db: &mut D,
    name: &PoolName,
    current: Option<Pool>,
    spec: PoolSpec,
    now: Millis,
) -> StoreResult<(Pool, bool)> {
    let pool = Pool::apply(name.clone(), current.as_ref(), spec, now);
    db.execute(
        Statement::new(
            "INSERT INTO pools (name, image_ref, image_policy, image_source, gate_mode, \
                expected_image_ids, \
             previous_image_ids, previous_valid_until, drift_grace_s, resolve_interval_s, \
             resolution_failures, resolved_digest, resolved_image_id, next_resolve_at, \
             created_at, updated_at, github, disk_warning, ejection, images, \
             undescribed_images) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
             $17, $18, $19, $20, $21) \
             ON CONFLICT (name) DO UPDATE SET image_ref = excluded.image_ref, \
             image_policy = excluded.image_policy, image_source = excluded.image_source, \
             gate_mode = excluded.gate_mode, expected_image_ids = excluded.expected_image_ids, \
             previous_image_ids = excluded.previous_image_ids, \
             previous_valid_until = excluded.previous_valid_until, drift_grace_s = \
             excluded.drift_grace_s, \
             resolve_interval_s = excluded.resolve_interval_s, resolution_failures = \
             excluded.resolution_failures, \
             resolved_digest = excluded.resolved_digest, resolved_image_id = \
             excluded.resolved_image_id, \
             next_resolve_at = excluded.next_resolve_at, updated_at = excluded.updated_at, \
             github = excluded.github, disk_warning = excluded.disk_warning, \
             ejection = excluded.ejection, images = excluded.images, \
             undescribed_images = excluded.undescribed_images",
        )
        .bind(pool.name.as_str())
        .bind(pool.image_ref.as_deref())
        .bind(pool.image_policy.as_str())
        .bind(pool.image_source.as_str())
        .bind(pool.gate_mode.as_str())
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
        .bind(rows::github_pool_json(pool.github.as_ref()))
        .bind(rows::disk_warning_json(pool.disk_warning.as_ref()))
        .bind(rows::ejection_policy_json(&pool.ejection))
        .bind(rows::pool_images_json(&pool.images))
        .bind(pool.undescribed_images.as_str()),
    )
    .await?;
    db.changed(Change::Pool(pool.name.clone())).await?;
    Ok((pool, current.is_none()))
}

/// Claims the registry pool `name` for a resolution until `until` if it is due at `now` and
/// unclaimed: the due check and the claim in one statement, so that of several replicas that
/// find it due at once exactly one gets it. A manual pool is claimed only for its registry
/// entries, and only such a pool has a `next_resolve_at` (`Pool::apply`).
pub async fn claim_resolution<D: Db>(
    db: &mut D,
    name: &PoolName,
    now: Millis,
    until: Millis,
) -> StoreResult<Option<Pool>> {
    let claimed = fetch_optional(
        db,
        Statement::new(
            "UPDATE pools SET resolve_claimed_until = $3 \
             WHERE name = $1 AND (image_source = 'registry' OR next_resolve_at IS NOT NULL) \
             AND (next_resolve_at IS NULL OR next_resolve_at <= $2) \
             AND (resolve_claimed_until IS NULL OR resolve_claimed_until <= $2) \
             RETURNING *",
        )
        .bind(name.as_str())
        .bind(now.0)
        .bind(until.0),
    )
    .await?;
    claimed.map(|r| rows::pool(&r)).transpose()
}

/// Records what resolving `image_ref` came to, the pool as `Pool::apply_resolution` makes it,
/// and releases the claim; `None` when the outcome no longer applies.
pub async fn record_resolution<D: Db>(
    db: &mut D,
    name: &PoolName,
    image_ref: &str,
    outcome: &ResolutionOutcome,
    now: Millis,
) -> StoreResult<Option<Pool>> {
    let current = locked(db, name).await?;
    let Some(pool) = current.and_then(|p| p.apply_resolution(image_ref, outcome, now)) else {
        db.execute(
            Statement::new("UPDATE pools SET resolve_claimed_until = NULL WHERE name = $1")
                .bind(name.as_str()),
        )
        .await?;
        return Ok(None);
    };
    let last = pool.last_resolution.as_ref();
    db.execute(
        Statement::new(
            "UPDATE pools SET expected_image_ids = $2, previous_image_ids = $3, \
                previous_valid_until = $4, \
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
        .bind(pool.updated_at.0),
    )
    .await?;
    db.changed(Change::Pool(pool.name.clone())).await?;
    Ok(Some(pool))
}

/// Records what resolving the pool's registry entries came to, the pool as
/// `Pool::apply_image_resolutions` makes it, and releases the claim; `None` when it is gone.
pub async fn record_image_resolutions<D: Db>(
    db: &mut D,
    name: &PoolName,
    outcomes: &[(String, ResolutionOutcome)],
    now: Millis,
) -> StoreResult<Option<Pool>> {
    let Some(current) = locked(db, name).await? else {
        return Ok(None);
    };
    let pool = current.apply_image_resolutions(outcomes, now);
    db.execute(
        Statement::new(
            "UPDATE pools SET images = $2, next_resolve_at = $3, resolve_claimed_until = NULL, \
             updated_at = $4 WHERE name = $1",
        )
        .bind(pool.name.as_str())
        .bind(rows::pool_images_json(&pool.images))
        .bind(pool.next_resolve_at.map(|m| m.0))
        .bind(pool.updated_at.0),
    )
    .await?;
    db.changed(Change::Pool(pool.name.clone())).await?;
    Ok(Some(pool))
}

/// Deletes the pool with everything of it (its revoked runners and their history, its
/// finished jobs, its registration tokens) when it has no live runner and no unfinished job;
/// `Ok(Err(_))` says why not (and nothing changed).
pub async fn delete<D: Db>(
    db: &mut D,
    name: &PoolName,
) -> StoreResult<Result<(), PoolDeleteError>> {
    if locked(db, name).await?.is_none() {
        return Ok(Err(PoolDeleteError::NotFound));
    }
    let in_use = fetch_one(
        db,
        Statement::new(
            "SELECT (SELECT COUNT(*) FROM runners WHERE pool = $1 AND revoked_at IS NULL) AS live, \
             (SELECT COUNT(*) FROM jobs WHERE pool = $1 \
                AND state IN ('queued', 'leased', 'running')) AS unfinished",
        )
        .bind(name.as_str()),
    )
    .await?;
    let (live, unfinished) = (in_use.int("live")?, in_use.int("unfinished")?);
    if live > 0 || unfinished > 0 {
        return Ok(Err(PoolDeleteError::InUse { live, unfinished }));
    }
    // Children first: every reference is to a row deleted after it.
    for sql in [
        "DELETE FROM job_events WHERE job_id IN (SELECT id FROM jobs WHERE pool = $1)",
        "DELETE FROM leases WHERE job_id IN (SELECT id FROM jobs WHERE pool = $1)",
        "DELETE FROM jobs WHERE pool = $1",
        "DELETE FROM forge_runners WHERE runner_id IN (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM github_registrations WHERE runner_id IN \
            (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM buildkite_pauses WHERE runner_id IN (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM buildkite_agents WHERE runner_id IN (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM attestation_history WHERE runner_id IN \
            (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM refusals WHERE runner_id IN (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM status_changes WHERE runner_id IN (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM seen_jtis WHERE runner_id IN (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM leases WHERE runner_id IN (SELECT id FROM runners WHERE pool = $1)",
        "DELETE FROM runners WHERE pool = $1",
        "DELETE FROM registration_tokens WHERE pool = $1",
        "DELETE FROM pools WHERE name = $1",
    ] {
        db.execute(Statement::new(sql).bind(name.as_str())).await?;
    }
    db.changed(Change::Pool(name.clone())).await?;
    db.changed(Change::ForgeRunners).await?;
    Ok(Ok(()))
}

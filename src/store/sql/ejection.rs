//! Ejection's writes: a job's end counted against its runner, the ejection it may make, the
//! release an operator gives, and the job ends seen through the forge gate, kept so that one
//! repeated counts once.
//!
//! What a job's end does is `domain::ejection::record`'s; here it is read and written. The
//! pool's row is locked before the runner's (the order registration and the pool's delete
//! keep) whenever the end may eject, so that two runners of one pool ejected at once on two
//! replicas cannot both pass `max_share`: the second reads the first's ejection.

use super::{pools, rows};
use crate::domain::ejection::{self, Effect, EjectionRecord, JobEnd, PoolLoad};
use crate::domain::ejection_load;
use crate::domain::ids::RunnerId;
use crate::domain::pool_name::PoolName;
use crate::domain::runner::{Runner, StatusRules};
use crate::domain::time::Millis;
use crate::store::StoreResult;
use crate::store::engine::{Change, Db, Statement, Tail, fetch_optional};

const RECORD_COLUMNS: &str = "eject_streak, ejections, ejection_last_until, ejected_at, \
     ejected_until, ejected_failures, ejected_nth, would_eject_at, would_eject_why, \
     would_eject_until, would_eject_failures";

/// The runner's record, its row locked.
async fn locked_record<D: Db>(
    db: &mut D,
    runner: &RunnerId,
) -> StoreResult<Option<EjectionRecord>> {
    let row = fetch_optional(
        db,
        Statement::built(format!(
            "SELECT {RECORD_COLUMNS} FROM runners WHERE id = $1"
        ))
        .bind(runner.as_str())
        .tail(Tail::RowLock),
    )
    .await?;
    row.map(|r| rows::ejection_record(&r)).transpose()
}

async fn write_record<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    before: &EjectionRecord,
    r: &EjectionRecord,
) -> StoreResult<()> {
    let streak = (!r.streak.is_empty()).then(|| r.streak.to_json());
    let ejected = r.ejected.as_ref();
    let would = r.would_eject.as_ref();
    db.execute(
        Statement::new(
            "UPDATE runners SET eject_streak = $2, ejections = $3, ejection_last_until = $4, \
             ejected_at = $5, ejected_until = $6, ejected_failures = $7, ejected_nth = $8, \
             would_eject_at = $9, would_eject_why = $10, would_eject_until = $11, \
             would_eject_failures = $12 WHERE id = $1",
        )
        .bind(runner.as_str())
        .bind(streak)
        .bind(r.ejections)
        .bind(r.last_until.map(|m| m.0))
        .bind(ejected.map(|e| e.at.0))
        .bind(ejected.map(|e| e.until.0))
        .bind(ejected.map(|e| e.failures.to_json()))
        .bind(ejected.map(|e| e.nth))
        .bind(would.map(|w| w.at.0))
        .bind(would.map(|w| w.why.as_str()))
        .bind(would.map(|w| w.until.0))
        .bind(would.map(|w| w.failures.to_json())),
    )
    .await?;
    // The gate holds the ejection in force (and every replica's cache forgets it).
    if before.ejected != r.ejected {
        db.changed(Change::Runner(runner.clone())).await?;
    }
    Ok(())
}

/// Locks what `end` of a job of `runner` (in `pool`) needs, in the one order: the pool when
/// the end is a failure (it may eject), then the runner. Called before the job's own rows are
/// locked.
pub async fn lock_for<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    pool: &PoolName,
    end: JobEnd,
) -> StoreResult<()> {
    if matches!(end, JobEnd::Infrastructure(_)) {
        pools::locked(db, pool).await?;
    }
    locked_record(db, runner).await?;
    Ok(())
}

/// `end` of a job `runner` (in `pool`) held, counted at `now`: what it did, audited as the
/// service's own doing (`client`: who reported the end). The rows are locked by `lock_for`
/// first.
pub async fn job_ended<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    pool: &PoolName,
    end: JobEnd,
    now: Millis,
    rules: StatusRules,
    client: &str,
) -> StoreResult<Effect> {
    let Some(the_pool) = pools::get(db, pool).await? else {
        return Ok(Effect::None);
    };
    let Some(current) = locked_record(db, runner).await? else {
        return Ok(Effect::None);
    };
    let policy = the_pool.ejection;
    let load = if ejection::needs_load(&current, end, &policy) {
        let summaries = super::runners::summaries(db, Some(pool), false).await?;
        ejection_load::of(runner, &summaries, &the_pool, now, rules)
    } else {
        PoolLoad::default()
    };
    let (next, effect) = ejection::record(&current, end, &policy, || load, now);
    if next != current {
        write_record(db, runner, &current, &next).await?;
    }
    if let Some(entry) = effect.audit(runner, now, client) {
        super::audit::record(db, &entry).await?;
    }
    Ok(effect)
}

/// A job's end seen through the forge gate (`key` names the forge's job), counted against
/// `runner` once however often it is seen: the runner's pool and what it did, `None` for a
/// repeat, or an unknown runner.
pub async fn forge_job_ended<D: Db>(
    db: &mut D,
    key: &str,
    runner: &RunnerId,
    end: JobEnd,
    now: Millis,
    rules: StatusRules,
) -> StoreResult<Option<(PoolName, Effect)>> {
    let found = fetch_optional(
        db,
        Statement::new("SELECT pool FROM runners WHERE id = $1").bind(runner.as_str()),
    )
    .await?;
    let Some(found) = found else { return Ok(None) };
    let pool = PoolName::from_trusted(found.text("pool")?);
    lock_for(db, runner, &pool, end).await?;
    let first = db
        .execute(
            Statement::new(
                "INSERT INTO job_ends (key, runner_id, at) VALUES ($1, $2, $3) \
                 ON CONFLICT (key) DO NOTHING",
            )
            .bind(key)
            .bind(runner.as_str())
            .bind(now.0),
        )
        .await?;
    if first != 1 {
        return Ok(None);
    }
    let effect = job_ended(db, runner, &pool, end, now, rules, "forge").await?;
    Ok(Some((pool, effect)))
}

/// Notes that `runner` took the forge's job `key` (a job request the gate relayed), so that
/// the job's end can be counted against it. The first runner named keeps the job.
pub async fn forge_job_taken<D: Db>(
    db: &mut D,
    key: &str,
    runner: &RunnerId,
    now: Millis,
) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "INSERT INTO forge_jobs (key, runner_id, at) VALUES ($1, $2, $3) \
             ON CONFLICT (key) DO NOTHING",
        )
        .bind(key)
        .bind(runner.as_str())
        .bind(now.0),
    )
    .await?;
    Ok(())
}

/// The runner that took the forge's job `key`, if the gate saw it taken.
pub async fn forge_job_runner<D: Db>(db: &mut D, key: &str) -> StoreResult<Option<RunnerId>> {
    let found = fetch_optional(
        db,
        Statement::new("SELECT runner_id FROM forge_jobs WHERE key = $1").bind(key),
    )
    .await?;
    found
        .map(|row| Ok(RunnerId(row.text("runner_id")?)))
        .transpose()
}

/// An operator's reinstatement: the runner after it, and whether it changed anything; `None`
/// for an unknown runner.
pub async fn reinstate<D: Db>(
    db: &mut D,
    runner: &RunnerId,
) -> StoreResult<Option<(bool, Runner)>> {
    let Some(current) = locked_record(db, runner).await? else {
        return Ok(None);
    };
    let next = ejection::reinstate(&current);
    let changed = next != current;
    if changed {
        write_record(db, runner, &current, &next).await?;
    }
    Ok(super::runners::get(db, runner).await?.map(|r| (changed, r)))
}

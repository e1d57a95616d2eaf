//! Jobs: the forge's enqueue (idempotent), a job's story, and the queue's depth.

use super::leases::{Event, add_event};
use super::rows;
use crate::domain::ids::JobId;
use crate::domain::job::{EventKind, Job, JobEvent};
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::store::engine::{Change, Db, Statement, fetch_optional};
use crate::store::{EnqueueError, NewJob, QueueDepth, StoreResult};
use std::collections::BTreeMap;

pub async fn by_idempotency_key<D: Db>(db: &mut D, key: &str) -> StoreResult<Option<Job>> {
    fetch_optional(
        db,
        Statement::new("SELECT * FROM jobs WHERE idempotency_key = $1").bind(key),
    )
    .await?
    .map(|r| rows::job(&r))
    .transpose()
}

/// Enqueues `job`, or answers the job its idempotency key already names; `true` when new.
pub async fn enqueue<D: Db>(
    db: &mut D,
    job: &NewJob,
    now: Millis,
) -> StoreResult<Result<(Job, bool), EnqueueError>> {
    if let Some(key) = &job.idempotency_key
        && let Some(existing) = by_idempotency_key(db, key).await?
    {
        return Ok(Ok((existing, false)));
    }
    if !super::pools::held(db, job.pool.as_str()).await? {
        return Ok(Err(EnqueueError::UnknownPool));
    }
    let inserted = fetch_optional(
        db,
        Statement::new(
            "INSERT INTO jobs (id, pool, payload, state, max_attempts, idempotency_key, \
                created_at, updated_at) \
             VALUES ($1, $2, $3, 'queued', $4, $5, $6, $6) ON CONFLICT (idempotency_key) DO \
             NOTHING RETURNING *",
        )
        .bind(job.id.as_str())
        .bind(job.pool.as_str())
        .bind(job.payload.to_string())
        .bind(job.max_attempts)
        .bind(job.idempotency_key.as_deref())
        .bind(now.0),
    )
    .await?;
    let Some(row) = inserted else {
        // A concurrent enqueue with the same key won the race: answer with its job.
        let key = job.idempotency_key.as_deref().unwrap_or_default();
        return match by_idempotency_key(db, key).await? {
            Some(existing) => Ok(Ok((existing, false))),
            None => Err(crate::store::StoreError::Internal(
                "an idempotency key conflicted with no job".into(),
            )),
        };
    };
    let stored = rows::job(&row)?;
    let event = Event {
        kind: EventKind::Enqueued,
        runner_id: None,
        lease_id: None,
        reason: None,
        detail: None,
    };
    add_event(db, &stored.id, now, event).await?;
    db.changed(Change::JobQueued(stored.pool.clone())).await?;
    Ok(Ok((stored, true)))
}

pub async fn get<D: Db>(db: &mut D, id: &JobId) -> StoreResult<Option<(Job, Vec<JobEvent>)>> {
    let Some(row) = fetch_optional(
        db,
        Statement::new("SELECT * FROM jobs WHERE id = $1").bind(id.as_str()),
    )
    .await?
    else {
        return Ok(None);
    };
    let events = db
        .fetch(
            Statement::new("SELECT * FROM job_events WHERE job_id = $1 ORDER BY id")
                .bind(id.as_str()),
        )
        .await?;
    let events = events
        .iter()
        .map(rows::job_event)
        .collect::<StoreResult<_>>()?;
    Ok(Some((rows::job(&row)?, events)))
}

pub async fn queue_depths<D: Db>(db: &mut D) -> StoreResult<BTreeMap<PoolName, QueueDepth>> {
    let found = db
        .fetch(Statement::new(
            "SELECT pool, COUNT(*) AS queued, MIN(created_at) AS oldest FROM jobs \
             WHERE state = 'queued' GROUP BY pool",
        ))
        .await?;
    found
        .iter()
        .map(|r| {
            Ok((
                PoolName::from_trusted(r.text("pool")?),
                QueueDepth {
                    queued: r.int("queued")?,
                    oldest_queued_at: r.opt_int("oldest")?.map(Millis),
                },
            ))
        })
        .collect()
}

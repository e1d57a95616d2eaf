//! A lease's life after its grant: the runner's calls (start, extend, complete, abandon), its
//! end by expiry (the sweeper) or revocation, and the forge's cancel of its job.
//!
//! The rules come from `domain::lease`; here they are only executed, each write fenced by the
//! lease's prior state and the job's lease, so that a late call from an expired lease can
//! never touch a job that moved on. Rows are locked in the one order, runner then job then
//! lease (`ARCHITECTURE.md`, `src/store/`): a call checks its token before it locks anything.
//!
//! Who locks what, in that order (pool before runner where a pool is locked at all): a lease
//! call locks the job, then the lease; one that ends the job (`complete`, `abandon`) locks its
//! runner first, and for a failure, which may eject the runner, the pool before that
//! (`ejection::lock_for`). A cancel locks the job, then ends its lease. The sweep takes each
//! overdue lease's job with `SKIP LOCKED`, then the lease; a revocation locks its runner, then
//! each live lease's job and lease; a round locks its runners in id order and then only skips
//! locked jobs. So no two transactions wait on each other in a circle: before this order, a
//! forge's cancel racing a runner's call was a deadlock and a 500 (`tests/races.rs`).

use super::{ejection, rows, runners};
use crate::domain::ejection::Effect;
use crate::domain::ids::{JobId, LeaseId, RunnerId};
use crate::domain::job::{EventKind, Job, JobState};
use crate::domain::lease::{self, EndCause, Lease, LeaseCall, LeaseState, Snapshot, Transition};
use crate::domain::pool_name::PoolName;
use crate::domain::runner::{Runner, StatusRules};
use crate::domain::time::Millis;
use crate::store::engine::{Change, Db, Statement, Tail, fetch_optional};
use crate::store::{
    CancelError, EndedLease, LeaseCallDone, LeaseCallFailure, StoreError, StoreResult,
};

/// The most leases one sweep transaction ends.
pub const SWEEP_BATCH: usize = 200;

/// One line of a job's story.
pub struct Event<'a> {
    pub kind: EventKind,
    pub runner_id: Option<&'a RunnerId>,
    pub lease_id: Option<&'a LeaseId>,
    pub reason: Option<&'a str>,
    pub detail: Option<&'a str>,
}

pub async fn add_event<D: Db>(
    db: &mut D,
    job_id: &JobId,
    at: Millis,
    e: Event<'_>,
) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "INSERT INTO job_events (job_id, at, kind, runner_id, lease_id, reason, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(job_id.as_str())
        .bind(at.0)
        .bind(e.kind.as_str())
        .bind(e.runner_id.map(|r| r.as_str()))
        .bind(e.lease_id.map(|l| l.as_str()))
        .bind(e.reason)
        .bind(e.detail),
    )
    .await?;
    Ok(())
}

async fn job<D: Db>(db: &mut D, id: &JobId, tail: Tail) -> StoreResult<Option<Job>> {
    fetch_optional(
        db,
        Statement::new("SELECT * FROM jobs WHERE id = $1")
            .bind(id.as_str())
            .tail(tail),
    )
    .await?
    .map(|r| rows::job(&r))
    .transpose()
}

async fn lease<D: Db>(db: &mut D, id: &LeaseId, tail: Tail) -> StoreResult<Option<Lease>> {
    fetch_optional(
        db,
        Statement::new("SELECT * FROM leases WHERE id = $1")
            .bind(id.as_str())
            .tail(tail),
    )
    .await?
    .map(|r| rows::lease(&r))
    .transpose()
}

/// Writes a transition of `lease` and its `job`, fenced by the lease's prior state and the
/// job's lease; `false` when either moved on. What it changed for others (a quarantine, a job
/// back in the queue) is noted.
async fn write_transition<D: Db>(
    db: &mut D,
    lease: &Lease,
    job: &Job,
    t: &Transition,
    now: Millis,
) -> StoreResult<bool> {
    let ended_at = (!t.lease_state.is_live()).then_some(now.0);
    let started_at = (lease.state == LeaseState::Leased && t.lease_state == LeaseState::Running)
        .then_some(now.0)
        .or(lease.started_at.map(|m| m.0));
    let fenced = db
        .execute(
            Statement::new(
                "UPDATE leases SET state = $1, expires_at = $2, ended_at = $3, started_at = $4 \
                 WHERE id = $5 AND state = $6",
            )
            .bind(t.lease_state.as_str())
            .bind(t.expires_at.0)
            .bind(ended_at)
            .bind(started_at)
            .bind(lease.id.as_str())
            .bind(lease.state.as_str()),
        )
        .await?;
    if fenced != 1 {
        return Ok(false);
    }
    let job_lease = (!t.releases_job()).then(|| lease.id.as_str());
    let fenced = db
        .execute(
            Statement::new(
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
            .bind(lease.id.as_str()),
        )
        .await?;
    if fenced != 1 {
        return Ok(false);
    }
    if let Some((kind, reason, detail)) = &t.event {
        let event = Event {
            kind: *kind,
            runner_id: Some(&lease.runner_id),
            lease_id: Some(&lease.id),
            reason: reason.as_deref(),
            detail: detail.as_deref(),
        };
        add_event(db, &job.id, now, event).await?;
    }
    if t.quarantine_runner {
        db.execute(
            Statement::new("UPDATE runners SET quarantined_at = $1 WHERE id = $2")
                .bind(now.0)
                .bind(lease.runner_id.as_str()),
        )
        .await?;
        db.changed(Change::Runner(lease.runner_id.clone())).await?;
    }
    if let Some(until) = t.hold_from_runner_until {
        db.execute(
            Statement::new("UPDATE jobs SET held_from = $1, held_until = $2 WHERE id = $3")
                .bind(lease.runner_id.as_str())
                .bind(until.0)
                .bind(job.id.as_str()),
        )
        .await?;
    }
    if t.job_state == JobState::Queued {
        db.changed(Change::JobsReturned(lease.pool.clone())).await?;
    }
    Ok(true)
}

fn snapshot(lease: &Lease, job: &Job) -> Snapshot {
    Snapshot {
        lease_state: lease.state,
        expires_at: lease.expires_at,
        attempts: job.attempts,
        max_attempts: job.max_attempts,
        returns: job.returns,
    }
}

/// Ends the live lease `lease_id` of `job_id` by `cause`, locking the job (skipped, with
/// `skip_locked`, when another transaction holds it), then the lease; `None` when it is not
/// live any more or moved on meanwhile.
pub async fn end_live<D: Db>(
    db: &mut D,
    job_id: &JobId,
    lease_id: &LeaseId,
    cause: EndCause,
    now: Millis,
    skip_locked: bool,
) -> StoreResult<Option<EndedLease>> {
    let tail = if skip_locked {
        Tail::SkipLocked
    } else {
        Tail::RowLock
    };
    let Some(job) = job(db, job_id, tail).await? else {
        return Ok(None);
    };
    let Some(lease) = lease(db, lease_id, Tail::RowLock).await? else {
        return Ok(None);
    };
    if !lease.state.is_live() || (cause == EndCause::Expired && lease.expires_at > now) {
        return Ok(None);
    }
    let t = lease::end(cause, snapshot(&lease, &job), now);
    let written = write_transition(db, &lease, &job, &t, now).await?;
    Ok(written.then(|| EndedLease {
        pool: lease.pool.clone(),
        before_start: lease.state == LeaseState::Leased,
        job_state: t.job_state,
    }))
}

/// A runner's call on its lease, checked against its token hash; a call that ends the job
/// counts for or against the runner's machine (`domain::ejection`) in the same transaction.
pub async fn call<D: Db>(
    db: &mut D,
    lease_id: &LeaseId,
    token_hash: &str,
    call: &LeaseCall,
    now: Millis,
    rules: StatusRules,
) -> StoreResult<Result<LeaseCallDone, LeaseCallFailure>> {
    use subtle::ConstantTimeEq;
    // The token first, before any lock: a wrong token holds nothing up.
    let ids = fetch_optional(
        db,
        Statement::new("SELECT job_id, runner_id, pool, token_hash FROM leases WHERE id = $1")
            .bind(lease_id.as_str()),
    )
    .await?;
    let Some(ids) = ids else {
        return Ok(Err(LeaseCallFailure::TokenInvalid));
    };
    let stored_hash = ids.text("token_hash")?;
    if !bool::from(stored_hash.as_bytes().ct_eq(token_hash.as_bytes())) {
        return Ok(Err(LeaseCallFailure::TokenInvalid));
    }
    // The one lock order: the pool (for a failure, which may eject its runner), the runner
    // (for a call that may quarantine it or count against it, as revocation takes it first
    // too), the job, the lease.
    let runner_id = RunnerId(ids.text("runner_id")?);
    let pool = PoolName::from_trusted(ids.text("pool")?);
    let end = call.job_end();
    if let Some(end) = end {
        ejection::lock_for(db, &runner_id, &pool, end).await?;
    }
    let job_id = JobId(ids.text("job_id")?);
    let (Some(job), Some(held)) = (
        job(db, &job_id, Tail::RowLock).await?,
        lease(db, lease_id, Tail::RowLock).await?,
    ) else {
        return Err(StoreError::Internal("lease without its job".into()));
    };
    let t = match lease::apply_call(call, snapshot(&held, &job), now) {
        Ok(t) => t,
        Err(refused) => return Ok(Err(refused.into())),
    };
    if !write_transition(db, &held, &job, &t, now).await? {
        return Err(StoreError::Internal(
            "lease moved during its own transaction".into(),
        ));
    }
    let ejection = match end {
        Some(end) => ejection::job_ended(db, &runner_id, &pool, end, now, rules, "runner").await?,
        None => Effect::None,
    };
    match (
        lease(db, lease_id, Tail::None).await?,
        self::job(db, &job_id, Tail::None).await?,
    ) {
        (Some(lease), Some(job)) => Ok(Ok(LeaseCallDone {
            lease,
            job,
            ejection,
        })),
        _ => Err(StoreError::Internal("lease or job vanished".into())),
    }
}

/// The forge cancels a job: its live lease (if any) ends `cancelled`, and so does the job.
pub async fn cancel<D: Db>(
    db: &mut D,
    id: &JobId,
    now: Millis,
) -> StoreResult<Result<Option<Job>, CancelError>> {
    let Some(found) = job(db, id, Tail::RowLock).await? else {
        return Ok(Ok(None));
    };
    if found.state.is_final() {
        return Ok(Err(CancelError::Finished(found.state.as_str())));
    }
    if let Some(lease_id) = &found.lease_id {
        db.execute(
            Statement::new(
                "UPDATE leases SET state = 'cancelled', ended_at = $1 WHERE id = $2 AND state IN \
                    ('leased', 'running')",
            )
            .bind(now.0)
            .bind(lease_id.as_str()),
        )
        .await?;
    }
    db.execute(
        Statement::new(
            "UPDATE jobs SET state = 'cancelled', lease_id = NULL, updated_at = $1 WHERE id = $2",
        )
        .bind(now.0)
        .bind(id.as_str()),
    )
    .await?;
    let event = Event {
        kind: EventKind::Cancelled,
        runner_id: None,
        lease_id: found.lease_id.as_ref(),
        reason: Some("cancelled_by_forge"),
        detail: None,
    };
    add_event(db, id, now, event).await?;
    Ok(Ok(job(db, id, Tail::None).await?))
}

/// Revokes the runner (the first time counts), ends its live leases as an expiry would, and
/// frees its forge runners. The update locks the runner's row first: no round claims for it
/// after, and the leases are then locked in the one order (job, lease).
pub async fn revoke<D: Db>(
    db: &mut D,
    id: &RunnerId,
    now: Millis,
) -> StoreResult<Option<(Runner, Vec<EndedLease>)>> {
    db.execute(
        Statement::new("UPDATE runners SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2")
            .bind(now.0)
            .bind(id.as_str()),
    )
    .await?;
    let live = db
        .fetch(
            Statement::new(
                "SELECT id, job_id FROM leases WHERE runner_id = $1 AND state IN ('leased', \
                    'running')",
            )
            .bind(id.as_str()),
        )
        .await?;
    let mut ended = Vec::new();
    for row in &live {
        let lease_id = LeaseId(row.text("id")?);
        let job_id = JobId(row.text("job_id")?);
        if let Some(e) =
            end_live(db, &job_id, &lease_id, EndCause::RunnerRevoked, now, false).await?
        {
            ended.push(e);
        }
    }
    db.execute(Statement::new("DELETE FROM forge_runners WHERE runner_id = $1").bind(id.as_str()))
        .await?;
    db.changed(Change::Runner(id.clone())).await?;
    db.changed(Change::ForgeRunners).await?;
    Ok(runners::get(db, id).await?.map(|r| (r, ended)))
}

/// Ends up to `SWEEP_BATCH` overdue leases at `now`; what became of each job, and whether
/// the batch was full (there may be more).
pub async fn sweep_batch<D: Db>(db: &mut D, now: Millis) -> StoreResult<(Vec<EndedLease>, bool)> {
    let overdue = db
        .fetch(
            Statement::new(
                "SELECT id, job_id FROM leases WHERE state IN ('leased', 'running') AND \
                    expires_at <= $1 \
                 ORDER BY expires_at LIMIT $2",
            )
            .bind(now.0)
            .bind(SWEEP_BATCH as i64),
        )
        .await?;
    let mut ended = Vec::new();
    for row in &overdue {
        let (lease_id, job_id) = (LeaseId(row.text("id")?), JobId(row.text("job_id")?));
        // The job first, skipped when another transaction holds it (a lease call, a cancel,
        // another replica's sweeper): the next tick sees what it did.
        if let Some(e) = end_live(db, &job_id, &lease_id, EndCause::Expired, now, true).await? {
            ended.push(e);
        }
    }
    Ok((ended, overdue.len() == SWEEP_BATCH))
}

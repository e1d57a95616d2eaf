//! Retention: the batches that delete what is past its horizon, and the claim that keeps
//! the pruner to one replica at a time.
//!
//! Each batch is one short transaction of at most `BATCH` rows per table, so that pruning a
//! month of backlog never holds the writer for long; the caller repeats until a batch comes
//! back short. Only finished jobs are selected: a queued, leased or running job is never old.

use super::param_list;
use crate::domain::retention::Horizons;
use crate::domain::time::Millis;
use crate::store::engine::{Db, Param, Statement, fetch_optional};
use crate::store::{PruneReport, StoreResult};

/// Rows per table per batch.
pub const BATCH: i64 = 500;

/// Takes the background task `task` until `until` unless another replica holds it.
pub async fn claim<D: Db>(db: &mut D, task: &str, now: Millis, until: Millis) -> StoreResult<bool> {
    let row = fetch_optional(
        db,
        Statement::new(
            "UPDATE maintenance SET claimed_until = $3 WHERE task = $1 AND claimed_until <= $2 \
             RETURNING task",
        )
        .bind(task)
        .bind(now.0)
        .bind(until.0),
    )
    .await?;
    Ok(row.is_some())
}

/// Lets the task go if its claim is still the one made until `until`, noting when it ran.
pub async fn release<D: Db>(db: &mut D, task: &str, until: Millis, now: Millis) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "UPDATE maintenance SET claimed_until = 0, last_run_at = $2 \
             WHERE task = $1 AND claimed_until = $3",
        )
        .bind(task)
        .bind(now.0)
        .bind(until.0),
    )
    .await?;
    Ok(())
}

/// One batch of finished jobs older than the horizon, with their events and leases.
pub async fn jobs_batch<D: Db>(db: &mut D, horizons: &Horizons) -> StoreResult<PruneReport> {
    let rows = db
        .fetch(
            Statement::new(
                "SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled') \
                 AND updated_at < $1 ORDER BY updated_at LIMIT $2",
            )
            .bind(horizons.jobs.0)
            .bind(BATCH),
        )
        .await?;
    let ids: Vec<String> = rows
        .iter()
        .map(|r| r.text("id"))
        .collect::<StoreResult<_>>()?;
    let mut report = PruneReport::default();
    if ids.is_empty() {
        return Ok(report);
    }
    let list = param_list(ids.len(), 1);
    let params = || ids.iter().map(|id| Param::Text(id)).collect::<Vec<_>>();
    for (kind, table) in [("job_events", "job_events"), ("leases", "leases")] {
        let sql = format!("DELETE FROM {table} WHERE job_id IN ({list})");
        let n = db.execute(Statement::built(sql).params(params())).await?;
        report.add(kind, n);
    }
    let n = db
        .execute(
            Statement::built(format!("DELETE FROM jobs WHERE id IN ({list})")).params(params()),
        )
        .await?;
    report.add("jobs", n);
    Ok(report)
}

/// One batch of history older than its horizon: refusal runs that ended before it,
/// attestation samples, status changes, audit entries, GitHub registrations and Buildkite
/// pauses that ended before it; and registration tokens used or expired before theirs.
pub async fn history_batch<D: Db>(db: &mut D, horizons: &Horizons) -> StoreResult<PruneReport> {
    let history = horizons.history.0;
    let mut report = PruneReport::default();
    let deletes: [(&str, &'static str, i64); 10] = [
        (
            "refusals",
            "DELETE FROM refusals WHERE (runner_id, slot) IN (SELECT runner_id, slot FROM \
             refusals WHERE at < $1 AND COALESCE(last_at, at) < $1 LIMIT $2)",
            history,
        ),
        (
            "attestation_samples",
            "DELETE FROM attestation_history WHERE (runner_id, slot) IN (SELECT runner_id, slot \
             FROM attestation_history WHERE received_at < $1 LIMIT $2)",
            history,
        ),
        (
            "status_changes",
            "DELETE FROM status_changes WHERE id IN (SELECT id FROM status_changes \
             WHERE at < $1 LIMIT $2)",
            history,
        ),
        (
            "audit",
            "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE at < $1 LIMIT $2)",
            history,
        ),
        ("github_registrations", super::github::PRUNE_SQL, history),
        ("buildkite_pauses", super::buildkite::PRUNE_SQL, history),
        (
            "pool_samples",
            "DELETE FROM pool_samples WHERE (pool, at) IN (SELECT pool, at FROM pool_samples \
             WHERE at < $1 LIMIT $2)",
            horizons.samples.0,
        ),
        (
            "registration_tokens",
            "DELETE FROM registration_tokens WHERE token_hash IN (SELECT token_hash FROM \
             registration_tokens WHERE expires_at < $1 OR used_at < $1 LIMIT $2)",
            horizons.tokens.0,
        ),
        (
            "forge_jobs",
            "DELETE FROM forge_jobs WHERE key IN (SELECT key FROM forge_jobs WHERE at < $1 LIMIT $2)",
            history,
        ),
        // A forge's runner repeats a job's final update for minutes, not days.
        (
            "job_ends",
            "DELETE FROM job_ends WHERE key IN (SELECT key FROM job_ends WHERE at < $1 LIMIT $2)",
            horizons.tokens.0,
        ),
    ];
    for (kind, sql, horizon) in deletes {
        let n = db
            .execute(Statement::new(sql).bind(horizon).bind(BATCH))
            .await?;
        report.add(kind, n);
    }
    Ok(report)
}

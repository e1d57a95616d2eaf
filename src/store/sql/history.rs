//! What a runner's detail shows beyond the runner: its kept attestations, status changes,
//! refusals (each a run of one code, with its count), leases and GitHub registrations; and a
//! refusal the forge gate records on a runner outside any round.

use super::round::upsert_refusals;
use super::rows;
use crate::domain::ids::RunnerId;
use crate::domain::record::RefusalRun;
use crate::domain::time::Millis;
use crate::store::engine::{Db, Statement, Tail, fetch_optional};
use crate::store::{RunnerHistory, StoreResult};
use std::collections::BTreeMap;

/// A runner's history, newest first. The open refusal run's entry is shown as the row has it
/// now (the ring's copy is brought up to date once a minute).
pub async fn of<D: Db>(db: &mut D, id: &RunnerId) -> StoreResult<RunnerHistory> {
    let attestations = db
        .fetch(
            Statement::new(
                "SELECT * FROM attestation_history WHERE runner_id = $1 ORDER BY seq DESC",
            )
            .bind(id.as_str()),
        )
        .await?;
    let changes = db
        .fetch(
            Statement::new(
                "SELECT * FROM status_changes WHERE runner_id = $1 ORDER BY id DESC LIMIT 100",
            )
            .bind(id.as_str()),
        )
        .await?;
    let refusals = db
        .fetch(
            Statement::new("SELECT * FROM refusals WHERE runner_id = $1 ORDER BY seq DESC")
                .bind(id.as_str()),
        )
        .await?;
    let leases = db
        .fetch(
            Statement::new(
                "SELECT * FROM leases WHERE runner_id = $1 ORDER BY granted_at DESC LIMIT 50",
            )
            .bind(id.as_str()),
        )
        .await?;
    let mut refusals = refusals
        .iter()
        .map(rows::refusal)
        .collect::<StoreResult<Vec<_>>>()?;
    if let Some(run) = open_run(db, id).await?
        && let Some(entry) = refusals.iter_mut().find(|r| r.seq == run.seq)
    {
        entry.count = run.count;
        entry.at = run.last_at.unwrap_or(entry.at);
        entry.detail = run.detail.clone().unwrap_or_default();
    }
    let (buildkite_pauses, buildkite_agents) = super::buildkite::of_runner(db, id).await?;
    Ok(RunnerHistory {
        attestations: attestations
            .iter()
            .map(rows::attestation_entry)
            .collect::<StoreResult<_>>()?,
        status_changes: changes
            .iter()
            .map(rows::status_change)
            .collect::<StoreResult<_>>()?,
        refusals,
        leases: leases.iter().map(rows::lease).collect::<StoreResult<_>>()?,
        github_registrations: super::github::of_runner(db, id).await?,
        buildkite_pauses,
        buildkite_agents,
    })
}

/// The run of refusals the runner is in, if any.
async fn open_run<D: Db>(db: &mut D, id: &RunnerId) -> StoreResult<Option<RefusalRun>> {
    let row = fetch_optional(
        db,
        Statement::new(
            "SELECT refusal_seq, refusal_code, refusal_detail, refusal_count, refusal_first_at, \
             refusal_last_at, refusal_synced_at FROM runners WHERE id = $1 AND refusal_code IS \
             NOT NULL",
        )
        .bind(id.as_str()),
    )
    .await?;
    row.map(|r| refusal_run(&r)).transpose()
}

fn refusal_run(r: &crate::store::engine::Row) -> StoreResult<RefusalRun> {
    Ok(RefusalRun {
        seq: r.int("refusal_seq")?,
        code: r.opt_text("refusal_code")?,
        detail: r.opt_text("refusal_detail")?,
        count: r.int("refusal_count")?,
        first_at: r.opt_int("refusal_first_at")?.map(Millis),
        last_at: r.opt_int("refusal_last_at")?.map(Millis),
        synced_at: r.opt_int("refusal_synced_at")?.map(Millis),
    })
}

/// Refusals since `since`, per runner: the runs that went on then, counted whole (an open run
/// as its row counts it).
pub async fn refusal_counts_since<D: Db>(
    db: &mut D,
    since: Millis,
) -> StoreResult<BTreeMap<RunnerId, i64>> {
    let found = db
        .fetch(
            Statement::new(
                "SELECT f.runner_id, CAST(SUM(CASE WHEN r.refusal_code IS NOT NULL \
                 AND f.seq = r.refusal_seq THEN r.refusal_count ELSE f.count END) AS BIGINT) AS n \
                 FROM refusals f JOIN runners r ON r.id = f.runner_id \
                 WHERE COALESCE(f.last_at, f.at) >= $1 \
                 OR (r.refusal_code IS NOT NULL AND f.seq = r.refusal_seq \
                 AND r.refusal_last_at >= $1) \
                 GROUP BY f.runner_id",
            )
            .bind(since.0),
        )
        .await?;
    found
        .iter()
        .map(|r| Ok((RunnerId(r.text("runner_id")?), r.int("n")?)))
        .collect()
}

/// A refusal outside a round (a forge fetch the gate answered): the runner's run goes on or
/// a new one opens, as a round would write it.
pub async fn record_refusal<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    code: &str,
    detail: &str,
    now: Millis,
) -> StoreResult<()> {
    let row = fetch_optional(
        db,
        Statement::new(
            "SELECT refusal_seq, refusal_code, refusal_detail, refusal_count, refusal_first_at, \
             refusal_last_at, refusal_synced_at FROM runners WHERE id = $1",
        )
        .bind(runner.as_str())
        .tail(Tail::RowLock),
    )
    .await?;
    let Some(row) = row else { return Ok(()) };
    let mut run = refusal_run(&row)?;
    let writes = run.refused(code, detail, now);
    db.execute(
        Statement::new(
            "UPDATE runners SET refusal_seq = $2, refusal_code = $3, refusal_detail = $4, \
                refusal_count = $5, \
             refusal_first_at = $6, refusal_last_at = $7, refusal_synced_at = $8 WHERE id = $1",
        )
        .bind(runner.as_str())
        .bind(run.seq)
        .bind(run.code.as_deref())
        .bind(run.detail.as_deref())
        .bind(run.count)
        .bind(run.first_at.map(|m| m.0))
        .bind(run.last_at.map(|m| m.0))
        .bind(run.synced_at.map(|m| m.0)),
    )
    .await?;
    let writes: Vec<(&RunnerId, _)> = writes.into_iter().map(|w| (runner, w)).collect();
    upsert_refusals(db, &writes).await?;
    Ok(())
}

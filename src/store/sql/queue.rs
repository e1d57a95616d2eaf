//! The queue: which jobs a claim takes (the pool's oldest queued ones, in the queue's order),
//! how it takes them (each moved to `leased` under its new lease), and the bench's bulk
//! statements over the same order.
//!
//! The order is written once, here (`QUEUE_ORDER`). `EXPLAIN` tests check that it runs through
//! the partial index `jobs_queue_order`, whatever the queue's depth and however stale the
//! planner's statistics. It orders by `created_at, seq` rather than `seq` alone so that no other
//! index can serve it: ordered by `seq`, PostgreSQL took the primary key whenever its
//! statistics said most jobs were queued (a deep queue, or one filled since the last analyze),
//! and then stepped over every finished job on each claim.
//!
//! At most one live lease per job: a claim moves a job only `WHERE … state = 'queued'`, and the
//! unique partial index `leases_one_live_per_job` fails the insert of a second live lease,
//! rolling the claim back, rather than hand one job to two runners. A job its runner abandoned
//! is held from that runner for a while (`domain::lease::ABANDON_HOLD_S`): a claim for it looks
//! `HELD_LOOKAHEAD` jobs further, and `assign` gives each claim the oldest job open to it.

use super::values_list;
use crate::domain::job::{EventKind, Job};
use crate::domain::lease::{Lease, LeaseState};
use crate::store::engine::{Db, Param, RowsWrite, Statement, Tail};
use crate::store::{Claim, StoreResult};
use std::sync::LazyLock;

/// The queue's order, after a `pool = $n` condition.
const QUEUE_ORDER: &str = "AND state = 'queued' ORDER BY created_at, seq";

/// A round's choice of jobs for the claims it holds on one pool: its `$2` oldest queued ones,
/// with the runner each is held from (an abandon's, for a while).
pub static CLAIM_BATCH_SQL: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT seq, held_from, held_until FROM jobs WHERE pool = $1 {QUEUE_ORDER} LIMIT $2")
});

/// How many jobs beyond one per claim a round looks at when a job it found is held from its
/// claim's runner (it abandoned it a moment ago): that claim then takes the next.
pub const HELD_LOOKAHEAD: usize = 4;

/// A queued job a claim may take, unless it is held from the claim's runner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub seq: i64,
    held: Option<(String, i64)>,
}

impl Candidate {
    /// Whether `claim`'s runner may take it.
    pub fn open_to(&self, claim: &Claim) -> bool {
        self.held.as_ref().is_none_or(|(runner, until)| {
            runner != claim.runner_id.as_str() || claim.now.0 >= *until
        })
    }
}

/// Each claim's job, in the queue's order: the oldest candidate not taken and open to it.
pub fn assign<'c>(candidates: &[Candidate], claims: &[&'c Claim]) -> Vec<(i64, &'c Claim)> {
    let mut taken = vec![false; candidates.len()];
    let mut pairs = Vec::with_capacity(claims.len());
    for claim in claims {
        let pick = candidates
            .iter()
            .enumerate()
            .find(|(i, c)| !taken[*i] && c.open_to(claim));
        if let Some((i, c)) = pick {
            taken[i] = true;
            pairs.push((c.seq, *claim));
        }
    }
    pairs
}

const RAW_CLAIM_SQL: &str = "UPDATE jobs SET state = 'leased', lease_id = $1, updated_at = $2 \
     WHERE seq = $3 AND state = 'queued' RETURNING id";

static PRECLAIM_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE jobs SET state = 'succeeded', updated_at = $3 WHERE seq IN (SELECT seq FROM jobs \
         WHERE pool = $1 {QUEUE_ORDER} LIMIT $2)"
    )
});

/// The pool's `n` oldest queued jobs, locked for the claim (skipping those another
/// transaction holds).
pub async fn candidates<D: Db>(db: &mut D, pool: &str, n: usize) -> StoreResult<Vec<Candidate>> {
    let found = db
        .fetch(
            Statement::new(CLAIM_BATCH_SQL.as_str())
                .bind(pool)
                .bind(n as i64)
                .tail(Tail::SkipLocked),
        )
        .await?;
    found
        .iter()
        .map(|r| {
            let held = match (r.opt_text("held_from")?, r.opt_int("held_until")?) {
                (Some(runner), Some(until)) => Some((runner, until)),
                _ => None,
            };
            Ok(Candidate {
                seq: r.int("seq")?,
                held,
            })
        })
        .collect()
}

/// Moves the chosen jobs to `leased`, each under its claim's lease; the jobs moved.
pub async fn lease_jobs<D: Db>(db: &mut D, pairs: &[(i64, &Claim)]) -> StoreResult<Vec<Job>> {
    let mut params = Vec::with_capacity(pairs.len() * 3);
    for (seq, claim) in pairs {
        params.extend([
            Param::Int(*seq),
            Param::Text(claim.lease_id.as_str()),
            Param::Int(claim.now.0),
        ]);
    }
    let st = Statement::built(format!(
        "WITH v (seq, lease_id, updated_at) AS (VALUES {}) \
         UPDATE jobs SET state = 'leased', lease_id = v.lease_id, updated_at = v.updated_at \
         FROM v WHERE jobs.seq = v.seq AND jobs.state = 'queued'",
        values_list(pairs.len(), 3, 1)
    ))
    .params(params)
    .tail(Tail::ReturningJobs);
    let moved = db.fetch(st).await?;
    moved.iter().map(super::rows::job).collect()
}

/// The granted leases' rows.
pub fn lease_rows<'a>(granted: &'a [(&'a Lease, &'a str)]) -> RowsWrite<'a> {
    let sql = |rows: &str| {
        format!(
            "INSERT INTO leases (id, job_id, runner_id, pool, token_hash, state, attempt, \
             granted_at, expires_at) {rows}"
        )
    };
    RowsWrite::of(granted, 9, sql, |(lease, token_hash)| {
        vec![
            Param::Text(lease.id.as_str()),
            Param::Text(lease.job_id.as_str()),
            Param::Text(lease.runner_id.as_str()),
            Param::Text(lease.pool.as_str()),
            Param::Text(token_hash),
            Param::Text(LeaseState::Leased.as_str()),
            Param::Int(lease.attempt),
            Param::Int(lease.granted_at.0),
            Param::Int(lease.expires_at.0),
        ]
    })
}

/// The `leased` line of each granted job's story.
pub fn leased_event_rows<'a>(granted: &'a [(&'a Lease, &'a str)]) -> RowsWrite<'a> {
    let sql = |rows: &str| {
        format!(
            "INSERT INTO job_events (job_id, at, kind, runner_id, lease_id, reason, detail) \
             {rows}"
        )
    };
    RowsWrite::of(granted, 7, sql, |(lease, _)| {
        vec![
            Param::Text(lease.job_id.as_str()),
            Param::Int(lease.granted_at.0),
            Param::Text(EventKind::Leased.as_str()),
            Param::Text(lease.runner_id.as_str()),
            Param::Text(lease.id.as_str()),
            Param::OptText(None),
            Param::OptText(None),
        ]
    })
}

/// The bench's raw claim (`bench/baseline.rs`): the pool's oldest queued job to `lease_id`
/// and its lease inserted, the engine's statements with nothing of the service around them.
/// The job is chosen as a round chooses (`candidates`, skipping the rows other claims hold),
/// so that concurrent claims on PostgreSQL take the next job rather than wait for the same one
/// and find it gone. `false` when the queue is empty.
pub async fn raw_claim<D: Db>(
    db: &mut D,
    pool: &str,
    runner_id: &str,
    lease_id: &str,
    now: i64,
) -> StoreResult<bool> {
    let Some(seq) = candidates(db, pool, 1).await?.first().map(|c| c.seq) else {
        return Ok(false);
    };
    let claimed = db
        .fetch(
            Statement::new(RAW_CLAIM_SQL)
                .bind(lease_id)
                .bind(now)
                .bind(seq),
        )
        .await?;
    let Some(job) = claimed.first() else {
        return Ok(false);
    };
    db.execute(
        Statement::new(
            "INSERT INTO leases (id, job_id, runner_id, pool, token_hash, state, attempt, \
                granted_at, expires_at) \
             VALUES ($1, $2, $3, $4, 'raw', 'leased', 1, $5, $6)",
        )
        .bind(lease_id)
        .bind(job.text("id")?)
        .bind(runner_id)
        .bind(pool)
        .bind(now)
        .bind(now + 300_000),
    )
    .await?;
    Ok(true)
}

/// Queues the jobs `prefix-from` to `prefix-(to-1)` of `pool` in one statement (the bench's
/// deep queues), the numbers counted by a recursive query both engines run.
pub async fn preload_batch<D: Db>(
    db: &mut D,
    from: i64,
    to: i64,
    prefix: &str,
    pool: &str,
    now: i64,
) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "INSERT INTO jobs (id, pool, payload, state, max_attempts, created_at, updated_at) \
             WITH RECURSIVE k(i) AS (SELECT $1 UNION ALL SELECT i + 1 FROM k WHERE i + 1 < $2) \
             SELECT $3 || '-' || i, $4, '{}', 'queued', 3, $5, $5 FROM k",
        )
        .bind(from)
        .bind(to)
        .bind(prefix)
        .bind(pool)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// Before a measurement on PostgreSQL, outside a transaction, as pgbench vacuums before its
/// run: what earlier work left (a bulk load's hint bits and visibility map, the dead rows of a
/// phase's claims and updates, dirty pages) is cleaned now, not paid for by the next phase's
/// requests beside an autovacuum that happens to start in them.
///
/// Neither is needed for a measurement to be right: each that fails (a role that may not
/// checkpoint, a vacuum longer than the statement timeout) is said and skipped.
pub async fn settle<D: Db>(db: &mut D) -> StoreResult<()> {
    if let Err(e) = db.execute(Statement::new("VACUUM (ANALYZE)")).await {
        tracing::warn!(error = %e, "no VACUUM before the measurement");
    }
    if let Err(e) = db.execute(Statement::new("CHECKPOINT")).await {
        tracing::warn!(error = %e, "no CHECKPOINT before the measurement (a role needs \
            pg_checkpoint, or to be a superuser)");
    }
    Ok(())
}

/// Moves the pool's `n` oldest queued jobs to `succeeded`, as `n` claims and completions would
/// (the bench's `--preclaim`): what matters for a later claim is that they left the partial
/// index `jobs_queue_order` and their old entries await vacuum, not how they left.
pub async fn preclaim_batch<D: Db>(db: &mut D, pool: &str, n: i64, now: i64) -> StoreResult<()> {
    db.execute(
        Statement::new(PRECLAIM_SQL.as_str())
            .bind(pool)
            .bind(n)
            .bind(now),
    )
    .await?;
    Ok(())
}

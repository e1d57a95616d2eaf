//! The claim transaction executed directly on each engine, without HTTP, JWT or the `Store`
//! trait: the limit `leasegate bench` measures the service against, in the same run.
//!
//! It runs the very statements the store's claim runs (`CLAIM_CANDIDATE_SQL`, the job update,
//! the lease insert) in one transaction per claim, with the engine's durable settings: SQLite
//! in WAL with `synchronous=NORMAL` and `BEGIN IMMEDIATE` through its C library (rusqlite, no
//! async hop), PostgreSQL through plain connections with `FOR UPDATE SKIP LOCKED`.

use super::round_sql::{Param, Statement};
use super::sql_store::CLAIM_CANDIDATE_SQL;
use std::time::{Duration, Instant};

const CLAIM_UPDATE_PREFIX: &str =
    "UPDATE jobs SET state = 'leased', lease_id = $1, updated_at = $2 WHERE seq = (";
const LEASE_INSERT: &str = "INSERT INTO leases (id, job_id, runner_id, pool, token_hash, state, attempt, granted_at, expires_at) \
     VALUES ($1, $2, $3, $4, 'raw', 'leased', 1, $5, $6)";

/// How many claims ran and for how long.
#[derive(Clone, Copy, Debug)]
pub struct RawClaims {
    pub claims: u64,
    pub elapsed: Duration,
}

impl RawClaims {
    pub fn per_second(&self) -> f64 {
        self.claims as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn now_ms() -> i64 {
    crate::domain::time::Millis::now().0
}

/// Claims up to `n` jobs of `pool` for `runner_id` on the SQLite file at `path`, one
/// transaction each, for at most `limit`.
pub fn sqlite(
    path: &str,
    pool: &str,
    runner_id: &str,
    n: u64,
    limit: Duration,
) -> anyhow::Result<RawClaims> {
    let conn = rusqlite::Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let claim_sql =
        format!("{CLAIM_UPDATE_PREFIX}{CLAIM_CANDIDATE_SQL}) AND state = 'queued' RETURNING id");
    let started = Instant::now();
    let mut claims = 0;
    while claims < n && started.elapsed() < limit {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let lease_id = uuid::Uuid::now_v7().to_string();
        let now = now_ms();
        let job: Option<String> = {
            let mut stmt = conn.prepare_cached(&claim_sql)?;
            let mut rows = stmt.query(rusqlite::params![lease_id, now, pool])?;
            rows.next()?.map(|r| r.get(0)).transpose()?
        };
        let Some(job) = job else {
            conn.execute_batch("ROLLBACK")?;
            break;
        };
        conn.prepare_cached(LEASE_INSERT)?
            .execute(rusqlite::params![
                lease_id,
                job,
                runner_id,
                pool,
                now,
                now + 300_000
            ])?;
        conn.execute_batch("COMMIT")?;
        claims += 1;
    }
    Ok(RawClaims {
        claims,
        elapsed: started.elapsed(),
    })
}

/// The same on PostgreSQL at `url`, from `concurrency` connections at once.
pub async fn postgres(
    url: &str,
    pool: &str,
    runner_id: &str,
    n: u64,
    concurrency: u32,
    limit: Duration,
) -> anyhow::Result<RawClaims> {
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(concurrency)
        .connect(url)
        .await?;
    let claim_sql: &'static str = Box::leak(
        format!("{CLAIM_UPDATE_PREFIX}{CLAIM_CANDIDATE_SQL} FOR UPDATE SKIP LOCKED) AND state = 'queued' RETURNING id")
            .into_boxed_str(),
    );
    let claimed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (db, claimed, pool, runner_id) = (
            db.clone(),
            claimed.clone(),
            pool.to_string(),
            runner_id.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            use std::sync::atomic::Ordering;
            while claimed.load(Ordering::Relaxed) < n && started.elapsed() < limit {
                let mut tx = db.begin().await?;
                let lease_id = uuid::Uuid::now_v7().to_string();
                let now = now_ms();
                let job: Option<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(claim_sql))
                    .bind(&lease_id)
                    .bind(now)
                    .bind(&pool)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some((job,)) = job else { break };
                sqlx::query(LEASE_INSERT)
                    .bind(&lease_id)
                    .bind(&job)
                    .bind(&runner_id)
                    .bind(&pool)
                    .bind(now)
                    .bind(now + 300_000)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                claimed.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    db.close().await;
    Ok(RawClaims {
        claims: claimed.load(std::sync::atomic::Ordering::Relaxed),
        elapsed,
    })
}

/// A connection straight to the engine, for the bench's bulk statements before the clock.
enum Direct {
    Sqlite(rusqlite::Connection),
    Postgres(sqlx::PgPool),
}

impl Direct {
    async fn open(url: &str) -> anyhow::Result<Direct> {
        Ok(if url.starts_with("sqlite:") {
            let conn = rusqlite::Connection::open(url.trim_start_matches("sqlite://"))?;
            conn.busy_timeout(Duration::from_secs(30))?;
            Direct::Sqlite(conn)
        } else {
            let db = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(url)
                .await?;
            Direct::Postgres(db)
        })
    }

    /// Runs `st`, its placeholders written `$n` as for PostgreSQL.
    async fn execute(&self, st: Statement<'_>) -> anyhow::Result<()> {
        match self {
            Direct::Sqlite(conn) => {
                // SQLite numbers `$n` by first appearance, `?n` by `n`.
                let sql = st.sql.replace('$', "?");
                conn.execute(&sql, rusqlite::params_from_iter(&st.params))?;
            }
            Direct::Postgres(db) => {
                super::pg_rounds::query(st).execute(db).await?;
            }
        }
        Ok(())
    }

    /// Runs `statement(done, upto)` for `n` rows in batches of `batch`.
    async fn in_batches<'a>(
        &self,
        n: u64,
        batch: u64,
        statement: impl Fn(u64, u64) -> Statement<'a>,
    ) -> anyhow::Result<()> {
        let mut done = 0;
        while done < n {
            let upto = (done + batch).min(n);
            self.execute(statement(done, upto)).await?;
            done = upto;
        }
        Ok(())
    }
}

/// Queues `n` jobs in `pool` straight through the engine, for measurements at a queue depth
/// that the forge API would take minutes to build (one statement per 100,000 jobs).
pub async fn preload(url: &str, pool: &str, n: u64) -> anyhow::Result<()> {
    let now = now_ms();
    let prefix = format!("{pool}-pre-{}", uuid::Uuid::now_v7().simple());
    let db = Direct::open(url).await?;
    // The numbers `$1..$2` of the batch, as rows: each engine has its own way to count.
    let numbers = match db {
        Direct::Sqlite(_) => {
            "WITH RECURSIVE k(i) AS (SELECT $1 UNION ALL SELECT i + 1 FROM k WHERE i + 1 < $2) SELECT i FROM k"
        }
        Direct::Postgres(_) => "SELECT i FROM generate_series($1, $2 - 1) AS i",
    };
    db.in_batches(n, 100_000, |done, upto| Statement {
        sql: format!(
            "INSERT INTO jobs (id, pool, payload, state, max_attempts, created_at, updated_at) \
             SELECT $3 || '-' || i, $4, '{{}}', 'queued', 3, $5, $5 FROM ({numbers}) AS k"
        ),
        params: vec![
            Param::Int(done as i64),
            Param::Int(upto as i64),
            Param::Text(&prefix),
            Param::Text(pool),
            Param::Int(now),
        ],
    })
    .await?;
    if let Direct::Postgres(db) = &db {
        // A million rows inserted in one go leave their hint bits, visibility map and dirty
        // pages for the first claims to pay for; a queue filled over hours has had autovacuum
        // and checkpoints do that as it grew. Settle them here, before the clock starts.
        sqlx::query("VACUUM (ANALYZE) jobs").execute(db).await?;
        if let Err(e) = sqlx::query("CHECKPOINT").execute(db).await {
            tracing::warn!(error = %e, "no CHECKPOINT after the preload (needs pg_checkpoint)");
        }
    }
    Ok(())
}

/// Moves the `n` oldest queued jobs of `pool` to `succeeded` in batches, as `n` claims and
/// completions would: what matters for a later claim is that they left the partial index
/// `jobs_queue_order` and their old entries await vacuum, not how they left.
pub async fn preclaim(url: &str, pool: &str, n: u64) -> anyhow::Result<()> {
    let now = now_ms();
    let db = Direct::open(url).await?;
    db.in_batches(n, 10_000, |done, upto| Statement {
        sql: concat!(
            "UPDATE jobs SET state = 'succeeded', updated_at = $3 WHERE seq IN (",
            super::round_sql::queued_in_order!("$1"),
            " LIMIT $2)"
        )
        .into(),
        params: vec![
            Param::Text(pool),
            Param::Int((upto - done) as i64),
            Param::Int(now),
        ],
    })
    .await
}

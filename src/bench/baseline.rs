//! The raw claims the service's grants are measured against: the claim transaction run
//! directly on the engine, without HTTP, JWT, group commit or the gate, and the bulk
//! statements that build deep queues before the clock starts.
//!
//! It runs the store's own queue statements (`store::sql::queue`: the same choice of job, the
//! job update, the lease insert), one transaction per claim, over the engine opened bare
//! (`store::Bare`): SQLite in WAL with `synchronous=NORMAL` and `BEGIN IMMEDIATE` on the
//! caller's thread, its WAL copied by a checkpointer beside it as the service's is;
//! PostgreSQL as pgbench runs a script, one connection per client for as many clients as the
//! bench's phases have, each statement prepared once on its connection, the job taken with
//! `FOR UPDATE SKIP LOCKED`.

use crate::domain::time::Millis;
use crate::store::engine::{Db, Engine, Work, work};
use crate::store::postgres::PgEngine;
use crate::store::sql::queue;
use crate::store::{Bare, DatabaseUrl};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// What one raw claim needs.
#[derive(Clone)]
struct Claimer {
    pool: String,
    runner_id: String,
}

impl Claimer {
    /// One claim as one piece of work: `false` when the queue is empty.
    fn claim<D: Db + 'static>(&self) -> Work<D, bool> {
        let me = self.clone();
        let lease_id = uuid::Uuid::now_v7().to_string();
        let now = Millis::now().0;
        work(move |db| {
            Box::pin(
                async move { queue::raw_claim(db, &me.pool, &me.runner_id, &lease_id, now).await },
            )
        })
    }
}

/// Claims up to `n` jobs of `pool` for `runner_id`, one transaction each, for at most
/// `limit`: on SQLite from one connection (there is one writer), on PostgreSQL from `clients`
/// clients at once, each on a connection of its own.
pub async fn raw_claims(
    url: &DatabaseUrl,
    pool: &str,
    runner_id: &str,
    n: u64,
    clients: u32,
    limit: Duration,
) -> anyhow::Result<RawClaims> {
    let claimer = Claimer {
        pool: pool.to_string(),
        runner_id: runner_id.to_string(),
    };
    if let DatabaseUrl::Sqlite(_) = url {
        let Bare::Sqlite(mut conn) = Bare::open(url, 1).await? else {
            unreachable!("a SQLite URL opens SQLite")
        };
        return tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut claims = 0;
            while claims < n && started.elapsed() < limit {
                if !conn.write(claimer.claim())? {
                    break;
                }
                claims += 1;
            }
            Ok(RawClaims {
                claims,
                elapsed: started.elapsed(),
            })
        })
        .await?;
    }
    // Every client connected before the clock starts, as pgbench does.
    let mut engines = Vec::new();
    for _ in 0..clients.max(1) {
        match Bare::open(url, 1).await? {
            Bare::Postgres(engine) => engines.push(Arc::new(engine)),
            Bare::Sqlite(_) => unreachable!("a PostgreSQL URL opens PostgreSQL"),
        }
    }
    let claimed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for engine in &engines {
        let (engine, claimed, claimer) = (engine.clone(), claimed.clone(), claimer.clone());
        tasks.push(tokio::spawn(async move {
            while claimed.load(Ordering::Relaxed) < n && started.elapsed() < limit {
                let (granted, _) = engine.write(claimer.claim()).await?;
                if !granted {
                    break;
                }
                claimed.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    let mut failed = None;
    for t in tasks {
        if let Err(e) = t.await? {
            failed.get_or_insert(e);
        }
    }
    let elapsed = started.elapsed();
    for engine in engines {
        engine.close().await;
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(RawClaims {
        claims: claimed.load(Ordering::Relaxed),
        elapsed,
    })
}

/// `0..n` in consecutive ranges of at most `batch`.
fn batches(n: u64, batch: u64) -> impl Iterator<Item = (i64, i64)> {
    (0..n.div_ceil(batch)).map(move |b| ((b * batch) as i64, ((b + 1) * batch).min(n) as i64))
}

fn preload_work<D: Db + 'static>(
    from: i64,
    to: i64,
    prefix: String,
    pool: String,
    now: i64,
) -> Work<D, ()> {
    work(move |db| {
        Box::pin(async move { queue::preload_batch(db, from, to, &prefix, &pool, now).await })
    })
}

fn preclaim_work<D: Db + 'static>(pool: String, n: i64, now: i64) -> Work<D, ()> {
    work(move |db| Box::pin(async move { queue::preclaim_batch(db, &pool, n, now).await }))
}

/// Queues `n` jobs in `pool` straight through the engine, for measurements at a queue depth
/// that the forge API would take minutes to build (one statement per 100,000 jobs).
pub async fn preload(url: &DatabaseUrl, pool: &str, n: u64) -> anyhow::Result<()> {
    let now = Millis::now().0;
    let prefix = format!("{pool}-pre-{}", uuid::Uuid::now_v7().simple());
    let (prefix, pool) = (prefix.as_str(), pool.to_string());
    match Bare::open(url, 1).await? {
        // The bench is idle while it fills: a blocking call here holds up nothing.
        Bare::Sqlite(mut conn) => {
            for (from, to) in batches(n, 100_000) {
                conn.write(preload_work(from, to, prefix.into(), pool.clone(), now))?;
            }
        }
        Bare::Postgres(engine) => {
            for (from, to) in batches(n, 100_000) {
                engine
                    .write(preload_work(from, to, prefix.into(), pool.clone(), now))
                    .await?;
            }
            // Here, not only before the first phase: `--preclaim`'s leftovers come after.
            settle_on(&engine).await?;
        }
    }
    Ok(())
}

/// Moves the `n` oldest queued jobs of `pool` to `succeeded` in batches, as `n` claims and
/// completions would (`--preclaim`).
pub async fn preclaim(url: &DatabaseUrl, pool: &str, n: u64) -> anyhow::Result<()> {
    let now = Millis::now().0;
    match Bare::open(url, 1).await? {
        Bare::Sqlite(mut conn) => {
            for (from, to) in batches(n, 10_000) {
                conn.write(preclaim_work(pool.into(), to - from, now))?;
            }
        }
        Bare::Postgres(engine) => {
            for (from, to) in batches(n, 10_000) {
                engine
                    .write(preclaim_work(pool.into(), to - from, now))
                    .await?;
            }
        }
    }
    Ok(())
}

/// Before each phase on PostgreSQL: vacuums and checkpoints what earlier phases and loads left
/// (`queue::settle`), so that each phase measures its own work. SQLite's WAL is checkpointed
/// before each phase by the bench's meter (`io::Meter`), where it has one (in process, or
/// with `--server-pid`).
pub async fn settle(url: &DatabaseUrl) -> anyhow::Result<()> {
    if !matches!(url, DatabaseUrl::Postgres(_)) {
        return Ok(());
    }
    let Bare::Postgres(engine) = Bare::open(url, 1).await? else {
        return Ok(());
    };
    let settled = settle_on(&engine).await;
    // Its connection given back before the phase needs the server's.
    engine.close().await;
    settled
}

/// `queue::settle` on one of `engine`'s connections, outside a transaction (VACUUM cannot run
/// inside one).
async fn settle_on(engine: &PgEngine) -> anyhow::Result<()> {
    Ok(engine
        .read(|| work(|db| Box::pin(queue::settle(db))))
        .await?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn batches_cover_the_range_once() {
        let b: Vec<(i64, i64)> = super::batches(25, 10).collect();
        assert_eq!(b, vec![(0, 10), (10, 20), (20, 25)]);
        assert_eq!(super::batches(0, 10).count(), 0);
    }
}

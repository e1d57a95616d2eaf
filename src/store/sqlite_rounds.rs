//! SQLite's write rounds, on a thread of their own through the C library.
//!
//! Through sqlx every statement is a hop to its SQLite worker thread and back, about 150 µs
//! each when the cores are busy, and a round has a dozen. Here a whole round is one hop: the
//! thread owns a connection to the same file, keeps its statements prepared, and runs the
//! round (`round_writer::write_round`, the same steps PostgreSQL runs) in one `BEGIN IMMEDIATE`
//! transaction.
//!
//! SQLite has one writer at a time. So that this connection and the store's sqlx writer never
//! contend for the file's lock (and sleep in SQLite's busy handler), a round holds the sqlx
//! writer pool's only connection while it runs: every write of the process still goes one at
//! a time. Another process holding the lock is waited for up to the busy timeout, then the
//! round fails as `unavailable`.

use super::round::{RoundItem, RoundResult, RunnerRow};
use super::round_sql::{Param, Statement};
use super::round_writer::{RoundDb, write_round};
use super::rows::JobColumns;
use super::{StoreError, StoreResult};
use crate::domain::ids::RunnerId;
use crate::domain::job::Job;
use crate::domain::time::Millis;
use rusqlite::types::ToSqlOutput;
use rusqlite::{Connection, ToSql, TransactionBehavior, params_from_iter};
use std::future::Future;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;
use tokio::sync::oneshot;

type Work = (Vec<RoundItem>, oneshot::Sender<RoundResult>);

/// The thread that writes SQLite's rounds. It stops when the store is dropped.
pub struct RoundThread {
    queue: mpsc::Sender<Work>,
}

impl RoundThread {
    /// Opens the database at `path` (already created and migrated) for the round thread.
    pub fn open(path: &Path, synchronous_full: bool) -> anyhow::Result<Self> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(
            None,
            "synchronous",
            if synchronous_full { "FULL" } else { "NORMAL" },
        )?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.set_prepared_statement_cache_capacity(128);
        let (queue, work) = mpsc::channel::<Work>();
        std::thread::Builder::new()
            .name("sqlite-rounds".into())
            .spawn(move || {
                let mut conn = conn;
                for (items, reply) in work {
                    let _ = reply.send(run(&mut conn, &items));
                }
            })?;
        Ok(RoundThread { queue })
    }

    /// Writes `items` as one round and answers once it is committed.
    pub async fn write(&self, items: &[RoundItem]) -> RoundResult {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send((items.to_vec(), reply))
            .map_err(|_| StoreError::Unavailable("the SQLite round thread stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the SQLite round thread stopped".into()))?
    }
}

fn run(conn: &mut Connection, items: &[RoundItem]) -> RoundResult {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(store_error)?;
    let outcomes = run_to_completion(write_round(&mut SqliteRound(&tx), items))?;
    tx.commit().map_err(store_error)?;
    Ok(outcomes)
}

/// Runs a future that never waits (every statement here is a blocking call) to its end.
fn run_to_completion<T>(future: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(result) => result,
        std::task::Poll::Pending => Err(StoreError::Internal(
            "a SQLite round waited, which it never should".into(),
        )),
    }
}

/// SQLite's errors as the store's: busy, locked, I/O and read-only are `unavailable`.
fn store_error(e: rusqlite::Error) -> StoreError {
    let code = match &e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.extended_code.to_string()),
        _ => None,
    };
    if super::is_unavailable(code.as_deref(), &e.to_string()) {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Internal(e.to_string())
    }
}

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Param::Text(s) => s.to_sql(),
            Param::Int(i) => i.to_sql(),
            Param::OptText(s) => s.to_sql(),
            Param::OptInt(i) => i.to_sql(),
        }
    }
}

/// A round's transaction on SQLite. The statements run to their end before each `await`
/// returns, so the round never waits.
struct SqliteRound<'c>(&'c rusqlite::Transaction<'c>);

impl SqliteRound<'_> {
    fn query<T>(
        &self,
        st: &Statement<'_>,
        mut read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> StoreResult<Vec<T>> {
        let mut stmt = self.0.prepare_cached(&st.sql).map_err(store_error)?;
        let mut rows = stmt
            .query(params_from_iter(st.params.iter()))
            .map_err(store_error)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(store_error)? {
            out.push(read(row).map_err(store_error)?);
        }
        Ok(out)
    }
}

impl RoundDb for SqliteRound<'_> {
    const ROW_LOCK: &'static str = "";
    const CLAIM_LOCK: &'static str = "";
    const RETURNING_JOBS: &'static str = "RETURNING *";

    async fn execute(&mut self, st: Statement<'_>) -> StoreResult<()> {
        let mut stmt = self.0.prepare_cached(&st.sql).map_err(store_error)?;
        stmt.execute(params_from_iter(st.params.iter()))
            .map_err(store_error)?;
        Ok(())
    }

    async fn exists(&mut self, st: Statement<'_>) -> StoreResult<bool> {
        Ok(!self.query(&st, |_| Ok(()))?.is_empty())
    }

    async fn runner_rows(&mut self, st: Statement<'_>) -> StoreResult<Vec<(RunnerId, RunnerRow)>> {
        self.query(&st, |r| {
            Ok((
                RunnerId(r.get("id")?),
                RunnerRow {
                    attestation_seq: r.get("attestation_seq")?,
                    refusal_seq: r.get("refusal_seq")?,
                    last_status: r.get("last_status")?,
                    quarantined_at: r.get::<_, Option<i64>>("quarantined_at")?.map(Millis),
                    revoked: r.get::<_, Option<i64>>("revoked_at")?.is_some(),
                    cordoned: r.get::<_, i64>("cordoned")? != 0,
                },
            ))
        })
    }

    async fn inserted_jtis(&mut self, st: Statement<'_>) -> StoreResult<Vec<(String, String)>> {
        self.query(&st, |r| Ok((r.get("runner_id")?, r.get("jti")?)))
    }

    async fn seqs(&mut self, st: Statement<'_>) -> StoreResult<Vec<i64>> {
        self.query(&st, |r| r.get("seq"))
    }

    async fn jobs(&mut self, st: Statement<'_>) -> StoreResult<Vec<Job>> {
        let raw = self.query(&st, |r| {
            Ok(JobColumns {
                id: r.get("id")?,
                pool: r.get("pool")?,
                payload: r.get("payload")?,
                state: r.get("state")?,
                attempts: r.get("attempts")?,
                max_attempts: r.get("max_attempts")?,
                returns: r.get("returns")?,
                last_error: r.get("last_error")?,
                idempotency_key: r.get("idempotency_key")?,
                lease_id: r.get("lease_id")?,
                created_at: r.get("created_at")?,
                updated_at: r.get("updated_at")?,
            })
        })?;
        raw.into_iter().map(JobColumns::into_job).collect()
    }
}

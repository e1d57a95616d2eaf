//! The embedded engine: one SQLite file in WAL mode.
//!
//! All writes go through a single writer connection and begin `IMMEDIATE`: SQLite has one
//! writer at a time anyway, and a deferred transaction that reads then writes fails at once with
//! `SQLITE_BUSY_SNAPSHOT` whatever the busy timeout. Write rounds (attestations and claims) run
//! on a thread of their own (`sqlite_rounds`) while holding that writer, so writes still go one
//! at a time. Reads use a separate pool, which WAL lets run beside the writer. `synchronous=NORMAL` survives a crash of the process; set
//! `LEASEGATE_SQLITE_SYNCHRONOUS=FULL` to survive power loss too.

use super::round::{RoundItem, RoundResult};
use super::sql_store::impl_sql_store;
use super::sqlite_rounds::RoundThread;
use super::{JobSignal, StoreResult};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::str::FromStr;
use std::time::Duration;

/// How often a long poll re-checks for work without a wake-up (see `store::open`).
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 256;

pub struct SqliteStore {
    rounds: RoundThread,
    writer: SqlitePool,
    reader: SqlitePool,
    signal: JobSignal,
}

impl SqliteStore {
    /// Opens (creating if missing) and migrates the database at `url` (`sqlite://path`).
    pub async fn open(url: &str, signal: JobSignal) -> anyhow::Result<Self> {
        let full = matches!(
            std::env::var("LEASEGATE_SQLITE_SYNCHRONOUS").as_deref(),
            Ok("FULL") | Ok("full")
        );
        let synchronous = if full {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        };
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true)
            // Room for the rounds' statements in each of their sizes (`round::chunks`) beside
            // the rest, so that none is evicted and parsed again.
            .statement_cache_capacity(STATEMENT_CACHE);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("migrations/sqlite").run(&writer).await?;
        let rounds = RoundThread::open(options.get_filename(), full)?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.read_only(true))
            .await?;
        Ok(SqliteStore {
            rounds,
            writer,
            reader,
            signal,
        })
    }

    async fn begin(&self) -> StoreResult<sqlx::Transaction<'static, sqlx::Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Ready means writable: take the write lock and give it back. A file that cannot be
    /// written, or is locked by another process, fails here rather than on the next lease.
    async fn health_check(&self) -> StoreResult<()> {
        let tx = self.begin().await?;
        tx.rollback().await?;
        Ok(())
    }

    fn reader(&self) -> &SqlitePool {
        &self.reader
    }

    fn writer(&self) -> &SqlitePool {
        &self.writer
    }

    /// In-process wake-ups need no announcement inside the transaction; the caller notifies
    /// after commit.
    async fn announce_job(
        &self,
        _tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        _pool: &str,
    ) -> StoreResult<()> {
        Ok(())
    }

    /// One process holds the file: `FastStore` forgets changed inputs itself.
    async fn announce_change(
        &self,
        _tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        _key: &str,
    ) -> StoreResult<()> {
        Ok(())
    }
}

impl_sql_store! {
    store: SqliteStore,
    db: sqlx::Sqlite,
    engine: "sqlite",
    row_lock: "",
    claim_lock: ""
}

impl SqliteStore {
    /// Writes `items` as one round on the round thread, holding the sqlx writer meanwhile so
    /// that the process's writes still go one at a time (`sqlite_rounds`).
    async fn run_round(&self, items: &[RoundItem]) -> RoundResult {
        let _one_writer = self.writer.acquire().await?;
        self.rounds.write(items).await
    }
}

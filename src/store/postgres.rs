//! The engine for more than one machine: any number of stateless replicas on one PostgreSQL.
//!
//! Claims take the oldest queued job with `FOR UPDATE SKIP LOCKED`, so concurrent claims on
//! many replicas never wait on each other's rows; every other lease-scoped write locks its lease
//! row and is fenced by its prior state. Wake-ups travel by `LISTEN/NOTIFY` on one channel;
//! since a notification can be lost while the listener reconnects, waiters also re-check on a
//! timer, so a lost notification only delays a waiter, never strands it.

use super::round::{RoundItem, RoundResult};
use super::sql_store::impl_sql_store;
use super::verdict_cache::VerdictCache;
use super::{JobSignal, StoreResult};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use std::str::FromStr;
use std::time::Duration;

/// The channel enqueues and requeues are announced on (`JobSignal::announced`).
const CHANNEL: &str = "leasegate_jobs";

/// The channel changes to the gate's inputs are announced on (`verdict_cache` keys).
const CHANGES: &str = "leasegate_changes";

/// How often a long poll re-checks for work even without a notification: the bound on a delay
/// should a notification be lost, and, with 10,000 waiting, 2,000 claims a second of load.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Connection settings for the PostgreSQL engine.
#[derive(Clone, Debug)]
pub struct PgSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    pub statement_timeout: Duration,
}

impl PgSettings {
    /// How many group-commit rounds may be written at once: enough to keep the database busy
    /// while one round waits for its commit, few enough to leave connections for the rest.
    pub fn round_workers(&self) -> usize {
        (self.max_connections as usize / 8).clamp(1, 2)
    }
}

impl Default for PgSettings {
    fn default() -> Self {
        PgSettings {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
        }
    }
}

pub struct PgStore {
    pool: PgPool,
    signal: JobSignal,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PgStore {
    /// Connects, migrates (under PostgreSQL's advisory lock, so replicas may start together)
    /// and starts listening for enqueues on other replicas.
    pub async fn open(
        url: &str,
        settings: &PgSettings,
        signal: JobSignal,
        changes: VerdictCache,
    ) -> anyhow::Result<Self> {
        let timeout_ms = settings.statement_timeout.as_millis().to_string();
        let options = PgConnectOptions::from_str(url)?
            .application_name("leasegate")
            // Room for the rounds' statements in each of their sizes (`round::chunks`).
            .statement_cache_capacity(256)
            .options([
                ("statement_timeout", timeout_ms.as_str()),
                ("lock_timeout", timeout_ms.as_str()),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        let listener = tokio::spawn(listen(pool.clone(), signal.clone(), changes));
        Ok(PgStore {
            pool,
            signal,
            listener,
        })
    }

    async fn begin(&self) -> StoreResult<sqlx::Transaction<'static, sqlx::Postgres>> {
        Ok(self.pool.begin().await?)
    }

    async fn health_check(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn reader(&self) -> &PgPool {
        &self.pool
    }

    fn writer(&self) -> &PgPool {
        &self.pool
    }

    /// Announces an enqueue to every replica; delivered when the transaction commits.
    async fn announce_job(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        pool: &str,
    ) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(pool)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Tells every replica that a gate input changed; delivered when the transaction commits.
    async fn announce_change(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        key: &str,
    ) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANGES)
            .bind(key)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// Feeds notifications from other replicas into the in-process signal and the gate's cache,
/// reconnecting with a capped backoff when the connection drops.
async fn listen(pool: PgPool, signal: JobSignal, changes: VerdictCache) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot LISTEN for enqueues; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Err(e) = listener.listen_all([CHANNEL, CHANGES]).await {
            tracing::warn!(error = %e, "LISTEN failed; retrying");
            tokio::time::sleep(backoff).await;
            continue;
        }
        backoff = Duration::from_millis(200);
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) if n.channel() == CHANGES => changes.forget_key(n.payload()),
                Ok(Some(n)) => signal.announced(n.payload()),
                Ok(None) => {
                    // The connection was lost and will be re-established: wake everyone and
                    // forget every cached input, since notifications may have been missed.
                    signal.notify_all();
                    changes.forget_all();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the enqueue listener lost its connection");
                    signal.notify_all();
                    changes.forget_all();
                    tokio::time::sleep(backoff).await;
                    break;
                }
            }
        }
    }
}

impl_sql_store! {
    store: PgStore,
    db: sqlx::Postgres,
    engine: "postgres",
    row_lock: " FOR UPDATE",
    claim_lock: " FOR UPDATE SKIP LOCKED"
}

impl PgStore {
    /// Writes `items` as one round in one transaction (`round_writer`).
    async fn run_round(&self, items: &[RoundItem]) -> RoundResult {
        super::pg_rounds::run(self.begin().await?, items).await
    }
}

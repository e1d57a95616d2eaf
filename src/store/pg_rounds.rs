//! PostgreSQL's write rounds on a thread of their own: a runtime with one thread, its own
//! connections, and nothing else to run.
//!
//! A round on PostgreSQL is a few statements in sequence (begin, lock and read, the writes,
//! commit), each a round trip. On the service's runtime, the answer to each waited until a
//! worker next looked for I/O: under load the workers were busy verifying signatures and
//! answering requests, and looked only between tasks, so a round of ten heartbeats took
//! 5-6 ms on two cores while its statements ran for about 1.1 ms, and a fifth of both cores sat
//! idle (every client waiting on a round that waited on the runtime). Here the thread sleeps
//! in its own poll of its own sockets and wakes when the database answers: grants, whose
//! rounds are the longest, gained 20-40 % (`docs/BENCHMARKS.md`, "PostgreSQL's rounds on a
//! thread of their own").
//!
//! This is what SQLite's writer thread is to SQLite: group commit's lanes run here
//! (`Engine::rounds_runtime`) and write over these connections (`Engine::write_round`); every
//! other statement stays on the service's pool.
//!
//! A lane keeps its connection from one round to the next (`take`, `keep`) rather than
//! giving it back to the pool: sqlx pings every connection given back, one more round trip
//! between two rounds, where a heartbeat round is two (`sql::round::write_unlocked`). A connection whose round did not end
//! cleanly (its commit or rollback failed, or the round was cancelled and may have left it in
//! a transaction) is closed, and so is one kept for `KEEP_FOR`, so that none lives for ever;
//! the pool opens the next. One that died while kept (a proxy or an operator ended it) is
//! found dead at the next round's `BEGIN`, before anything was sent, and replaced
//! (`postgres::begin_kept`): where the pool pings a connection idle for a while, the `BEGIN`
//! is that ping. One that went silent (a partition, a primary gone without closing its
//! sockets) is closed when a statement's answer does not come in time (`postgres::answer`).

use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long the lanes keep a connection before it is closed and the pool opens another.
const KEEP_FOR: Duration = Duration::from_secs(60);

/// A connection a lane holds between rounds, and since when.
pub struct Kept {
    pub conn: PoolConnection<Postgres>,
    since: Instant,
}

/// The rounds' runtime and connections; the thread stops when this is dropped.
pub struct RoundThread {
    runtime: tokio::runtime::Handle,
    pool: PgPool,
    kept: Mutex<Vec<Kept>>,
    /// Dropped with this: the thread's `block_on` then returns, and its runtime ends.
    _stop: oneshot::Sender<()>,
}

impl RoundThread {
    /// Starts the thread and opens its connections with `connect` (run on its runtime, so that
    /// their sockets are that runtime's to poll).
    pub async fn start<F, Fut>(connect: F) -> anyhow::Result<RoundThread>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<PgPool>>,
    {
        let (ready, started) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("pg-rounds".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready.send(Err(anyhow::anyhow!(
                            "cannot start the PostgreSQL rounds' runtime: {e}"
                        )));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let opened = connect()
                        .await
                        .map(|pool| (tokio::runtime::Handle::current(), pool));
                    if ready.send(opened).is_err() {
                        return;
                    }
                    // Runs the lanes spawned here until the engine is gone.
                    let _ = stopped.await;
                });
            })?;
        let (runtime, pool) = started.await.map_err(|_| {
            anyhow::anyhow!("the PostgreSQL rounds' thread stopped as it started")
        })??;
        Ok(RoundThread {
            runtime,
            pool,
            kept: Mutex::new(Vec::new()),
            _stop: stop,
        })
    }

    pub fn runtime(&self) -> tokio::runtime::Handle {
        self.runtime.clone()
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A connection for one round: one a lane kept, or the pool's. It is closed if it is
    /// dropped rather than kept (a round that failed or was cancelled may have left it in a
    /// transaction).
    pub async fn take(&self) -> Result<Kept, sqlx::Error> {
        let kept = self.kept.lock().expect("the kept connections' lock").pop();
        if let Some(kept) = kept
            && kept.since.elapsed() < KEEP_FOR
        {
            return Ok(kept);
        }
        let mut conn = self.pool.acquire().await?;
        conn.close_on_drop();
        Ok(Kept {
            conn,
            since: Instant::now(),
        })
    }

    /// Keeps `kept`, whose round ended cleanly, for the next round.
    pub fn keep(&self, kept: Kept) {
        self.kept
            .lock()
            .expect("the kept connections' lock")
            .push(kept);
    }
}

impl Drop for RoundThread {
    /// A kept connection closes itself by spawning a task, which needs a runtime: the rounds'
    /// own, whichever thread drops the engine.
    fn drop(&mut self) {
        let _inside = self.runtime.enter();
        self.kept
            .lock()
            .expect("the kept connections' lock")
            .clear();
    }
}

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

use sqlx::postgres::PgPool;
use tokio::sync::oneshot;

/// The rounds' runtime and connections; the thread stops when this is dropped.
pub struct RoundThread {
    runtime: tokio::runtime::Handle,
    pool: PgPool,
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
            _stop: stop,
        })
    }

    pub fn runtime(&self) -> tokio::runtime::Handle {
        self.runtime.clone()
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

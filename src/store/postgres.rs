//! The engine for more than one machine: any number of stateless replicas on one PostgreSQL,
//! through sqlx.
//!
//! Claims take the oldest queued jobs with `FOR UPDATE SKIP LOCKED`, so concurrent claims on
//! many replicas never wait on each other's rows; every other write locks its rows (`FOR
//! UPDATE`) in the one order and is fenced by their prior state. What a write changes for
//! others (`engine::Change`) is announced with `pg_notify` inside its transaction, delivered on
//! commit to every replica's listener: the gate's cached inputs on `leasegate_changes`, long
//! polls' wake-ups on `leasegate_jobs`. A notification can be lost while a listener reconnects,
//! so a lost connection forgets every cached input and wakes every waiter, and waiters also
//! re-check on a timer: a lost notification only delays a waiter, never strands it.
//!
//! Every connection carries a `statement_timeout` and a `lock_timeout`, so a stuck database is
//! answered 503 `unavailable` rather than left as hung requests; a statement that gets no
//! answer at all (a connection gone silent) is given up on after its patience (`answer`). And
//! an `idle_in_transaction_session_timeout`, so that a replica whose host dies or is cut off
//! in the middle of a transaction (a round holding its runners' rows) does not leave the
//! server holding those locks until TCP gives up on it, two hours by default: every other
//! replica's rounds naming those runners would wait out their `lock_timeout` meanwhile.
//! TLS is sqlx's over rustls (the Mozilla roots built in, plus `sslrootcert=`), as `sslmode`
//! in the URL asks.

use super::engine::{
    Change, Db, Engine, Param, Row, RowsWrite, Statement, Tail, Value, Work, fetch_one,
};
use super::pg_rounds::{Kept, RoundThread};
use super::{StoreError, StoreResult};
use crate::domain::ids::RunnerId;
use crate::domain::pool_name::PoolName;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{
    PgArguments, PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow, Postgres,
};
use sqlx::{Column, Row as _, TypeInfo, ValueRef};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// The channel enqueues and requeues are announced on.
const JOBS: &str = "leasegate_jobs";

/// The channel changes to the gate's inputs are announced on.
const CHANGES: &str = "leasegate_changes";

/// Prefix of a jobs announcement that wakes every waiter of the pool it names (a requeue); a
/// bare pool name wakes one (an enqueue).
const WAKE_ALL: &str = "all:";

/// The payload of `Change::ForgeRunners` on `CHANGES`.
const FORGE_RUNNERS: &str = "forge_runners";

/// How often a long poll re-checks for work even without a notification: the bound on a delay
/// should a notification be lost, and, with 10,000 waiting, 2,000 claims a second of load.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// What the service's connections call themselves in `pg_stat_activity`, and the rounds' own
/// (`pg_rounds`).
pub const APPLICATION_NAME: &str = "leasegate";
pub const ROUNDS_APPLICATION_NAME: &str = "leasegate-rounds";
/// The change listener's connection (`LISTEN`), in `pg_stat_activity`.
pub const LISTEN_APPLICATION_NAME: &str = "leasegate-listen";

/// The rounds' connections' own settings. Every row a round reads or writes it finds by its
/// key, and its statements' plans are kept (prepared statements, and the plans inside
/// `leasegate_read_round`), made perhaps while a table was all but empty: `seen_jtis` is,
/// whenever no runner has spilled a jti lately. For a table of a page or none a sequential scan
/// is the cheapest plan, and kept, a lookup then scanned the whole table once it grew (a burst
/// of spills) until the next analyze or until the connection was replaced (`pg_rounds`, a
/// minute at most): measured, a round's asked jtis read every row of
/// `seen_jtis`, and grants fell to half their rate on a queue analyzed before it was leased
/// (`docs/BENCHMARKS.md`, "Rounds take their keys' indexes whatever the statistics say").
/// Off, the planner takes the index whenever the statement has one.
const ROUNDS_SESSION: &[(&str, &str)] = &[("enable_seqscan", "off")];

/// A pooled connection idle for longer is pinged before it is used.
const PING_AFTER_IDLE: Duration = Duration::from_secs(10);

/// Connection settings for the PostgreSQL engine.
#[derive(Clone, Debug)]
pub struct PgSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    pub statement_timeout: Duration,
}

/// How many group-commit rounds a replica writes at once, each over a connection of its own on
/// the rounds' thread (`pg_rounds`): one. A round is four round trips whatever its size (begin,
/// lock and read, every write in one statement, commit), or two when it may be written
/// unlocked (`sql::round::write_unlocked`), so one lane writes larger rounds where two wrote
/// smaller ones: heartbeats and refusals 1.4x with one lane against two, grants level
/// (`docs/BENCHMARKS.md`, "PostgreSQL's rounds in four round trips"), and with unlocked rounds
/// two lanes gained nothing ("Rounds in two round trips"). Two lanes were worth it while a
/// round was eight round trips.
pub const ROUND_LANES: u32 = 1;

impl PgSettings {
    /// How long the server lets one of the service's transactions sit idle before it ends the
    /// session: six statements' worth (30 s by default). Between two statements of a
    /// transaction the service waits only for the first's answer.
    pub fn idle_in_transaction(&self) -> Duration {
        self.statement_timeout * 6
    }

    /// How long a statement waits for its answer before its connection is taken for silent
    /// (`answer`): the server's own bound on it (`statement_timeout`), and as long again as a
    /// connection may take to come (`acquire_timeout`) for the answer to travel. 10 s by
    /// default.
    pub fn patience(&self) -> Duration {
        self.statement_timeout + self.acquire_timeout
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

/// What another replica announced, for this one to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Announced {
    Change(Change),
    /// The listener's connection was lost: anything may have changed meanwhile.
    Lost,
}

pub struct PgEngine {
    pool: PgPool,
    /// How long a statement waits for its answer (`PgSettings::patience`).
    patience: Duration,
    /// Group commit's rounds: their thread, runtime and connections (the service's engine; the
    /// bench's bare one writes no rounds).
    rounds: Option<RoundThread>,
    listener: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for PgEngine {
    fn drop(&mut self) {
        if let Some(listener) = &self.listener {
            listener.abort();
        }
    }
}

impl PgEngine {
    /// Connects, migrates (under PostgreSQL's advisory lock, so replicas may start together)
    /// and starts listening for other replicas' announcements, handed to `announced`.
    pub async fn open(
        url: &str,
        settings: &PgSettings,
        announced: Arc<dyn Fn(Announced) + Send + Sync>,
    ) -> anyhow::Result<Self> {
        // The rounds' connections come out of `max_connections` (one per lane), and so does
        // the change listener's.
        let lanes = ROUND_LANES;
        let shared = PgSettings {
            max_connections: settings.max_connections.saturating_sub(lanes + 1).max(1),
            ..settings.clone()
        };
        let pool = Self::pool(url, &shared, APPLICATION_NAME, &[]).await?;
        super::migrations::postgres().run(&pool).await?;
        let for_rounds = PgSettings {
            max_connections: lanes,
            ..settings.clone()
        };
        let url = url.to_string();
        let rounds = RoundThread::start(move || async move {
            Self::pool(&url, &for_rounds, ROUNDS_APPLICATION_NAME, ROUNDS_SESSION).await
        })
        .await?;
        let listener = Some(tokio::spawn(listen(
            pool.connect_options(),
            settings.patience(),
            announced,
        )));
        Ok(PgEngine {
            pool,
            patience: settings.patience(),
            rounds: Some(rounds),
            listener,
        })
    }

    /// Connects to a database the service has migrated, without migrating or listening: the
    /// bench's baseline (`store::Bare`), which may run beside a service of another version.
    pub async fn connect(url: &str, settings: &PgSettings) -> anyhow::Result<Self> {
        Ok(PgEngine {
            pool: Self::pool(url, settings, APPLICATION_NAME, &[]).await?,
            patience: settings.patience(),
            rounds: None,
            listener: None,
        })
    }

    /// How many rounds this engine writes at once: one per connection of its rounds' thread.
    pub fn round_lanes(&self) -> usize {
        self.rounds
            .as_ref()
            .map_or(1, |r| r.pool().options().get_max_connections() as usize)
    }

    /// Closes every connection, waiting until they are: the bench's baseline gives them back
    /// before the next measurement needs the server's connections.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// A pool of connections named `application_name` (in `pg_stat_activity`), each with the
    /// settings `session` besides the timeouts.
    async fn pool(
        url: &str,
        settings: &PgSettings,
        application_name: &str,
        session: &[(&str, &str)],
    ) -> anyhow::Result<PgPool> {
        let timeout_ms = settings.statement_timeout.as_millis().to_string();
        let idle_ms = settings.idle_in_transaction().as_millis().to_string();
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| {
                anyhow::anyhow!(
                    "DATABASE_URL: {e}; write postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE \
                     (through a unix socket: postgres://USER@localhost/DATABASE?host=/run/postgresql)"
                )
            })?
            .application_name(application_name)
            // Room for the rounds' statements in each of their sizes (`sql::chunks`).
            .statement_cache_capacity(256)
            .options([
                ("statement_timeout", timeout_ms.as_str()),
                ("lock_timeout", timeout_ms.as_str()),
                ("idle_in_transaction_session_timeout", idle_ms.as_str()),
            ])
            .options(session.iter().copied());
        // Alone first, so that a failure says why rather than "pool timed out".
        super::pg_connect::first_connection(&options, settings.acquire_timeout).await?;
        Ok(PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            // sqlx pings every connection it hands out, by default: one more round trip for
            // each round and each read. Only a connection that sat idle a while is pinged (a
            // dead one is then replaced before a request fails on it).
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_AFTER_IDLE {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?)
    }
}

impl Engine for PgEngine {
    type Db = PgDb;

    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn write<T: Send + 'static>(&self, work: Work<PgDb, T>) -> StoreResult<(T, Vec<Change>)> {
        write_on(&self.pool, self.patience, work).await
    }

    async fn read<T: Send + 'static>(
        &self,
        make: impl Fn() -> Work<PgDb, T> + Send,
    ) -> StoreResult<T> {
        // As `begin_again`: one more try than the pool holds, each on a connection found gone
        // at once (not one that went silent, which has had its patience already).
        let tries = self.pool.options().get_max_connections() + 1;
        let mut gone = 0;
        loop {
            let mut db = PgDb::on(Lent::new(self.pool.acquire().await?), self.patience);
            let result = make()(&mut db).await;
            match db.link {
                // Back to the pool.
                Link::Answering => {
                    db.conn.finish();
                    return result;
                }
                Link::Gone if result.is_err() && gone < tries => {
                    gone += 1;
                    tracing::debug!("a connection to PostgreSQL was gone; reading on another");
                }
                // Closed as it is dropped; the statement's error is the result.
                Link::Gone | Link::Silent => return result,
            }
        }
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = Lent::new(self.pool.acquire().await?);
        answer(
            self.patience,
            sqlx::query("SELECT 1").execute(conn.connection()),
        )
        .await?;
        conn.finish();
        Ok(())
    }

    fn rounds_runtime(&self) -> Option<tokio::runtime::Handle> {
        self.rounds.as_ref().map(RoundThread::runtime)
    }

    async fn write_round<T: Send + 'static>(
        &self,
        work: Work<PgDb, T>,
    ) -> StoreResult<(T, Vec<Change>)> {
        match &self.rounds {
            Some(rounds) => write_kept(rounds, self.patience, work).await,
            None => write_on(&self.pool, self.patience, work).await,
        }
    }

    /// On the rounds' kept connection; the bench's bare engine, which writes no rounds, has
    /// none.
    fn write_round_unlocked<T: Send + 'static>(
        &self,
        make: impl FnOnce() -> Work<PgDb, T> + Send,
    ) -> Option<impl Future<Output = StoreResult<T>> + Send> {
        let rounds = self.rounds.as_ref()?;
        Some(write_kept_unlocked(rounds, self.patience, make()))
    }
}

/// Runs `work` in a transaction on the connection the rounds' lane keeps (`pg_rounds`), and
/// commits it (unless it discarded it). The connection is kept for the next round when this
/// one ended cleanly, committed or rolled back (a statement's error included); when a
/// statement got no answer (`answer`) or the commit or the rollback failed, it is closed.
async fn write_kept<T: Send + 'static>(
    rounds: &RoundThread,
    patience: Duration,
    work: Work<PgDb, T>,
) -> StoreResult<(T, Vec<Change>)> {
    let mut kept = begin_kept(rounds, patience).await?;
    let (result, changes, conn) = transact(PgDb::on(Lent::new(kept.conn), patience), work).await;
    if let Some(conn) = conn {
        kept.conn = conn;
        rounds.keep(kept);
    }
    result.map(|value| (value, changes))
}

/// Runs `work` on the connection the rounds' lane keeps with no transaction around it: each
/// statement commits by itself. The connection is kept for the next round when every statement
/// was answered (an error the server answered included: no transaction is left open); one
/// that did not answer, or was found gone, is closed. A kept connection that died since is
/// found so by the work's first statement (`sql::round::write_unlocked`: a read, or the
/// round's one write when its lane knows the rows), and the round is then written the locked
/// way, whose `BEGIN` takes another (`begin_kept`).
async fn write_kept_unlocked<T: Send + 'static>(
    rounds: &RoundThread,
    patience: Duration,
    work: Work<PgDb, T>,
) -> StoreResult<T> {
    let mut kept = rounds.take().await?;
    let mut db = PgDb::on(Lent::new(kept.conn), patience);
    let result = work(&mut db).await;
    if db.link == Link::Answering {
        kept.conn = db.conn.finish();
        rounds.keep(kept);
    }
    result
}

/// Begins a transaction on the rounds' connection, kept or the pool's (`begin_again`).
async fn begin_kept(rounds: &RoundThread, patience: Duration) -> Result<Kept, sqlx::Error> {
    // One more try than the pool holds: the kept connection is not among them.
    let tries = rounds.pool().options().get_max_connections() + 1;
    begin_again(tries, || async {
        let mut kept = rounds.take().await?;
        answer(patience, sqlx::query("BEGIN").execute(&mut *kept.conn)).await?;
        Ok(kept)
    })
    .await
}

/// Runs `work` in a transaction on one of `pool`'s connections and commits it (unless it
/// discarded it). The connection goes back to the pool when the transaction ended cleanly, and
/// is closed otherwise.
async fn write_on<T: Send + 'static>(
    pool: &PgPool,
    patience: Duration,
    work: Work<PgDb, T>,
) -> StoreResult<(T, Vec<Change>)> {
    let conn = begin_again(pool.options().get_max_connections(), || async {
        let mut conn = Lent::new(pool.acquire().await?);
        answer(patience, sqlx::query("BEGIN").execute(conn.connection())).await?;
        Ok(conn)
    })
    .await?;
    // The connection, when it comes back, goes back to the pool as it is dropped.
    let (result, changes, _) = transact(PgDb::on(conn, patience), work).await;
    result.map(|value| (value, changes))
}

/// `work` over `db`, whose transaction has begun, then its `COMMIT` (or `ROLLBACK`, when the
/// work failed or discarded itself). The outcome, what it changed (nothing unless committed),
/// and the connection when the transaction ended cleanly; one that did not is closed.
async fn transact<T: Send + 'static>(
    mut db: PgDb,
    work: Work<PgDb, T>,
) -> (
    StoreResult<T>,
    Vec<Change>,
    Option<PoolConnection<Postgres>>,
) {
    let result = work(&mut db).await;
    if db.link != Link::Answering {
        return (result, Vec::new(), None);
    }
    let commit = result.is_ok() && !db.discard;
    let end = if commit { "COMMIT" } else { "ROLLBACK" };
    let ended = answer(db.patience, sqlx::query(end).execute(db.connection())).await;
    let PgDb { conn, changes, .. } = db;
    match (result, ended) {
        (Ok(value), Ok(_)) if commit => (Ok(value), changes, Some(conn.finish())),
        // The work's own error first: a rollback that failed after it adds nothing to it.
        (result, Ok(_)) => (result, Vec::new(), Some(conn.finish())),
        (Err(e), Err(_)) => (Err(e), Vec::new(), None),
        (Ok(_), Err(e)) => (Err(e.into()), Vec::new(), None),
    }
}

/// `statement`'s answer, or, when none came within `patience`, an I/O error: the connection is
/// taken for silent (a network that drops packets, a primary gone without closing its
/// sockets), which the server's `statement_timeout` cannot end and TCP gives up on only after
/// about fifteen minutes. Silent at a `BEGIN`, it is lost like a closed one (`begin_again`
/// takes another); later, the work fails as `unavailable`. Either way it is closed, not given
/// back (`Lent`).
async fn answer<T>(
    patience: Duration,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    match tokio::time::timeout(patience, statement).await {
        Ok(answered) => answered,
        Err(_) => {
            tracing::warn!(
                patience_ms = patience.as_millis() as u64,
                "PostgreSQL did not answer a statement in time; its connection is closed"
            );
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "PostgreSQL did not answer within {} ms",
                    patience.as_millis()
                ),
            )))
        }
    }
}

/// Runs `begin` again, at most `tries` times, while it fails on a connection that is gone. A
/// connection that died while it sat in a pool or was kept (the server restarted, a proxy or an
/// operator ended it: `lost`) fails at its `BEGIN`, before anything of the work was sent, and
/// is closed; the next try takes another. Without this the first write after a blip of the
/// database failed on each connection (`tests/replicas.rs`, `tests/pg_rounds.rs`). A server
/// that is down fails to connect instead (the pool's timeout), which is not retried here.
async fn begin_again<T, F, Fut>(tries: u32, mut begin: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut dead = 0;
    loop {
        match begin().await {
            Err(e) if lost(&e) && dead < tries => {
                dead += 1;
                tracing::debug!(error = %e, "a connection to PostgreSQL was dead; \
                    beginning on another");
            }
            begun => return begun,
        }
    }
}

/// Whether `e`, at a `BEGIN`, says the connection is gone: the socket failed, or the server
/// ended the session (an operator's `pg_terminate_backend`, a shutdown: SQLSTATE class 57P,
/// sent before it closes the socket) or says the connection failed (class 08).
fn lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("57P") || code.starts_with("08")),
        _ => false,
    }
}

/// A pooled connection lent to one piece of work. It goes back to the pool only when the work
/// ended cleanly (`finish`); dropped otherwise (a statement got no answer, a commit failed, the
/// request was cancelled mid-statement) it is closed, since the pool checks a connection given
/// back with a ping, which on a silent one would wait as long as TCP does.
struct Lent {
    conn: Option<PoolConnection<Postgres>>,
}

impl Lent {
    fn new(conn: PoolConnection<Postgres>) -> Lent {
        Lent { conn: Some(conn) }
    }

    fn connection(&mut self) -> &mut sqlx::PgConnection {
        self.conn
            .as_mut()
            .expect("a lent connection until finished")
    }

    /// The connection, its work ended cleanly.
    fn finish(mut self) -> PoolConnection<Postgres> {
        self.conn.take().expect("a lent connection until finished")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.conn {
            conn.close_on_drop();
        }
    }
}

/// An open PostgreSQL transaction (or, for reads, a pooled connection).
pub struct PgDb {
    conn: Lent,
    changes: Vec<Change>,
    discard: bool,
    /// How long each statement waits for its answer (`answer`).
    patience: Duration,
    /// Whether the connection still answers; one that does not is not used again.
    link: Link,
}

/// What the statements found of a `PgDb`'s connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Answering,
    /// A statement got no answer within its patience (`answer`).
    Silent,
    /// A statement found it closed, or ended by the server (`lost`).
    Gone,
}

impl PgDb {
    fn on(conn: Lent, patience: Duration) -> PgDb {
        PgDb {
            conn,
            changes: Vec::new(),
            discard: false,
            patience,
            link: Link::Answering,
        }
    }

    fn connection(&mut self) -> &mut sqlx::PgConnection {
        self.conn.connection()
    }
}

/// A `PgDb` statement's answer within `patience` (`answer`); one that never came marks the
/// connection `Silent`, a failure that says it is closed or ended marks it `Gone`. Over the
/// fields, not the `PgDb`, since the statement borrows its connection.
async fn heard<T>(
    patience: Duration,
    link: &mut Link,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> StoreResult<T> {
    let answered = answer(patience, statement).await;
    match &answered {
        Err(sqlx::Error::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
            *link = Link::Silent;
        }
        Err(e) if lost(e) => *link = Link::Gone,
        _ => {}
    }
    Ok(answered?)
}

/// The statement's text as PostgreSQL reads it, its tail written out.
fn pg_sql(st: &Statement<'_>) -> String {
    let tail = match st.tail {
        Tail::None => "",
        Tail::RowLock => " FOR UPDATE",
        Tail::SkipLocked => " FOR UPDATE SKIP LOCKED",
        Tail::KeyShareLock => " FOR KEY SHARE",
        // `RETURNING *` of an `UPDATE … FROM` would return the joined columns too.
        Tail::ReturningJobs => " RETURNING jobs.*",
    };
    format!("{}{tail}", st.sql)
}

/// `st` as a sqlx query, its parameters bound in order. Nulls carry their type: PostgreSQL
/// types a `VALUES` column from its rows.
fn query<'q>(
    sql: &'q str,
    params: &'q [Param<'q>],
) -> sqlx::query::Query<'q, Postgres, PgArguments> {
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
    for p in params {
        q = match p {
            Param::Text(s) => q.bind(*s),
            Param::Int(i) => q.bind(*i),
            Param::OptText(s) => q.bind(*s),
            Param::OptInt(i) => q.bind(*i),
            Param::Owned(s) => q.bind(s.as_deref()),
            Param::Texts(v) => q.bind(v.as_slice()),
            Param::Ints(v) => q.bind(v.as_slice()),
        };
    }
    q
}

/// How a result's column is read: decided once from its type, for all of its rows (matching
/// the type's name and checking it for every value was a fifth of reading 10,000 runners).
#[derive(Clone, Copy)]
enum ColumnKind {
    Int8,
    Int4,
    Int2,
    Bool,
    Text,
    /// A type the store does not read: an error if a row has a value there.
    Unread,
}

fn column_kinds(row: &PgRow) -> Vec<ColumnKind> {
    row.columns()
        .iter()
        .map(|column| match column.type_info().name() {
            "INT8" => ColumnKind::Int8,
            "INT4" => ColumnKind::Int4,
            "INT2" => ColumnKind::Int2,
            "BOOL" => ColumnKind::Bool,
            "TEXT" | "VARCHAR" | "NAME" | "BPCHAR" => ColumnKind::Text,
            _ => ColumnKind::Unread,
        })
        .collect()
}

fn row_of(row: &PgRow, columns: &Arc<[String]>, kinds: &[ColumnKind]) -> StoreResult<Row> {
    let mut values = Vec::with_capacity(kinds.len());
    for (i, kind) in kinds.iter().enumerate() {
        if row.try_get_raw(i)?.is_null() {
            values.push(Value::Null);
            continue;
        }
        // Unchecked: the kind was taken from this column's type.
        let value = match kind {
            ColumnKind::Int8 => Value::Int(row.try_get_unchecked::<i64, _>(i)?),
            ColumnKind::Int4 => Value::Int(i64::from(row.try_get_unchecked::<i32, _>(i)?)),
            ColumnKind::Int2 => Value::Int(i64::from(row.try_get_unchecked::<i16, _>(i)?)),
            ColumnKind::Bool => Value::Int(i64::from(row.try_get_unchecked::<bool, _>(i)?)),
            ColumnKind::Text => Value::Text(row.try_get_unchecked::<String, _>(i)?),
            ColumnKind::Unread => {
                let column = &row.columns()[i];
                return Err(StoreError::Internal(format!(
                    "column {} has type {}, which the store does not read",
                    column.name(),
                    column.type_info().name()
                )));
            }
        };
        values.push(value);
    }
    Ok(Row::new(columns.clone(), values))
}

impl Db for PgDb {
    async fn execute(&mut self, st: Statement<'_>) -> StoreResult<u64> {
        let sql = pg_sql(&st);
        let statement = query(&sql, &st.params).execute(self.conn.connection());
        let done = heard(self.patience, &mut self.link, statement).await?;
        Ok(done.rows_affected())
    }

    async fn fetch(&mut self, st: Statement<'_>) -> StoreResult<Vec<Row>> {
        let sql = pg_sql(&st);
        let statement = query(&sql, &st.params).fetch_all(self.conn.connection());
        let found = heard(self.patience, &mut self.link, statement).await?;
        let Some(first) = found.first() else {
            return Ok(Vec::new());
        };
        let columns: Arc<[String]> = first
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        let kinds = column_kinds(first);
        found.iter().map(|r| row_of(r, &columns, &kinds)).collect()
    }

    async fn changed(&mut self, change: Change) -> StoreResult<()> {
        if self.changes.contains(&change) {
            return Ok(());
        }
        let Some((channel, payload)) = announcement(&change) else {
            return Ok(());
        };
        let statement = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(payload)
            .execute(self.conn.connection());
        heard(self.patience, &mut self.link, statement).await?;
        self.changes.push(change);
        Ok(())
    }

    /// All of `writes` in one statement, each over its columns as arrays (`unnest`), the
    /// writes side by side as the parts of a `WITH`: one round trip, and one statement text
    /// whatever the number of rows. (A round used to send a statement per write and per
    /// power-of-two slice of its rows, each a round trip: a round of ten heartbeats sent
    /// eight.)
    ///
    /// A write marked `every_row` returns a row for each it wrote, and the statement ends by
    /// counting them (`leasegate_all_rows_written`), which fails it whole when one is missing.
    async fn write_rows(&mut self, writes: Vec<RowsWrite<'_>>) -> StoreResult<Option<String>> {
        let mut params = Vec::new();
        let mut parts = Vec::new();
        let mut checks = Vec::new();
        for write in writes.iter().filter(|w| w.rows() > 0) {
            let mut columns = Vec::with_capacity(write.cols);
            for c in 0..write.cols {
                let (values, element) = column(write, c)?;
                params.push(values);
                columns.push(format!("${}::{element}[]", params.len()));
            }
            let mut part = (write.sql)(&format!("SELECT * FROM unnest({})", columns.join(", ")));
            if write.every_row {
                // The count a parameter, so that the text stays one whatever the rows.
                part.push_str(" RETURNING 1");
                params.push(Param::Int(write.rows() as i64));
                checks.push(format!(
                    "leasegate_all_rows_written((SELECT count(*) FROM w{}), ${}::int8)",
                    parts.len(),
                    params.len()
                ));
            }
            parts.push(part);
        }
        let named = || -> String {
            let named: Vec<String> = parts
                .iter()
                .enumerate()
                .map(|(i, part)| format!("w{i} AS ({part})"))
                .collect();
            named.join(", ")
        };
        if checks.is_empty() {
            let sql = match parts.len() {
                0 => return Ok(None),
                1 => parts.swap_remove(0),
                _ => format!("WITH {} SELECT 1", named()),
            };
            self.execute(Statement::built(sql).params(params)).await?;
            return Ok(None);
        }
        // The rows written have this transaction's id for their `xmin`: its low 32 bits
        // (`txid_current` counts the wraparounds above them).
        let sql = format!(
            "WITH {} SELECT {}, {} AS version",
            named(),
            checks.join(", "),
            super::sql::round::row_version_sql("txid_current() % 4294967296")
        );
        let row = fetch_one(self, Statement::built(sql).params(params)).await?;
        Ok(Some(row.text("version")?))
    }

    fn discard(&mut self) {
        self.discard = true;
    }

    fn spill_index(&self) -> Option<&super::spills::SpillIndex> {
        None
    }
}

/// Column `c` of `write`'s rows as one array, and the type of its elements.
fn column<'p>(write: &'p RowsWrite<'_>, c: usize) -> StoreResult<(Param<'p>, &'static str)> {
    let values = || write.params.iter().skip(c).step_by(write.cols);
    let mixed = || StoreError::Internal(format!("column {c} of a multi-row write mixes types"));
    match &write.params[c] {
        Param::Int(_) | Param::OptInt(_) => {
            let ints = values()
                .map(|p| match p {
                    Param::Int(i) => Ok(Some(*i)),
                    Param::OptInt(i) => Ok(*i),
                    _ => Err(mixed()),
                })
                .collect::<StoreResult<Vec<_>>>()?;
            Ok((Param::Ints(ints), "int8"))
        }
        Param::Text(_) | Param::OptText(_) | Param::Owned(_) => {
            let texts = values()
                .map(|p| match p {
                    Param::Text(s) => Ok(Some(*s)),
                    Param::OptText(s) => Ok(*s),
                    Param::Owned(s) => Ok(s.as_deref()),
                    _ => Err(mixed()),
                })
                .collect::<StoreResult<Vec<_>>>()?;
            Ok((Param::Texts(texts), "text"))
        }
        _ => Err(StoreError::Internal(format!(
            "column {c} of a multi-row write is a list"
        ))),
    }
}

/// A change as a notification: its channel and payload. Spilled jtis are not announced:
/// they are looked up in their table, which every replica shares.
fn announcement(change: &Change) -> Option<(&'static str, String)> {
    Some(match change {
        Change::Runner(id) => (CHANGES, format!("runner:{id}")),
        Change::Pool(name) => (CHANGES, format!("pool:{name}")),
        Change::ForgeRunners => (CHANGES, FORGE_RUNNERS.to_string()),
        Change::JobQueued(pool) => (JOBS, pool.to_string()),
        Change::JobsReturned(pool) => (JOBS, format!("{WAKE_ALL}{pool}")),
        Change::Spilled { .. } => return None,
    })
}

/// A notification as a change; `None` for one this version does not know.
fn announced(channel: &str, payload: &str) -> Option<Change> {
    if channel == JOBS {
        return Some(match payload.strip_prefix(WAKE_ALL) {
            Some(pool) => Change::JobsReturned(PoolName::from_trusted(pool.to_string())),
            None => Change::JobQueued(PoolName::from_trusted(payload.to_string())),
        });
    }
    if payload == FORGE_RUNNERS {
        return Some(Change::ForgeRunners);
    }
    if let Some(id) = payload.strip_prefix("runner:") {
        return Some(Change::Runner(RunnerId(id.to_string())));
    }
    payload
        .strip_prefix("pool:")
        .map(|name| Change::Pool(PoolName::from_trusted(name.to_string())))
}

/// Hands other replicas' announcements to `apply`, reconnecting with a capped backoff when the
/// connection drops (and telling `apply` so).
///
/// Whatever was announced while no connection listened is lost, so `apply` is told the changes
/// were lost once each connection listens (the first included: the cache may have been filled
/// before it did), not only when the previous one was found gone: what was read between the
/// two is forgotten too. The listener never reconnects by itself (`eager_reconnect(false)`, and
/// a lost connection ends it), so that no connection listens without that being said.
///
/// A connection may also go silent (a network dropping packets, a failed-over primary that
/// never closed its sockets): it then hears nothing, and this replica would miss every other
/// replica's change until its cache's TTL. So when nothing has come for `patience`, the
/// listener asks its connection a question, and one that does not answer within `patience`
/// is given up: `apply` is told the changes were lost, and a new connection listens.
///
/// Each connection comes from a pool of one of its own, outside the shared pool: a dropped
/// `PgListener` sends `UNLISTEN` from a task of its own before it gives its connection back,
/// which on a silent connection waits as long as TCP does, and would hold a shared slot as
/// long.
async fn listen(
    options: Arc<PgConnectOptions>,
    patience: Duration,
    apply: Arc<dyn Fn(Announced) + Send + Sync>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let own = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(patience)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(
                options
                    .as_ref()
                    .clone()
                    .application_name(LISTEN_APPLICATION_NAME),
            );
        // No longer than a statement's patience (`answer`), as every wait on the server is.
        let connected = answer(patience, async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.eager_reconnect(false);
            listener.listen_all([JOBS, CHANGES]).await?;
            Ok(listener)
        })
        .await;
        let mut listener = match connected {
            Ok(listener) => listener,
            Err(e) => {
                tracing::warn!(error = %e, "cannot LISTEN for other replicas' changes; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        // Listening from here on; what was announced before is lost.
        apply(Announced::Lost);
        backoff = Duration::from_millis(200);
        loop {
            let heard = match tokio::time::timeout(patience, listener.try_recv()).await {
                Ok(heard) => heard,
                // Nothing heard for a while: is the connection still there?
                Err(_quiet) => {
                    match answer(patience, sqlx::query("SELECT 1").execute(&mut listener)).await {
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::warn!(
                                error = %e,
                                "the change listener's connection does not answer; listening on a new one"
                            );
                            apply(Announced::Lost);
                            break;
                        }
                    }
                }
            };
            match heard {
                Ok(Some(n)) => match announced(n.channel(), n.payload()) {
                    Some(change) => apply(Announced::Change(change)),
                    None => apply(Announced::Lost),
                },
                // The connection was lost: a new one listens, and says so.
                Ok(None) => {
                    tracing::warn!("the change listener lost its connection");
                    apply(Announced::Lost);
                    tokio::time::sleep(backoff).await;
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the change listener lost its connection");
                    apply(Announced::Lost);
                    tokio::time::sleep(backoff).await;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_is_announced_and_read_back_as_itself() {
        for change in [
            Change::Runner(RunnerId("r1".into())),
            Change::Pool(PoolName::parse("linux").unwrap()),
            Change::ForgeRunners,
            Change::JobQueued(PoolName::parse("linux").unwrap()),
            Change::JobsReturned(PoolName::parse("linux").unwrap()),
        ] {
            let (channel, payload) = announcement(&change).unwrap();
            assert_eq!(announced(channel, &payload), Some(change));
        }
        assert_eq!(announced(CHANGES, "something:new"), None);
    }
}

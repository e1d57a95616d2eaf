//! The embedded engine: one SQLite file in WAL mode, through its C library (rusqlite).
//!
//! SQLite has one writer at a time, so every write runs on one thread that owns the only
//! writing connection, each in a `BEGIN IMMEDIATE` transaction (a deferred one that reads then
//! writes fails at once with `SQLITE_BUSY_SNAPSHOT`, whatever the busy timeout). A round of
//! group commit is one such write: one hop to the thread and back, however many statements it
//! runs. Reads run on a few threads of their own with read-only connections, which WAL lets
//! run beside the writer. The connections' settings are made once, in `connection`.
//!
//! One driver for every read and write of the file. sqlx's SQLite driver hops to its worker
//! thread for each statement, which made a round of many statements cost a hop apiece
//! (`docs/BENCHMARKS.md`, "What was built"), and two drivers on one file would be two sets of
//! settings and connections to keep in step.
//!
//! The statements are the store's (`sql/`), written with `$n` placeholders; SQLite reads them
//! as `?n` (which binds by number, where `$n` would bind by first appearance). `sync=NORMAL`
//! survives a crash of the process; `LEASEGATE_SQLITE_SYNCHRONOUS=FULL` survives power loss
//! too, at the cost of an fsync per commit.
//!
//! The writer does not checkpoint: a thread beside it copies the WAL into the file
//! (`sqlite_checkpoints`), so that no round waits for a checkpoint's `fsync`.
//!
//! The process is the file's only writer, so the index of spilled jtis is kept here, in memory
//! (`sql::replay`): loaded from the spill table at start, added to after each commit.
//!
//! Migrations are the files of `migrations/sqlite/`, embedded; they are applied here and
//! recorded in `_sqlx_migrations` as sqlx records them, so databases migrated by earlier
//! versions (which ran them through sqlx) go on from where they were.

use super::engine::{Change, Db, Engine, Param, Row, RowsWrite, Statement, Tail, Value, Work};
use super::spills::SpillIndex;
use super::sql::{chunk_sizes, replay, values_list};
use super::sqlite_checkpoints::{Cadence, Checkpoints, checkpoint};
use super::{StoreError, StoreResult};
use crate::domain::ids::RunnerId;
use crate::domain::time::Millis;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags, ToSql, params_from_iter};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;
use tokio::sync::oneshot;

/// How often a long poll re-checks for work without a wake-up (see `store::open`).
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Connections that read beside the writer.
const READERS: usize = 4;

/// How long a statement waits for another process holding the file's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A job for a connection's thread: it borrows the thread's connection (taking it out of the
/// slot while it runs, and putting it back).
type Job = Box<dyn FnOnce(&mut Option<Connection>) + Send>;

pub struct SqliteEngine {
    /// Held while the engine lives: the lock that makes this process the file's only server.
    _lock: std::fs::File,
    writer: mpsc::Sender<Job>,
    readers: mpsc::Sender<Job>,
    /// This process is the file's only writer: the spilled jtis are looked up here.
    spills: Arc<SpillIndex>,
    /// The WAL is copied beside the writer, not by it (`sqlite_checkpoints`).
    checkpoints: Arc<Checkpoints>,
}

/// Whether commits wait for the disk (`LEASEGATE_SQLITE_SYNCHRONOUS`, a setting of `serve`).
/// Written in capitals as SQLite's own PRAGMA values are, and accepted in any case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Synchronous {
    /// Survives a crash of the process; the last commits may be lost on power loss.
    #[default]
    #[value(name = "NORMAL")]
    Normal,
    /// Survives power loss too, at the cost of an fsync per commit.
    #[value(name = "FULL")]
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// A connection to `path` with the engine's settings: WAL, the synchronous level, the busy
/// timeout, foreign keys, and statements kept prepared.
fn connection(path: &Path, read_only: bool, sync: Synchronous) -> rusqlite::Result<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    if !read_only {
        conn.pragma_update(None, "journal_mode", "WAL")?;
    }
    conn.pragma_update(None, "synchronous", sync.pragma())?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Room for the rounds' statements in each of their sizes (`sql::chunks`) beside the
    // rest, so that none is evicted and parsed again.
    conn.set_prepared_statement_cache_capacity(if read_only { 64 } else { 256 });
    Ok(conn)
}

/// Takes the lock on `PATH.lock` that makes this process the only one serving the database at
/// `PATH`: SQLite serves one process (a second one would write beside it with its own cache
/// and index of spilled jtis), so a second `serve` on the same file stops here and says why.
/// The lock is the kernel's (`flock`): it ends with the process, however it ends. A file of its
/// own, because closing any descriptor of the database file would drop SQLite's own locks.
fn lock(path: &Path) -> anyhow::Result<std::fs::File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let at = std::path::PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&at)
        .map_err(|e| anyhow::anyhow!("cannot create the lock file {}: {e}", at.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another leasegate process is serving the SQLite database {} (it holds {}); \
             SQLite serves one process: stop the other, or use PostgreSQL for replicas",
            path.display(),
            at.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            anyhow::bail!("cannot lock {}: {e}", at.display())
        }
    }
}

/// Runs `jobs` on a thread that owns a connection opened by `open`, until every sender is
/// gone. A job that panics loses nothing but its own answer: the connection is opened again.
fn spawn_thread(
    name: &str,
    open: impl Fn() -> rusqlite::Result<Connection> + Send + 'static,
    jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
) -> anyhow::Result<()> {
    let mut slot = Some(open()?);
    std::thread::Builder::new().name(name.into()).spawn(move || {
        loop {
            let job = match jobs.lock() {
                Ok(rx) => rx.recv(),
                Err(_) => return,
            };
            let Ok(job) = job else { return };
            if slot.is_none() {
                slot = open().ok();
            }
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut slot)));
            if ran.is_err() {
                tracing::error!(thread = %std::thread::current().name().unwrap_or(""), "a SQLite \
                    job panicked");
                slot = None;
            }
        }
    })?;
    Ok(())
}

impl SqliteEngine {
    /// Opens (creating if missing) and migrates the database at `path`.
    pub fn open(path: &Path, sync: Synchronous) -> anyhow::Result<Self> {
        Self::open_with(path, sync, Cadence::SERVICE)
    }

    /// `open`, with the WAL copied at `cadence`.
    fn open_with(path: &Path, sync: Synchronous, cadence: Cadence) -> anyhow::Result<Self> {
        let lock = lock(path)?;
        let mut first = connection(path, false, sync)?;
        // SQLite falls back to read-only where it cannot write, and says so only at the first
        // write; `location::check` has usually said it already, before anything was written.
        if first.is_readonly(rusqlite::MAIN_DB)? {
            anyhow::bail!(
                "the SQLite database {} opened read-only; make it and its directory writable \
                 by the user leasegate runs as",
                path.display()
            );
        }
        migrate(&mut first)?;
        let (_, loaded) = transaction(
            first,
            "BEGIN",
            &Arc::new(SpillIndex::default()),
            Box::new(|db| Box::pin(replay::load(db, crate::domain::record::forgetting_now()))),
        );
        let spills = Arc::new(loaded?.0);
        let at = path.to_path_buf();
        let checkpoints = Arc::new(Checkpoints::start(
            path.to_path_buf(),
            move || connection(&at, false, sync),
            cadence,
        )?);
        let (writer, writer_jobs) = mpsc::channel::<Job>();
        let at = path.to_path_buf();
        spawn_thread(
            "sqlite-writer",
            move || {
                let conn = connection(&at, false, sync)?;
                Checkpoints::hand_over(&conn);
                Ok(conn)
            },
            Arc::new(Mutex::new(writer_jobs)),
        )?;
        let (readers, reader_jobs) = mpsc::channel::<Job>();
        let reader_jobs = Arc::new(Mutex::new(reader_jobs));
        for i in 0..READERS {
            let at = path.to_path_buf();
            spawn_thread(
                &format!("sqlite-reader-{i}"),
                move || connection(&at, true, sync),
                reader_jobs.clone(),
            )?;
        }
        Ok(SqliteEngine {
            _lock: lock,
            writer,
            readers,
            spills,
            checkpoints,
        })
    }

    /// Runs `job` on `queue`'s thread and waits for its answer.
    async fn on_thread<T: Send + 'static>(
        queue: &mpsc::Sender<Job>,
        job: impl FnOnce(Connection) -> (Connection, StoreResult<T>) + Send + 'static,
    ) -> StoreResult<T> {
        let (reply, answer) = oneshot::channel();
        queue
            .send(Box::new(move |slot| {
                let Some(conn) = slot.take() else {
                    let _ = reply.send(Err(StoreError::Unavailable(
                        "the SQLite database cannot be opened".into(),
                    )));
                    return;
                };
                let (conn, result) = job(conn);
                *slot = Some(conn);
                let _ = reply.send(result);
            }))
            .map_err(|_| StoreError::Unavailable("the SQLite threads stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the SQLite threads stopped".into()))?
    }
}

/// Runs `work` over `conn` in a transaction begun with `begin`; commits unless it failed or
/// was discarded. The connection moves into the work's `Db` and comes back after.
fn transaction<T>(
    conn: Connection,
    begin: &str,
    spills: &Arc<SpillIndex>,
    work: Work<SqliteDb, T>,
) -> (Connection, StoreResult<(T, Vec<Change>)>) {
    if let Err(e) = conn.execute_batch(begin) {
        return (conn, Err(store_error(e)));
    }
    let mut db = SqliteDb {
        conn,
        changes: Vec::new(),
        spilled: Vec::new(),
        spills: spills.clone(),
        discard: false,
    };
    let result = run_to_completion(work(&mut db));
    let SqliteDb {
        conn,
        changes,
        spilled,
        discard,
        ..
    } = db;
    if result.is_err() || discard {
        // Some failures end the transaction as they happen (a full disk, an I/O error, an
        // `OR ROLLBACK` conflict): then there is nothing to roll back, and the work's own
        // error, not the `ROLLBACK`'s "no transaction is active", is the answer.
        if !conn.is_autocommit()
            && let Err(e) = conn.execute_batch("ROLLBACK")
            && result.is_ok()
        {
            return (conn, Err(store_error(e)));
        }
        return (conn, result.map(|v| (v, Vec::new())));
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        // A COMMIT that fails may leave its transaction open (SQLite keeps it on a busy
        // database or a deferred constraint, to be committed again): rolled back here, or the
        // writer's every later `BEGIN` would fail as one inside a transaction.
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        return (conn, Err(store_error(e)));
    }
    // Known to lookups once durable, and before the writer's next transaction.
    for (runner, key, until) in &spilled {
        spills.remember(runner, key, *until);
    }
    (conn, result.map(|v| (v, changes)))
}

/// A write on a writing connection (the writer's, or `Direct`'s): `work` in a `BEGIN
/// IMMEDIATE` transaction, then its checkpointer told what the commit left in the WAL.
fn write_here<T>(
    conn: Connection,
    spills: &Arc<SpillIndex>,
    checkpoints: &Checkpoints,
    work: Work<SqliteDb, T>,
) -> (Connection, StoreResult<(T, Vec<Change>)>) {
    let (conn, result) = transaction(conn, "BEGIN IMMEDIATE", spills, work);
    checkpoints.committed(&conn);
    (conn, result)
}

/// Runs a future that never waits (every statement here is a blocking call) to its end.
fn run_to_completion<T>(future: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(result) => result,
        std::task::Poll::Pending => Err(StoreError::Internal(
            "a SQLite transaction waited, which it never should".into(),
        )),
    }
}

impl Engine for SqliteEngine {
    type Db = SqliteDb;

    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn write<T: Send + 'static>(
        &self,
        work: Work<SqliteDb, T>,
    ) -> StoreResult<(T, Vec<Change>)> {
        let (spills, checkpoints) = (self.spills.clone(), self.checkpoints.clone());
        Self::on_thread(&self.writer, move |conn| {
            write_here(conn, &spills, &checkpoints, work)
        })
        .await
    }

    async fn read<T: Send + 'static>(
        &self,
        make: impl Fn() -> Work<SqliteDb, T> + Send,
    ) -> StoreResult<T> {
        let (spills, work) = (self.spills.clone(), make());
        Self::on_thread(&self.readers, move |conn| {
            let (conn, result) = transaction(conn, "BEGIN", &spills, work);
            (conn, result.map(|(t, _)| t))
        })
        .await
    }

    /// Ready means writable: take the write lock and give it back. A file that cannot be
    /// written, or is locked by another process, fails here rather than on the next lease.
    async fn ping(&self) -> StoreResult<()> {
        Self::on_thread(&self.writer, |conn| {
            let result = conn
                .execute_batch("BEGIN IMMEDIATE; ROLLBACK")
                .map_err(store_error);
            (conn, result)
        })
        .await
    }
}

/// One writing connection used on the caller's own thread, with no writer thread between:
/// the bench's baseline (`store::Bare`). Its WAL is copied beside it as the service's is, so
/// that the baseline does not wait for checkpoints the service does not wait for.
pub struct Direct {
    conn: Option<Connection>,
    /// The baseline's statements spill nothing: an index of its own, always empty.
    spills: Arc<SpillIndex>,
    checkpoints: Checkpoints,
}

impl Direct {
    /// Opens the database at `path`, which the service has created and migrated.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let conn = connection(path, false, Synchronous::Normal)?;
        Checkpoints::hand_over(&conn);
        let at = path.to_path_buf();
        Ok(Direct {
            conn: Some(conn),
            spills: Arc::default(),
            checkpoints: Checkpoints::start(
                path.to_path_buf(),
                move || connection(&at, false, Synchronous::Normal),
                Cadence::SERVICE,
            )?,
        })
    }

    /// Runs `work` in one `BEGIN IMMEDIATE` transaction, here.
    pub fn write<T>(&mut self, work: Work<SqliteDb, T>) -> StoreResult<T> {
        let conn = self
            .conn
            .take()
            .ok_or_else(|| StoreError::Internal("a failed write lost its connection".into()))?;
        let (conn, result) = write_here(conn, &self.spills, &self.checkpoints, work);
        self.conn = Some(conn);
        result.map(|(value, _)| value)
    }

    /// Copies what the WAL holds into the database file (a passive checkpoint: it waits for
    /// no one), so that the writes of a piece of work, checkpoint included, are done before the
    /// bench reads what they cost. Answers whether the whole WAL was copied.
    pub fn checkpoint(&mut self) -> StoreResult<bool> {
        let conn = self
            .conn
            .as_ref()
            .ok_or_else(|| StoreError::Internal("a failed write lost its connection".into()))?;
        checkpoint(conn).map_err(store_error)
    }
}

/// An open SQLite transaction.
pub struct SqliteDb {
    conn: Connection,
    changes: Vec<Change>,
    /// Spilled jtis, for the index once the transaction commits.
    spilled: Vec<(RunnerId, String, Millis)>,
    spills: Arc<SpillIndex>,
    discard: bool,
}

/// The statement's text as SQLite reads it. Its row locks are no-ops: a write transaction
/// holds the whole database.
fn sqlite_sql(st: &Statement<'_>) -> String {
    let mut sql = st.sql.replace('$', "?");
    if st.tail == Tail::ReturningJobs {
        sql.push_str(" RETURNING *");
    }
    sql
}

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Param::Text(s) => s.to_sql(),
            Param::Int(i) => i.to_sql(),
            Param::OptText(s) => s.to_sql(),
            Param::OptInt(i) => i.to_sql(),
            Param::Owned(s) => s.to_sql(),
            Param::Texts(_) | Param::Ints(_) => Err(rusqlite::Error::ToSqlConversionFailure(
                "SQLite has no arrays: a statement over lists is PostgreSQL's".into(),
            )),
        }
    }
}

impl SqliteDb {
    fn rows(&mut self, st: &Statement<'_>) -> StoreResult<Vec<Row>> {
        let mut stmt = self
            .conn
            .prepare_cached(&sqlite_sql(st))
            .map_err(store_error)?;
        let columns: Arc<[String]> = stmt.column_names().into_iter().map(String::from).collect();
        let mut rows = stmt
            .query(params_from_iter(st.params.iter()))
            .map_err(store_error)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(store_error)? {
            let mut values = Vec::with_capacity(columns.len());
            for i in 0..columns.len() {
                values.push(match row.get_ref(i).map_err(store_error)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(n) => Value::Int(n),
                    ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Real(r) => Value::Int(r as i64),
                    ValueRef::Blob(_) => {
                        return Err(StoreError::Internal(format!(
                            "column {} holds a blob",
                            columns[i]
                        )));
                    }
                });
            }
            out.push(Row::new(columns.clone(), values));
        }
        Ok(out)
    }
}

impl Db for SqliteDb {
    async fn execute(&mut self, st: Statement<'_>) -> StoreResult<u64> {
        let mut stmt = self
            .conn
            .prepare_cached(&sqlite_sql(&st))
            .map_err(store_error)?;
        let n = stmt
            .execute(params_from_iter(st.params.iter()))
            .map_err(store_error)?;
        Ok(n as u64)
    }

    async fn fetch(&mut self, st: Statement<'_>) -> StoreResult<Vec<Row>> {
        self.rows(&st)
    }

    async fn changed(&mut self, change: Change) -> StoreResult<()> {
        match change {
            Change::Spilled { runner, key, until } => self.spilled.push((runner, key, until)),
            other if !self.changes.contains(&other) => self.changes.push(other),
            _ => {}
        }
        Ok(())
    }

    /// Each write as `VALUES` lists, in power-of-two slices: a round's statements come in a
    /// few sizes that stay prepared, and the writer's statements cost no round trip.
    async fn write_rows(&mut self, writes: Vec<RowsWrite<'_>>) -> StoreResult<Option<String>> {
        for write in writes {
            let (rows, cols, every_row) = (write.rows(), write.cols, write.every_row);
            let mut params = write.params.into_iter();
            let mut written = 0;
            for size in chunk_sizes(rows) {
                let values = format!("VALUES {}", values_list(size, cols, 1));
                let part: Vec<Param> = params.by_ref().take(size * cols).collect();
                written += self
                    .execute(Statement::built((write.sql)(&values)).params(part))
                    .await?;
            }
            // The work fails with this, and its transaction is rolled back.
            if every_row && written != rows as u64 {
                return Err(StoreError::Conflict(format!(
                    "a row changed since it was read: {written} of {rows} written"
                )));
            }
        }
        // No row versions: rounds here are written under the one writer's transaction.
        Ok(None)
    }

    fn discard(&mut self) {
        self.discard = true;
    }

    fn spill_index(&self) -> Option<&SpillIndex> {
        Some(&self.spills)
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

/// Applies the embedded migrations not applied yet, each in its own transaction, recording
/// them in `_sqlx_migrations` as sqlx does (version, description, checksum); a migration
/// applied before with another checksum stops the start.
fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS _sqlx_migrations (
            version BIGINT PRIMARY KEY,
            description TEXT NOT NULL,
            installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
            success BOOLEAN NOT NULL,
            checksum BLOB NOT NULL,
            execution_time BIGINT NOT NULL
        )",
    )?;
    let applied: Vec<(i64, Vec<u8>, bool)> = {
        let mut stmt = conn.prepare("SELECT version, checksum, success FROM _sqlx_migrations")?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?
    };
    // A migration may rebuild a table others refer to, which SQLite allows only with foreign
    // keys off (and outside a transaction); every reference is checked once they have run.
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let applied_all = apply_migrations(conn, &applied);
    conn.pragma_update(None, "foreign_keys", "ON")?;
    applied_all?;
    let broken: i64 = conn.query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |r| {
        r.get(0)
    })?;
    anyhow::ensure!(
        broken == 0,
        "{broken} rows refer to rows that are gone after migrating"
    );
    Ok(())
}

fn apply_migrations(conn: &mut Connection, applied: &[(i64, Vec<u8>, bool)]) -> anyhow::Result<()> {
    use anyhow::Context;
    for m in super::migrations::sqlite().iter() {
        if let Some((_, checksum, success)) = applied.iter().find(|(v, _, _)| *v == m.version) {
            anyhow::ensure!(*success, "migration {} was left half applied", m.version);
            anyhow::ensure!(
                checksum.as_slice() == m.checksum.as_ref(),
                "migration {} changed since it was applied to this database",
                m.version
            );
            continue;
        }
        let started = std::time::Instant::now();
        let tx = conn.transaction()?;
        tx.execute_batch(m.sql.as_str())
            .with_context(|| format!("migration {} ({})", m.version, m.description))?;
        tx.execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
                execution_time) \
             VALUES (?1, ?2, TRUE, ?3, ?4)",
            rusqlite::params![
                m.version,
                m.description.as_ref(),
                m.checksum.as_ref(),
                started.elapsed().as_nanos() as i64
            ],
        )?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite_checkpoints::Counts;
    use std::sync::atomic::Ordering;

    const PAGE: usize = 4096;

    #[test]
    fn a_commit_that_fails_leaves_no_transaction_open_behind_it() {
        let conn = Connection::open_in_memory().unwrap();
        // A deferred foreign key is checked at COMMIT, whose failure SQLite leaves open.
        conn.execute_batch(
            "PRAGMA foreign_keys = ON; CREATE TABLE p (id INTEGER PRIMARY KEY); \
             CREATE TABLE c (pid INTEGER REFERENCES p (id) DEFERRABLE INITIALLY DEFERRED);",
        )
        .unwrap();
        let spills = Arc::new(SpillIndex::default());
        let orphan: Work<SqliteDb, ()> = Box::new(|db: &mut SqliteDb| {
            Box::pin(async move {
                db.execute(Statement::new("INSERT INTO c VALUES (1)"))
                    .await
                    .map(|_| ())
            })
        });
        let (conn, result) = transaction(conn, "BEGIN IMMEDIATE", &spills, orphan);
        assert!(result.is_err(), "the commit failed");
        assert!(conn.is_autocommit(), "no transaction is left open");
        let count: Work<SqliteDb, i64> = Box::new(|db: &mut SqliteDb| {
            Box::pin(async move {
                let rows = db
                    .fetch(Statement::new("SELECT COUNT(*) AS n FROM c"))
                    .await?;
                rows[0].int("n")
            })
        });
        let (_, after) = transaction(conn, "BEGIN IMMEDIATE", &spills, count);
        assert_eq!(after.expect("the next transaction begins").0, 0);
    }

    #[test]
    fn a_work_whose_failure_ended_the_transaction_answers_its_own_error() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE u (id INTEGER PRIMARY KEY); INSERT INTO u VALUES (1);")
            .unwrap();
        let spills = Arc::new(SpillIndex::default());
        // `OR ROLLBACK` ends the whole transaction at the conflict, as a full disk can.
        let conflict: Work<SqliteDb, ()> = Box::new(|db: &mut SqliteDb| {
            Box::pin(async move {
                db.execute(Statement::new("INSERT OR ROLLBACK INTO u VALUES (1)"))
                    .await
                    .map(|_| ())
            })
        });
        let (conn, result) = transaction(conn, "BEGIN IMMEDIATE", &spills, conflict);
        let error = result.expect_err("the insert failed").to_string();
        assert!(error.contains("UNIQUE"), "the work's own error: {error}");
        assert!(conn.is_autocommit(), "no transaction is left open");
    }

    /// Writes one transaction that adds about a page to the WAL.
    async fn write_a_page(engine: &SqliteEngine) {
        engine
            .write(Box::new(|db: &mut SqliteDb| {
                let result = db
                    .conn
                    .execute(
                        "INSERT INTO scratch (b) VALUES (randomblob(?1))",
                        [PAGE as i64 - 200],
                    )
                    .map(|_| ())
                    .map_err(store_error);
                Box::pin(async move { result })
            }))
            .await
            .unwrap();
    }

    /// An engine on a file of its own, its WAL copied at `cadence`, with a table to write.
    async fn engine(cadence: Cadence) -> (tempfile::TempDir, SqliteEngine, Arc<Counts>) {
        let dir = tempfile::tempdir().unwrap();
        let engine =
            SqliteEngine::open_with(&dir.path().join("lg.db"), Synchronous::Normal, cadence)
                .unwrap();
        engine
            .write(Box::new(|db: &mut SqliteDb| {
                let result = db
                    .conn
                    .execute_batch("CREATE TABLE scratch (b BLOB)")
                    .map_err(store_error);
                Box::pin(async move { result })
            }))
            .await
            .unwrap();
        let counts = engine.checkpoints.counts();
        (dir, engine, counts)
    }

    /// The checkpointer copies the WAL while the writer goes on, so that it starts again, and
    /// the writer never checkpoints below the bound.
    #[tokio::test]
    async fn the_wal_is_copied_beside_the_writer() {
        let cadence = Cadence {
            every: 8,
            most: 1_000_000,
        };
        let (_dir, engine, counts) = engine(cadence).await;
        while counts.wal_pages.load(Ordering::Relaxed) < cadence.every {
            write_a_page(&engine).await;
        }
        // Cued by the last write; nothing is written while it copies, so it copies it all.
        let started = std::time::Instant::now();
        while counts.beside.load(Ordering::Relaxed) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the checkpointer never copied the WAL: {counts:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        write_a_page(&engine).await;
        let pages = counts.wal_pages.load(Ordering::Relaxed);
        assert!(
            pages < cadence.every,
            "the WAL did not start again: {pages} pages, {counts:?}"
        );
        assert_eq!(counts.on_the_writer.load(Ordering::Relaxed), 0);
    }

    /// Past the bound the writer copies the WAL itself: a WAL the checkpointer cannot keep
    /// short (here it is never cued) stops growing there.
    #[tokio::test]
    async fn the_wal_stops_growing_at_its_bound() {
        let cadence = Cadence {
            every: 1_000_000,
            most: 20,
        };
        let (dir, engine, counts) = engine(cadence).await;
        for _ in 0..80 {
            write_a_page(&engine).await;
        }
        assert!(
            counts.on_the_writer.load(Ordering::Relaxed) >= 2,
            "{counts:?}"
        );
        assert_eq!(counts.beside.load(Ordering::Relaxed), 0);
        let wal = std::fs::metadata(dir.path().join("lg.db-wal"))
            .unwrap()
            .len() as usize;
        // A frame is a page and its 24-byte header; a write adds at most three pages here.
        assert!(
            wal <= 32 + (cadence.most as usize + 3) * (PAGE + 24),
            "the WAL holds {wal} bytes, {} pages",
            wal / (PAGE + 24)
        );
    }

    /// A transaction that rolled back wrote nothing to the WAL: it asks for no checkpoint.
    #[tokio::test]
    async fn a_rolled_back_write_asks_for_no_checkpoint() {
        let cadence = Cadence {
            every: 1_000_000,
            most: 1,
        };
        let (_dir, engine, counts) = engine(cadence).await;
        let copied = counts.on_the_writer.load(Ordering::Relaxed);
        assert!(
            copied >= 1,
            "the table's creation is copied here: {counts:?}"
        );
        let failed = engine
            .write(Box::new(|db: &mut SqliteDb| {
                let wrote = db
                    .conn
                    .execute("INSERT INTO scratch (b) VALUES (x'00')", [])
                    .map_err(store_error);
                Box::pin(async move {
                    wrote?;
                    StoreResult::<()>::Err(StoreError::Internal("given up".into()))
                })
            }))
            .await;
        assert!(failed.is_err());
        assert_eq!(counts.on_the_writer.load(Ordering::Relaxed), copied);
        write_a_page(&engine).await;
        assert_eq!(counts.on_the_writer.load(Ordering::Relaxed), copied + 1);
    }

    /// The bundled SQLite is built as `.cargo/config.toml` says (`LIBSQLITE3_FLAGS`): without
    /// the extensions leasegate does not use, which cost build time, and with what it relies on.
    #[test]
    fn the_bundled_sqlite_is_built_without_the_unused_extensions() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut statement = conn.prepare("PRAGMA compile_options").unwrap();
        let options: Vec<String> = statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for left_out in [
            "ENABLE_FTS3",
            "ENABLE_FTS5",
            "ENABLE_RTREE",
            "ENABLE_DBSTAT_VTAB",
            "SOUNDEX",
        ] {
            assert!(
                !options.iter().any(|o| o == left_out),
                "{left_out} is built in: {options:?}"
            );
        }
        for kept in ["ENABLE_STAT4", "THREADSAFE=1", "DEFAULT_FOREIGN_KEYS"] {
            assert!(
                options.iter().any(|o| o == kept),
                "{kept} is missing: {options:?}"
            );
        }
    }
}

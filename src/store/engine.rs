//! The one interface the store's statements run over, and that each engine implements.
//!
//! A statement is SQL text with `$n` placeholders and its bound values (`Statement`); a row
//! comes back as plain values (`Row`), decoded into domain values once, in `sql::rows`. An
//! open transaction (`Db`) can `execute` and `fetch` statements and note what it `changed`;
//! an `Engine` runs a piece of `Work` over one such transaction and commits it, or over a
//! read-only connection. Everything the store writes is a function of `sql/` over `Db`, so
//! each statement exists once, for both engines.
//!
//! The few places where the engines' SQL differs are named, not pasted: a statement asks for
//! a row lock, a skip-locked claim or the returned jobs of an `UPDATE … FROM` (`Tail`), and
//! the engine writes it its way (nothing on SQLite, whose writer is alone anyway). Rows written
//! many at a time are data (`RowsWrite`), sent as each engine sends rows best (`Db::write_rows`:
//! `VALUES` lists on SQLite, arrays and one statement for all of them on PostgreSQL).
//!
//! `changed` is how a write says what it changed that others hold in memory: the gate's cached
//! inputs (a runner, a pool), the long polls' wake-ups (a job queued or returned), and SQLite's
//! in-memory index of spilled jtis. PostgreSQL
//! announces each inside the transaction (`NOTIFY`, delivered on commit to every replica); the
//! store applies them in this process once the transaction has committed (`held.rs`). So the
//! list of what to forget is written where the change happens, once.
//!
//! Why plain functions over this small interface rather than functions generic over
//! `sqlx::Database`: those would repeat on every function bounds such as `for<'c> &'c mut
//! DB::Connection: Executor<'c, Database = DB>`, and `Encode`, `Decode` and `Type` for every
//! value, and SQLite would still pay sqlx's hop to its worker thread for every statement. Here
//! the values are integers and text, the two types both schemas use, and fixing a query fixes
//! it for both engines.

use super::spills::SpillIndex;
use super::{StoreError, StoreResult};
use crate::domain::ids::RunnerId;
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

/// A bound value.
#[derive(Clone, Debug, PartialEq)]
pub enum Param<'a> {
    Text(&'a str),
    Int(i64),
    OptText(Option<&'a str>),
    OptInt(Option<i64>),
    /// A value made for the statement (JSON, a formatted digest).
    Owned(Option<String>),
    /// Arrays, for PostgreSQL only (SQLite has no array type): a round's lists passed whole
    /// to its function, or a column of a multi-row write (`Db::write_rows`), one statement
    /// whatever their length.
    Texts(Vec<Option<&'a str>>),
    Ints(Vec<Option<i64>>),
}

impl<'a> Param<'a> {
    /// The text this parameter binds, if it is text.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Param::Text(s) => Some(s),
            Param::OptText(s) => *s,
            Param::Owned(s) => s.as_deref(),
            Param::Int(_) | Param::OptInt(_) | Param::Texts(_) | Param::Ints(_) => None,
        }
    }
}

impl From<String> for Param<'_> {
    fn from(s: String) -> Self {
        Param::Owned(Some(s))
    }
}

impl From<Option<String>> for Param<'_> {
    fn from(s: Option<String>) -> Self {
        Param::Owned(s)
    }
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(s: &'a str) -> Self {
        Param::Text(s)
    }
}

impl<'a> From<&'a String> for Param<'a> {
    fn from(s: &'a String) -> Self {
        Param::Text(s)
    }
}

impl From<i64> for Param<'_> {
    fn from(i: i64) -> Self {
        Param::Int(i)
    }
}

impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(s: Option<&'a str>) -> Self {
        Param::OptText(s)
    }
}

impl From<Option<i64>> for Param<'_> {
    fn from(i: Option<i64>) -> Self {
        Param::OptInt(i)
    }
}

/// What an engine appends to a statement, in its own dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    None,
    /// Lock the selected rows for the transaction (`FOR UPDATE`).
    RowLock,
    /// Lock the selected rows, skipping those another transaction holds: a claim.
    SkipLocked,
    /// Keep the selected rows from being deleted until the transaction ends
    /// (`FOR KEY SHARE`, the lock a foreign key's check takes). Taken before inserting a row
    /// that refers to them, so that a concurrent delete is either waited for and seen (the
    /// row is gone: a clean refusal) or made to wait (it then sees the new reference),
    /// never a foreign-key violation at the insert.
    KeyShareLock,
    /// Return the updated `jobs` rows of an `UPDATE jobs … FROM …`.
    ReturningJobs,
}

/// One statement: SQL with `$1`, `$2`… placeholders, and what they are bound to.
#[derive(Clone, Debug)]
pub struct Statement<'a> {
    pub sql: Cow<'static, str>,
    pub params: Vec<Param<'a>>,
    pub tail: Tail,
}

impl<'a> Statement<'a> {
    pub fn new(sql: &'static str) -> Self {
        Statement {
            sql: Cow::Borrowed(sql),
            params: Vec::new(),
            tail: Tail::None,
        }
    }

    /// A statement whose text is built at run time (a multi-row `VALUES` list).
    pub fn built(sql: String) -> Self {
        Statement {
            sql: Cow::Owned(sql),
            params: Vec::new(),
            tail: Tail::None,
        }
    }

    pub fn bind(mut self, p: impl Into<Param<'a>>) -> Self {
        self.params.push(p.into());
        self
    }

    pub fn params(mut self, params: Vec<Param<'a>>) -> Self {
        self.params = params;
        self
    }

    pub fn tail(mut self, tail: Tail) -> Self {
        self.tail = tail;
        self
    }
}

/// Rows written by one multi-row statement: `sql(rows)` is its text, `rows` standing where a
/// query of the rows goes (after `INSERT INTO t (…)`, or in `WITH v (…) AS (rows)`), and
/// `params` hold each row's `cols` values, row after row. How the rows are sent is the
/// engine's (`Db::write_rows`): `VALUES` lists on SQLite, arrays on PostgreSQL.
pub struct RowsWrite<'a> {
    pub sql: fn(&str) -> String,
    pub cols: usize,
    pub params: Vec<Param<'a>>,
    /// Each row must write one row of the table (an `UPDATE`'s rows each find theirs): when
    /// one does not, the whole `write_rows` fails as a conflict and writes nothing
    /// (`every_row`).
    pub every_row: bool,
}

impl<'a> RowsWrite<'a> {
    /// `rows`, each bound by `bind` to its `cols` values.
    pub fn of<T>(
        rows: &'a [T],
        cols: usize,
        sql: fn(&str) -> String,
        bind: impl Fn(&'a T) -> Vec<Param<'a>>,
    ) -> Self {
        let params: Vec<Param<'a>> = rows.iter().flat_map(bind).collect();
        debug_assert_eq!(params.len(), rows.len() * cols);
        RowsWrite {
            sql,
            cols,
            params,
            every_row: false,
        }
    }

    /// This write, which fails whole, with every write given beside it, when one of its rows
    /// writes nothing: an update guarded by the version of the row it read
    /// (`sql::round::write_unlocked`) finds the row changed since.
    pub fn every_row(mut self) -> Self {
        self.every_row = true;
        self
    }

    pub fn rows(&self) -> usize {
        self.params.len() / self.cols
    }
}

/// A column's value as stored: every column of both schemas is an integer or text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
}

/// One row: its values by column name.
#[derive(Clone, Debug, Default)]
pub struct Row {
    columns: std::sync::Arc<[String]>,
    values: Vec<Value>,
}

impl Row {
    pub fn new(columns: std::sync::Arc<[String]>, values: Vec<Value>) -> Self {
        Row { columns, values }
    }

    fn value(&self, column: &str) -> StoreResult<&Value> {
        self.columns
            .iter()
            .position(|c| c == column)
            .map(|i| &self.values[i])
            .ok_or_else(|| StoreError::Internal(format!("no column {column} in the row")))
    }

    pub fn int(&self, column: &str) -> StoreResult<i64> {
        match self.value(column)? {
            Value::Int(i) => Ok(*i),
            other => Err(type_error(column, "an integer", other)),
        }
    }

    pub fn opt_int(&self, column: &str) -> StoreResult<Option<i64>> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Int(i) => Ok(Some(*i)),
            other => Err(type_error(column, "an integer", other)),
        }
    }

    pub fn text(&self, column: &str) -> StoreResult<String> {
        match self.value(column)? {
            Value::Text(s) => Ok(s.clone()),
            other => Err(type_error(column, "text", other)),
        }
    }

    pub fn opt_text(&self, column: &str) -> StoreResult<Option<String>> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s.clone())),
            other => Err(type_error(column, "text", other)),
        }
    }

    pub fn flag(&self, column: &str) -> StoreResult<bool> {
        Ok(self.int(column)? != 0)
    }
}

fn type_error(column: &str, expected: &str, got: &Value) -> StoreError {
    StoreError::Internal(format!("column {column}: expected {expected}, got {got:?}"))
}

/// What a write changed that other parts of the service (and other replicas) hold in memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Change {
    /// A runner's gate inputs: cordon, quarantine, revocation, key, forge runners, and its
    /// latest attestation's facts or status.
    Runner(RunnerId),
    /// Which forge runners are bound to which runners (the forge gate's first read).
    ForgeRunners,
    /// A pool's accepted images, policy or mode.
    Pool(PoolName),
    /// One job joined the pool's queue: wake one waiter.
    JobQueued(PoolName),
    /// Jobs went back to the pool's queue: wake every waiter.
    JobsReturned(PoolName),
    /// A runner's jti no longer fit its row and went to the spill table: known to the
    /// in-memory spill index once committed, where the engine keeps one (`sql::replay`).
    Spilled {
        runner: RunnerId,
        key: String,
        until: Millis,
    },
}

/// A transaction (or, for reads, a connection) of one engine.
pub trait Db: Send {
    /// Runs `st`; how many rows it changed.
    fn execute(&mut self, st: Statement<'_>) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Runs `st`; the rows it returned.
    fn fetch(&mut self, st: Statement<'_>) -> impl Future<Output = StoreResult<Vec<Row>>> + Send;

    /// Notes that this transaction changed `change`: announced to other replicas with the
    /// commit, and applied in this process after it.
    fn changed(&mut self, change: Change) -> impl Future<Output = StoreResult<()>> + Send;

    /// Writes each of `writes` (those with rows), in order, however the engine sends rows
    /// best: SQLite as `VALUES` lists in slices of a few sizes that stay prepared, PostgreSQL
    /// all of them in one statement over arrays, one round trip whatever their number and
    /// size. One statement on PostgreSQL means the writes cannot see each other's rows: give
    /// it only writes that do not read what another of them writes. A write marked
    /// `every_row` that writes fewer rows than it has fails the call with
    /// `StoreError::Conflict`, and nothing of it is kept (PostgreSQL: the statement fails;
    /// SQLite: its transaction is rolled back as the work fails).
    ///
    /// Answers, where `writes` hold an `every_row` write and the engine keeps row versions,
    /// the version every row written now has (PostgreSQL: the statement's transaction id,
    /// what its rows' `xmin` read), which a later `every_row` update may be guarded by.
    fn write_rows(
        &mut self,
        writes: Vec<RowsWrite<'_>>,
    ) -> impl Future<Output = StoreResult<Option<String>>> + Send;

    /// Rolls the transaction back instead of committing it when the work returns.
    fn discard(&mut self);

    /// The index of spilled jtis kept in memory, where this process is the database's only
    /// writer (SQLite); `None` where the spill table's primary key is the index (PostgreSQL,
    /// whose replicas share it). See `sql::replay`.
    fn spill_index(&self) -> Option<&SpillIndex>;
}

/// The first row `st` returns, if any.
pub async fn fetch_optional<D: Db>(db: &mut D, st: Statement<'_>) -> StoreResult<Option<Row>> {
    Ok(db.fetch(st).await?.into_iter().next())
}

/// The one row `st` must return.
pub async fn fetch_one<D: Db>(db: &mut D, st: Statement<'_>) -> StoreResult<Row> {
    fetch_optional(db, st)
        .await?
        .ok_or_else(|| StoreError::Internal("a statement returned no row".into()))
}

/// A future a piece of work returns, borrowing its transaction.
pub type WorkFuture<'a, T> = Pin<Box<dyn Future<Output = StoreResult<T>> + Send + 'a>>;

/// A piece of work to run over an engine's transaction. It owns what it needs: an engine may
/// run it on a thread of its own (SQLite's writer).
pub type Work<D, T> = Box<dyn for<'a> FnOnce(&'a mut D) -> WorkFuture<'a, T> + Send>;

/// An engine: SQLite or PostgreSQL.
pub trait Engine: Send + Sync + 'static {
    type Db: Db;

    /// `sqlite` or `postgres`.
    fn name(&self) -> &'static str;

    /// Runs `work` in one write transaction and commits it (unless it discarded it), and
    /// answers its result with what it changed.
    fn write<T: Send + 'static>(
        &self,
        work: Work<Self::Db, T>,
    ) -> impl Future<Output = StoreResult<(T, Vec<Change>)>> + Send;

    /// Runs the work `make` makes over a connection that reads. A read changes nothing, so
    /// an engine may make it again and run it on another connection when the first was found
    /// gone (PostgreSQL: closed by the server or a proxy while it sat in the pool).
    fn read<T: Send + 'static>(
        &self,
        make: impl Fn() -> Work<Self::Db, T> + Send,
    ) -> impl Future<Output = StoreResult<T>> + Send;

    /// Whether the database answers (and, for SQLite, may be written).
    fn ping(&self) -> impl Future<Output = StoreResult<()>> + Send;

    /// The runtime group commit's rounds run on, where the engine keeps one of its own
    /// (PostgreSQL: `pg_rounds`); `None`, the caller's.
    fn rounds_runtime(&self) -> Option<tokio::runtime::Handle> {
        None
    }

    /// Writes one round of group commit, as `write` does, over the connections of the rounds'
    /// runtime where the engine has one.
    fn write_round<T: Send + 'static>(
        &self,
        work: Work<Self::Db, T>,
    ) -> impl Future<Output = StoreResult<(T, Vec<Change>)>> + Send {
        self.write(work)
    }

    /// Runs the work `make` makes over the rounds' connection with no transaction around it,
    /// each of its statements committed by itself (`sql::round::write_unlocked`), where the
    /// engine writes rounds so: PostgreSQL, where a round's `BEGIN`, row locks and `COMMIT`
    /// cost round trips and WAL of their own. `None`, `make` not called, where it does not:
    /// SQLite, whose one writer holds the whole database for every round anyway. What such
    /// work notes as `changed` is not announced (a round written so changes nothing that is).
    fn write_round_unlocked<T: Send + 'static>(
        &self,
        make: impl FnOnce() -> Work<Self::Db, T> + Send,
    ) -> Option<impl Future<Output = StoreResult<T>> + Send> {
        let _ = make;
        None::<std::future::Ready<StoreResult<T>>>
    }
}

/// `work` as an engine takes it (the closure's future boxed, borrowing its transaction).
pub fn work<D, T, F>(f: F) -> Work<D, T>
where
    F: for<'a> FnOnce(&'a mut D) -> WorkFuture<'a, T> + Send + 'static,
{
    Box::new(f)
}

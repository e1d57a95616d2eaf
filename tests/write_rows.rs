//! A multi-row write (`Db::write_rows`) on each engine: SQLite sends `VALUES` lists in
//! power-of-two slices, PostgreSQL one statement over arrays for all the writes given together
//! (the rounds' writes, `store/sql/round.rs`). Either way every row arrives as written, NULLs
//! included, an `UPDATE … FROM` of rows changes what it names and nothing else, more rows than
//! a slice holds are not cut, and a write with no rows writes nothing. On PostgreSQL the same
//! holds over the rounds' kept connection (`Engine::write_round`), round after round. A write
//! that must write every one of its rows (`RowsWrite::every_row`) and finds one missing fails
//! as a conflict, and nothing given with it is kept: in a transaction, and on PostgreSQL
//! without one too (`Engine::write_round_unlocked`, where the statement is all there is).

use crate::common::{self, Engine};
use leasegate::store::engine::{Db, Engine as _, Param, Row, RowsWrite, Statement, Work};
use leasegate::store::postgres::{PgEngine, PgSettings};
use leasegate::store::sqlite::{SqliteEngine, Synchronous};
use leasegate::store::{StoreError, StoreResult};
use std::sync::Arc;

/// 70 rows: more than the largest slice (64), so SQLite writes them in three statements.
const ROWS: i64 = 70;

fn insert_a(rows: &str) -> String {
    format!("INSERT INTO scratch_a (id, n, note) {rows}")
}

fn insert_b(rows: &str) -> String {
    format!("INSERT INTO scratch_b (a_id, k) {rows} ON CONFLICT DO NOTHING")
}

fn update_a(rows: &str) -> String {
    format!(
        "WITH v (id, n, note) AS ({rows}) \
         UPDATE scratch_a SET n = v.n, note = v.note FROM v WHERE scratch_a.id = v.id"
    )
}

type A = (String, i64, Option<String>);

fn a_rows() -> Vec<A> {
    (0..ROWS)
        .map(|i| {
            let note = (i % 2 == 1).then(|| format!("note {i}, with 'quotes' and $1"));
            (format!("a-{i:03}"), i, note)
        })
        .collect()
}

fn bind_a(r: &A) -> Vec<Param<'_>> {
    vec![
        Param::Text(&r.0),
        Param::Int(r.1),
        Param::Owned(r.2.clone()),
    ]
}

fn bind_b(r: &(String, i64)) -> Vec<Param<'_>> {
    vec![Param::Text(&r.0), Param::Int(r.1)]
}

/// The two tables the writes go to, made afresh.
async fn create_tables<D: Db>(db: &mut D) -> StoreResult<()> {
    for table in ["scratch_a", "scratch_b"] {
        db.execute(Statement::built(format!("DROP TABLE IF EXISTS {table}")))
            .await?;
    }
    db.execute(Statement::new(
        "CREATE TABLE scratch_a (id TEXT PRIMARY KEY, n BIGINT NOT NULL, note TEXT)",
    ))
    .await?;
    db.execute(Statement::new(
        "CREATE TABLE scratch_b (a_id TEXT NOT NULL, k BIGINT NOT NULL, \
         PRIMARY KEY (a_id, k))",
    ))
    .await?;
    Ok(())
}

/// Creates the tables and writes rows into both in one call, then updates some of them in
/// three more (as rounds, when `rounds`), and reads everything back.
async fn check_engine<E: leasegate::store::engine::Engine>(engine: &E, rounds: bool) {
    let setup: Work<E::Db, ()> = Box::new(|db| {
        Box::pin(async move {
            create_tables(db).await?;
            let a = a_rows();
            let b: Vec<(String, i64)> = (0..5).map(|k| ("a-000".to_string(), k)).collect();
            db.write_rows(vec![
                RowsWrite::of(&a, 3, insert_a, bind_a),
                RowsWrite::of(&b, 2, insert_b, bind_b),
            ])
            .await?;
            Ok(())
        })
    });
    engine.write(setup).await.expect("the first write");

    // Every seventh row updated, an empty write between, more of the other table's rows
    // (one of them already there).
    for round in 0..3 {
        let update: Work<E::Db, ()> = Box::new(move |db| {
            Box::pin(async move {
                let changed: Vec<A> = a_rows()
                    .into_iter()
                    .filter(|(_, n, _)| n % 7 == 0)
                    .map(|(id, n, _)| (id, n * 10 + round, Some(format!("round {round}"))))
                    .collect();
                let none: Vec<(String, i64)> = Vec::new();
                let b: Vec<(String, i64)> =
                    (4..9).map(|k| ("a-001".to_string(), k + round)).collect();
                db.write_rows(vec![
                    RowsWrite::of(&changed, 3, update_a, bind_a),
                    RowsWrite::of(&none, 2, insert_b, bind_b),
                    RowsWrite::of(&b, 2, insert_b, bind_b),
                ])
                .await?;
                Ok(())
            })
        });
        if rounds {
            engine.write_round(update).await.expect("a round's write");
        } else {
            engine.write(update).await.expect("a write");
        }
    }

    let read = || -> Work<E::Db, (Vec<Row>, Vec<Row>)> {
        Box::new(|db| {
            Box::pin(async move {
                let a = db
                    .fetch(Statement::new(
                        "SELECT id, n, note FROM scratch_a ORDER BY id",
                    ))
                    .await?;
                let b = db
                    .fetch(Statement::new(
                        "SELECT a_id, k FROM scratch_b ORDER BY a_id, k",
                    ))
                    .await?;
                Ok((a, b))
            })
        })
    };
    let (a, b) = engine.read(read).await.expect("read back");
    let got: Vec<A> = a
        .iter()
        .map(|r| -> StoreResult<A> { Ok((r.text("id")?, r.int("n")?, r.opt_text("note")?)) })
        .collect::<Result<_, StoreError>>()
        .unwrap();
    let expected: Vec<A> = a_rows()
        .into_iter()
        .map(|(id, n, note)| match n % 7 {
            0 => (id, n * 10 + 2, Some("round 2".to_string())),
            _ => (id, n, note),
        })
        .collect();
    assert_eq!(got, expected);
    let pairs: Vec<(String, i64)> = b
        .iter()
        .map(|r| (r.text("a_id").unwrap(), r.int("k").unwrap()))
        .collect();
    let mut want: Vec<(String, i64)> = (0..5).map(|k| ("a-000".to_string(), k)).collect();
    want.extend((4..11).map(|k| ("a-001".to_string(), k)));
    assert_eq!(pairs, want);
}

/// A SQLite engine on a file of `dir`.
fn sqlite_in(dir: &tempfile::TempDir) -> SqliteEngine {
    SqliteEngine::open(&dir.path().join("rows.db"), Synchronous::Normal).expect("open SQLite")
}

/// A PostgreSQL engine as the service opens it (its rounds' thread and connection included),
/// on a database of its own; `None` where the test skips PostgreSQL.
async fn postgres() -> Option<(common::pg::TestDatabase, PgEngine)> {
    let db = common::pg::TestDatabase::create().await?;
    let pg = PgEngine::open(&db.url, &PgSettings::default(), Arc::new(|_| {}))
        .await
        .expect("open PostgreSQL");
    Some((db, pg))
}

async fn every_row_arrives_as_written(engine: Engine) {
    match engine {
        Engine::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            check_engine(&sqlite_in(&dir), false).await;
        }
        Engine::Postgres => {
            let Some((_db, pg)) = postgres().await else {
                return;
            };
            check_engine(&pg, false).await;
            // The same, the tables made afresh, through the rounds' lane and its kept
            // connection.
            check_engine(&pg, true).await;
        }
    }
}

/// Three of the rows updated with `every_row`, and a row of the other table beside them;
/// `missing`: one of the three names no row. The version the rows now have, where the engine
/// keeps one.
fn guarded_update<D: Db + 'static>(missing: bool) -> Work<D, Option<String>> {
    Box::new(move |db| {
        Box::pin(async move {
            let mut changed: Vec<A> = ["a-001", "a-002", "a-003"]
                .iter()
                .map(|id| (id.to_string(), -1, Some("guarded".to_string())))
                .collect();
            if missing {
                changed[1].0 = "a-999".to_string();
            }
            let b = vec![("a-002".to_string(), 77)];
            db.write_rows(vec![
                RowsWrite::of(&changed, 3, update_a, bind_a).every_row(),
                RowsWrite::of(&b, 2, insert_b, bind_b),
            ])
            .await
        })
    })
}

/// What the guarded update may have changed: the rows' notes and the other table's row.
async fn guarded_state<E: leasegate::store::engine::Engine>(engine: &E) -> (Vec<String>, i64) {
    let read = || -> Work<E::Db, (Vec<String>, i64)> {
        Box::new(|db| {
            Box::pin(async move {
                let notes = db
                    .fetch(Statement::new(
                        "SELECT COALESCE(note, '') AS note FROM scratch_a \
                         WHERE id IN ('a-001', 'a-002', 'a-003') ORDER BY id",
                    ))
                    .await?
                    .iter()
                    .map(|r| r.text("note"))
                    .collect::<StoreResult<Vec<String>>>()?;
                let b = db
                    .fetch(Statement::new(
                        "SELECT COUNT(*) AS n FROM scratch_b WHERE k = 77",
                    ))
                    .await?;
                Ok((notes, b[0].int("n")?))
            })
        })
    };
    engine.read(read).await.expect("read back")
}

async fn a_write_of_every_row_fails_whole_when_one_finds_nothing(engine: Engine) {
    async fn check<E: leasegate::store::engine::Engine>(engine: &E, unlocked: bool, versions: bool)
    where
        E::Db: 'static,
    {
        let setup: Work<E::Db, ()> = Box::new(|db| {
            Box::pin(async move {
                create_tables(db).await?;
                let a = a_rows();
                db.write_rows(vec![RowsWrite::of(&a, 3, insert_a, bind_a)])
                    .await?;
                Ok(())
            })
        });
        engine.write(setup).await.expect("the first write");
        let before = guarded_state(engine).await;
        assert!(!before.0.contains(&"guarded".to_string()) && before.1 == 0);
        let write = |missing| async move {
            if unlocked {
                engine
                    .write_round_unlocked(move || guarded_update(missing))
                    .expect("the service's PostgreSQL engine writes unlocked rounds")
                    .await
            } else {
                engine
                    .write(guarded_update(missing))
                    .await
                    .map(|(version, _)| version)
            }
        };

        let failed = write(true).await;
        assert!(
            matches!(failed, Err(StoreError::Conflict(_))),
            "a row that wrote nothing is a conflict: {failed:?}"
        );
        assert_eq!(
            guarded_state(engine).await,
            before,
            "nothing of the failed write is kept, the rows that were found included"
        );

        let version = write(false).await.expect("every row found");
        let notes = vec!["guarded".to_string(); 3];
        assert_eq!(guarded_state(engine).await, (notes, 1));
        if !versions {
            assert_eq!(version, None, "this engine keeps no row versions");
            return;
        }
        // The version answered is what each row written now reads as its own: what a later
        // write guarded by it (`sql::round::write_unlocked`, from `KnownRows`) compares.
        let read = || -> Work<E::Db, Vec<String>> {
            Box::new(|db| {
                Box::pin(async move {
                    db.fetch(Statement::built(format!(
                        "SELECT DISTINCT {} AS v FROM scratch_a \
                         WHERE id IN ('a-001', 'a-002', 'a-003')",
                        leasegate::store::sql::round::row_version_sql("xmin")
                    )))
                    .await?
                    .iter()
                    .map(|r| r.text("v"))
                    .collect()
                })
            })
        };
        let rows_versions = engine.read(read).await.expect("the rows' versions");
        assert_eq!(
            version.map(|v| vec![v]),
            Some(rows_versions),
            "one version, every written row's"
        );
    }

    match engine {
        Engine::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let sqlite = sqlite_in(&dir);
            assert!(
                sqlite
                    .write_round_unlocked(|| guarded_update(false))
                    .is_none(),
                "SQLite's rounds are all written in its one writer's transaction"
            );
            check(&sqlite, false, false).await;
        }
        Engine::Postgres => {
            let Some((_db, pg)) = postgres().await else {
                return;
            };
            check(&pg, false, true).await;
            check(&pg, true, true).await;
        }
    }
}

common::each_engine!(
    every_row_arrives_as_written,
    a_write_of_every_row_fails_whole_when_one_finds_nothing,
);

//! SQLite's and PostgreSQL's migration trees describe one schema: the same tables, the same
//! columns with the same types (each engine's spelling mapped to one kind) and nullability,
//! the same primary keys, and the same indexes (name, table, columns, unique, partial or
//! not). A migration written for one engine and forgotten, or written differently, for the
//! other fails here rather than on the first replica that reads the column.
//!
//! Each schema is read back from a service that ran its migrations, not from the files:
//! what is compared is what the store queries meet. The differences made on purpose are
//! listed in `DELIBERATE`, each with why; any other fails.

use crate::common;

use common::*;
use sqlx::{Connection, Row};
use std::collections::BTreeMap;

/// One column: its kind and whether it may be NULL.
type Columns = BTreeMap<String, (&'static str, bool)>;

/// One engine's schema.
#[derive(Debug, Default, PartialEq, Eq)]
struct Schema {
    tables: BTreeMap<String, Columns>,
    /// Table → its primary key's columns, in order.
    primary_keys: BTreeMap<String, Vec<String>>,
    /// Index name → (table, columns in order, unique, partial).
    indexes: BTreeMap<String, (String, Vec<String>, bool, bool)>,
}

/// The differences the two trees make on purpose: the line `differences` writes, and why.
const DELIBERATE: &[(&str, &str)] = &[
    (
        "primary key of seen_jtis: sqlite None, postgres Some([\"runner_id\", \"jti\"])",
        "SQLite's spilled jtis are one process's append-only record, looked up in memory; \
         PostgreSQL's replicas share the table and ask it by its key (store/sql/replay.rs)",
    ),
    (
        "index seen_jtis_by_expiry: sqlite None, postgres Some((\"seen_jtis\", \
         [\"expires_at\"], false, false))",
        "SQLite's append-only record of spilled jtis is purged from its head, in the order it \
         was written; PostgreSQL's is keyed by jti, and purged by its expiry index",
    ),
];

/// Both engines' spellings of a type, as one kind. SQLite has no JSON or 64-bit types of its
/// own, and PostgreSQL spells a `BIGSERIAL` `bigint`.
fn kind(declared: &str) -> &'static str {
    match declared.to_ascii_lowercase().as_str() {
        "integer" | "bigint" | "int" | "int8" | "int4" | "smallint" => "integer",
        "text" | "character varying" | "json" => "text",
        "real" | "double precision" => "real",
        "blob" | "bytea" => "bytes",
        "boolean" => "boolean",
        other => panic!("a column type this test does not map: {other}"),
    }
}

/// The migrations' own bookkeeping, which each engine's migrator keeps its own way.
fn is_bookkeeping(table: &str) -> bool {
    table.starts_with("_sqlx") || table.starts_with("sqlite_")
}

fn sqlite_schema(url: &str) -> Schema {
    let leasegate::store::DatabaseUrl::Sqlite(path) =
        leasegate::store::DatabaseUrl::parse(url).unwrap()
    else {
        panic!("not a SQLite URL: {url}")
    };
    let conn = rusqlite::Connection::open(path).unwrap();
    let names = |sql: &str| -> Vec<String> {
        let mut q = conn.prepare(sql).unwrap();
        q.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let mut schema = Schema::default();
    for table in names("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name") {
        if is_bookkeeping(&table) {
            continue;
        }
        let mut info = conn
            .prepare(&format!("PRAGMA table_info(\"{table}\")"))
            .unwrap();
        let rows: Vec<(String, String, bool, i64)> = info
            .query_map([], |r| Ok((r.get(1)?, r.get(2)?, r.get(3)?, r.get(5)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut pk: Vec<(i64, String)> = Vec::new();
        let mut columns = Columns::new();
        for (name, ty, not_null, pk_position) in rows {
            // SQLite lets a primary key column hold NULL unless it says NOT NULL; PostgreSQL
            // never does. The store never writes one, so a key column counts as NOT NULL.
            columns.insert(name.clone(), (kind(&ty), !not_null && pk_position == 0));
            if pk_position > 0 {
                pk.push((pk_position, name));
            }
        }
        pk.sort();
        if !pk.is_empty() {
            schema
                .primary_keys
                .insert(table.clone(), pk.into_iter().map(|(_, c)| c).collect());
        }
        let mut list = conn
            .prepare(&format!("PRAGMA index_list(\"{table}\")"))
            .unwrap();
        let indexes: Vec<(String, bool, String, bool)> = list
            .query_map([], |r| Ok((r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for (name, unique, origin, partial) in indexes {
            // `pk`: the primary key's, compared above.
            if origin == "pk" {
                continue;
            }
            let mut cols = conn
                .prepare(&format!("PRAGMA index_info(\"{name}\")"))
                .unwrap();
            let cols: Vec<String> = cols
                .query_map([], |r| r.get(2))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            // A UNIQUE constraint's index is named by each engine its own way.
            let name = if origin == "u" {
                format!("unique {table} ({})", cols.join(", "))
            } else {
                name
            };
            schema
                .indexes
                .insert(name, (table.clone(), cols, unique, partial));
        }
        schema.tables.insert(table, columns);
    }
    schema
}

async fn postgres_schema(url: &str) -> Schema {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let mut schema = Schema::default();
    let columns = sqlx::query(
        "SELECT table_name::text AS t, column_name::text AS c, data_type::text AS ty, \
                is_nullable = 'YES' AS nullable \
         FROM information_schema.columns WHERE table_schema = current_schema() \
         ORDER BY table_name, ordinal_position",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    for row in columns {
        let table: String = row.get("t");
        if is_bookkeeping(&table) {
            continue;
        }
        let ty: String = row.get("ty");
        schema
            .tables
            .entry(table)
            .or_default()
            .insert(row.get("c"), (kind(&ty), row.get("nullable")));
    }
    // Every index with its columns in order, whether it is the primary key's, unique, and
    // partial, and whether a UNIQUE constraint made it.
    let indexes = sqlx::query(
        "SELECT i.relname::text AS name, t.relname::text AS t, x.indisprimary AS pk, \
                x.indisunique AS uniq, x.indpred IS NOT NULL AS partial, \
                EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid \
                        AND c.contype = 'u') AS constraint_made, \
                ARRAY(SELECT a.attname::text FROM unnest(x.indkey) WITH ORDINALITY AS k(n, o) \
                      JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.n \
                      ORDER BY k.o) AS cols \
         FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
         JOIN pg_class t ON t.oid = x.indrelid JOIN pg_namespace s ON s.oid = t.relnamespace \
         WHERE s.nspname = current_schema() ORDER BY i.relname",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    for row in indexes {
        let table: String = row.get("t");
        if is_bookkeeping(&table) {
            continue;
        }
        let cols: Vec<String> = row.get("cols");
        if row.get::<bool, _>("pk") {
            schema.primary_keys.insert(table, cols);
            continue;
        }
        let name = if row.get::<bool, _>("constraint_made") {
            format!("unique {table} ({})", cols.join(", "))
        } else {
            row.get("name")
        };
        schema
            .indexes
            .insert(name, (table, cols, row.get("uniq"), row.get("partial")));
    }
    conn.close().await.ok();
    schema
}

/// Where two maps differ, one line per key.
fn differences<V: std::fmt::Debug + PartialEq>(
    what: &str,
    sqlite: &BTreeMap<String, V>,
    postgres: &BTreeMap<String, V>,
) -> Vec<String> {
    let mut out = Vec::new();
    for key in sqlite.keys().chain(postgres.keys()) {
        let (a, b) = (sqlite.get(key), postgres.get(key));
        if a != b
            && !out
                .iter()
                .any(|l: &String| l.starts_with(&format!("{what} {key}:")))
        {
            out.push(format!("{what} {key}: sqlite {a:?}, postgres {b:?}"));
        }
    }
    out
}

#[tokio::test]
async fn sqlite_and_postgres_migrations_make_the_same_schema() {
    let Some(pg) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    let lite = spawn_app().await;
    let (sqlite, postgres) = (
        sqlite_schema(&lite.database_url),
        postgres_schema(&pg.database_url).await,
    );
    assert!(
        sqlite.tables.contains_key("pools") && sqlite.tables.len() > 10,
        "{sqlite:?}"
    );
    let mut diff = Vec::new();
    for (table, columns) in sqlite.tables.iter() {
        if let Some(other) = postgres.tables.get(table) {
            diff.extend(differences(&format!("column {table}"), columns, other));
        }
    }
    let tables =
        |s: &Schema| -> BTreeMap<String, ()> { s.tables.keys().map(|t| (t.clone(), ())).collect() };
    diff.extend(differences("table", &tables(&sqlite), &tables(&postgres)));
    diff.extend(differences(
        "primary key of",
        &sqlite.primary_keys,
        &postgres.primary_keys,
    ));
    diff.extend(differences("index", &sqlite.indexes, &postgres.indexes));
    for (line, why) in DELIBERATE {
        assert!(
            diff.contains(&line.to_string()),
            "a deliberate difference is gone ({why}): remove it from DELIBERATE: {line}"
        );
    }
    diff.retain(|line| !DELIBERATE.iter().any(|(d, _)| d == line));
    assert!(
        diff.is_empty(),
        "the two migration trees differ:\n{}",
        diff.join("\n")
    );
}

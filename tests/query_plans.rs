//! The claim's plan must not regress to a scan that skips every leased row (14 ms per claim
//! after 14k claims was measured with an `ORDER BY id` / `(pool, id)` index). These tests fill
//! a queue mostly with finished jobs and check that the claim candidate uses
//! `jobs_queue_order`; and, on PostgreSQL, that it still does when the statistics say every job
//! is queued while the oldest ones are finished (a deep queue between two analyzes: ordered by
//! `seq` alone, the claim then walked the primary key past every finished job, 95 ms per claim
//! after 100k of a million).

use crate::common;

use common::*;
use leasegate::store::CLAIM_BATCH_SQL;
use sqlx::Connection;

/// A connection of its own to the app's SQLite file.
fn sqlite(url: &str) -> rusqlite::Connection {
    let leasegate::store::DatabaseUrl::Sqlite(path) =
        leasegate::store::DatabaseUrl::parse(url).unwrap()
    else {
        panic!("not a SQLite URL: {url}")
    };
    rusqlite::Connection::open(path).unwrap()
}

/// A single claim's choice (the raw baseline's) and a round's of 64 jobs at once.
fn candidates_for(pool: &str) -> [String; 2] {
    ["1", "64"].map(|n| {
        CLAIM_BATCH_SQL
            .replace("$1", &format!("'{pool}'"))
            .replace("$2", n)
    })
}

#[tokio::test]
async fn sqlite_claim_uses_the_partial_queue_index() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let conn = sqlite(&app.database_url);
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
         INSERT INTO jobs (id, pool, payload, state, max_attempts, created_at, updated_at) \
         SELECT 'j' || i, 'linux', '{}', CASE WHEN i % 100 = 0 THEN 'queued' ELSE 'succeeded' END, 3, i, i FROM n; \
         ANALYZE;",
    )
    .unwrap();
    for candidate in candidates_for("linux") {
        let mut explain = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {candidate}"))
            .unwrap();
        let plan: Vec<String> = explain
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let text: Vec<&str> = plan.iter().map(String::as_str).collect();
        assert!(
            text.iter().any(|d| d.contains("jobs_queue_order")),
            "plan of {candidate}: {text:?}"
        );
        assert!(
            !text.iter().any(|d| d.contains("TEMP B-TREE")),
            "{candidate} sorts: {text:?}"
        );
    }
}

#[tokio::test]
async fn postgres_claim_uses_the_partial_queue_index() {
    postgres_claim_plan(
        "INSERT INTO jobs (id, pool, payload, state, max_attempts, created_at, updated_at) \
         SELECT 'j' || i, 'linux', '{}', CASE WHEN i % 100 = 0 THEN 'queued' ELSE 'succeeded' END, 3, i, i \
         FROM generate_series(1, 50000) AS i; ANALYZE jobs;",
    )
    .await;
}

#[tokio::test]
async fn postgres_claim_uses_the_partial_queue_index_with_stale_statistics() {
    postgres_claim_plan(
        "ALTER TABLE jobs SET (autovacuum_enabled = false); \
         INSERT INTO jobs (id, pool, payload, state, max_attempts, created_at, updated_at) \
         SELECT 'j' || i, 'linux', '{}', 'queued', 3, i, i FROM generate_series(1, 50000) AS i; \
         ANALYZE jobs; \
         UPDATE jobs SET state = 'succeeded' WHERE seq <= 10000;",
    )
    .await;
}

/// Fills the queue with `fill`, then checks both claims' plans.
async fn postgres_claim_plan(fill: &'static str) {
    let Some(app) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap();
    sqlx::raw_sql(fill).execute(&mut conn).await.unwrap();
    for candidate in candidates_for("linux") {
        let plan: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "EXPLAIN {candidate} FOR UPDATE SKIP LOCKED"
        )))
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let text: Vec<&str> = plan.iter().map(|r| r.0.as_str()).collect();
        assert!(
            text.iter().any(|l| l.contains("jobs_queue_order")),
            "plan of {candidate}: {text:#?}"
        );
        assert!(
            !text
                .iter()
                .any(|l| l.contains("Seq Scan") || l.contains("Sort")),
            "plan of {candidate}: {text:#?}"
        );
    }
}

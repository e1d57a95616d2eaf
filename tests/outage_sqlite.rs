//! The embedded engine when its file cannot be written (here: locked by another process):
//! `/readyz` and writes answer 503 `unavailable` with `Retry-After` within a bounded time, and
//! the service recovers by itself when the file is writable again.

use crate::common;

use common::*;
use reqwest::StatusCode;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_file_answers_503_and_recovers() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );

    // Another process takes the write lock and keeps it.
    let leasegate::store::DatabaseUrl::Sqlite(path) =
        leasegate::store::DatabaseUrl::parse(&app.database_url).unwrap()
    else {
        panic!("not a SQLite URL")
    };
    let other = rusqlite::Connection::open(path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();

    let started = Instant::now();
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = app.heartbeat(&runner.healthy()).await;
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(
        code_of(r, StatusCode::SERVICE_UNAVAILABLE).await,
        "unavailable"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );

    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
}

//! The gate judges attestations from its cache of each runner's cordon, quarantine and
//! ejection; a round checks those facts against the row it reads, so that an entry which
//! missed a change (a notification lost, a change made behind the service's back) is not
//! renewed by the rounds it was wrong for, but forgotten: the runner's next attestation is
//! judged by the database, not after the cache's `MAX_AGE`.

use crate::common;
use common::*;
use leasegate::domain::ids::RunnerId;
use reqwest::StatusCode;

each_engine!(a_cache_entry_that_missed_a_cordon_is_forgotten_by_the_next_round);

/// Runs `sql` (`$1`: the runner's id) on `app`'s database, as nothing the service hears of.
async fn behind_the_service(app: &TestApp, sql: &str, id: &str) {
    match app.engine {
        Engine::Sqlite => {
            let path = app.database_url.trim_start_matches("sqlite://");
            let conn = rusqlite::Connection::open(path).expect("the database file");
            conn.busy_timeout(std::time::Duration::from_secs(5))
                .unwrap();
            conn.execute(&sql.replace("$1", "?1"), [id])
                .expect("the update");
        }
        Engine::Postgres => {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&app.database_url)
                .await
                .unwrap();
            sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                .bind(id)
                .execute(&mut conn)
                .await
                .expect("the update");
        }
    }
}

async fn a_cache_entry_that_missed_a_cordon_is_forgotten_by_the_next_round(engine: Engine) {
    let Some(app) = spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r0").await;
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    let id = RunnerId(runner.id.clone());
    let cordoned_in_cache = || async {
        let held = app.state.store().gate_runner(&id).await.unwrap().unwrap();
        held.record.gate.cordoned
    };
    assert!(!cordoned_in_cache().await, "held, not cordoned");

    behind_the_service(
        &app,
        "UPDATE runners SET cordoned = 1 WHERE id = $1",
        &runner.id,
    )
    .await;
    // Judged by the cache, which missed the cordon; its round reads the row, which holds it.
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    assert!(
        cordoned_in_cache().await,
        "the entry was forgotten by the round, and read again"
    );
    assert_eq!(
        code_of(app.lease(&runner.healthy()).await, StatusCode::CONFLICT).await,
        "runner_cordoned"
    );
}

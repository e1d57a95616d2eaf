//! On PostgreSQL, group commit's rounds run on a thread of their own (`pg-rounds`) over
//! connections of their own (`leasegate-rounds` in `pg_stat_activity`), and those connections
//! are counted in the replica's `LEASEGATE_DB_MAX_CONNECTIONS` (`store/pg_rounds.rs`). A
//! connection that died or went silent is replaced without leaving the rounds stuck, and a
//! round's write whose answer was lost with its connection is neither called a replay of
//! itself nor lets a replay through. A round's lookups keep to their keys' indexes whatever
//! the planner's statistics say of the tables.

use crate::common;

use common::*;
use futures_util::future::join_all;
use leasegate::store::StoreError;
use leasegate::store::engine::{Db, Engine as _, Statement, Work};
use leasegate::store::postgres::{
    APPLICATION_NAME, LISTEN_APPLICATION_NAME, PgDb, PgEngine, PgSettings, ROUNDS_APPLICATION_NAME,
};
use serde_json::json;
use sqlx::Connection;
use std::sync::Arc;
use std::time::Duration;

/// The database an app's URL names.
fn database_of(url: &str) -> String {
    let url = reqwest::Url::parse(url).expect("a database URL");
    url.path().trim_start_matches('/').to_string()
}

/// A connection of the test's own to the PostgreSQL server, beside the app's.
async fn server_connection() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&common::pg::server_url().unwrap())
        .await
        .unwrap()
}

/// The names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that `response` is rule 5's refusal, 401 `attestation_replayed` (`expect_problem`);
/// `why`, what that shows.
async fn refused_as_a_replay(response: reqwest::Response, why: &str) {
    expect_problem(
        response,
        why,
        reqwest::StatusCode::UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;
}

/// An app on PostgreSQL behind a proxy (`Proxy`: silenced, or a connection deafened), each
/// statement's answer waited for at most 2 s (the statement and acquire timeouts, 1 s each), a
/// pool `linux` made. `in_the_clear`: no TLS to the server, for the proxy to see what a
/// statement names; else the URL's own `sslmode`.
async fn app_behind_a_proxy(
    in_the_clear: bool,
) -> Option<(pg::TestDatabase, proxy::Proxy, TestApp)> {
    let (db, proxy, via_proxy) = pg::behind_proxy().await?;
    let url = match (in_the_clear, via_proxy.contains('?')) {
        (false, _) => via_proxy,
        (true, false) => format!("{via_proxy}?sslmode=disable"),
        (true, true) => format!("{via_proxy}&sslmode=disable"),
    };
    let app = spawn_app_on_with(Engine::Sqlite, |args| {
        args.database_url = url.clone();
        args.db_statement_timeout_ms = 1000;
        args.db_acquire_timeout_ms = 1000;
        args.db_max_connections = 4;
    })
    .await
    .unwrap();
    app.pool("linux", &[IMAGE_A]).await;
    Some((db, proxy, app))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_are_written_over_their_own_connections_within_the_replicas_budget() {
    let Some(app) = spawn_app_on_with(Engine::Postgres, |a| a.db_max_connections = 4).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let names: Vec<String> = (0..6).map(|i| format!("round-{i}")).collect();
    let runners = join_all(names.iter().map(|name| app.register("linux", name))).await;
    // Heartbeats in rounds, while the shared connections serve reads beside them.
    for _ in 0..5 {
        let attestations: Vec<String> = runners.iter().map(|r| r.healthy()).collect();
        let beats = join_all(attestations.iter().map(|a| app.heartbeat(a)));
        let reads = join_all((0..3).map(|_| app.admin_get("/api/v1/admin/runners")));
        let (beats, reads) = tokio::join!(beats, reads);
        assert!(beats.iter().all(|r| r.status() == reqwest::StatusCode::OK));
        assert!(reads.iter().all(|r| r.status() == reqwest::StatusCode::OK));
    }

    let mut conn = server_connection().await;
    let sessions: Vec<(String, String)> = sqlx::query_as(
        "SELECT application_name, query FROM pg_stat_activity \
         WHERE datname = $1 AND backend_type = 'client backend'",
    )
    .bind(database_of(&app.database_url))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(
        sessions.len() <= 4,
        "the replica keeps to its 4 connections, the rounds' included: {sessions:?}"
    );
    let rounds: Vec<&(String, String)> = sessions
        .iter()
        .filter(|(name, _)| name == ROUNDS_APPLICATION_NAME)
        .collect();
    // One lane (`ROUND_LANES`), with one connection of its own.
    assert_eq!(rounds.len(), 1, "{sessions:?}");
    // Heartbeats' rounds are written without a transaction (`round::write_unlocked`): the
    // last statement was the round's write, which committed by itself.
    assert!(
        rounds[0].1.contains("UPDATE runners"),
        "the rounds' connection wrote the last round: {sessions:?}"
    );
    let (state,): (String,) = sqlx::query_as(
        "SELECT state FROM pg_stat_activity WHERE application_name = $1 AND datname = $2",
    )
    .bind(ROUNDS_APPLICATION_NAME)
    .bind(database_of(&app.database_url))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(state, "idle", "no transaction left open between rounds");
    assert!(
        sessions.iter().all(|(name, _)| [
            ROUNDS_APPLICATION_NAME,
            LISTEN_APPLICATION_NAME,
            APPLICATION_NAME
        ]
        .contains(&name.as_str())),
        "{sessions:?}"
    );
    assert_eq!(
        sessions
            .iter()
            .filter(|(name, _)| name == LISTEN_APPLICATION_NAME)
            .count(),
        1,
        "one connection listens for other replicas' changes: {sessions:?}"
    );
    assert!(
        thread_names().iter().any(|name| name == "pg-rounds"),
        "the rounds run on a thread of their own: {:?}",
        thread_names()
    );
}

/// The rounds' backend's process id, once there is exactly one.
async fn rounds_backend(conn: &mut sqlx::PgConnection, database: &str) -> i32 {
    let pids: Vec<(i32,)> = sqlx::query_as(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
    )
    .bind(database)
    .bind(ROUNDS_APPLICATION_NAME)
    .fetch_all(conn)
    .await
    .unwrap();
    assert_eq!(pids.len(), 1, "one rounds' connection: {pids:?}");
    pids[0].0
}

/// The rounds keep their connection from round to round (no return to the pool between them);
/// one that died while kept (a proxy cut it, an operator ended it) is found dead at the next
/// round's `BEGIN`, before anything was written, and the round is written on a new one: no
/// request sees the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_rounds_connection_that_died_is_replaced_before_a_round_fails() {
    let Some(app) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "kept").await;
    let database = database_of(&app.database_url);
    let mut conn = server_connection().await;
    for _ in 0..3 {
        assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
    }
    let kept = rounds_backend(&mut conn, &database).await;
    for _ in 0..3 {
        assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
    }
    assert_eq!(
        rounds_backend(&mut conn, &database).await,
        kept,
        "the same connection, kept"
    );

    let (ended,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)")
        .bind(kept)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(ended);
    for _ in 0..3 {
        let beat = app.heartbeat(&runner.healthy()).await;
        assert_eq!(beat.status(), 200, "{}", beat.text().await.unwrap());
    }
    let replaced = rounds_backend(&mut conn, &database).await;
    assert_ne!(replaced, kept, "a new connection for the rounds");
}

/// Connections that go silent (a network dropping packets, a primary gone without closing its
/// sockets) do not hold the service for TCP's fifteen minutes: no statement waits longer than
/// its patience (the statement timeout and the acquire timeout, here 1 s each) for an answer.
/// A round whose kept connection went silent begins again on a new one; a read on a silent
/// pooled connection answers 503 `unavailable` with `Retry-After`; each silent connection is
/// closed, not given back, so the pool fills with working ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_gone_silent_are_closed_after_the_statements_patience() {
    use std::time::{Duration, Instant};
    let Some((_db, proxy, app)) = app_behind_a_proxy(false).await else {
        return;
    };
    let runner = app.register("linux", "silent").await;
    for _ in 0..3 {
        assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
        assert_eq!(app.admin_get("/api/v1/admin/runners").await.status(), 200);
    }

    proxy.silence();
    let started = Instant::now();
    let beat = tokio::time::timeout(Duration::from_secs(30), app.heartbeat(&runner.healthy()))
        .await
        .expect("a round on a silent connection is not waited on");
    let waited = started.elapsed();
    assert_eq!(beat.status(), 200, "{}", beat.text().await.unwrap());
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(15),
        "the round began again on a new connection after its BEGIN's patience: {waited:?}"
    );

    let mut answered = Vec::new();
    for _ in 0..6 {
        let started = Instant::now();
        let read = tokio::time::timeout(
            Duration::from_secs(30),
            app.admin_get("/api/v1/admin/runners"),
        )
        .await
        .expect("a read on a silent connection is not waited on");
        assert!(started.elapsed() < Duration::from_secs(15));
        let status = read.status();
        if status != 200 {
            assert!(read.headers().get("retry-after").is_some());
            assert_eq!(
                code_of(read, reqwest::StatusCode::SERVICE_UNAVAILABLE).await,
                "unavailable"
            );
        }
        answered.push(status.as_u16());
    }
    assert_eq!(
        answered.last(),
        Some(&200),
        "the silent connections were closed and replaced: {answered:?}"
    );
    assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
}

/// A read on a pooled connection that died while it sat in the pool (the server restarted, an
/// operator or a proxy ended it) is run again on another, as a write's `BEGIN` is: no request
/// sees the loss. (A connection that sat idle for a while is pinged before it is lent; these
/// died a moment ago.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_on_a_pooled_connection_that_died_is_run_again_on_another() {
    let Some(app) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "pooled").await;
    assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
    // Several reads at once, so that the pool holds several connections.
    let reads = join_all((0..4).map(|_| app.admin_get("/api/v1/admin/runners"))).await;
    assert!(reads.iter().all(|r| r.status() == 200));

    let database = database_of(&app.database_url);
    let mut conn = server_connection().await;
    let ended: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND application_name = $2",
    )
    .bind(&database)
    .bind(APPLICATION_NAME)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(!ended.is_empty(), "the pool's connections were ended");
    // Their sockets are closed by the time the server has ended them.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    for _ in 0..ended.len() + 1 {
        let read = app.admin_get("/api/v1/admin/runners").await;
        assert_eq!(read.status(), 200, "{}", read.text().await.unwrap());
    }
    assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
}

/// The statement the rounds' connection waits on a row lock in, once it waits.
async fn round_waiting_on_a_lock(database: &str) -> String {
    let mut conn = server_connection().await;
    for _ in 0..500 {
        let waiting: Option<(String,)> = sqlx::query_as(
            "SELECT query FROM pg_stat_activity WHERE datname = $1 \
             AND application_name = $2 AND wait_event_type = 'Lock'",
        )
        .bind(database)
        .bind(ROUNDS_APPLICATION_NAME)
        .fetch_optional(&mut conn)
        .await
        .unwrap();
        if let Some((query,)) = waiting {
            return query;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the round never waited on the row held open");
}

/// `change` made to the runner's row in a transaction held open while a heartbeat's round is
/// written, committed once the round waits on it; the heartbeat's answer.
async fn heartbeat_beside(app: &TestApp, runner: &TestRunner, change: &str) -> reqwest::Response {
    let database = database_of(&app.database_url);
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap();
    let mut held = conn.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(change))
        .bind(&runner.id)
        .execute(&mut *held)
        .await
        .unwrap();
    let release = async {
        let waiting = round_waiting_on_a_lock(&database).await;
        // The round read the row unlocked, and its one write found the row held: the write
        // that changes the row only where its version is the one read.
        assert!(
            waiting.contains("UPDATE runners") && waiting.contains("row_version"),
            "the unlocked round's write waits, not a locked read: {waiting}"
        );
        held.commit().await.unwrap();
    };
    let attestation = runner.healthy();
    let (beat, ()) = tokio::join!(app.heartbeat(&attestation), release);
    beat
}

/// A heartbeat's round has its runner's row without a lock (known to its lane, or read), then
/// writes it only where the row is still that version (`round::write_unlocked`). A change
/// committed in between is neither overwritten nor overlooked: the write finds the row
/// changed and keeps nothing; a round planned from the lane's row is then read and written
/// again (the cordon below), one planned from a read is written under the row's lock (the
/// revocation, once the lane reads the runner it found changed). A change the gate does not
/// judge leaves the heartbeat accepted, once; a revocation refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_committed_between_a_rounds_read_and_its_write_is_not_lost() {
    let Some(app) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "between").await;
    // The first heartbeat changes the runner's status (a locked round); the rest do not.
    for _ in 0..2 {
        assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
    }

    let beat = heartbeat_beside(
        &app,
        &runner,
        "UPDATE runners SET cordoned = cordoned WHERE id = $1",
    )
    .await;
    assert_eq!(beat.status(), 200, "{}", beat.text().await.unwrap());
    let attestation = runner.healthy();
    assert_eq!(app.heartbeat(&attestation).await.status(), 200);
    refused_as_a_replay(
        app.heartbeat(&attestation).await,
        "an attestation accepted after a round written again is remembered",
    )
    .await;

    let now_ms = now_s() * 1000;
    let beat = heartbeat_beside(
        &app,
        &runner,
        &format!("UPDATE runners SET revoked_at = {now_ms} WHERE id = $1"),
    )
    .await;
    assert_eq!(
        code_of(beat, reqwest::StatusCode::FORBIDDEN).await,
        "runner_revoked",
        "a revocation committed before the round's write is the round's verdict"
    );
}

/// Makes `leasegate_read_round` fail when it is asked for an unlocked read (a round planned
/// from rows it read); the locked read still answers. Its definition as it was, to restore.
async fn forbid_unlocked_reads(app: &TestApp) -> String {
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap();
    let (definition,): (String,) = sqlx::query_as(
        "SELECT pg_get_functiondef('leasegate_read_round(boolean, text[], text[], text[], \
         bigint[])'::regprocedure)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let forbidding = definition.replacen(
        "\nBEGIN\n",
        "\nBEGIN\n    IF NOT lock THEN RAISE EXCEPTION 'a round read its rows unlocked'; END IF;\n",
        1,
    );
    assert_ne!(
        forbidding, definition,
        "the function's body begins: {definition}"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(forbidding))
        .execute(&mut conn)
        .await
        .unwrap();
    definition
}

/// A runner whose rounds a lane wrote is known to it (`store::known_rows`): its next
/// heartbeat's round is planned from what the lane knows and written in one statement, with no
/// read before it (here, an unlocked read fails the round). What another writer changed
/// since is found by that write's guard (the row's version), nothing of the write is kept,
/// and the round is read and judged on what the database holds: a revocation made behind the
/// service's back is the verdict, and a spilled jti replayed is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_runners_round_reads_nothing_and_finds_what_changed_behind_it() {
    let Some(app) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "known").await;
    let other = app.register("linux", "revoked-behind").await;
    // The first heartbeat changes each runner's status (a locked round), the second is read
    // and written unlocked, and the lane knows the rows from then on.
    for r in [&runner, &other] {
        for _ in 0..2 {
            assert_eq!(app.heartbeat(&r.healthy()).await.status(), 200);
        }
    }
    let read_round = forbid_unlocked_reads(&app).await;

    // More than the row keeps (12) within one window: the oldest spill to `seen_jtis`, and
    // the rounds after ask it for each new jti, in their one statement.
    let jtis: Vec<String> = (0..20)
        .map(|i| format!("known-{i}-{}", uuid::Uuid::now_v7()))
        .collect();
    let spent: Vec<String> = jtis
        .iter()
        .map(|jti| runner.attest(json!({ "jti": jti })))
        .collect();
    for (i, attestation) in spent.iter().enumerate() {
        let beat = app.heartbeat(attestation).await;
        assert_eq!(
            beat.status(),
            200,
            "heartbeat {i}: {}",
            beat.text().await.unwrap()
        );
    }
    // What follows is read again once the guard finds it: reads are allowed again.
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(read_round))
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("UPDATE runners SET revoked_at = $1 WHERE id = $2")
        .bind(now_s() * 1000)
        .bind(&other.id)
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        code_of(
            app.heartbeat(&other.healthy()).await,
            reqwest::StatusCode::FORBIDDEN
        )
        .await,
        "runner_revoked",
        "the lane's row of the runner was out of date, and not believed"
    );
    // One whose jti its row no longer holds: only the write's guard can find it.
    let spilled: Vec<(String,)> = sqlx::query_as("SELECT jti FROM seen_jtis WHERE runner_id = $1")
        .bind(&runner.id)
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let replayed = jtis
        .iter()
        .position(|jti| spilled.contains(&(leasegate::domain::record::jti_key(jti),)))
        .expect("some of the 20 heartbeats' jtis spilled");
    refused_as_a_replay(
        app.heartbeat(&spent[replayed]).await,
        "a spilled jti is refused though the lane's row no longer holds it",
    )
    .await;
}

/// Replicas of the previous version still read and lock their rounds' rows with
/// `leasegate_lock_round` during a rolling upgrade: it answers as `leasegate_read_round` does
/// (without the versions), and the rows stay locked until its transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_versions_round_read_still_locks_and_reads() {
    let Some(app) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "previous").await;
    assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);

    let mut old = sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap();
    let mut round = old.begin().await.unwrap();
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT id, last_status, spilled_hits FROM leasegate_lock_round(ARRAY[$1], \
         ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::bigint[])",
    )
    .bind(&runner.id)
    .fetch_all(&mut *round)
    .await
    .unwrap();
    assert_eq!(rows, vec![(runner.id.clone(), "healthy".to_string(), None)]);

    let mut other = sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap();
    let locked = sqlx::query("SELECT 1 FROM runners WHERE id = $1 FOR UPDATE NOWAIT")
        .bind(&runner.id)
        .execute(&mut other)
        .await;
    assert!(locked.is_err(), "the row is locked by the old round's read");
    round.rollback().await.unwrap();
}

/// Deafens the next statement that names `runner`, once its next heartbeat's only statement is
/// its round's one write. The change its first heartbeat announced (its status) reaches the
/// gate's cache in its own time and empties the runner's entry, and the heartbeat after that
/// reads the runner (a statement that names it) to fill it again: let it arrive, and the entry
/// fill, first.
async fn deafen_the_next_write(app: &TestApp, proxy: &proxy::Proxy, runner: &TestRunner) {
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
    proxy.deafen_after(runner.id.as_bytes());
}

/// Sends `attestation` as a heartbeat with the next statement that names `runner` deafened: its
/// round's one write reaches the server, and the server's answer never comes back.
async fn heartbeat_whose_answer_is_lost(
    app: &TestApp,
    proxy: &proxy::Proxy,
    runner: &TestRunner,
    attestation: &str,
) -> reqwest::Response {
    deafen_the_next_write(app, proxy, runner).await;
    let beat = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        app.heartbeat(attestation),
    )
    .await
    .expect("a round whose answer was lost is not waited on");
    assert_eq!(
        proxy.deafened(),
        1,
        "the round's write reached the server and its answer was dropped"
    );
    beat
}

/// What a round whose one write's answer was lost answers for an attestation its locked round
/// then finds replayed: 503 `unavailable` with `Retry-After`, neither taken nor called a replay.
async fn answered_undecided(response: reqwest::Response) {
    let retry_after = response.headers().get("retry-after").is_some();
    let status = response.status();
    assert!(retry_after, "{status}: {}", response.text().await.unwrap());
    assert_eq!(
        code_of(response, reqwest::StatusCode::SERVICE_UNAVAILABLE).await,
        "unavailable"
    );
}

/// A round's one write (its runner's row known to the lane) that the server committed but whose
/// answer was lost with its connection: the round is written again under its rows' locks on
/// another connection, which finds the attestation's jti taken and cannot tell whether by this
/// write or by a replay before it. The heartbeat is answered 503, as undecided, where it was
/// answered 401 `attestation_replayed`, a replay of itself; it was taken once, and the same
/// attestation sent again is a replay. The runner's next heartbeat is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_committed_whose_answer_was_lost_is_not_called_a_replay_of_itself() {
    let Some((_db, proxy, app)) = app_behind_a_proxy(true).await else {
        return;
    };
    let runner = app.register("linux", "deafened").await;
    // The lane learns the runner's row, and the gate's cache its verdict: a heartbeat's only
    // statement is now its round's one write, which names the runner.
    for _ in 0..3 {
        assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
    }

    let attestation = runner.healthy();
    answered_undecided(heartbeat_whose_answer_is_lost(&app, &proxy, &runner, &attestation).await)
        .await;

    let again = app.heartbeat(&attestation).await;
    refused_as_a_replay(again, "the write had committed").await;
    assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
}

/// An attestation of `runner`'s, taken, whose jti then spilled out of the runner's row (into
/// `seen_jtis`): a replay of it is found only by the guard's question or a read.
async fn an_attestation_spilled(app: &TestApp, runner: &TestRunner) -> String {
    // Ending before the others, its jti is the first to spill out of the row (those that end
    // together are kept by their keys' order).
    let first = runner.attest(json!({"iat": now_s() - 20, "exp": now_s() + 40}));
    assert_eq!(app.heartbeat(&first).await.status(), 200);
    // More attestations than a row keeps.
    for _ in 0..15 {
        assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
    }
    first
}

/// A replay in a round whose answer was lost is never taken: the round's write found the
/// replayed jti among those its runner spilled and wrote nothing, and the locked round that
/// follows answers it undecided (503); sent again, it is refused as a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_whose_rounds_answer_was_lost_is_not_taken() {
    let Some((_db, proxy, app)) = app_behind_a_proxy(true).await else {
        return;
    };
    let runner = app.register("linux", "replayed").await;
    let first = an_attestation_spilled(&app, &runner).await;

    answered_undecided(heartbeat_whose_answer_is_lost(&app, &proxy, &runner, &first).await).await;
    refused_as_a_replay(app.heartbeat(&first).await, "sent again, the replay").await;
    assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
}

/// The same, while another replica writes the runner's row (the runner's own next heartbeat,
/// there) between the lost write and the locked round: the replay is not taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_whose_rounds_answer_was_lost_is_not_taken_while_another_replica_writes() {
    let Some((db, proxy, app)) = app_behind_a_proxy(true).await else {
        return;
    };
    let direct = db.url.clone();
    let other = spawn_replica_with(&app, |args| args.database_url = direct).await;
    let runner = app.register("linux", "replayed-beside").await;
    let first = an_attestation_spilled(&app, &runner).await;
    refused_as_a_replay(
        other.heartbeat(&first).await,
        "at the other replica, the replay",
    )
    .await;

    deafen_the_next_write(&app, &proxy, &runner).await;
    let replay = tokio::spawn({
        let (base, first) = (app.base.clone(), first.clone());
        async move {
            reqwest::Client::new()
                .post(format!("{base}/api/v1/runners/heartbeat"))
                .json(&json!({"attestation": first}))
                .send()
                .await
                .unwrap()
        }
    });
    while proxy.deafened() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(other.heartbeat(&runner.healthy()).await.status(), 200);
    let replay = tokio::time::timeout(std::time::Duration::from_secs(30), replay)
        .await
        .expect("a round whose answer was lost is not waited on")
        .unwrap();
    answered_undecided(replay).await;
    refused_as_a_replay(
        app.heartbeat(&first).await,
        "after the undecided round, the replay",
    )
    .await;
}

/// How many rows of `seen_jtis` were read by sequential scans so far. A backend sends the
/// server its counts as it goes idle, once a second has passed since it last did: a heartbeat
/// after a pause makes the rounds' backend send what it counted before.
async fn seen_jtis_read_in_sequence(
    app: &TestApp,
    runner: &TestRunner,
    conn: &mut sqlx::PgConnection,
) -> i64 {
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(app.heartbeat(&runner.healthy()).await.status(), 200);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = 'seen_jtis'::regclass",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// Every runner of `fleet` heartbeats at once, `times` times over: rounds of many runners,
/// whose plans the server keeps generic (a plan made for ten rows).
async fn heartbeats_at_once(app: &TestApp, fleet: &[TestRunner], times: usize) {
    for _ in 0..times {
        let answers = join_all(fleet.iter().map(|r| async move {
            let attestation = r.healthy();
            app.heartbeat(&attestation).await
        }))
        .await;
        for answer in answers {
            assert_eq!(answer.status(), 200);
        }
    }
}

/// A round looks its asked jtis up in `seen_jtis` by the key whatever the planner's statistics
/// say. Its plans are kept on the rounds' connection and may have been made while the table
/// was empty or nearly (as it is whenever no runner spilled lately), when a sequential scan is
/// the cheapest; kept once the table grew (a burst of spills, before the next analyze), such a
/// plan read every spilled jti for each jti a round asked about: heartbeats fell to a fifth of
/// their rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rounds_spilled_jtis_are_looked_up_by_key_whatever_the_statistics() {
    let Some(app) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let names: Vec<String> = (0..24).map(|i| format!("spilling-{i}")).collect();
    let fleet = join_all(names.iter().map(|name| app.register("linux", name))).await;
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap();
    // No autovacuum's analyze replans the rounds' statements behind the test.
    sqlx::raw_sql("ALTER TABLE seen_jtis SET (autovacuum_enabled = off); ANALYZE seen_jtis")
        .execute(&mut conn)
        .await
        .unwrap();
    // Past a row's room every heartbeat spills a jti and asks about its own: the rounds'
    // statements are planned (and, past five, kept) while the table holds a page or two.
    heartbeats_at_once(&app, &fleet, 20).await;
    // Grown behind the statistics' back, as a burst of spills grows it.
    let spilled = 50_000;
    sqlx::query(
        "INSERT INTO seen_jtis (runner_id, jti, expires_at) \
         SELECT $1, md5(i::text), $2 FROM generate_series(1, $3) AS i",
    )
    .bind(&fleet[0].id)
    .bind((now_s() + 3600) * 1000)
    .bind(spilled)
    .execute(&mut conn)
    .await
    .unwrap();
    let before = seen_jtis_read_in_sequence(&app, &fleet[0], &mut conn).await;
    heartbeats_at_once(&app, &fleet, 3).await;
    let read = seen_jtis_read_in_sequence(&app, &fleet[0], &mut conn).await - before;
    // Each of the 73 heartbeats asks about its jti in two forms: scanned, 146 times the table.
    // The sweeper's purge of expired jtis (once a second, on the service's other connections,
    // whose plans are not the rounds') may scan it once a second.
    assert!(
        read < 20 * spilled,
        "73 heartbeats read {read} rows of seen_jtis ({spilled} rows) in sequence"
    );
}

/// A table of one row, through `engine`.
async fn one_locked_row(engine: &PgEngine) {
    let setup: Work<PgDb, ()> = Box::new(|db| {
        Box::pin(async move {
            db.execute(Statement::new("CREATE TABLE scratch (id INT PRIMARY KEY)"))
                .await?;
            db.execute(Statement::new("INSERT INTO scratch VALUES (1)"))
                .await?;
            Ok(())
        })
    });
    engine.write(setup).await.expect("the table");
}

/// A replica whose host dies in the middle of a transaction (a round holding its runners'
/// rows) must not leave the server holding its locks until TCP gives up on it (two hours by
/// default), every other replica's rounds on those runners failing meanwhile: the server ends
/// a session of the service's that sits idle in a transaction (`idle_in_transaction`, six
/// statements' worth). And a statement that waited out its `lock_timeout` (or its
/// `statement_timeout`, as long: whichever the server notices first) is the database's "not
/// now" (503), not a fault of the request's (500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_idle_is_ended_by_the_server_and_a_lock_wait_answers_unavailable() {
    let Some(db) = common::pg::TestDatabase::create().await else {
        return;
    };
    let settings = PgSettings {
        statement_timeout: Duration::from_millis(300),
        ..PgSettings::default()
    };
    assert_eq!(settings.idle_in_transaction(), Duration::from_millis(1_800));
    let engine = PgEngine::open(&db.url, &settings, Arc::new(|_| {}))
        .await
        .expect("open PostgreSQL");
    one_locked_row(&engine).await;

    // Another session holds the row: the service's statement waits out its lock_timeout.
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("SELECT id FROM scratch WHERE id = 1 FOR UPDATE")
        .execute(&mut other)
        .await
        .unwrap();
    let wait: Work<PgDb, ()> = Box::new(|db| {
        Box::pin(async move {
            db.execute(Statement::new(
                "SELECT id FROM scratch WHERE id = 1 FOR UPDATE",
            ))
            .await
            .map(|_| ())
        })
    });
    let waited = engine.write(wait).await;
    assert!(
        matches!(waited, Err(StoreError::Unavailable(_))),
        "a lock waited out: {waited:?}"
    );
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();

    // The service's own transaction, idle past the bound: the server ends it, and with it
    // the lock it held, which another session then takes at once.
    let idle: Work<PgDb, ()> = Box::new(|db| {
        Box::pin(async move {
            db.execute(Statement::new(
                "SELECT id FROM scratch WHERE id = 1 FOR UPDATE",
            ))
            .await?;
            tokio::time::sleep(Duration::from_millis(2_600)).await;
            db.execute(Statement::new("SELECT 1")).await.map(|_| ())
        })
    });
    let idle = tokio::spawn(async move { engine.write(idle).await });
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    sqlx::query("SET lock_timeout = '200ms'")
        .execute(&mut other)
        .await
        .unwrap();
    let taken = sqlx::query("SELECT id FROM scratch WHERE id = 1 FOR UPDATE")
        .execute(&mut other)
        .await;
    assert!(
        taken.is_ok(),
        "the idle transaction's lock was freed: {taken:?}"
    );
    let ended = idle.await.unwrap();
    assert!(
        matches!(ended, Err(StoreError::Unavailable(_))),
        "the idle transaction ended: {ended:?}"
    );
}

/// The id of the transaction that last wrote `runner`'s row (its `xmin`), on `conn`.
async fn row_xid(conn: &mut sqlx::PgConnection, runner: &TestRunner) -> i64 {
    let (xid,): (String,) = sqlx::query_as("SELECT xmin::text FROM runners WHERE id = $1")
        .bind(&runner.id)
        .fetch_one(conn)
        .await
        .unwrap();
    xid.parse().unwrap()
}

/// A failover to a standby that had not received the last transactions: the new primary
/// hands out again the transaction ids the lost ones had, so a row can be written by a
/// transaction with the very id the lane knew as its version (`store::known_rows`). The
/// lane's version names its server too (`sql::round::row_version_sql`): a row written after
/// the failover never matches one known before it, whatever its transaction id, and the round
/// is read and judged on what the new primary holds. Here another writer revoked the runner
/// in a transaction given the id of the lane's last write (lost); the runner's next heartbeat
/// is refused as revoked, on a connection the lanes opened without seeing a lost one (a
/// lease's round, locked from its `BEGIN`, replaced the dead kept connection first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_version_known_before_a_failover_is_not_believed_after_it() {
    // Skips, as every PostgreSQL case does, unless the tests are given a server.
    if common::pg::server_url().is_none() {
        return;
    }
    let Some(cluster) = common::pg_cluster::Cluster::start() else {
        return;
    };
    let Some(app) = spawn_app_on_with(Engine::Postgres, |a| {
        a.database_url = cluster.url();
        a.db_acquire_timeout_ms = 10_000;
    })
    .await
    else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "known-before").await;
    let other = app.register("linux", "first-after").await;
    cluster.copy_aside();

    let mut conn = sqlx::PgConnection::connect(&cluster.url()).await.unwrap();
    // Room between the copy's last transaction id and the lane's last write: the ids the new
    // primary hands out before the revocation's (the other runner's round, the service's own
    // writes) come from there.
    for _ in 0..200 {
        sqlx::query("SELECT txid_current()")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    // The first heartbeat changes the runner's status (a locked round), the second is read and
    // written unlocked, and the third is written from what the lane knows.
    for _ in 0..3 {
        let beat = app.heartbeat(&runner.healthy()).await;
        assert_eq!(beat.status(), 200, "{}", beat.text().await.unwrap());
    }
    let known = row_xid(&mut conn, &runner).await;
    drop(conn);

    cluster.fail_over();
    // A lease request's round is written under its rows' locks, first thing: its `BEGIN` finds
    // the kept connection dead and takes a new one, to the new primary, which the lanes keep.
    let lease = app.lease(&other.healthy()).await;
    assert_eq!(lease.status(), 204, "{}", lease.text().await.unwrap());

    let mut conn = sqlx::PgConnection::connect(&cluster.url()).await.unwrap();
    let (next,): (i64,) = sqlx::query_as("SELECT txid_current()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(
        next < known,
        "the new primary has not yet handed out the lost write's id ({next} ≥ {known})"
    );
    for _ in next + 1..known {
        sqlx::query("SELECT txid_current()")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    sqlx::query("UPDATE runners SET revoked_at = $1 WHERE id = $2")
        .bind(now_s() * 1000)
        .bind(&runner.id)
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        row_xid(&mut conn, &runner).await,
        known,
        "the revocation was given the lost write's transaction id"
    );

    assert_eq!(
        code_of(
            app.heartbeat(&runner.healthy()).await,
            reqwest::StatusCode::FORBIDDEN
        )
        .await,
        "runner_revoked",
        "the lane's row from before the failover was not believed"
    );
}

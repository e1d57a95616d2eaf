//! PostgreSQL with more than one replica on one database: wake-ups, replay protection and the
//! sweeper across replicas. Skipped (with the reason printed) without a PostgreSQL to use.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_one_replica_wakes_on_an_enqueue_at_another() {
    let Some(a) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    let b = spawn_replica(&a).await;
    a.pool("linux", &[IMAGE_A]).await;
    let runner = a.register("linux", "r1").await;

    for round in 0..3 {
        let attestation = runner.healthy();
        let waiting = {
            let client = a.client.clone();
            let url = a.url("/api/v1/lease");
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .json(&json!({"attestation": attestation, "wait_s": 20}))
                    .send()
                    .await
                    .unwrap();
                (Instant::now(), r)
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let enqueued_at = Instant::now();
        let job = b.enqueue("linux").await;
        let (answered_at, r) = waiting.await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "round {round}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["job"]["id"], job.as_str());
        let waited = answered_at - enqueued_at;
        assert!(
            waited < Duration::from_secs(1),
            "round {round}: woke {waited:?} after the enqueue"
        );
        let lease = Granted {
            lease_id: body["lease_id"].as_str().unwrap().into(),
            token: body["lease_token"].as_str().unwrap().into(),
            job_id: job,
            body,
        };
        // Lease calls work on any replica.
        assert_eq!(b.call(&lease, "start", None).await.status(), StatusCode::OK);
        let done = a
            .call(&lease, "complete", Some(json!({"outcome": "succeeded"})))
            .await;
        assert_eq!(done.status(), StatusCode::OK);
    }
}

/// One attestation posted to replica `a` as a heartbeat and at once to `b`, as a heartbeat
/// too (`lease`: as a lease): exactly one is accepted, the other refused as a replay. Two
/// heartbeats' rounds are both written unlocked (`round::write_unlocked`), so one of them
/// finds the row changed and is written again under its lock; a lease's round is locked.
async fn posted_to_two_replicas_at_once(lease: bool) {
    let Some(a) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    let b = spawn_replica(&a).await;
    a.pool("linux", &[IMAGE_A]).await;
    let runner = a.register("linux", "r1").await;
    // The first heartbeat changes the runner's status, which a locked round writes.
    assert_eq!(
        a.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );

    for round in 0..20 {
        let attestation = runner.healthy();
        let at_b = async {
            if lease {
                b.lease(&attestation).await
            } else {
                b.heartbeat(&attestation).await
            }
        };
        let (ra, rb) = tokio::join!(a.heartbeat(&attestation), at_b);
        let statuses = [ra.status(), rb.status()];
        let accepted = statuses.iter().filter(|s| s.is_success()).count();
        assert_eq!(accepted, 1, "round {round}: {statuses:?}");
        let replayed = if ra.status().is_success() { rb } else { ra };
        assert_eq!(
            code_of(replayed, StatusCode::UNAUTHORIZED).await,
            "attestation_replayed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_attestation_posted_to_two_replicas_at_once_is_accepted_once() {
    posted_to_two_replicas_at_once(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_heartbeat_posted_to_two_replicas_at_once_is_accepted_once() {
    posted_to_two_replicas_at_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweepers_on_every_replica_expire_each_lease_once() {
    let Some(a) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    let b = spawn_replica(&a).await;
    let c = spawn_replica(&a).await;
    a.pool("linux", &[IMAGE_A]).await;
    let mut jobs = Vec::new();
    for i in 0..30 {
        jobs.push(a.enqueue("linux").await);
        let runner = a.register("linux", &format!("r{i}")).await;
        let lease = a.grant(&runner).await;
        if i % 2 == 0 {
            a.call(&lease, "start", None).await;
        }
    }
    tokio::join!(a.sweep_ahead(400), b.sweep_ahead(400), c.sweep_ahead(400));
    for (i, id) in jobs.iter().enumerate() {
        let job = a.job(id).await;
        assert_eq!(job["state"], "queued");
        let ends = job["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| matches!(e["kind"].as_str(), Some("returned" | "requeued")));
        assert_eq!(ends.count(), 1, "job {i} ended more than once: {job}");
        let (attempts, returns) = if i % 2 == 0 { (1, 0) } else { (0, 1) };
        assert_eq!(job["attempts"], attempts);
        assert_eq!(job["returns"], returns);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_answers_503_and_the_service_recovers_by_itself() {
    let Some((_db, proxy, via_proxy)) = pg::behind_proxy().await else {
        return;
    };
    let app = spawn_app_on_with(Engine::Sqlite, |args| args.database_url = via_proxy.clone())
        .await
        .unwrap();
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );

    proxy.cut().await;
    let started = Instant::now();
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = app.heartbeat(&runner.healthy()).await;
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(
        code_of(r, StatusCode::SERVICE_UNAVAILABLE).await,
        "unavailable"
    );
    let r = app
        .forge_post("/api/v1/jobs", json!({"pool": "linux"}))
        .await;
    assert_eq!(
        code_of(r, StatusCode::SERVICE_UNAVAILABLE).await,
        "unavailable"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "outage answers took {:?}",
        started.elapsed()
    );

    proxy.restore().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
        if ready.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "the service did not recover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    let job = app.enqueue("linux").await;
    assert_eq!(app.grant(&runner).await.job_id, job);
}

/// The gate keeps each runner's cordon, quarantine and pool in memory; a change made through
/// one replica reaches the others' caches by `NOTIFY`, well before the cache's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordon_and_a_pool_change_at_one_replica_reach_the_others_gate_at_once() {
    let Some(a) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    let b = spawn_replica(&a).await;
    a.pool("linux", &[IMAGE_A]).await;
    let runner = a.register("linux", "r1").await;
    // B judges the runner once, which caches its inputs there.
    let r = b.lease(&runner.healthy()).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);

    let cordon = a
        .admin_post(
            &format!("/api/v1/admin/runners/{}/cordon", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(cordon.status(), StatusCode::OK);
    let refused_at = eventually_code(&b, &runner, "runner_cordoned").await;
    assert!(
        refused_at < Duration::from_secs(2),
        "B saw the cordon after {refused_at:?}"
    );

    let uncordon = a
        .admin_post(
            &format!("/api/v1/admin/runners/{}/uncordon", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(uncordon.status(), StatusCode::OK);
    // A pool roll at A: the runner's image is no longer expected, and B says so.
    roll_pool(&a, IMAGE_B).await;
    let drift_at = eventually_code(&b, &runner, "image_drift").await;
    assert!(
        drift_at < Duration::from_secs(2),
        "B saw the pool change after {drift_at:?}"
    );
}

/// A replica whose `LISTEN` connection went silent (a network dropping packets) hears no other
/// replica's change on it; it notices within its patience (here 1 s + 1 s: a question asked
/// after that long without a notification, and that long for the answer), forgets what it
/// cached, and listens on a new connection, well before the cache's 30 s TTL would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_listener_went_silent_listens_again_and_catches_up() {
    let Some((db, proxy, via_proxy)) = pg::behind_proxy().await else {
        return;
    };
    let direct = pg::with_database(&pg::server_url().unwrap(), db.name());
    let a = spawn_app_on_with(Engine::Postgres, |args| args.database_url = direct)
        .await
        .unwrap();
    let b = spawn_replica_with(&a, |args| {
        args.database_url = via_proxy;
        args.db_statement_timeout_ms = 1000;
        args.db_acquire_timeout_ms = 1000;
    })
    .await;
    a.pool("linux", &[IMAGE_A]).await;
    let runner = a.register("linux", "r1").await;
    // B judges the runner once, which caches its pool there.
    assert_eq!(
        b.lease(&runner.healthy()).await.status(),
        StatusCode::NO_CONTENT
    );

    proxy.silence();
    let silenced = Instant::now();
    roll_pool(&a, IMAGE_B).await;
    eventually_code(&b, &runner, "image_drift").await;
    assert!(
        silenced.elapsed() < Duration::from_secs(10),
        "B saw the pool change {:?} after its listener went silent",
        silenced.elapsed()
    );

    // Listening again: the next change reaches B by notification.
    roll_pool(&a, IMAGE_A).await;
    let started = Instant::now();
    loop {
        let r = b.lease(&runner.healthy()).await;
        if r.status() == StatusCode::NO_CONTENT {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "B did not hear the roll back: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rolls the pool `linux` at `app` to expect `image` alone, with no grace.
async fn roll_pool(app: &TestApp, image: &str) {
    let roll = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [image], "drift_grace_s": 0}),
        )
        .await;
    assert_eq!(roll.status(), StatusCode::OK);
}

/// How long until a lease at `app` is refused with `code`; panics after 10 s.
async fn eventually_code(app: &TestApp, runner: &TestRunner, code: &str) -> Duration {
    let started = Instant::now();
    loop {
        let r = app.lease(&runner.healthy()).await;
        if r.status() == StatusCode::CONFLICT {
            let body: Value = r.json().await.unwrap();
            if body["code"] == code {
                return started.elapsed();
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never refused with {code}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The number of connections `role` has open to the server.
async fn connections_of(conn: &mut sqlx::PgConnection, role: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = $1")
        .bind(role)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Whatever other replicas announce while a replica's change listener has no connection is
/// lost: once a new connection listens, the replica forgets what it cached, including what it
/// read while it could not listen. Here A's listener is cut and cannot connect again (its
/// role's connection limit is reached) while A reads the runner and B cordons it; once A
/// listens again, A's gate judges the cordon at once, not after its cache's TTL (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_while_a_replicas_listener_could_not_connect_is_not_missed() {
    use leasegate::domain::audit::{Action, Entry};
    use leasegate::domain::ids::RunnerId;
    use leasegate::domain::time::Millis;
    use leasegate::store::postgres::LISTEN_APPLICATION_NAME;
    use sqlx::Connection;

    let Some(db) = pg::TestDatabase::create().await else {
        return;
    };
    let server = pg::server_url().unwrap();
    let role = format!("lg_listen_{}", uuid::Uuid::now_v7().simple());
    let _dropped = pg::DroppedWithRole {
        server: server.clone(),
        database: db.name().to_string(),
        role: role.clone(),
    };
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    // A connects as a role of its own, whose connections can be limited (a superuser's cannot).
    for statement in [
        format!("CREATE ROLE \"{role}\" LOGIN"),
        format!("ALTER DATABASE \"{}\" OWNER TO \"{role}\"", db.name()),
        format!("GRANT ALL ON SCHEMA public TO \"{role}\""),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let as_role = pg::with_database(
        &server.replacen("postgres@", &format!("{role}@"), 1),
        db.name(),
    );
    assert!(
        as_role.contains(&role),
        "the server URL names its user: {server}"
    );
    // Its patience 1 s: the listener gives up on a connection, and on a connect, that soon.
    let a = spawn_app_on_with(Engine::Postgres, |args| {
        args.database_url = as_role;
        args.db_statement_timeout_ms = 1000;
        args.db_acquire_timeout_ms = 1000;
    })
    .await
    .unwrap();
    let b = spawn_replica_with(&a, |args| args.database_url = db.url.clone()).await;
    a.pool("linux", &[IMAGE_A]).await;
    let runner = a.register("linux", "r1").await;
    assert_eq!(
        a.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    let id = RunnerId(runner.id.clone());
    let cordoned_at_a = || async {
        let held = a.state.store().gate_runner(&id).await.unwrap().unwrap();
        held.record.gate.cordoned
    };
    assert!(!cordoned_at_a().await);

    // A's listener is cut, and cannot connect again: the role may keep the connections it has
    // but the listener's.
    let open = connections_of(&mut admin, &role).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER ROLE \"{role}\" CONNECTION LIMIT {}",
        open - 1
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let (cut,): (bool,) = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE usename = $1 AND application_name = $2",
    )
    .bind(&role)
    .bind(LISTEN_APPLICATION_NAME)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(cut, "A's listener's connection ended");
    // Past its patience: A has found the connection gone, and fails to connect again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // A reads the runner meanwhile (its cache holds it, not cordoned); B cordons it, and
    // announces so to nobody at A.
    assert!(!cordoned_at_a().await);
    let audit = Entry {
        at: Millis::now(),
        actor: "replicas-test".into(),
        action: Action::RunnerCordon,
        target: runner.id.clone(),
        detail: None,
        client: "127.0.0.1".into(),
    };
    b.state
        .store()
        .set_cordoned(&id, true, &audit)
        .await
        .unwrap()
        .expect("the runner");
    assert!(!cordoned_at_a().await, "A heard nothing of it");

    // A's listener connects and listens again (its backoff is at most 5 s), and A forgets.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER ROLE \"{role}\" CONNECTION LIMIT -1"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let started = Instant::now();
    while !cordoned_at_a().await {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "A listens again and judges the cordon, well before its cache's TTL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

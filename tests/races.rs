//! The forge's `cancel` raced against a runner's call on the same job's lease, hundreds of
//! times: whichever wins, the loser gets an answer of the protocol (never a 5xx), the job ends
//! in one state, and no lease outlives a cancelled job. On PostgreSQL every job/lease write
//! takes the job's row lock before the lease's, so the two never wait on each other in a
//! cycle (`deadlock detected`), and a conflict the database reports anyway is retried.

use crate::common;

use common::*;
use leasegate::domain::time::Millis;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;

const PAIRS: usize = 60;

fn fresh(runner: &TestRunner) -> String {
    // Sub-second checked_at, so a probe right after an abandon lifts the quarantine.
    runner.attest(json!({"probe": {"checked_at": Millis::now().0 as f64 / 1000.0}}))
}

/// Leases the only queued job of `runner`'s pool to it, started when `start` says so.
async fn leased(app: &TestApp, runner: &TestRunner, start: bool) -> Granted {
    app.enqueue(&runner.pool).await;
    let r = app.lease(&fresh(runner)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let lease = Granted {
        lease_id: body["lease_id"].as_str().unwrap().into(),
        token: body["lease_token"].as_str().unwrap().into(),
        job_id: body["job"]["id"].as_str().unwrap().into(),
        body,
    };
    if start {
        assert_eq!(
            app.call(&lease, "start", None).await.status(),
            StatusCode::OK
        );
    }
    lease
}

async fn race(app: Arc<TestApp>, runner: TestRunner, action: &'static str, started: bool) {
    let body = match action {
        "complete" => Some(json!({"outcome": "succeeded", "exit_code": 0})),
        "extend" => Some(json!({"ttl_s": 60})),
        _ => None,
    };
    for pair in 0..PAIRS {
        let lease = leased(&app, &runner, started).await;
        let cancel = {
            let app = app.clone();
            let job = lease.job_id.clone();
            tokio::spawn(async move {
                app.forge_post(&format!("/api/v1/jobs/{job}/cancel"), json!({}))
                    .await
                    .status()
            })
        };
        let call = {
            let app = app.clone();
            let (id, token, body) = (lease.lease_id.clone(), lease.token.clone(), body.clone());
            tokio::spawn(async move { app.call_with(&id, &token, action, body).await.status() })
        };
        let (cancel, call) = (cancel.await.unwrap(), call.await.unwrap());
        let case = format!("{action} #{pair}: cancel {cancel}, {action} {call}");
        assert!(
            matches!(cancel, StatusCode::OK | StatusCode::CONFLICT),
            "{case}"
        );
        assert!(
            matches!(
                call,
                StatusCode::OK | StatusCode::CONFLICT | StatusCode::GONE
            ),
            "{case}"
        );
        let job = app.job(&lease.job_id).await;
        let state = job["state"].as_str().unwrap().to_string();
        if cancel == StatusCode::OK {
            assert_eq!(state, "cancelled", "{case}");
        } else {
            // The call won and finished the job first: cancel found it finished.
            assert_eq!(
                (action, state.as_str()),
                ("complete", "succeeded"),
                "{case}"
            );
        }
        // Nothing of the job is left in the queue or on a live lease.
        if state == "cancelled" {
            let r = app.lease(&fresh(&runner)).await;
            assert_eq!(
                r.status(),
                StatusCode::NO_CONTENT,
                "{case}: the job came back"
            );
        }
    }
}

/// The four statuses of one round: the pool's delete, then a registration, an enqueue and a
/// token's creation sent at the same moment into the pool.
async fn delete_racing_inserts(app: &Arc<TestApp>, pool: &str, token: String) -> [StatusCode; 4] {
    let delete = {
        let app = app.clone();
        let url = app.url(&format!("/api/v1/admin/pools/{pool}"));
        tokio::spawn(async move {
            app.client
                .delete(url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    let register = {
        let app = app.clone();
        let key = leasegate::agent::keys::RunnerKey::generate();
        let body =
            json!({"registration_token": token, "name": "r", "public_key": key.public_jwk()});
        tokio::spawn(async move { app.post("/api/v1/runners", body).await.status() })
    };
    let enqueue = {
        let app = app.clone();
        let body = json!({"pool": pool, "payload": {"script": "make"}});
        tokio::spawn(async move { app.forge_post("/api/v1/jobs", body).await.status() })
    };
    let token = {
        let app = app.clone();
        let path = format!("/api/v1/admin/pools/{pool}/registration-tokens");
        tokio::spawn(async move { app.admin_post(&path, json!({})).await.status() })
    };
    [
        delete.await.unwrap(),
        register.await.unwrap(),
        enqueue.await.unwrap(),
        token.await.unwrap(),
    ]
}

each_engine!(
    deleting_a_pool_racing_what_refers_to_it_never_answers_a_server_error,
    one_registration_token_registers_one_runner_however_many_race_for_it,
    cancel_racing_every_lease_call_never_answers_a_server_error,
    revoking_a_runner_racing_its_abandon_never_answers_a_server_error,
);

async fn deleting_a_pool_racing_what_refers_to_it_never_answers_a_server_error(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    // Each insert holds the pool before it writes a row naming it, so a racing delete is
    // either seen (a clean refusal) or sees the new row (pool_in_use); never a foreign-key
    // error from the database as a 500.
    let app = Arc::new(app);
    for round in 0..40 {
        let pool = format!("gone-{round}");
        app.pool(&pool, &[IMAGE_A]).await;
        let token = app.registration_token(&pool).await;
        let [delete, register, enqueue, token] = delete_racing_inserts(&app, &pool, token).await;
        let case = format!(
            "#{round}: delete {delete}, register {register}, enqueue {enqueue}, token {token}"
        );
        assert!(
            matches!(delete, StatusCode::NO_CONTENT | StatusCode::CONFLICT),
            "{case}"
        );
        assert!(
            matches!(register, StatusCode::CREATED | StatusCode::UNAUTHORIZED),
            "{case}"
        );
        assert!(
            matches!(
                enqueue,
                StatusCode::CREATED | StatusCode::UNPROCESSABLE_ENTITY
            ),
            "{case}"
        );
        assert!(
            matches!(token, StatusCode::CREATED | StatusCode::NOT_FOUND),
            "{case}"
        );
        let exists = app
            .admin_get(&format!("/api/v1/admin/pools/{pool}"))
            .await
            .status();
        if delete == StatusCode::NO_CONTENT {
            // Nothing that refers to the pool got in: not a runner, not a job.
            assert_eq!(
                (register, enqueue, exists),
                (
                    StatusCode::UNAUTHORIZED,
                    StatusCode::UNPROCESSABLE_ENTITY,
                    StatusCode::NOT_FOUND
                ),
                "{case}"
            );
        } else {
            assert!(
                register == StatusCode::CREATED || enqueue == StatusCode::CREATED,
                "{case}"
            );
            assert_eq!(exists, StatusCode::OK, "{case}");
        }
    }
}

async fn one_registration_token_registers_one_runner_however_many_race_for_it(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let app = Arc::new(app);
    app.pool("linux", &[IMAGE_A]).await;
    for round in 0..20 {
        let token = app.registration_token("linux").await;
        let racers: Vec<_> = (0..4)
            .map(|i| {
                let app = app.clone();
                let key = leasegate::agent::keys::RunnerKey::generate();
                let body = json!({"registration_token": token, "name": format!("r{round}-{i}"), "public_key": key.public_jwk()});
                tokio::spawn(async move { app.post("/api/v1/runners", body).await.status() })
            })
            .collect();
        let mut statuses = Vec::new();
        for racer in racers {
            statuses.push(racer.await.unwrap());
        }
        let created = statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count();
        let refused = statuses
            .iter()
            .filter(|s| **s == StatusCode::UNAUTHORIZED)
            .count();
        assert_eq!((created, refused), (1, 3), "#{round}: {statuses:?}");
    }
}

async fn cancel_racing_every_lease_call_never_answers_a_server_error(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let app = Arc::new(app);
    let mut tasks = Vec::new();
    for (action, started) in [
        ("start", false),
        ("complete", true),
        ("extend", true),
        ("abandon", false),
    ] {
        // A pool each, so that one race's lease never takes another's job.
        app.pool(action, &[IMAGE_A]).await;
        let runner = app.register(action, "r1").await;
        tasks.push(tokio::spawn(race(app.clone(), runner, action, started)));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn revoking_a_runner_racing_its_abandon_never_answers_a_server_error(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    // Both take the runner's row first (an abandon quarantines it), then the job, the lease.
    let app = Arc::new(app);
    app.pool("linux", &[IMAGE_A]).await;
    for pair in 0..30 {
        let runner = app.register("linux", &format!("r{pair}")).await;
        let lease = leased(&app, &runner, false).await;
        let revoke = {
            let app = app.clone();
            let id = runner.id.clone();
            tokio::spawn(async move {
                app.admin_post(&format!("/api/v1/admin/runners/{id}/revoke"), json!({}))
                    .await
                    .status()
            })
        };
        let abandon = {
            let app = app.clone();
            let (id, token) = (lease.lease_id.clone(), lease.token.clone());
            tokio::spawn(async move { app.call_with(&id, &token, "abandon", None).await.status() })
        };
        let (revoke, abandon) = (revoke.await.unwrap(), abandon.await.unwrap());
        let case = format!("#{pair}: revoke {revoke}, abandon {abandon}");
        assert_eq!(revoke, StatusCode::OK, "{case}");
        assert!(
            matches!(abandon, StatusCode::OK | StatusCode::FORBIDDEN),
            "{case}"
        );
        // Either way the job is back in the queue, no attempt used.
        let job = app.job(&lease.job_id).await;
        assert_eq!(
            (job["state"].as_str(), job["attempts"].as_i64()),
            (Some("queued"), Some(0)),
            "{case}"
        );
        let other = app.register("linux", &format!("taker{pair}")).await;
        app.grant(&other).await;
    }
}

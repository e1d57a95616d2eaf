//! The forge's `cancel` raced against a runner's call on the same job's lease, hundreds of
//! times: whichever wins, the loser gets an answer of the protocol (never a 5xx), the job ends
//! in one state, and no lease outlives a cancelled job. On PostgreSQL every job/lease write
//! takes the job's row lock before the lease's, so the two never wait on each other in a
//! cycle (`deadlock detected`), and a conflict the database reports anyway is retried.

mod common;

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

on_both_engines! {
async fn cancel_racing_every_lease_call_never_answers_a_server_error(app) {
    let app = Arc::new(app);
    let mut tasks = Vec::new();
    for (action, started) in [("start", false), ("complete", true), ("extend", true), ("abandon", false)] {
        // A pool each, so that one race's lease never takes another's job.
        app.pool(action, &[IMAGE_A]).await;
        let runner = app.register(action, "r1").await;
        tasks.push(tokio::spawn(race(app.clone(), runner, action, started)));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn revoking_a_runner_racing_its_abandon_never_answers_a_server_error(app) {
    // Both take the runner's row first (an abandon quarantines it), then the job, the lease.
    let app = Arc::new(app);
    app.pool("linux", &[IMAGE_A]).await;
    for pair in 0..30 {
        let runner = app.register("linux", &format!("r{pair}")).await;
        let lease = leased(&app, &runner, false).await;
        let revoke = {
            let app = app.clone();
            let id = runner.id.clone();
            tokio::spawn(async move { app.admin_post(&format!("/api/v1/admin/runners/{id}/revoke"), json!({})).await.status() })
        };
        let abandon = {
            let app = app.clone();
            let (id, token) = (lease.lease_id.clone(), lease.token.clone());
            tokio::spawn(async move { app.call_with(&id, &token, "abandon", None).await.status() })
        };
        let (revoke, abandon) = (revoke.await.unwrap(), abandon.await.unwrap());
        let case = format!("#{pair}: revoke {revoke}, abandon {abandon}");
        assert_eq!(revoke, StatusCode::OK, "{case}");
        assert!(matches!(abandon, StatusCode::OK | StatusCode::FORBIDDEN), "{case}");
        // Either way the job is back in the queue, no attempt used.
        let job = app.job(&lease.job_id).await;
        assert_eq!((job["state"].as_str(), job["attempts"].as_i64()), (Some("queued"), Some(0)), "{case}");
        let other = app.register("linux", &format!("taker{pair}")).await;
        app.grant(&other).await;
    }
}
}

//! Every lease transition over a real listener, and the attempt accounting across refusal,
//! abandon, expiry before and after start, and `errored` retries.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

each_engine!(
    grant_start_complete_uses_exactly_one_attempt,
    oldest_job_first_and_no_job_gives_204,
    refused_lease_touches_no_job,
    abandon_before_start_is_free_and_quarantines_until_a_newer_probe,
    an_abandoned_job_is_held_from_its_runner_for_a_while_only,
    lease_calls_answer_with_the_lease_fate,
    errored_requeues_until_attempts_run_out,
    expiry_before_start_is_free_after_start_keeps_the_attempt,
    cancel_reaches_the_runner_on_its_next_call,
    revoke_ends_live_leases_and_refuses_the_runner,
    long_poll_wakes_on_enqueue,
    long_poll_times_out_with_204_and_shutdown_answers_at_once,
    a_runner_holding_two_leases_is_listed_once_with_its_newest,
);

async fn grant_start_complete_uses_exactly_one_attempt(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;

    let lease = app.grant(&runner).await;
    assert_eq!(lease.job_id, job);
    assert_eq!(lease.body["job"]["attempt"], 1);
    assert_eq!(lease.body["job"]["payload"]["script"], "make test");
    assert_eq!(app.job(&job).await["state"], "leased");
    assert_eq!(
        app.job(&job).await["attempts"],
        0,
        "a lease alone uses no attempt"
    );

    let started: Value = app.call(&lease, "start", None).await.json().await.unwrap();
    assert_eq!(started["state"], "running");
    assert_eq!(started["job"]["state"], "running");
    assert_eq!(app.job(&job).await["attempts"], 1);

    let extended = app
        .call(&lease, "extend", Some(json!({"ttl_s": 600})))
        .await;
    assert_eq!(extended.status(), StatusCode::OK);

    let done = app
        .call(
            &lease,
            "complete",
            Some(json!({"outcome": "succeeded", "exit_code": 0})),
        )
        .await;
    assert_eq!(done.status(), StatusCode::OK);
    let story = app.job(&job).await;
    assert_eq!(story["state"], "succeeded");
    assert_eq!(story["attempts"], 1);
    assert_eq!(story["returns"], 0);
    let kinds: Vec<&str> = story["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["enqueued", "leased", "started", "completed"]);
    assert_eq!(story["events"][1]["runner_id"], runner.id.as_str());
}

async fn oldest_job_first_and_no_job_gives_204(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    assert_eq!(
        app.lease(&runner.healthy()).await.status(),
        StatusCode::NO_CONTENT
    );
    let first = app.enqueue("linux").await;
    let second = app.enqueue("linux").await;
    assert_eq!(app.grant(&runner).await.job_id, first);
    assert_eq!(app.grant(&runner).await.job_id, second);
}

async fn refused_lease_touches_no_job(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "broken").await;
    let job = app.enqueue("linux").await;
    let before = app.job(&job).await;

    let r = app
        .lease(&runner.failing("default OCI runtime \"crun\" not found: invalid argument"))
        .await;
    assert!(r.headers().get("retry-after").is_some());
    let body = problem(r, StatusCode::CONFLICT).await;
    assert_eq!(body["code"], "probe_failed");
    assert_eq!(
        body["detail"],
        "cannot run a container with podman: default OCI runtime \"crun\" not found: invalid argument"
    );
    assert_eq!(
        app.job(&job).await,
        before,
        "a refusal must not change the job"
    );

    let detail = app.runner(&runner.id).await;
    assert_eq!(detail["refusals"][0]["code"], "probe_failed");
    assert_eq!(detail["status"], "probe_failed");
}

async fn abandon_before_start_is_free_and_quarantines_until_a_newer_probe(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;
    let lease = app.grant(&runner).await;
    // An attestation whose probe predates the abandon cannot lift the quarantine.
    let old_probe = runner.attest(json!({"probe": {"checked_at": now_s() - 1}}));

    let r = app
        .call(
            &lease,
            "abandon",
            Some(json!({"reason": "disk_full", "message": "no space"})),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let story = app.job(&job).await;
    assert_eq!(story["state"], "queued");
    assert_eq!(story["attempts"], 0);
    assert_eq!(story["returns"], 1);
    assert_eq!(
        story["events"].as_array().unwrap().last().unwrap()["kind"],
        "returned"
    );

    assert_eq!(
        code_of(app.lease(&old_probe).await, StatusCode::CONFLICT).await,
        "runner_quarantined"
    );
    // A passing probe checked after the abandon lifts it (sub-second precision).
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let fresh = runner.attest(json!({"probe": {"checked_at": (leasegate::domain::time::Millis::now().0 as f64) / 1000.0}}));
    // Healthy again, but the job it gave back is not handed straight back to it...
    assert_eq!(app.lease(&fresh).await.status(), StatusCode::NO_CONTENT);
    // ...while any other runner takes it at once, its attempt still unused.
    let other = app.register("linux", "r2").await;
    let again = app.lease(&other.healthy()).await;
    assert_eq!(again.status(), StatusCode::OK);
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["job"]["id"], job.as_str());
    assert_eq!(body["job"]["attempt"], 1);
}

async fn an_abandoned_job_is_held_from_its_runner_for_a_while_only(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    use leasegate::domain::ids::{LeaseId, RunnerId};
    use leasegate::domain::lease::{ABANDON_HOLD_S, LeaseCall};
    use leasegate::domain::time::Millis;
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;
    let store = app.state.store();
    let claim = |now: Millis| leasegate::store::Claim {
        runner_id: RunnerId(runner.id.clone()),
        pool: leasegate::domain::pool_name::PoolName::parse("linux").unwrap(),
        lease_id: LeaseId::generate(),
        token_hash: "h".repeat(64),
        ttl_s: 300,
        now,
    };
    let now = Millis::now();
    let (lease, _) = store
        .claim_job(&claim(now))
        .await
        .unwrap()
        .expect("the job");
    let abandon = LeaseCall::Abandon {
        reason: None,
        message: None,
    };
    let rules = app.state.settings().status_rules();
    store
        .lease_call(&lease.id, &"h".repeat(64), &abandon, now, rules)
        .await
        .unwrap();
    // A second job behind it: the runner takes that one instead.
    let second = app.enqueue("linux").await;
    let (_, got) = store
        .claim_job(&claim(now))
        .await
        .unwrap()
        .expect("the next job");
    assert_eq!(got.id.as_str(), second);
    assert!(
        store
            .claim_job(&claim(now.plus_secs(ABANDON_HOLD_S - 1)))
            .await
            .unwrap()
            .is_none()
    );
    let (_, back) = store
        .claim_job(&claim(now.plus_secs(ABANDON_HOLD_S)))
        .await
        .unwrap()
        .expect("held no longer");
    assert_eq!(back.id.as_str(), job);
}

async fn lease_calls_answer_with_the_lease_fate(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    app.enqueue("linux").await;
    let lease = app.grant(&runner).await;

    assert_eq!(
        code_of(
            app.call(&lease, "complete", Some(json!({"outcome": "succeeded"})))
                .await,
            StatusCode::CONFLICT
        )
        .await,
        "lease_not_started"
    );
    assert_eq!(
        app.call(&lease, "start", None).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        code_of(app.call(&lease, "start", None).await, StatusCode::CONFLICT).await,
        "lease_started"
    );
    assert_eq!(
        code_of(
            app.call(&lease, "abandon", None).await,
            StatusCode::CONFLICT
        )
        .await,
        "lease_started"
    );
    let wrong = app
        .call_with(&lease.lease_id, "lgl_wrong", "extend", None)
        .await;
    assert_eq!(
        code_of(wrong, StatusCode::UNAUTHORIZED).await,
        "lease_token_invalid"
    );
    let unknown = app
        .call_with("no-such-lease", &lease.token, "extend", None)
        .await;
    assert_eq!(
        code_of(unknown, StatusCode::UNAUTHORIZED).await,
        "lease_token_invalid"
    );
    let bad_ttl = app.call(&lease, "extend", Some(json!({"ttl_s": 0}))).await;
    assert_eq!(
        code_of(bad_ttl, StatusCode::BAD_REQUEST).await,
        "bad_request"
    );
    assert_eq!(
        app.call(
            &lease,
            "complete",
            Some(json!({"outcome": "failed", "exit_code": 2}))
        )
        .await
        .status(),
        StatusCode::OK
    );
    assert_eq!(
        code_of(app.call(&lease, "extend", None).await, StatusCode::CONFLICT).await,
        "lease_finished"
    );
}

async fn errored_requeues_until_attempts_run_out(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app
        .enqueue_with(json!({"pool": "linux", "payload": null, "max_attempts": 2}))
        .await;

    for attempt in 1..=2 {
        let lease = app.grant(&runner).await;
        assert_eq!(lease.body["job"]["attempt"], attempt);
        app.call(&lease, "start", None).await;
        let r = app
            .call(
                &lease,
                "complete",
                Some(json!({"outcome": "errored", "message": "runner lost its disk"})),
            )
            .await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    let story = app.job(&job).await;
    assert_eq!(story["state"], "failed");
    assert_eq!(story["attempts"], 2);
    assert_eq!(story["last_error"], "runner lost its disk");
    assert_eq!(
        app.lease(&runner.healthy()).await.status(),
        StatusCode::NO_CONTENT
    );
}

async fn expiry_before_start_is_free_after_start_keeps_the_attempt(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app
        .enqueue_with(json!({"pool": "linux", "payload": {}, "max_attempts": 1}))
        .await;

    let lease = app.grant(&runner).await;
    app.sweep_ahead(301).await;
    let story = app.job(&job).await;
    assert_eq!(
        (
            story["state"].as_str(),
            story["attempts"].as_i64(),
            story["returns"].as_i64()
        ),
        (Some("queued"), Some(0), Some(1))
    );
    assert_eq!(
        code_of(app.call(&lease, "start", None).await, StatusCode::GONE).await,
        "lease_expired"
    );

    let second = app.grant(&runner).await;
    app.call(&second, "start", None).await;
    app.sweep_ahead(301).await;
    let story = app.job(&job).await;
    assert_eq!(story["state"], "failed");
    assert_eq!(story["attempts"], 1);
    assert_eq!(story["last_error"], "lease_expired");
    // A late call from the expired lease cannot complete the job that moved on.
    let late = app
        .call(&second, "complete", Some(json!({"outcome": "succeeded"})))
        .await;
    assert_eq!(code_of(late, StatusCode::GONE).await, "lease_expired");
    assert_eq!(app.job(&job).await["state"], "failed");
}

async fn cancel_reaches_the_runner_on_its_next_call(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let queued = app.enqueue("linux").await;
    let r = app
        .forge_post(&format!("/api/v1/jobs/{queued}/cancel"), json!({}))
        .await;
    assert_eq!(r.json::<Value>().await.unwrap()["state"], "cancelled");
    assert_eq!(
        app.lease(&runner.healthy()).await.status(),
        StatusCode::NO_CONTENT
    );

    let running = app.enqueue("linux").await;
    let lease = app.grant(&runner).await;
    app.call(&lease, "start", None).await;
    app.forge_post(&format!("/api/v1/jobs/{running}/cancel"), json!({}))
        .await;
    assert_eq!(
        code_of(app.call(&lease, "extend", None).await, StatusCode::CONFLICT).await,
        "job_cancelled"
    );
    let again = app
        .forge_post(&format!("/api/v1/jobs/{running}/cancel"), json!({}))
        .await;
    assert_eq!(code_of(again, StatusCode::CONFLICT).await, "job_finished");
}

async fn revoke_ends_live_leases_and_refuses_the_runner(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;
    let lease = app.grant(&runner).await;

    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/revoke", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "revoked");
    let story = app.job(&job).await;
    assert_eq!(
        (story["state"].as_str(), story["returns"].as_i64()),
        (Some("queued"), Some(1))
    );
    assert_eq!(
        code_of(app.call(&lease, "start", None).await, StatusCode::FORBIDDEN).await,
        "runner_revoked"
    );
    assert_eq!(
        code_of(app.lease(&runner.healthy()).await, StatusCode::FORBIDDEN).await,
        "runner_revoked"
    );
}

async fn long_poll_wakes_on_enqueue(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let attestation = runner.healthy();
    let started = std::time::Instant::now();
    let waiting = app.spawn_lease_wait(attestation, 20);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let job = app.enqueue("linux").await;
    let r = waiting.await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["job"]["id"], job.as_str());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the waiter was not woken by the enqueue"
    );
}

async fn long_poll_times_out_with_204_and_shutdown_answers_at_once(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let started = std::time::Instant::now();
    assert_eq!(
        app.lease_wait(&runner.healthy(), 1).await.status(),
        StatusCode::NO_CONTENT
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));

    let attestation = runner.healthy();
    let waiting = app.spawn_lease_wait(attestation, 30);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let stopping = std::time::Instant::now();
    app.shutdown.cancel();
    assert_eq!(waiting.await.unwrap().status(), StatusCode::NO_CONTENT);
    assert!(stopping.elapsed() < std::time::Duration::from_secs(3));
}

async fn a_runner_holding_two_leases_is_listed_once_with_its_newest(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    app.enqueue("linux").await;
    app.enqueue("linux").await;
    let _first = app.grant(&runner).await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let second = app.grant(&runner).await;

    let list: Value = app
        .admin_get("/api/v1/admin/runners")
        .await
        .json()
        .await
        .unwrap();
    let rows = list["runners"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{list}");
    assert_eq!(
        rows[0]["current_lease"]["lease_id"],
        second.lease_id.as_str()
    );
    let drift: Value = app
        .admin_get("/api/v1/admin/drift")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        drift["drifted"].as_array().unwrap().len() + drift["skipped"].as_array().unwrap().len(),
        0,
        "{drift}"
    );
    let pool: Value = app
        .admin_get("/api/v1/admin/pools/linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pool["runners_by_status"]["healthy"], 1, "{pool}");
}

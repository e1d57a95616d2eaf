//! Outlier ejection over a real listener and a real database: infrastructure failures in a row
//! eject a runner, a job run to its end resets the count, the second ejection lasts twice as
//! long, release takes both the time and a probe checked after it, `max_share` and the last
//! admitted runner hold an ejection back, an operator reinstates, a pool that observes only
//! marks, and every replica refuses at once.

use crate::common;

use common::*;
use leasegate::domain::attestation::{Probe, RunningImage};
use leasegate::domain::ejection::{Effect, FailureReason, JobEnd};
use leasegate::domain::ids::{LeaseId, RunnerId};
use leasegate::domain::lease::{LeaseCall, Outcome};
use leasegate::domain::pool_name::PoolName;
use leasegate::domain::status::RunnerStatus;
use leasegate::domain::time::Millis;
use leasegate::domain::verdict::AttestedState;
use leasegate::store::{AttestationRecord, Claim, DynStore, RoundItem};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A pool of `runners` healthy runners (each has heart-beaten, so each is live and admitted),
/// with `ejection` as its policy, and one job that `errored` puts back in the queue for ever.
async fn pool_of(app: &TestApp, runners: usize, extra: Value) -> Vec<TestRunner> {
    let mut body = json!({"expected_image_ids": [IMAGE_A]});
    merge(&mut body, &extra);
    let r = app.admin_put("/api/v1/admin/pools/linux", body).await;
    assert!(r.status().is_success(), "pool: {}", r.status());
    let mut out = Vec::new();
    for i in 0..runners {
        let runner = app.register("linux", &format!("r{i}")).await;
        assert_eq!(
            app.heartbeat(&runner.healthy()).await.status(),
            StatusCode::OK
        );
        out.push(runner);
    }
    app.enqueue_with(json!({"pool": "linux", "payload": {}, "max_attempts": 100}))
        .await;
    out
}

/// One job leased, started and completed with `outcome` by `runner`.
async fn run_job(app: &TestApp, runner: &TestRunner, outcome: &str) {
    let lease = app.grant(runner).await;
    assert_eq!(
        app.call(&lease, "start", None).await.status(),
        StatusCode::OK
    );
    let done = app
        .call(&lease, "complete", Some(json!({"outcome": outcome})))
        .await;
    assert_eq!(done.status(), StatusCode::OK);
    if outcome != "errored" {
        app.enqueue_with(json!({"pool": "linux", "payload": {}, "max_attempts": 100}))
            .await;
    }
}

async fn lease_code(app: &TestApp, runner: &TestRunner) -> (StatusCode, Value) {
    let r = app.lease(&runner.healthy()).await;
    let status = r.status();
    let body = if status == StatusCode::CONFLICT || status == StatusCode::OK {
        r.json().await.unwrap()
    } else {
        Value::Null
    };
    (status, body)
}

async fn metrics(app: &TestApp) -> String {
    app.metrics_text().await
}

each_engine!(
    three_errored_completions_eject_and_a_success_between_resets,
    an_abandon_before_start_counts_as_a_failure,
    max_share_keeps_a_pool_of_three_with_one_ejected_from_ejecting_a_second,
    a_pools_last_admitted_runner_is_never_ejected,
    an_operator_reinstates_at_once_audited,
    a_pool_that_observes_marks_would_eject_and_refuses_nothing,
    the_policy_is_in_the_pool_and_checked,
    a_forge_jobs_end_counts_once_however_often_it_is_seen,
    the_second_ejection_lasts_twice_as_long_and_release_takes_the_time_and_a_newer_probe,
);

async fn three_errored_completions_eject_and_a_success_between_resets(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runners = pool_of(&app, 3, json!({})).await;
    let r = &runners[0];
    run_job(&app, r, "errored").await;
    run_job(&app, r, "errored").await;
    run_job(&app, r, "succeeded").await;
    run_job(&app, r, "errored").await;
    run_job(&app, r, "errored").await;
    let standing = app.runner(&r.id).await;
    assert_eq!(
        standing["status"], "healthy",
        "two in a row since the success"
    );
    assert_eq!(standing["ejection"]["failures_in_a_row"], 2);
    run_job(&app, r, "errored").await;

    let (status, body) = lease_code(&app, r).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["code"], "runner_ejected");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("3 infrastructure failures in a row (errored ×3)")
            && detail.contains("until"),
        "{detail}"
    );
    let check = app
        .forge_post("/api/v1/gate/check", json!({"attestation": r.healthy()}))
        .await;
    let check: Value = check.json().await.unwrap();
    assert_eq!(
        (check["decision"].as_str(), check["code"].as_str()),
        (Some("refuse"), Some("runner_ejected"))
    );

    let shown = app.runner(&r.id).await;
    assert_eq!(shown["status"], "ejected");
    assert_eq!(shown["ejection"]["state"], "ejected");
    assert_eq!(shown["ejection"]["ejected"]["nth"], 1);
    assert_eq!(shown["ejection"]["ejected"]["failures"]["errored"], 3);
    assert_eq!(
        shown["ejection"]["failures_in_a_row"], 0,
        "an ejection resets the count"
    );
    let audit: Vec<&str> = shown["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(audit.contains(&"runner_eject"), "{audit:?}");
    let text = metrics(&app).await;
    assert!(
        text.contains(r#"leasegate_ejections_total{pool="linux",reason="errored"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"leasegate_ejected_runners{pool="linux"} 1"#),
        "{text}"
    );
    // The others take the work meanwhile.
    assert_eq!(lease_code(&app, &runners[1]).await.0, StatusCode::OK);
}

async fn an_abandon_before_start_counts_as_a_failure(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runners = pool_of(&app, 3, json!({"ejection": {"consecutive_failures": 2}})).await;
    let r = &runners[0];
    run_job(&app, r, "errored").await;
    let lease = app.grant(r).await;
    assert_eq!(
        app.call(&lease, "abandon", None).await.status(),
        StatusCode::OK
    );
    let shown = app.runner(&r.id).await;
    assert_eq!(shown["ejection"]["state"], "ejected");
    assert_eq!(
        shown["ejection"]["ejected"]["failures"],
        json!({"errored": 1, "abandoned": 1})
    );
}

async fn max_share_keeps_a_pool_of_three_with_one_ejected_from_ejecting_a_second(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runners = pool_of(&app, 3, json!({})).await;
    for _ in 0..3 {
        run_job(&app, &runners[0], "errored").await;
    }
    assert_eq!(
        app.runner(&runners[0].id).await["ejection"]["state"],
        "ejected"
    );
    for _ in 0..3 {
        run_job(&app, &runners[1], "errored").await;
    }
    let spared = app.runner(&runners[1].id).await;
    assert_eq!(spared["status"], "healthy");
    assert_eq!(spared["ejection"]["state"], "would_eject");
    assert_eq!(spared["ejection"]["would_eject"]["why"], "max_share");
    assert_eq!(
        lease_code(&app, &runners[1]).await.0,
        StatusCode::OK,
        "stays admitted"
    );
    let text = metrics(&app).await;
    assert!(
        text.contains(r#"leasegate_ejections_withheld_total{pool="linux",reason="max_share"} 1"#),
        "{text}"
    );
}

async fn a_pools_last_admitted_runner_is_never_ejected(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runners = pool_of(&app, 1, json!({})).await;
    for _ in 0..3 {
        run_job(&app, &runners[0], "errored").await;
    }
    let shown = app.runner(&runners[0].id).await;
    assert_eq!(shown["ejection"]["would_eject"]["why"], "last_admitted");
    assert_eq!(lease_code(&app, &runners[0]).await.0, StatusCode::OK);
}

async fn an_operator_reinstates_at_once_audited(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runners = pool_of(&app, 3, json!({})).await;
    let r = &runners[0];
    for _ in 0..3 {
        run_job(&app, r, "errored").await;
    }
    assert_eq!(lease_code(&app, r).await.1["code"], "runner_ejected");
    let back = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/reinstate", r.id),
            json!({}),
        )
        .await;
    assert_eq!(back.status(), StatusCode::OK);
    let back: Value = back.json().await.unwrap();
    assert_eq!(back["ejection"]["state"], Value::Null);
    assert_eq!(back["status"], "healthy");
    assert_eq!(back["audit"][0]["action"], "runner_reinstate");
    assert_eq!(back["audit"][0]["actor"], "bootstrap");
    assert_eq!(lease_code(&app, r).await.0, StatusCode::OK);
    let unknown = app
        .admin_post("/api/v1/admin/runners/no-such-runner/reinstate", json!({}))
        .await;
    expect_problem(
        unknown,
        "unknown runner",
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
}

async fn a_pool_that_observes_marks_would_eject_and_refuses_nothing(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runners = pool_of(&app, 3, json!({"gate_mode": "observe"})).await;
    for _ in 0..3 {
        run_job(&app, &runners[0], "errored").await;
    }
    let shown = app.runner(&runners[0].id).await;
    assert_eq!(shown["status"], "healthy");
    assert_eq!(shown["ejection"]["state"], "would_eject");
    assert_eq!(shown["ejection"]["would_eject"]["why"], "observe");
    assert_eq!(
        shown["ejection"]["ejections"], 1,
        "recorded as the pool would when enforcing"
    );
    let r = app.lease(&runners[0].healthy()).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("x-leasegate-would-refuse").is_none());
}

async fn the_policy_is_in_the_pool_and_checked(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    pool_of(&app, 0, json!({"ejection": {"base_s": 60}})).await;
    let pool: Value = app
        .admin_get("/api/v1/admin/pools/linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        pool["ejection"],
        json!({"consecutive_failures": 3, "base_s": 60, "max_share": 0.34})
    );
    let patched = app
        .admin_patch(
            "/api/v1/admin/pools/linux",
            json!({"ejection": {"max_share": 0.5}}),
        )
        .await;
    let patched: Value = patched.json().await.unwrap();
    assert_eq!(
        patched["ejection"],
        json!({"consecutive_failures": 3, "base_s": 60, "max_share": 0.5})
    );
    for (bad, field) in [
        (json!({"base_s": 0}), "base_s"),
        (json!({"consecutive_failures": -1}), "consecutive_failures"),
        (json!({"max_share": 2}), "max_share"),
        (json!({"base": 5}), "base"),
    ] {
        let r = app
            .admin_put(
                "/api/v1/admin/pools/linux",
                json!({"expected_image_ids": [IMAGE_A], "ejection": bad}),
            )
            .await;
        let p = expect_problem(r, field, StatusCode::BAD_REQUEST, "bad_request").await;
        assert!(p["detail"].as_str().unwrap().contains(field), "{p}");
    }
}

async fn a_forge_jobs_end_counts_once_however_often_it_is_seen(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runners = pool_of(&app, 3, json!({})).await;
    let store = app.state.store().clone();
    let rules = app.state.settings().status_rules();
    let id = RunnerId(runners[0].id.clone());
    let failed = JobEnd::Infrastructure(FailureReason::RunnerSystemFailure);
    let now = Millis::now();
    let first = store
        .forge_job_ended("gitlab:1", &id, failed, now, rules)
        .await
        .unwrap();
    assert_eq!(
        first,
        Some((PoolName::parse("linux").unwrap(), Effect::Counted))
    );
    for _ in 0..3 {
        // The runner repeats its final update while the forge answers 202.
        let again = store
            .forge_job_ended("gitlab:1", &id, failed, now, rules)
            .await
            .unwrap();
        assert_eq!(again, None);
    }
    assert_eq!(
        app.runner(&runners[0].id).await["ejection"]["failures_in_a_row"],
        1
    );
    store
        .forge_job_ended("gitlab:2", &id, failed, now, rules)
        .await
        .unwrap();
    let third = store
        .forge_job_ended("gitlab:3", &id, failed, now, rules)
        .await
        .unwrap();
    assert!(matches!(third, Some((_, Effect::Ejected(_)))), "{third:?}");
    let shown = app.runner(&runners[0].id).await;
    assert_eq!(
        shown["ejection"]["ejected"]["failures"]["runner_system_failure"],
        3
    );
    let unknown = RunnerId("no-such-runner".into());
    assert_eq!(
        store
            .forge_job_ended("gitlab:4", &unknown, failed, now, rules)
            .await
            .unwrap(),
        None
    );
}

async fn the_second_ejection_lasts_twice_as_long_and_release_takes_the_time_and_a_newer_probe(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runners = pool_of(&app, 3, json!({"ejection": {"base_s": 300}})).await;
    let store = app.state.store().clone();
    let ids: Vec<RunnerId> = runners.iter().map(|r| RunnerId(r.id.clone())).collect();
    let t = Millis::now().plus_secs(10_000);
    for id in &ids {
        attest(&store, id, t, t).await;
    }
    fail_three_times(&app, &store, &ids[0], t).await;
    let ejected = |store: DynStore, id: RunnerId| async move {
        store.get_runner(&id).await.unwrap().unwrap().gate.ejection
    };
    let first = ejected(store.clone(), ids[0].clone())
        .await
        .expect("ejected");
    assert_eq!((first.until, first.nth), (t.plus_secs(300), 1));

    attest(&store, &ids[0], t.plus_secs(200), t.plus_secs(200)).await;
    assert!(
        ejected(store.clone(), ids[0].clone()).await.is_some(),
        "its time has not passed"
    );
    attest(&store, &ids[0], t.plus_secs(301), t.plus_secs(250)).await;
    assert!(
        ejected(store.clone(), ids[0].clone()).await.is_some(),
        "a probe checked before the time passed"
    );
    attest(&store, &ids[0], t.plus_secs(302), t.plus_secs(301)).await;
    assert!(
        ejected(store.clone(), ids[0].clone()).await.is_none(),
        "released"
    );

    let t2 = t.plus_secs(400);
    for id in &ids {
        attest(&store, id, t2, t2).await;
    }
    fail_three_times(&app, &store, &ids[0], t2).await;
    let second = ejected(store.clone(), ids[0].clone())
        .await
        .expect("ejected again");
    assert_eq!((second.until, second.nth), (t2.plus_secs(600), 2));
}

/// An attestation of `runner` received at `at`, its passing probe checked at `checked_at`.
async fn attest(store: &DynStore, runner: &RunnerId, at: Millis, checked_at: Millis) {
    let record = AttestationRecord {
        runner_id: runner.clone(),
        jti: uuid::Uuid::now_v7().to_string(),
        replay_until: at.plus_secs(60),
        received_at: at,
        state: AttestedState {
            probe: Probe {
                ok: true,
                runtime: "podman".into(),
                runtime_version: None,
                checked_at,
                error: None,
                exit_code: None,
                disk: Default::default(),
            },
            image: RunningImage {
                id: Some(leasegate::domain::digest::ImageDigest::parse(IMAGE_A).unwrap()),
                digest: None,
                image_ref: None,
            },
            images: Vec::new(),
        },
        agent: None,
        status: RunnerStatus::Healthy,
        refusal: None,
        judged_gate: Default::default(),
    };
    let outcome = store
        .submit(RoundItem {
            attestation: Some(record),
            claim: None,
        })
        .await
        .unwrap();
    assert!(matches!(outcome.attestation, Some(Ok(()))));
}

/// Three jobs of `runner` claimed, started and `errored` at `at`, through the store.
async fn fail_three_times(app: &TestApp, store: &DynStore, runner: &RunnerId, at: Millis) {
    let rules = app.state.settings().status_rules();
    for _ in 0..3 {
        let hash = leasegate::secrets::hash_token(&format!("lgl_{}", uuid::Uuid::now_v7()));
        let claim = Claim {
            runner_id: runner.clone(),
            pool: PoolName::parse("linux").unwrap(),
            lease_id: LeaseId::generate(),
            token_hash: hash.clone(),
            ttl_s: 300,
            now: at,
        };
        let (lease, _) = store.claim_job(&claim).await.unwrap().expect("a job");
        let start = LeaseCall::Start { ttl_s: 300 };
        store
            .lease_call(&lease.id, &hash, &start, at, rules)
            .await
            .unwrap();
        let errored = LeaseCall::Complete {
            outcome: Outcome::Errored,
            exit_code: None,
            message: None,
        };
        store
            .lease_call(&lease.id, &hash, &errored, at, rules)
            .await
            .unwrap();
    }
}

/// Every replica refuses at once: the count and the ejection are in the database, and the
/// change reaches the other replica's gate by `NOTIFY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejection_at_one_replica_is_refused_at_the_other() {
    let Some(a) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    let b = spawn_replica(&a).await;
    let runners = pool_of(&a, 3, json!({})).await;
    let r = &runners[0];
    // B judges the runner once, which caches its inputs there.
    assert_eq!(b.heartbeat(&r.healthy()).await.status(), StatusCode::OK);
    // Two failures at A, the third at B: the count is the database's, not a replica's.
    run_job(&a, r, "errored").await;
    run_job(&a, r, "errored").await;
    run_job(&b, r, "errored").await;
    let started = std::time::Instant::now();
    loop {
        let (status, body) = lease_code(&a, r).await;
        let (status_b, body_b) = lease_code(&b, r).await;
        if status == StatusCode::CONFLICT && status_b == StatusCode::CONFLICT {
            assert_eq!(body["code"], "runner_ejected");
            assert_eq!(body_b["code"], "runner_ejected");
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "not refused at both: {status} {body} / {status_b} {body_b}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

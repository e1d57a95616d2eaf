//! The forge gate in front of test forges that do what Forgejo/Gitea and GitLab do for their
//! runners (`common::forges`): a refused runner's fetch never reaches the forge and gets "no
//! work" in the forge's own terms; an eligible runner's is forwarded and its answer relayed
//! byte for byte; every other call passes, even for a refused runner; bodies stream both ways;
//! a forge that is down or silent is a 502 or a 504; unbound runners are refused or passed;
//! a pool that observes forwards and records; and a job offered only to broken runners stays
//! queued, unclaimed, until a healthy runner takes it.

use crate::common;

use common::forges::{self, FETCH_TASK, FORGEJO_TOKEN, Gated, JOBS_REQUEST, UUID, runner_v1};
use common::*;
use leasegate::config::ServeArgs;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

pub(crate) const GITLAB_TOKEN: &str = "glrt-test-runner-token";

/// The service on `engine` in front of the test forges (`forges::gated`), with `adjust` on top.
pub(crate) async fn gated(engine: Engine, adjust: impl FnOnce(&mut ServeArgs)) -> Option<Gated> {
    forges::gated(engine, GITLAB_TOKEN, 2, adjust).await
}

pub(crate) fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// A leasegate runner in pool `linux` on the same machine as the forge runners, bound to them.
pub(crate) async fn bound_runner(app: &TestApp) -> TestRunner {
    app.pool("linux", &[IMAGE_A]).await;
    let token = app.registration_token("linux").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": token, "name": "build-01", "public_key": key.public_jwk(),
                   "forge_runners": [{"kind": "forgejo", "uuid": UUID},
                                     {"kind": "gitlab", "token_sha256": sha256_hex(GITLAB_TOKEN)}]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let body: Value = r.json().await.unwrap();
    TestRunner {
        id: body["runner_id"].as_str().unwrap().into(),
        pool: "linux".into(),
        key,
    }
}

pub(crate) async fn heartbeat_healthy(app: &TestApp, runner: &TestRunner) {
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
}

pub(crate) async fn heartbeat_broken(app: &TestApp, runner: &TestRunner) {
    let broken = runner.failing("default OCI runtime \"crun\" not found: invalid argument");
    assert_eq!(app.heartbeat(&broken).await.status(), StatusCode::OK);
}

/// A runner's `FetchTask`, in protobuf (as the runners send it) or JSON.
pub(crate) async fn fetch_task(
    app: &TestApp,
    uuid: &str,
    token: &str,
    json: bool,
) -> reqwest::Response {
    let req = app
        .client
        .post(app.url(FETCH_TASK))
        .header("connect-protocol-version", "1")
        .header("x-runner-uuid", uuid)
        .header("x-runner-token", token);
    let req = if json {
        req.header("content-type", "application/json")
            .body(r#"{"tasksVersion":"0"}"#)
    } else {
        req.header("content-type", "application/proto")
            .body(runner_v1::FetchTaskRequest { tasks_version: 0 }.encode_to_vec())
    };
    req.send().await.unwrap()
}

/// GitLab's `jobs/request`, as gitlab-runner sends it.
async fn request_job(app: &TestApp, token: &str, last_update: Option<&str>) -> reqwest::Response {
    let mut body = json!({"token": token, "info": {"name": "gitlab-runner", "version": "17.0.0"}});
    if let Some(l) = last_update {
        body["last_update"] = json!(l);
    }
    app.client
        .post(app.url(JOBS_REQUEST))
        .header("runner-token", token)
        .json(&body)
        .send()
        .await
        .unwrap()
}

pub(crate) fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

each_engine!(
    a_refused_forgejo_runner_gets_no_task_and_the_forge_never_hears_of_it,
    an_eligible_forgejo_runner_fetches_through_and_the_answer_is_relayed_as_sent,
    every_other_call_passes_for_a_refused_runner,
    a_refused_gitlab_request_is_held_then_answered_no_job,
    a_held_gitlab_request_goes_through_once_the_runner_may_work,
    unbound_forge_runners_are_refused_or_passed_as_configured,
    a_pool_that_observes_forwards_and_records_what_it_would_refuse,
    bindings_are_one_runner_each_and_revoking_frees_them,
    a_job_offered_only_to_broken_runners_stays_queued_until_a_healthy_one_takes_it,
);

async fn a_refused_forgejo_runner_gets_no_task_and_the_forge_never_hears_of_it(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&g.app).await;
    heartbeat_broken(&g.app, &runner).await;
    g.forgejo.enqueue();
    for json in [false, true] {
        let r = fetch_task(&g.app, UUID, FORGEJO_TOKEN, json).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-leasegate-refusal"), Some("probe_failed"));
        let content_type = header(&r, "content-type").unwrap().to_string();
        let body = r.bytes().await.unwrap();
        if json {
            assert_eq!(content_type, "application/json");
            assert_eq!(body.as_ref(), b"{}");
        } else {
            assert_eq!(content_type, "application/proto");
            // The published message, decoded: no task, and no version to change the runner's.
            let answer = runner_v1::FetchTaskResponse::decode(body.as_ref()).unwrap();
            assert_eq!(
                answer,
                runner_v1::FetchTaskResponse {
                    task: None,
                    tasks_version: 0
                }
            );
        }
    }
    assert_eq!(
        g.forgejo.calls_to(FETCH_TASK),
        0,
        "the forge saw a refused fetch"
    );
    assert_eq!(g.forgejo.queued().len(), 1);
    // The refusal is on the runner's record, with the runtime's words.
    let view = g.app.runner(&runner.id).await;
    let refusal = &view["refusals"][0];
    assert_eq!(refusal["code"], "probe_failed");
    assert!(
        refusal["detail"]
            .as_str()
            .unwrap()
            .contains("forgejo fetch"),
        "{refusal}"
    );
    assert!(
        refusal["detail"].as_str().unwrap().contains("crun"),
        "{refusal}"
    );
    let metrics = g.app.metrics_text().await;
    assert!(
        metrics.contains(r#"leasegate_forge_fetches_total{forge="forgejo",outcome="refused",code="probe_failed"} 2"#),
        "{metrics}"
    );
}

async fn an_eligible_forgejo_runner_fetches_through_and_the_answer_is_relayed_as_sent(
    engine: Engine,
) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&g.app).await;
    heartbeat_healthy(&g.app, &runner).await;
    for json in [false, true] {
        let id = g.forgejo.enqueue();
        let r = fetch_task(&g.app, UUID, FORGEJO_TOKEN, json).await;
        let (status, headers) = (r.status(), r.headers().clone());
        let body = r.bytes().await.unwrap();
        let (sent_status, sent_headers, sent_body) = g.forgejo.last_answer().unwrap();
        assert_eq!(status.as_u16(), sent_status);
        assert_eq!(body, sent_body, "the forge's bytes, relayed as they were");
        for name in ["content-type", "x-forge-answer"] {
            assert_eq!(headers.get(name), sent_headers.get(name), "{name}");
        }
        assert!(headers.get("x-leasegate-refusal").is_none());
        if !json {
            let answer = runner_v1::FetchTaskResponse::decode(body.as_ref()).unwrap();
            assert_eq!(answer.task.unwrap().id, id);
        }
    }
    assert_eq!(g.forgejo.claimed().len(), 2);
    // The forge saw who asked and through whom; the binding saw the fetch.
    let call = g
        .forgejo
        .calls()
        .into_iter()
        .find(|c| c.path == FETCH_TASK)
        .unwrap();
    assert_eq!(call.headers["x-runner-token"], FORGEJO_TOKEN);
    assert_eq!(call.headers["x-forwarded-for"], "127.0.0.1");
    assert!(
        call.headers["host"]
            .to_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    let view = g.app.runner(&runner.id).await;
    let forgejo = view["forge_runners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["kind"] == "forgejo")
        .unwrap()
        .clone();
    assert_eq!(forgejo["uuid"], UUID);
    assert!(forgejo["last_fetch_at"].is_string(), "{view}");
}

async fn every_other_call_passes_for_a_refused_runner(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&g.app).await;
    heartbeat_broken(&g.app, &runner).await;
    let c = &g.app.client;
    // A job already running reports its logs and state, and its steps use the artifact services.
    let log = runner_v1::UpdateLogRequest {
        task_id: 7,
        index: 41,
        no_more: false,
    }
    .encode_to_vec();
    let r = c
        .post(g.app.url("/api/actions/runner.v1.RunnerService/UpdateLog"))
        .header("content-type", "application/proto")
        .header("x-runner-uuid", UUID)
        .header("x-runner-token", FORGEJO_TOKEN)
        .body(log)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ack = runner_v1::UpdateLogResponse::decode(r.bytes().await.unwrap().as_ref()).unwrap();
    assert_eq!(ack.ack_index, 42);
    for path in [
        "/api/actions/runner.v1.RunnerService/UpdateTask",
        "/api/actions_pipeline/_apis/pipelines/workflows/7/artifacts?api-version=6.0-preview",
        "/twirp/github.actions.results.api.v1.ArtifactService/CreateArtifact",
    ] {
        let r = c
            .post(g.app.url(path))
            .header("x-runner-uuid", UUID)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{path}");
        let echoed: Value = r.json().await.unwrap();
        assert_eq!(echoed["path"], path.split('?').next().unwrap(), "{path}");
    }
    // GitLab: job updates and traces of a refused runner's running job go through too.
    let r = c
        .put(g.app.url("/api/v4/jobs/7"))
        .header("job-token", "job-token-7")
        .json(&json!({"state": "running"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let r = c
        .patch(g.app.url("/api/v4/jobs/7/trace"))
        .header("content-range", "0-4")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let echoed: Value = r.json().await.unwrap();
    assert_eq!(echoed["headers"]["content-range"], "0-4");
    assert_eq!(echoed["body_len"], 5);
    // A gzipped answer stays gzipped: the same bytes, the same headers.
    let r = c.get(g.app.url("/api/v4/download")).send().await.unwrap();
    assert_eq!(header(&r, "content-encoding"), Some("gzip"));
    assert_eq!(header(&r, "x-forge-own"), Some("kept"));
    assert_eq!(
        r.bytes().await.unwrap().as_ref(),
        forges::gzipped_payload().as_slice()
    );
}

async fn a_refused_gitlab_request_is_held_then_answered_no_job(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&g.app).await;
    heartbeat_broken(&g.app, &runner).await;
    g.gitlab.enqueue();
    let started = Instant::now();
    let r = request_job(&g.app, GITLAB_TOKEN, Some("17")).await;
    let held = started.elapsed();
    // As GitLab answers a paused runner: 204 with its own last_update, never a 403.
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(header(&r, "x-gitlab-last-update"), Some("17"));
    assert_eq!(header(&r, "x-leasegate-refusal"), Some("probe_failed"));
    assert!(
        held >= Duration::from_millis(1900) && held < Duration::from_secs(4),
        "held {held:?}"
    );
    assert_eq!(g.gitlab.calls_to(JOBS_REQUEST), 0);
    assert_eq!(g.gitlab.queued().len(), 1);
    // Without a last_update the hold is the same, and the header is left out.
    let r = request_job(&g.app, GITLAB_TOKEN, None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(r.headers().get("x-gitlab-last-update").is_none());
}

async fn a_held_gitlab_request_goes_through_once_the_runner_may_work(engine: Engine) {
    let Some(g) = gated(engine, |a| a.forge_hold_s = 10).await else {
        return;
    };
    let runner = bound_runner(&g.app).await;
    heartbeat_broken(&g.app, &runner).await;
    let id = g.gitlab.enqueue();
    let started = Instant::now();
    let pending = {
        let (client, url) = (g.app.client.clone(), g.app.url(JOBS_REQUEST));
        tokio::spawn(async move {
            client
                .post(url)
                .json(&json!({"token": GITLAB_TOKEN, "info": {}}))
                .send()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    heartbeat_healthy(&g.app, &runner).await;
    let r = pending.await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "forwarded after {:?}",
        started.elapsed()
    );
    let job: Value = r.json().await.unwrap();
    assert_eq!(job["id"], id);
    assert_eq!(g.gitlab.claimed(), vec![(id, GITLAB_TOKEN.to_string())]);
}

async fn unbound_forge_runners_are_refused_or_passed_as_configured(engine: Engine) {
    let other = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9";
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    g.forgejo.add_runner(other, "other-token");
    g.forgejo.enqueue();
    let r = fetch_task(&g.app, other, "other-token", false).await;
    assert_eq!(header(&r, "x-leasegate-refusal"), Some("unknown_runner"));
    // No uuid at all is no better.
    let r = g
        .app
        .client
        .post(g.app.url(FETCH_TASK))
        .header("content-type", "application/proto")
        .body(vec![])
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "x-leasegate-refusal"), Some("unknown_runner"));
    let r = request_job(&g.app, "glrt-unbound", None).await;
    assert_eq!(
        (r.status(), header(&r, "x-leasegate-refusal")),
        (StatusCode::NO_CONTENT, Some("unknown_runner"))
    );
    assert_eq!(
        g.forgejo.calls_to(FETCH_TASK) + g.gitlab.calls_to(JOBS_REQUEST),
        0
    );

    let Some(pass) = gated(engine, |a| {
        a.forge_unbound = leasegate::config::ForgeUnbound::Pass
    })
    .await
    else {
        return;
    };
    pass.forgejo.add_runner(other, "other-token");
    let id = pass.forgejo.enqueue();
    let r = fetch_task(&pass.app, other, "other-token", false).await;
    assert!(r.headers().get("x-leasegate-refusal").is_none());
    let answer = runner_v1::FetchTaskResponse::decode(r.bytes().await.unwrap().as_ref()).unwrap();
    assert_eq!(answer.task.unwrap().id, id);
    // The forge still checks the token of what is forwarded: a spoofed uuid gets nothing.
    let r = fetch_task(&pass.app, UUID, "not-its-token", false).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

async fn a_pool_that_observes_forwards_and_records_what_it_would_refuse(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&g.app).await;
    g.app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A], "gate_mode": "observe"}),
        )
        .await;
    heartbeat_broken(&g.app, &runner).await;
    let id = g.forgejo.enqueue();
    let r = fetch_task(&g.app, UUID, FORGEJO_TOKEN, false).await;
    assert_eq!(header(&r, "x-leasegate-would-refuse"), Some("probe_failed"));
    assert!(r.headers().get("x-leasegate-refusal").is_none());
    let answer = runner_v1::FetchTaskResponse::decode(r.bytes().await.unwrap().as_ref()).unwrap();
    assert_eq!(answer.task.unwrap().id, id);
    // GitLab: forwarded at once, unheld.
    g.gitlab.enqueue();
    let started = Instant::now();
    let r = request_job(&g.app, GITLAB_TOKEN, None).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(header(&r, "x-leasegate-would-refuse"), Some("probe_failed"));
    assert!(started.elapsed() < Duration::from_secs(1));
    // Recorded and counted as in enforce.
    let view = g.app.runner(&runner.id).await;
    assert_eq!(view["refusals"][0]["code"], "probe_failed");
    let metrics = g.app.metrics_text().await;
    assert!(metrics.contains(r#"leasegate_forge_fetches_total{forge="gitlab",outcome="observed",code="probe_failed"} 1"#), "{metrics}");
    // leasegate's own queue in an observing pool: granted, and marked.
    g.app.enqueue("linux").await;
    let r = g.app.lease(&runner.failing("crun missing")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-leasegate-would-refuse"), Some("probe_failed"));
}

async fn bindings_are_one_runner_each_and_revoking_frees_them(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let app = &g.app;
    let first = bound_runner(app).await;
    // Another runner may not claim them, at registration or later.
    let token = app.registration_token("linux").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": token, "name": "build-02", "public_key": key.public_jwk(),
        "forge_runners": [{"kind": "gitea", "uuid": UUID.to_uppercase()}]}),
        )
        .await;
    expect_problem(
        r,
        "a taken uuid at registration",
        StatusCode::CONFLICT,
        "forge_runner_taken",
    )
    .await;
    // ... and the token was not spent.
    let r = app.post("/api/v1/runners", json!({"registration_token": token, "name": "build-02", "public_key": key.public_jwk()})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let second: Value = r.json().await.unwrap();
    let second = second["runner_id"].as_str().unwrap().to_string();
    let put = |id: &str, body: Value| {
        let path = format!("/api/v1/admin/runners/{id}/forge-runners");
        async move { app.admin_put(&path, body).await }
    };
    let r = put(
        &second,
        json!({"forge_runners": [{"kind": "forgejo", "uuid": UUID}]}),
    )
    .await;
    expect_problem(
        r,
        "a taken uuid by PUT",
        StatusCode::CONFLICT,
        "forge_runner_taken",
    )
    .await;
    for (case, body) in [
        (
            "a bad uuid",
            json!({"forge_runners": [{"kind": "forgejo", "uuid": "nope"}]}),
        ),
        (
            "an upper-case sha",
            json!({"forge_runners": [{"kind": "gitlab", "token_sha256": sha256_hex("x").to_uppercase()}]}),
        ),
        (
            "a raw token",
            json!({"forge_runners": [{"kind": "gitlab", "token": "glrt-x"}]}),
        ),
        (
            "an unknown forge",
            json!({"forge_runners": [{"kind": "github", "uuid": UUID}]}),
        ),
    ] {
        expect_problem(
            put(&second, body).await,
            case,
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    // The owner replaces its set; what it drops is free.
    let r = put(
        &first.id,
        json!({"forge_runners": [{"kind": "gitlab", "token_sha256": sha256_hex(GITLAB_TOKEN)}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let view: Value = r.json().await.unwrap();
    assert_eq!(view["forge_runners"].as_array().unwrap().len(), 1);
    assert_eq!(
        view["forge_runners"][0]["token_sha256"],
        sha256_hex(GITLAB_TOKEN)
    );
    let r = put(
        &second,
        json!({"forge_runners": [{"kind": "forgejo", "uuid": UUID}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    // Revoking frees a runner's forge runners.
    app.admin_post(
        &format!("/api/v1/admin/runners/{}/revoke", first.id),
        json!({}),
    )
    .await;
    let r = put(&second, json!({"forge_runners": [{"kind": "forgejo", "uuid": UUID}, {"kind": "gitlab", "token_sha256": sha256_hex(GITLAB_TOKEN)}]})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = put(&first.id, json!({"forge_runners": []})).await;
    expect_problem(
        r,
        "a revoked runner",
        StatusCode::CONFLICT,
        "runner_revoked",
    )
    .await;
    expect_problem(
        put("no-such-runner", json!({"forge_runners": []})).await,
        "unknown",
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
}

async fn a_job_offered_only_to_broken_runners_stays_queued_until_a_healthy_one_takes_it(
    engine: Engine,
) {
    let Some(g) = gated(engine, |a| a.forge_hold_s = 1).await else {
        return;
    };
    let app = &g.app;
    app.pool("linux", &[IMAGE_A]).await;
    // Three machines: a broken runtime, a superseded image, and a healthy one that comes last.
    let uuids = [
        "11111111-1111-4111-8111-111111111111",
        "22222222-2222-4222-8222-222222222222",
        "33333333-3333-4333-8333-333333333333",
    ];
    let mut runners = Vec::new();
    for (i, uuid) in uuids.iter().enumerate() {
        g.forgejo.add_runner(uuid, &format!("token-{i}"));
        let token = app.registration_token("linux").await;
        let key = leasegate::agent::keys::RunnerKey::generate();
        let r = app.post("/api/v1/runners", json!({"registration_token": token, "name": format!("m{i}"), "public_key": key.public_jwk(),
            "forge_runners": [{"kind": "forgejo", "uuid": uuid}]})).await;
        let id = r.json::<Value>().await.unwrap()["runner_id"]
            .as_str()
            .unwrap()
            .to_string();
        runners.push(TestRunner {
            id,
            pool: "linux".into(),
            key,
        });
    }
    assert_eq!(
        app.heartbeat(&runners[0].failing("crun not found"))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        app.heartbeat(&runners[1].attest(json!({"image": {"id": IMAGE_B}})))
            .await
            .status(),
        StatusCode::OK
    );
    let job = g.forgejo.enqueue();
    for _ in 0..5 {
        for (i, uuid) in uuids[..2].iter().enumerate() {
            let r = fetch_task(app, uuid, &format!("token-{i}"), false).await;
            assert!(r.headers().contains_key("x-leasegate-refusal"));
        }
    }
    // Asked ten times by broken runners: still queued, never claimed, no attempt counted.
    assert_eq!(g.forgejo.queued(), vec![job]);
    assert!(g.forgejo.claimed().is_empty());
    heartbeat_healthy(app, &runners[2]).await;
    let r = fetch_task(app, uuids[2], "token-2", false).await;
    let answer = runner_v1::FetchTaskResponse::decode(r.bytes().await.unwrap().as_ref()).unwrap();
    assert_eq!(answer.task.unwrap().id, job);
    assert_eq!(g.forgejo.claimed(), vec![(job, uuids[2].to_string())]);
    // The same on GitLab.
    assert_eq!(
        app.heartbeat(&runners[0].failing("crun not found"))
            .await
            .status(),
        StatusCode::OK
    );
    let gl = g.gitlab.enqueue();
    let r = app.admin_put(
        &format!("/api/v1/admin/runners/{}/forge-runners", runners[0].id),
        json!({"forge_runners": [{"kind": "gitlab", "token_sha256": sha256_hex(GITLAB_TOKEN)}]}),
    ).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = request_job(app, GITLAB_TOKEN, None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(g.gitlab.queued(), vec![gl]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forge_that_is_down_or_silent_is_a_502_or_a_504() {
    let (_held, refusing) = refusing_address();
    let app = spawn_app_with(move |a| a.gitlab_upstream = Some(format!("http://{refusing}"))).await;
    let r = app
        .client
        .get(app.url("/api/v4/jobs/7"))
        .send()
        .await
        .unwrap();
    let body = expect_problem(
        r,
        "a forge that is down",
        StatusCode::BAD_GATEWAY,
        "forge_unreachable",
    )
    .await;
    assert!(
        body["detail"].as_str().unwrap().contains("refused"),
        "{body}"
    );
    let gitlab = forges::gitlab(1).await;
    let base = gitlab.base.clone();
    let app = spawn_app_with(move |a| {
        a.gitlab_upstream = Some(base);
        a.forge_timeout_s = 1;
    })
    .await;
    let r = app
        .client
        .get(app.url("/api/v4/slow/3"))
        .send()
        .await
        .unwrap();
    expect_problem(
        r,
        "a forge that says nothing",
        StatusCode::GATEWAY_TIMEOUT,
        "forge_timeout",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_upload_and_a_55_s_held_request_pass_through() {
    use sha2::{Digest, Sha256};
    let forgejo = forges::forgejo().await;
    let base = forgejo.base.clone();
    let app = spawn_app_with(move |a| a.forgejo_upstream = Some(base)).await;
    // 200 MB, streamed in 1 MiB chunks, hashed on both sides.
    const CHUNK: usize = 1 << 20;
    const CHUNKS: usize = 200;
    let chunk: Vec<u8> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
    let mut hasher = Sha256::new();
    for _ in 0..CHUNKS {
        hasher.update(&chunk);
    }
    let expected = hex::encode(hasher.finalize());
    let stream = futures_stream(chunk, CHUNKS);
    let held = {
        let (client, url) = (app.client.clone(), app.url("/api/actions_pipeline/slow/55"));
        tokio::spawn(async move {
            let started = Instant::now();
            let r = client.get(url).send().await.unwrap();
            (r.status(), r.text().await.unwrap(), started.elapsed())
        })
    };
    let r = app
        .client
        .post(app.url("/api/actions_pipeline/upload"))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let got: Value = r.json().await.unwrap();
    assert_eq!(got["bytes"], (CHUNK * CHUNKS) as u64);
    assert_eq!(got["sha256"], expected);
    let (status, text, took) = held.await.unwrap();
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::OK, "held and answered")
    );
    assert!(took >= Duration::from_secs(55));
}

/// `count` copies of `chunk`, as a body stream.
pub(crate) fn futures_stream(
    chunk: Vec<u8>,
    count: usize,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    futures_util::stream::iter((0..count).map(move |_| Ok(chunk.clone())))
}

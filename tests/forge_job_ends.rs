//! Ejection from what the jobs say through the forge gate: GitLab's final job update
//! (`failure_reason` `runner_system_failure` or `image_pull_failure`, the job's runner known
//! from the `201` the gate relayed) and Forgejo's final `UpdateTask` (a failure in which no
//! step started) count against the machine, once however often they are repeated; a job the
//! machine ran to its end resets the count; a report the forge refuses counts for nothing; and
//! three in a row eject the runner, whose next fetch the gate answers "no work".

use crate::common;

use common::forges::{self, FETCH_TASK, FORGEJO_TOKEN, Gated, JOBS_REQUEST, UUID, runner_v1};
use common::*;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};

const GITLAB_TOKEN: &str = "glrt-ejection-token";

fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// A runner of pool `linux` named `name`, bound to `forge_runners`, healthy.
async fn runner_with(app: &TestApp, name: &str, forge_runners: Value) -> TestRunner {
    let token = app.registration_token("linux").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": token, "name": name, "public_key": key.public_jwk(),
                   "forge_runners": forge_runners}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let body: Value = r.json().await.unwrap();
    let runner = TestRunner {
        id: body["runner_id"].as_str().unwrap().into(),
        pool: "linux".into(),
        key,
    };
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    runner
}

/// The service in front of the test forges, which check job reports, and a pool of three
/// healthy runners (ejecting after `consecutive_failures`): the GitLab runner's, the Forgejo
/// runner's, and one more, so that one may be ejected.
async fn setup(engine: Engine) -> Option<(Gated, TestRunner, TestRunner)> {
    let g = forges::gated(engine, GITLAB_TOKEN, 1, |_| {}).await?;
    g.gitlab.check_reports();
    g.forgejo.check_reports();
    let r = g
        .app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A], "ejection": {"consecutive_failures": 3}}),
        )
        .await;
    assert!(r.status().is_success(), "pool: {}", r.status());
    let gitlab = runner_with(
        &g.app,
        "gitlab-machine",
        json!([{"kind": "gitlab", "token_sha256": sha256_hex(GITLAB_TOKEN)}]),
    )
    .await;
    let forgejo = runner_with(
        &g.app,
        "forgejo-machine",
        json!([{"kind": "forgejo", "uuid": UUID}]),
    )
    .await;
    runner_with(&g.app, "spare", json!([])).await;
    Some((g, gitlab, forgejo))
}

/// gitlab-runner's job request through the gate.
async fn request_job(app: &TestApp) -> reqwest::Response {
    app.client
        .post(app.url(JOBS_REQUEST))
        .json(&json!({"token": GITLAB_TOKEN, "info": {"name": "gitlab-runner"}}))
        .send()
        .await
        .unwrap()
}

/// A job taken by the GitLab runner through the gate: its id.
async fn take_gitlab_job(g: &Gated) -> i64 {
    g.gitlab.enqueue();
    let r = request_job(&g.app).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let job: Value = r.json().await.unwrap();
    job["id"].as_i64().unwrap()
}

/// gitlab-runner's job update through the gate, with the job's token (or `token`).
async fn update_job(app: &TestApp, id: i64, body: Value) -> StatusCode {
    let mut body = body;
    if body.get("token").is_none() {
        body["token"] = json!(format!("job-token-{id}"));
    }
    app.client
        .put(app.url(&format!("/api/v4/jobs/{id}")))
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
}

fn failed(reason: &str) -> Value {
    json!({"state": "failed", "failure_reason": reason, "exit_code": 1})
}

async fn failures_in_a_row(app: &TestApp, runner: &TestRunner) -> i64 {
    app.runner(&runner.id).await["ejection"]["failures_in_a_row"]
        .as_i64()
        .unwrap()
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

each_engine!(
    gitlab_system_failures_eject_once_each_and_a_script_failure_resets,
    a_job_update_the_forge_refuses_counts_for_nothing,
    forgejo_tasks_that_never_started_a_step_eject,
);

async fn gitlab_system_failures_eject_once_each_and_a_script_failure_resets(engine: Engine) {
    let Some((g, runner, _)) = setup(engine).await else {
        return;
    };
    let app = &g.app;
    // A runner system failure, repeated as gitlab-runner repeats a final update: counted once.
    let first = take_gitlab_job(&g).await;
    for _ in 0..3 {
        assert_eq!(
            update_job(app, first, failed("runner_system_failure")).await,
            StatusCode::OK
        );
    }
    assert_eq!(failures_in_a_row(app, &runner).await, 1);
    // A running update is not an end; the job's own failure is the machine running it.
    let second = take_gitlab_job(&g).await;
    assert_eq!(
        update_job(app, second, json!({"state": "running"})).await,
        StatusCode::OK
    );
    assert_eq!(failures_in_a_row(app, &runner).await, 1);
    assert_eq!(
        update_job(app, second, failed("script_failure")).await,
        StatusCode::OK
    );
    assert_eq!(failures_in_a_row(app, &runner).await, 0, "reset");

    for reason in [
        "runner_system_failure",
        "image_pull_failure",
        "runner_system_failure",
    ] {
        let id = take_gitlab_job(&g).await;
        assert_eq!(update_job(app, id, failed(reason)).await, StatusCode::OK);
    }
    let shown = app.runner(&runner.id).await;
    assert_eq!(shown["status"], "ejected", "{shown}");
    assert_eq!(
        shown["ejection"]["ejected"]["failures"],
        json!({"runner_system_failure": 2, "image_pull_failure": 1})
    );
    // Ejected: the next job request gets GitLab's "no job", and the forge is not asked.
    g.gitlab.enqueue();
    let asked = g.gitlab.calls_to(JOBS_REQUEST);
    let r = request_job(app).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(header(&r, "x-leasegate-refusal"), Some("runner_ejected"));
    assert_eq!(g.gitlab.calls_to(JOBS_REQUEST), asked);
    let text = app.metrics_text().await;
    assert!(
        text.contains(
            r#"leasegate_ejections_total{pool="linux",reason="runner_system_failure"} 1"#
        ),
        "{text}"
    );
}

async fn a_job_update_the_forge_refuses_counts_for_nothing(engine: Engine) {
    let Some((g, runner, _)) = setup(engine).await else {
        return;
    };
    let app = &g.app;
    let id = take_gitlab_job(&g).await;
    // Anyone may send a job update naming a job; without its token GitLab refuses it, and it
    // must not count against the machine that took the job.
    for _ in 0..5 {
        let forged = json!({"token": "not-the-job-token", "state": "failed",
                            "failure_reason": "runner_system_failure"});
        assert_eq!(update_job(app, id, forged).await, StatusCode::FORBIDDEN);
    }
    // Nor does a job the gate never saw handed out.
    assert_eq!(
        update_job(app, 999, failed("runner_system_failure")).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(failures_in_a_row(app, &runner).await, 0);
    assert_eq!(app.runner(&runner.id).await["status"], "healthy");
}

/// forgejo-runner's fetch through the gate: its status, its refusal header, the task's id if
/// one came.
async fn fetch_task(app: &TestApp) -> (StatusCode, Option<String>, Option<i64>) {
    let r = app
        .client
        .post(app.url(FETCH_TASK))
        .header("connect-protocol-version", "1")
        .header("content-type", "application/proto")
        .header("x-runner-uuid", UUID)
        .header("x-runner-token", FORGEJO_TOKEN)
        .body(runner_v1::FetchTaskRequest { tasks_version: 0 }.encode_to_vec())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let refusal = header(&r, "x-leasegate-refusal").map(str::to_string);
    let bytes = r.bytes().await.unwrap();
    let task = runner_v1::FetchTaskResponse::decode(bytes.as_ref())
        .ok()
        .and_then(|t| t.task)
        .map(|t| t.id);
    (status, refusal, task)
}

/// forgejo-runner's final `UpdateTask`: `result` (2 failure, 1 success), steps started or not.
async fn update_task(app: &TestApp, task: i64, result: i32, started: &[bool]) -> StatusCode {
    let at = Some(runner_v1::Timestamp {
        seconds: 1_800_000_000,
        nanos: 0,
    });
    let steps = started
        .iter()
        .enumerate()
        .map(|(i, s)| runner_v1::StepState {
            id: i as i64,
            result: if *s { result } else { 3 },
            started_at: if *s { at.clone() } else { None },
            stopped_at: if *s { at.clone() } else { None },
        })
        .collect();
    let body = runner_v1::UpdateTaskRequest {
        state: Some(runner_v1::TaskState {
            id: task,
            result,
            started_at: at.clone(),
            stopped_at: at,
            steps,
        }),
    };
    app.client
        .post(app.url("/api/actions/runner.v1.RunnerService/UpdateTask"))
        .header("connect-protocol-version", "1")
        .header("content-type", "application/proto")
        .header("x-runner-uuid", UUID)
        .header("x-runner-token", FORGEJO_TOKEN)
        .body(body.encode_to_vec())
        .send()
        .await
        .unwrap()
        .status()
}

async fn take_task(g: &Gated) -> i64 {
    g.forgejo.enqueue();
    let (status, _, task) = fetch_task(&g.app).await;
    assert_eq!(status, StatusCode::OK);
    task.expect("a task")
}

async fn forgejo_tasks_that_never_started_a_step_eject(engine: Engine) {
    let Some((g, _, runner)) = setup(engine).await else {
        return;
    };
    let app = &g.app;
    let first = take_task(&g).await;
    // forgejo-runner retries its final update: counted once.
    for _ in 0..2 {
        assert_eq!(
            update_task(app, first, 2, &[false, false]).await,
            StatusCode::OK
        );
    }
    assert_eq!(failures_in_a_row(app, &runner).await, 1);
    // A failure in which a step ran is the job's: reset.
    let second = take_task(&g).await;
    assert_eq!(
        update_task(app, second, 2, &[true, false]).await,
        StatusCode::OK
    );
    assert_eq!(failures_in_a_row(app, &runner).await, 0);
    for _ in 0..3 {
        let task = take_task(&g).await;
        assert_eq!(update_task(app, task, 2, &[false]).await, StatusCode::OK);
    }
    let shown = app.runner(&runner.id).await;
    assert_eq!(shown["status"], "ejected", "{shown}");
    assert_eq!(
        shown["ejection"]["ejected"]["failures"],
        json!({"no_step_started": 3})
    );
    g.forgejo.enqueue();
    let (status, refusal, task) = fetch_task(app).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(task, None);
    assert_eq!(refusal.as_deref(), Some("runner_ejected"));
}

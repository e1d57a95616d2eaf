//! Every error `code` of PROTOCOL.md that tests/lease_flow.rs does not already cover, over the
//! real listener: malformed requests, credentials, unknown things, registration, pools, the
//! lease refusals of rules 7–12 with their `Retry-After`, and what the heartbeat, `gate/check`,
//! the drift report and the pool grace answer.

use crate::common;

use common::*;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The problem's `detail` as a string.
fn detail(body: &Value) -> &str {
    body["detail"].as_str().unwrap()
}

/// A lease refusal (rules 7–13): 409, `code`, and a `Retry-After` of whole seconds.
async fn refused(app: &TestApp, case: &str, attestation: &str, code: &str) -> Value {
    let r = app.lease(attestation).await;
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let body = expect_problem(r, case, StatusCode::CONFLICT, code).await;
    let secs: u64 = retry_after
        .unwrap_or_else(|| panic!("{case}: a refusal without Retry-After"))
        .parse()
        .unwrap_or_else(|_| panic!("{case}: Retry-After is not a number of seconds"));
    assert!(secs >= 1, "{case}: Retry-After {secs}");
    body
}

async fn heartbeat_body(app: &TestApp, attestation: &str) -> Value {
    let r = app.heartbeat(attestation).await;
    assert_eq!(r.status(), StatusCode::OK, "heartbeat");
    r.json().await.unwrap()
}

async fn gate_check(app: &TestApp, attestation: &str) -> Value {
    let r = app
        .forge_post("/api/v1/gate/check", json!({"attestation": attestation}))
        .await;
    assert_eq!(r.status(), StatusCode::OK, "gate/check");
    r.json().await.unwrap()
}

async fn send_raw(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Response {
    let mut req = app
        .client
        .request(method, app.url(path))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

async fn put_pool(app: &TestApp, name: &str, body: Value) -> Response {
    app.admin_put(&format!("/api/v1/admin/pools/{name}"), body)
        .await
}

/// A raw HTTP/1.1 exchange, for what reqwest will not send (a chunked body of unknown length).
/// Returns the status, the header block (lowercased) and the body.
async fn raw_http(app: &TestApp, request: &[u8]) -> (u16, String, String) {
    let addr = app.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it has read everything; that is its right.
    let _ = stream.write_all(request).await;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    (status, head.to_ascii_lowercase(), body.to_string())
}

// ---------------------------------------------------------------------------------------------
// 400 bad_request
// ---------------------------------------------------------------------------------------------

fn oversized_heartbeat() -> String {
    let body = json!({"attestation": "a".repeat(70_000)}).to_string();
    assert!(body.len() > 65_536);
    body
}

async fn register_with(app: &TestApp, token: &str, name: &str) -> Response {
    let key = leasegate::agent::keys::RunnerKey::generate();
    app.post(
        "/api/v1/runners",
        json!({"registration_token": token, "name": name, "public_key": key.public_jwk(), "labels": {}}),
    )
    .await
}

each_engine!(
    malformed_json_is_a_bad_request,
    json_with_trailing_characters_is_a_bad_request,
    a_wrong_field_type_is_a_bad_request_naming_the_field,
    an_empty_body_is_a_bad_request,
    wait_s_outside_0_to_30_is_a_bad_request_and_spends_nothing,
    missing_or_bad_credentials_are_unauthorized_with_www_authenticate,
    the_other_party_token_is_forbidden,
    unknown_things_are_not_found,
    a_wrong_method_is_method_not_allowed,
    a_body_over_the_limit_is_payload_too_large,
    a_chunked_body_over_the_limit_is_payload_too_large,
    a_body_at_the_limit_is_read,
    a_request_head_over_8_kib_is_refused_and_the_service_goes_on,
    registration_tokens_are_single_use_and_expire,
    a_taken_name_is_runner_exists_and_keeps_the_token,
    enqueue_to_an_unknown_pool_is_unknown_pool,
    a_manual_enforce_pool_without_images_is_unprocessable,
    idempotency_key_returns_the_existing_job_even_when_the_body_differs,
    a_cordoned_runner_is_refused_until_uncordoned,
    a_stale_probe_is_refused,
    an_unresolved_registry_pool_refuses_leases,
    an_enforce_pool_needs_an_image_id,
    the_runner_list_pages_and_filters_on_the_server,
    a_pool_put_without_grace_replaces_its_image_at_once,
    image_drift_names_both_digests,
    report_and_off_pools_never_refuse_for_images,
    the_heartbeat_reports_status_and_image_currency,
    gate_check_answers_allow_or_refuse_with_200,
    the_drift_report_fails_closed,
    the_previous_image_leases_inside_the_grace_but_is_told_to_recycle,
    without_a_grace_the_previous_image_is_refused_at_once,
);

async fn malformed_json_is_a_bad_request(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let post = reqwest::Method::POST;
    for (case, path, token, body) in [
        (
            "heartbeat",
            "/api/v1/runners/heartbeat",
            None,
            "{\"attestation\": ",
        ),
        ("lease", "/api/v1/lease", None, "{attestation: 'x'}"),
        ("register", "/api/v1/runners", None, "not json at all"),
        (
            "enqueue",
            "/api/v1/jobs",
            Some(FORGE),
            "{\"pool\": \"linux\",}",
        ),
        ("gate/check", "/api/v1/gate/check", Some(FORGE), "[1, 2"),
        ("a JSON string", "/api/v1/lease", None, "\"attestation\""),
    ] {
        let r = send_raw(&app, post.clone(), path, token, body).await;
        expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
    }
    let r = send_raw(
        &app,
        reqwest::Method::PUT,
        "/api/v1/admin/pools/linux",
        Some(ADMIN),
        "{\"expected_image_ids\": [",
    )
    .await;
    expect_problem(r, "put pool", StatusCode::BAD_REQUEST, "bad_request").await;
    // Nothing was written: the enqueue did not create a job.
    let pools: Value = app
        .admin_get("/api/v1/admin/pools")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pools["pools"][0]["queued_jobs"], 0);
}

async fn json_with_trailing_characters_is_a_bad_request(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    for (case, body) in [
        ("trailing garbage", r#"{"pool": "linux"} x"#),
        ("two objects", r#"{"pool": "linux"}{"pool": "linux"}"#),
    ] {
        let r = send_raw(
            &app,
            reqwest::Method::POST,
            "/api/v1/jobs",
            Some(FORGE),
            body,
        )
        .await;
        expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
    }
    // Nothing was written.
    let pool: Value = app
        .admin_get("/api/v1/admin/pools/linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pool["queued_jobs"], 0);
}

async fn a_wrong_field_type_is_a_bad_request_naming_the_field(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let cases = [
        (
            "heartbeat attestation",
            "/api/v1/runners/heartbeat",
            None,
            json!({"attestation": 5}),
            "attestation",
        ),
        (
            "lease attestation",
            "/api/v1/lease",
            None,
            json!({"attestation": ["x"]}),
            "attestation",
        ),
        (
            "enqueue pool",
            "/api/v1/jobs",
            Some(FORGE),
            json!({"pool": 5}),
            "pool",
        ),
        (
            "enqueue max_attempts",
            "/api/v1/jobs",
            Some(FORGE),
            json!({"pool": "linux", "max_attempts": "3"}),
            "max_attempts",
        ),
        (
            "gate/check attestation",
            "/api/v1/gate/check",
            Some(FORGE),
            json!({"attestation": {}}),
            "attestation",
        ),
        (
            "register name",
            "/api/v1/runners",
            None,
            json!({"registration_token": "x", "name": 7, "public_key": {"kty": "OKP", "crv": "Ed25519", "x": "x"}}),
            "name",
        ),
        (
            "missing attestation",
            "/api/v1/lease",
            None,
            json!({"wait_s": 1}),
            "attestation",
        ),
    ];
    for (case, path, token, body, field) in cases {
        let r = send_raw(&app, reqwest::Method::POST, path, token, &body.to_string()).await;
        let problem = expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
        assert!(
            detail(&problem).contains(field),
            "{case}: the detail must name `{field}`: {problem}"
        );
    }
    for (case, body, field) in [
        (
            "expected_image_ids not a list",
            json!({"expected_image_ids": "sha256:x"}),
            "expected_image_ids",
        ),
        (
            "short image id",
            json!({"expected_image_ids": ["abc123"]}),
            "expected_image_ids",
        ),
        (
            "tag as image id",
            json!({"expected_image_ids": ["ci/runner:stable"]}),
            "expected_image_ids",
        ),
        (
            "drift_grace_s a string",
            json!({"expected_image_ids": [IMAGE_A], "drift_grace_s": "900"}),
            "drift_grace_s",
        ),
        (
            "unknown policy",
            json!({"expected_image_ids": [IMAGE_A], "image_policy": "strict"}),
            "image_policy",
        ),
    ] {
        let r = put_pool(&app, "linux", body).await;
        let problem = expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
        assert!(
            detail(&problem).contains(field),
            "{case}: the detail must name `{field}`: {problem}"
        );
    }
    // The rejected PUTs left the pool as it was.
    let pool: Value = app
        .admin_get("/api/v1/admin/pools/linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pool["expected_image_ids"], json!([IMAGE_A]));
    assert_eq!(pool["drift_grace_s"], 900);
}

async fn an_empty_body_is_a_bad_request(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    for (case, path, token) in [
        ("heartbeat", "/api/v1/runners/heartbeat", None),
        ("lease", "/api/v1/lease", None),
        ("register", "/api/v1/runners", None),
        ("enqueue", "/api/v1/jobs", Some(FORGE)),
        ("gate/check", "/api/v1/gate/check", Some(FORGE)),
    ] {
        let r = send_raw(&app, reqwest::Method::POST, path, token, "").await;
        expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
    }
}

async fn wait_s_outside_0_to_30_is_a_bad_request_and_spends_nothing(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let attestation = runner.healthy();
    for wait in [json!(31), json!(-1), json!("5"), json!(1000)] {
        let case = format!("wait_s {wait}");
        let r = app
            .post(
                "/api/v1/lease",
                json!({"attestation": attestation, "wait_s": wait}),
            )
            .await;
        let problem = expect_problem(r, &case, StatusCode::BAD_REQUEST, "bad_request").await;
        assert!(detail(&problem).contains("wait_s"), "{case}: {problem}");
    }
    // The attestation was neither recorded nor spent by the bad requests.
    let detail = app.runner(&runner.id).await;
    assert!(detail["last_attestation_at"].is_null(), "{detail}");
    assert_eq!(
        app.lease_wait(&attestation, 0).await.status(),
        StatusCode::NO_CONTENT
    );
    for ok in [0, 1, 30] {
        // Bounds are inclusive; a job is waiting, so even wait_s 30 answers at once.
        app.enqueue("linux").await;
        let r = app.lease_wait(&runner.healthy(), ok).await;
        assert_eq!(r.status(), StatusCode::OK, "wait_s {ok}");
    }
}

// ---------------------------------------------------------------------------------------------
// 401 unauthorized, 403 forbidden
// ---------------------------------------------------------------------------------------------
async fn missing_or_bad_credentials_are_unauthorized_with_www_authenticate(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let job = app.enqueue("linux").await;
    let endpoints: Vec<(reqwest::Method, String, Option<Value>)> = vec![
        (reqwest::Method::GET, "/api/v1/admin/pools".into(), None),
        (reqwest::Method::GET, "/api/v1/admin/runners".into(), None),
        (reqwest::Method::GET, "/api/v1/admin/drift".into(), None),
        (
            reqwest::Method::PUT,
            "/api/v1/admin/pools/other".into(),
            Some(json!({"expected_image_ids": [IMAGE_A]})),
        ),
        (
            reqwest::Method::POST,
            "/api/v1/admin/pools/linux/registration-tokens".into(),
            Some(json!({})),
        ),
        (
            reqwest::Method::POST,
            "/api/v1/jobs".into(),
            Some(json!({"pool": "linux", "payload": {}})),
        ),
        (reqwest::Method::GET, format!("/api/v1/jobs/{job}"), None),
        (
            reqwest::Method::POST,
            format!("/api/v1/jobs/{job}/cancel"),
            Some(json!({})),
        ),
        (
            reqwest::Method::POST,
            "/api/v1/gate/check".into(),
            Some(json!({"attestation": "x.y.z"})),
        ),
    ];
    for (method, path, body) in &endpoints {
        for (what, auth) in [
            ("no token", None),
            ("wrong bearer", Some("Bearer not-the-token")),
            ("empty bearer", Some("Bearer ")),
            (
                "basic scheme with the admin token",
                Some("Basic dGVzdC1hZG1pbi10b2tlbg=="),
            ),
            ("admin token without a scheme", Some(ADMIN)),
        ] {
            let case = format!("{method} {path}: {what}");
            let mut req = app.client.request(method.clone(), app.url(path));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let r = req.send().await.unwrap();
            let www = r
                .headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap().to_string());
            expect_problem(r, &case, StatusCode::UNAUTHORIZED, "unauthorized").await;
            assert!(
                www.as_deref().is_some_and(|v| v.starts_with("Bearer")),
                "{case}: WWW-Authenticate {www:?}"
            );
        }
    }
    // Nothing happened behind the failed calls.
    assert_eq!(app.job(&job).await["state"], "queued");
    assert_eq!(
        app.admin_get("/api/v1/admin/pools/other").await.status(),
        StatusCode::NOT_FOUND
    );
}

async fn the_other_party_token_is_forbidden(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let job = app.enqueue("linux").await;
    let runner = app.register("linux", "r1").await;

    // The forge token on admin endpoints.
    for (method, path) in [
        (reqwest::Method::GET, "/api/v1/admin/pools".to_string()),
        (reqwest::Method::GET, "/api/v1/admin/drift".to_string()),
        (
            reqwest::Method::GET,
            format!("/api/v1/admin/runners/{}", runner.id),
        ),
        (
            reqwest::Method::POST,
            format!("/api/v1/admin/runners/{}/cordon", runner.id),
        ),
        (
            reqwest::Method::POST,
            "/api/v1/admin/pools/linux/registration-tokens".to_string(),
        ),
        (
            reqwest::Method::PUT,
            "/api/v1/admin/pools/linux".to_string(),
        ),
    ] {
        let r = app
            .client
            .request(method.clone(), app.url(&path))
            .bearer_auth(FORGE)
            .json(&json!({"expected_image_ids": [IMAGE_B]}))
            .send()
            .await
            .unwrap();
        expect_problem(
            r,
            &format!("forge token on {method} {path}"),
            StatusCode::FORBIDDEN,
            "forbidden",
        )
        .await;
    }
    // The admin token on forge endpoints.
    for (method, path, body) in [
        (
            reqwest::Method::POST,
            "/api/v1/jobs".to_string(),
            json!({"pool": "linux"}),
        ),
        (
            reqwest::Method::GET,
            format!("/api/v1/jobs/{job}"),
            json!({}),
        ),
        (
            reqwest::Method::POST,
            format!("/api/v1/jobs/{job}/cancel"),
            json!({}),
        ),
        (
            reqwest::Method::POST,
            "/api/v1/gate/check".to_string(),
            json!({"attestation": runner.healthy()}),
        ),
    ] {
        let r = app
            .client
            .request(method.clone(), app.url(&path))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        expect_problem(
            r,
            &format!("admin token on {method} {path}"),
            StatusCode::FORBIDDEN,
            "forbidden",
        )
        .await;
    }
    // Nothing moved.
    assert_eq!(app.job(&job).await["state"], "queued");
    let detail = app.runner(&runner.id).await;
    assert_eq!(detail["cordoned"], false);
    assert!(detail["last_attestation_at"].is_null());
    let pool: Value = app
        .admin_get("/api/v1/admin/pools/linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pool["expected_image_ids"], json!([IMAGE_A]));
}

// ---------------------------------------------------------------------------------------------
// 404 not_found, 405 method_not_allowed, 413 payload_too_large
// ---------------------------------------------------------------------------------------------
async fn unknown_things_are_not_found(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let nobody = uuid::Uuid::now_v7().to_string();
    let cases = [
        ("unknown route", app.client.get(app.url("/api/v1/nope"))),
        (
            "unknown route, root",
            app.client.post(app.url("/nope")).json(&json!({})),
        ),
        (
            "unknown job",
            app.client
                .get(app.url(&format!("/api/v1/jobs/{nobody}")))
                .bearer_auth(FORGE),
        ),
        (
            "cancel unknown job",
            app.client
                .post(app.url(&format!("/api/v1/jobs/{nobody}/cancel")))
                .bearer_auth(FORGE),
        ),
        (
            "unknown runner",
            app.client
                .get(app.url(&format!("/api/v1/admin/runners/{nobody}")))
                .bearer_auth(ADMIN),
        ),
        (
            "cordon unknown runner",
            app.client
                .post(app.url(&format!("/api/v1/admin/runners/{nobody}/cordon")))
                .bearer_auth(ADMIN),
        ),
        (
            "revoke unknown runner",
            app.client
                .post(app.url(&format!("/api/v1/admin/runners/{nobody}/revoke")))
                .bearer_auth(ADMIN),
        ),
        (
            "unknown pool",
            app.client
                .get(app.url("/api/v1/admin/pools/nope"))
                .bearer_auth(ADMIN),
        ),
        (
            "registration token for an unknown pool",
            app.client
                .post(app.url("/api/v1/admin/pools/nope/registration-tokens"))
                .bearer_auth(ADMIN)
                .json(&json!({})),
        ),
    ];
    for (case, req) in cases {
        expect_problem(
            req.send().await.unwrap(),
            case,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
    }
}

async fn a_wrong_method_is_method_not_allowed(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    for (method, path) in [
        (reqwest::Method::DELETE, "/livez"),
        (reqwest::Method::POST, "/livez"),
        (reqwest::Method::GET, "/api/v1/lease"),
        (reqwest::Method::GET, "/api/v1/runners/heartbeat"),
        (reqwest::Method::PATCH, "/api/v1/admin/pools"),
    ] {
        let r = app
            .client
            .request(method.clone(), app.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        expect_problem(
            r,
            &format!("{method} {path}"),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        )
        .await;
    }
}

async fn a_body_over_the_limit_is_payload_too_large(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let r = send_raw(
        &app,
        reqwest::Method::POST,
        "/api/v1/runners/heartbeat",
        None,
        &oversized_heartbeat(),
    )
    .await;
    expect_problem(
        r,
        "heartbeat over 64 KiB",
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
}

async fn a_chunked_body_over_the_limit_is_payload_too_large(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let body = oversized_heartbeat();
    let mut request = format!(
        "POST /api/v1/runners/heartbeat HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());
    request.extend_from_slice(b"\r\n0\r\n\r\n");
    let (status, head, body) = raw_http(&app, &request).await;
    assert_eq!(status, 413, "{head}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    assert!(body.contains("\"code\":\"payload_too_large\""), "{body}");
}

async fn a_body_at_the_limit_is_read(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    // Exactly 65536 bytes: not too large, so it is judged (and here rejected as an attestation).
    let skeleton = json!({"attestation": ""}).to_string().len();
    let body = json!({"attestation": "a".repeat(65_536 - skeleton)}).to_string();
    assert_eq!(body.len(), 65_536);
    let r = send_raw(
        &app,
        reqwest::Method::POST,
        "/api/v1/runners/heartbeat",
        None,
        &body,
    )
    .await;
    expect_problem(
        r,
        "64 KiB exactly",
        StatusCode::UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
}

async fn a_request_head_over_8_kib_is_refused_and_the_service_goes_on(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    // The service reads request heads into a buffer of 8 KiB (`listener`), so that the
    // connections of waiting long polls stay small; a bigger head is refused by hyper.
    let request = format!(
        "GET /livez HTTP/1.1\r\nHost: test\r\nX-Padding: {}\r\nConnection: close\r\n\r\n",
        "p".repeat(9 * 1024)
    );
    let (status, head, _) = raw_http(&app, request.as_bytes()).await;
    assert_eq!(status, 431, "{head}");
    // A head just under the cap is read, on a kept-alive connection like any other.
    let r = app
        .client
        .get(app.url("/livez"))
        .header("x-padding", "p".repeat(7 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

// ---------------------------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------------------------
async fn registration_tokens_are_single_use_and_expire(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;

    let r = register_with(&app, "lgr_no-such-token", "r0").await;
    expect_problem(
        r,
        "unknown token",
        StatusCode::UNAUTHORIZED,
        "registration_token_invalid",
    )
    .await;

    let token = app.registration_token("linux").await;
    let first = register_with(&app, &token, "r1").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let registered: Value = first.json().await.unwrap();
    assert_eq!(registered["pool"], "linux");
    assert_eq!(registered["audience"], "leasegate");
    assert_eq!(registered["heartbeat_interval_s"], 15);
    assert_eq!(registered["attestation_max_age_s"], 60);
    assert_eq!(registered["probe_max_age_s"], 300);
    let r = register_with(&app, &token, "r2").await;
    expect_problem(
        r,
        "token used twice",
        StatusCode::UNAUTHORIZED,
        "registration_token_invalid",
    )
    .await;

    let r = app
        .admin_post(
            "/api/v1/admin/pools/linux/registration-tokens",
            json!({"ttl_s": 1}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let short: Value = r.json().await.unwrap();
    assert!(short["expires_at"].is_string());
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let r = register_with(&app, short["token"].as_str().unwrap(), "r3").await;
    expect_problem(
        r,
        "expired token",
        StatusCode::UNAUTHORIZED,
        "registration_token_invalid",
    )
    .await;

    // Only r1 exists.
    let runners: Value = app
        .admin_get("/api/v1/admin/runners")
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = runners["runners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["r1"]);
}

async fn a_taken_name_is_runner_exists_and_keeps_the_token(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    app.pool("other", &[IMAGE_A]).await;
    app.register("linux", "r1").await;

    let token = app.registration_token("linux").await;
    let r = register_with(&app, &token, "r1").await;
    expect_problem(
        r,
        "same name, same pool",
        StatusCode::CONFLICT,
        "runner_exists",
    )
    .await;
    // The refused registration did not consume the token.
    let r = register_with(&app, &token, "r2").await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "the token was consumed by a refused registration"
    );

    // The same name in another pool is another runner.
    let r = register_with(&app, &app.registration_token("other").await, "r1").await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

// ---------------------------------------------------------------------------------------------
// Pools and the forge
// ---------------------------------------------------------------------------------------------
async fn enqueue_to_an_unknown_pool_is_unknown_pool(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    for pool in ["nope", "Not A Pool Name", ""] {
        let r = app
            .forge_post("/api/v1/jobs", json!({"pool": pool, "payload": {}}))
            .await;
        expect_problem(
            r,
            &format!("pool {pool:?}"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_pool",
        )
        .await;
    }
    let pools: Value = app
        .admin_get("/api/v1/admin/pools")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pools["pools"].as_array().unwrap().len(), 1);
    assert_eq!(pools["pools"][0]["queued_jobs"], 0);
}

async fn a_manual_enforce_pool_without_images_is_unprocessable(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    for (case, body) in [
        ("empty list, defaults", json!({"expected_image_ids": []})),
        ("no list at all", json!({"image_ref": "ci/runner:stable"})),
        (
            "explicit enforce and manual",
            json!({"image_policy": "enforce", "image_source": "manual", "expected_image_ids": []}),
        ),
    ] {
        let r = put_pool(&app, "linux", body).await;
        expect_problem(
            r,
            case,
            StatusCode::UNPROCESSABLE_ENTITY,
            "pool_image_unresolved",
        )
        .await;
    }
    assert_eq!(
        app.admin_get("/api/v1/admin/pools/linux").await.status(),
        StatusCode::NOT_FOUND,
        "a refused PUT created the pool"
    );
    // On an existing pool, the refused PUT changes nothing.
    app.pool("linux", &[IMAGE_A]).await;
    let r = put_pool(&app, "linux", json!({"expected_image_ids": []})).await;
    expect_problem(
        r,
        "existing pool",
        StatusCode::UNPROCESSABLE_ENTITY,
        "pool_image_unresolved",
    )
    .await;
    let pool: Value = app
        .admin_get("/api/v1/admin/pools/linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pool["expected_image_ids"], json!([IMAGE_A]));
    assert_eq!(pool["previous_image_ids"], json!([]));
    // `report` and `off` may have no images.
    for policy in ["report", "off"] {
        let r = put_pool(&app, policy, json!({"image_policy": policy})).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{policy}");
    }
}

async fn idempotency_key_returns_the_existing_job_even_when_the_body_differs(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let r = app
        .forge_post(
            "/api/v1/jobs",
            json!({"pool": "linux", "payload": {"n": 1}, "idempotency_key": "build-42"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let first: Value = r.json().await.unwrap();
    for body in [
        json!({"pool": "linux", "payload": {"n": 1}, "idempotency_key": "build-42"}),
        json!({"pool": "linux", "payload": {"n": 2}, "max_attempts": 7, "idempotency_key": "build-42"}),
        // Even a body that could not be enqueued answers with the job its key names.
        json!({"pool": "linux", "max_attempts": 0, "idempotency_key": "build-42"}),
        json!({"pool": "No Such Pool", "idempotency_key": "build-42"}),
    ] {
        let r = app.forge_post("/api/v1/jobs", body).await;
        assert_eq!(r.status(), StatusCode::OK);
        let again: Value = r.json().await.unwrap();
        assert_eq!(again["id"], first["id"]);
        assert_eq!(again["state"], "queued");
    }
    let job = app.job(first["id"].as_str().unwrap()).await;
    assert_eq!(job["payload"], json!({"n": 1}));
    assert_eq!(job["max_attempts"], 3);
    let pools: Value = app
        .admin_get("/api/v1/admin/pools/linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pools["queued_jobs"], 1);
    // Another key is another job.
    let r = app
        .forge_post(
            "/api/v1/jobs",
            json!({"pool": "linux", "idempotency_key": "build-43"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_ne!(r.json::<Value>().await.unwrap()["id"], first["id"]);
}

// ---------------------------------------------------------------------------------------------
// Lease refusals, rules 7–12
// ---------------------------------------------------------------------------------------------
async fn a_cordoned_runner_is_refused_until_uncordoned(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;

    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/cordon", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["cordoned"], true);

    refused(&app, "cordoned", &runner.healthy(), "runner_cordoned").await;
    // Cordon comes first (rule 7), even before a failed probe.
    refused(
        &app,
        "cordoned, failed probe",
        &runner.failing("crun not found"),
        "runner_cordoned",
    )
    .await;
    assert_eq!(app.job(&job).await["state"], "queued");
    let hb = heartbeat_body(&app, &runner.healthy()).await;
    assert_eq!(hb["status"], "cordoned");
    assert_eq!(hb["code"], "runner_cordoned");
    let check = gate_check(&app, &runner.healthy()).await;
    assert_eq!(check["decision"], "refuse");
    assert_eq!(check["code"], "runner_cordoned");
    let detail = app.runner(&runner.id).await;
    assert_eq!(detail["status"], "cordoned");
    assert_eq!(detail["refusals"][0]["code"], "runner_cordoned");

    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/uncordon", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["cordoned"], false);
    assert_eq!(app.grant(&runner).await.job_id, job);
}

async fn a_stale_probe_is_refused(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;
    let stale = runner.attest(json!({"probe": {"checked_at": now_s() - 301}}));
    let body = refused(&app, "probe 301 s old", &stale, "probe_stale").await;
    assert!(detail(&body).contains("300"), "{body}");
    assert_eq!(app.job(&job).await["state"], "queued");
    let hb = heartbeat_body(
        &app,
        &runner.attest(json!({"probe": {"checked_at": now_s() - 301}})),
    )
    .await;
    assert_eq!(hb["status"], "probe_stale");
    assert_eq!(hb["code"], "probe_stale");
    // A probe 290 s old is still fresh.
    let fresh = runner.attest(json!({"probe": {"checked_at": now_s() - 290}}));
    assert_eq!(app.lease(&fresh).await.status(), StatusCode::OK);
}

async fn an_unresolved_registry_pool_refuses_leases(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let r = put_pool(
        &app,
        "reg",
        json!({"image_ref": "r/x:1", "image_source": "registry"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let pool: Value = r.json().await.unwrap();
    assert_eq!(pool["image_policy"], "enforce");
    assert_eq!(pool["image_source"], "registry");
    assert_eq!(pool["expected_image_ids"], json!([]));
    let runner = app.register("reg", "r1").await;
    let job = app.enqueue("reg").await;

    refused(
        &app,
        "unresolved pool",
        &runner.healthy(),
        "pool_image_unresolved",
    )
    .await;
    assert_eq!(app.job(&job).await["state"], "queued");
    let hb = heartbeat_body(&app, &runner.healthy()).await;
    assert_eq!(hb["status"], "pool_image_unresolved");
    assert_eq!(hb["code"], "pool_image_unresolved");
    assert!(hb["image_current"].is_null(), "{hb}");
    assert_eq!(hb["action"], "none");
}

async fn an_enforce_pool_needs_an_image_id(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;
    for (case, patch) in [
        ("no image at all", json!({"image": null})),
        (
            "no image.id",
            json!({"image": {"id": null, "ref": "ci/runner:stable"}}),
        ),
        (
            "only image.digest",
            json!({"image": {"id": null, "digest": IMAGE_A}}),
        ),
    ] {
        refused(&app, case, &runner.attest(patch), "image_unreported").await;
    }
    assert_eq!(app.job(&job).await["state"], "queued");
    let hb = heartbeat_body(&app, &runner.attest(json!({"image": null}))).await;
    assert_eq!(hb["status"], "image_unreported");
    assert!(hb["image_current"].is_null(), "{hb}");
    assert_eq!(hb["action"], "none");
}

async fn the_runner_list_pages_and_filters_on_the_server(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    for i in 0..5 {
        let r = app.register("linux", &format!("r{i}")).await;
        if i < 4 {
            app.heartbeat(
                &r.attest(json!({"host": format!("host-{i}.ci"), "agent": {"version": "1.2.3"}})),
            )
            .await;
        }
    }
    let mut seen = Vec::new();
    let mut query = "limit=2".to_string();
    loop {
        let page: Value = app
            .admin_get(&format!("/api/v1/admin/runners?{query}"))
            .await
            .json()
            .await
            .unwrap();
        let runners = page["runners"].as_array().unwrap();
        assert!(runners.len() <= 2, "{page}");
        seen.extend(
            runners
                .iter()
                .map(|r| r["name"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => query = format!("limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, ["r0", "r1", "r2", "r3", "r4"]);
    let found: Value = app
        .admin_get("/api/v1/admin/runners?q=HOST-3")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(found["runners"].as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found["runners"][0]["host"], "host-3.ci");
    assert_eq!(found["runners"][0]["agent_version"], "1.2.3");
    assert!(found["next_cursor"].is_null());
    let unknown: Value = app
        .admin_get("/api/v1/admin/runners?status=unknown")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(unknown["runners"].as_array().unwrap().len(), 1, "{unknown}");
    // A status filter pages too, and a listed runner is the whole runner (its lease, its
    // host), as its own detail shows it: the list judges from summaries, then reads the page.
    app.enqueue("linux").await;
    let r1 = app.register("linux", "r1b").await;
    let granted = app.grant(&r1).await;
    let healthy: Value = app
        .admin_get("/api/v1/admin/runners?status=healthy&limit=3")
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = healthy["runners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["r0", "r1", "r1b"], "{healthy}");
    assert_eq!(healthy["next_cursor"], "3");
    let listed = &healthy["runners"][2];
    assert_eq!(listed["current_lease"]["job_id"], granted.job_id.as_str());
    let detail = app.runner(&r1.id).await;
    assert_eq!(listed["current_lease"], detail["current_lease"], "{detail}");
    assert_eq!(healthy["runners"][0]["host"], "host-0.ci");
    let rest: Value = app
        .admin_get("/api/v1/admin/runners?status=healthy&limit=3&cursor=3")
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = rest["runners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["r2", "r3"], "{rest}");
    for bad in ["limit=0", "limit=1001", "cursor=x", "status=sleepy"] {
        let r = app.admin_get(&format!("/api/v1/admin/runners?{bad}")).await;
        expect_problem(r, bad, StatusCode::BAD_REQUEST, "bad_request").await;
    }
}

async fn a_pool_put_without_grace_replaces_its_image_at_once(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    // podman's `{{.Id}}` prints the bare hex: accepted, and stored as a full digest.
    let bare_a = IMAGE_A.trim_start_matches("sha256:");
    let pool = app.pool("linux", &[bare_a]).await;
    assert_eq!(pool["expected_image_ids"], json!([IMAGE_A]), "{pool}");
    let runner = app.register("linux", "r1").await;
    assert_eq!(
        app.lease(&runner.healthy()).await.status(),
        StatusCode::NO_CONTENT
    );
    // A wrong image fixed with `drift_grace_s: 0`: the replaced one is refused from now on.
    let r = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_B], "drift_grace_s": 0}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    refused(&app, "replaced at once", &runner.healthy(), "image_drift").await;
    // With the default grace the replaced set would still lease.
    let r = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let on_b = runner.attest(json!({"image": {"id": IMAGE_B}}));
    assert_eq!(app.lease(&on_b).await.status(), StatusCode::NO_CONTENT);
    let r = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": ["ABC"]}),
        )
        .await;
    let p = expect_problem(r, "not an image id", StatusCode::BAD_REQUEST, "bad_request").await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .starts_with("expected_image_ids[0]"),
        "{p}"
    );
}

async fn image_drift_names_both_digests(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;
    let drifted = runner.attest(json!({"image": {"id": IMAGE_B}}));
    let body = refused(&app, "drifted", &drifted, "image_drift").await;
    assert!(
        detail(&body).contains(IMAGE_B),
        "running digest missing: {body}"
    );
    assert!(
        detail(&body).contains(IMAGE_A),
        "expected digest missing: {body}"
    );
    assert_eq!(app.job(&job).await["state"], "queued");
    // Either image.id or image.digest matching is enough.
    let by_digest = runner.attest(json!({"image": {"id": IMAGE_B, "digest": IMAGE_A}}));
    assert_eq!(app.lease(&by_digest).await.status(), StatusCode::OK);
}

async fn report_and_off_pools_never_refuse_for_images(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    put_pool(
        &app,
        "rep",
        json!({"expected_image_ids": [IMAGE_A], "image_policy": "report"}),
    )
    .await;
    put_pool(&app, "rep-empty", json!({"image_policy": "report"})).await;
    put_pool(
        &app,
        "off",
        json!({"expected_image_ids": [IMAGE_A], "image_policy": "off"}),
    )
    .await;
    put_pool(
        &app,
        "reg-off",
        json!({"image_policy": "off", "image_source": "registry", "image_ref": "r/x:1"}),
    )
    .await;
    for pool in ["rep", "rep-empty", "off", "reg-off"] {
        let runner = app.register(pool, "r1").await;
        for (case, patch) in [
            ("drifted", json!({"image": {"id": IMAGE_B}})),
            ("no image", json!({"image": null})),
        ] {
            app.enqueue(pool).await;
            let r = app.lease(&runner.attest(patch)).await;
            let status = r.status();
            assert_eq!(
                status,
                StatusCode::OK,
                "{pool}, {case}: {}",
                r.text().await.unwrap()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the heartbeat and gate/check answer
// ---------------------------------------------------------------------------------------------
async fn the_heartbeat_reports_status_and_image_currency(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    put_pool(
        &app,
        "rep",
        json!({"expected_image_ids": [IMAGE_A], "image_policy": "report"}),
    )
    .await;
    put_pool(
        &app,
        "off",
        json!({"expected_image_ids": [IMAGE_A], "image_policy": "off"}),
    )
    .await;
    let runner = app.register("linux", "r1").await;

    let hb = heartbeat_body(&app, &runner.healthy()).await;
    assert_eq!(
        hb,
        json!({
            "runner_id": runner.id, "status": "healthy", "code": null, "detail": null,
            "expected_image_ids": [IMAGE_A], "image_current": true, "next_heartbeat_s": 15,
            "action": "none", "pull": [], "expected_images": [],
        })
    );

    // A failed probe is accepted and recorded: 200, with the runtime's own words.
    let hb = heartbeat_body(
        &app,
        &runner.failing("default OCI runtime \"crun\" not found:\tinvalid argument"),
    )
    .await;
    assert_eq!(hb["status"], "probe_failed");
    assert_eq!(hb["code"], "probe_failed");
    assert_eq!(
        hb["detail"],
        "cannot run a container with podman: default OCI runtime \"crun\" not found: invalid argument"
    );
    assert_eq!(app.runner(&runner.id).await["status"], "probe_failed");

    // Drifted on an enforce pool: refused for drift, and told to recycle.
    let hb = heartbeat_body(&app, &runner.attest(json!({"image": {"id": IMAGE_B}}))).await;
    assert_eq!(hb["status"], "drifted");
    assert_eq!(hb["code"], "image_drift");
    assert_eq!(hb["image_current"], false);
    assert_eq!(hb["action"], "recycle");

    // Drifted on a report pool: healthy, but told to recycle.
    let reporter = app.register("rep", "r2").await;
    let hb = heartbeat_body(&app, &reporter.attest(json!({"image": {"id": IMAGE_B}}))).await;
    assert_eq!(hb["status"], "healthy");
    assert!(hb["code"].is_null(), "{hb}");
    assert_eq!(hb["image_current"], false);
    assert_eq!(hb["action"], "recycle");
    let hb = heartbeat_body(&app, &reporter.healthy()).await;
    assert_eq!(
        (hb["image_current"].clone(), hb["action"].clone()),
        (json!(true), json!("none"))
    );

    // Off pool: images are not compared at all.
    let ignorer = app.register("off", "r3").await;
    for patch in [json!({"image": {"id": IMAGE_B}}), json!({})] {
        let hb = heartbeat_body(&app, &ignorer.attest(patch)).await;
        assert_eq!(hb["status"], "healthy");
        assert!(hb["image_current"].is_null(), "{hb}");
        assert_eq!(hb["action"], "none");
    }
}

async fn gate_check_answers_allow_or_refuse_with_200(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;

    let check = gate_check(&app, "garbage").await;
    assert_eq!(check["decision"], "refuse");
    assert_eq!(check["code"], "attestation_invalid");

    let check = gate_check(&app, &runner.healthy()).await;
    assert_eq!(check["decision"], "allow");
    assert!(check["code"].is_null(), "{check}");
    assert_eq!(check["runner_id"], runner.id.as_str());
    assert_eq!(check["pool"], "linux");

    let check = gate_check(&app, &runner.failing("crun not found")).await;
    assert_eq!(check["decision"], "refuse");
    assert_eq!(check["code"], "probe_failed");
    assert_eq!(
        check["detail"],
        "cannot run a container with podman: crun not found"
    );
    assert_eq!(check["runner_id"], runner.id.as_str());
    // A gate/check refusal is recorded like a lease refusal.
    assert_eq!(
        app.runner(&runner.id).await["refusals"][0]["code"],
        "probe_failed"
    );

    let check = gate_check(&app, &runner.attest(json!({"image": {"id": IMAGE_B}}))).await;
    assert_eq!(check["code"], "image_drift");
}

// ---------------------------------------------------------------------------------------------
// The drift report and the pool grace
// ---------------------------------------------------------------------------------------------
async fn the_drift_report_fails_closed(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    put_pool(
        &app,
        "off",
        json!({"expected_image_ids": [IMAGE_A], "image_policy": "off"}),
    )
    .await;
    put_pool(
        &app,
        "reg",
        json!({"image_ref": "r/x:1", "image_source": "registry"}),
    )
    .await;

    let drifted = app.register("linux", "drifted").await;
    heartbeat_body(&app, &drifted.attest(json!({"image": {"id": IMAGE_B}}))).await;
    let current = app.register("linux", "current").await;
    heartbeat_body(&app, &current.healthy()).await;
    let never = app.register("linux", "never-attested").await;
    let no_image = app.register("linux", "no-image").await;
    heartbeat_body(&app, &no_image.attest(json!({"image": null}))).await;
    let off = app.register("off", "off").await;
    heartbeat_body(&app, &off.attest(json!({"image": {"id": IMAGE_B}}))).await;
    let unresolved = app.register("reg", "unresolved").await;
    heartbeat_body(&app, &unresolved.attest(json!({"image": {"id": IMAGE_B}}))).await;
    let revoked = app.register("linux", "revoked").await;
    heartbeat_body(&app, &revoked.attest(json!({"image": {"id": IMAGE_B}}))).await;
    app.admin_post(
        &format!("/api/v1/admin/runners/{}/revoke", revoked.id),
        json!({}),
    )
    .await;

    let r = app.admin_get("/api/v1/admin/drift").await;
    assert_eq!(r.status(), StatusCode::OK);
    let report: Value = r.json().await.unwrap();
    assert_eq!(
        report["drifted"],
        json!([{
            "runner_id": drifted.id, "pool": "linux",
            "running_image_id": IMAGE_B, "expected_image_ids": [IMAGE_A], "images": [],
        }]),
        "{report}"
    );
    let skipped: Vec<&str> = report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert!(s["reason"].as_str().is_some_and(|r| !r.is_empty()), "{s}");
            s["runner_id"].as_str().unwrap()
        })
        .collect();
    for (what, runner) in [
        ("never attested", &never),
        ("no image.id", &no_image),
        ("off pool", &off),
        ("unresolved pool", &unresolved),
        ("revoked", &revoked),
    ] {
        assert!(
            skipped.contains(&runner.id.as_str()),
            "{what} not skipped: {report}"
        );
    }
    assert!(!skipped.contains(&current.id.as_str()), "{report}");
    assert!(!skipped.contains(&drifted.id.as_str()), "{report}");
}

async fn the_previous_image_leases_inside_the_grace_but_is_told_to_recycle(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    heartbeat_body(&app, &runner.healthy()).await;

    let r = put_pool(
        &app,
        "linux",
        json!({"expected_image_ids": [IMAGE_B], "drift_grace_s": 900}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let pool: Value = r.json().await.unwrap();
    assert_eq!(pool["expected_image_ids"], json!([IMAGE_B]));
    assert_eq!(pool["previous_image_ids"], json!([IMAGE_A]));
    assert!(pool["previous_valid_until"].is_string(), "{pool}");

    // Still leased on IMAGE_A…
    assert_eq!(
        app.lease(&runner.healthy()).await.status(),
        StatusCode::NO_CONTENT
    );
    let job = app.enqueue("linux").await;
    assert_eq!(app.grant(&runner).await.job_id, job);
    // …but drifted all the same.
    let hb = heartbeat_body(&app, &runner.healthy()).await;
    assert_eq!(hb["status"], "healthy");
    assert_eq!(hb["image_current"], false);
    assert_eq!(hb["action"], "recycle");
    assert_eq!(hb["expected_image_ids"], json!([IMAGE_B]));
    let report: Value = app
        .admin_get("/api/v1/admin/drift")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        report["drifted"][0]["runner_id"],
        runner.id.as_str(),
        "{report}"
    );
    // A runner on the new image is current.
    let hb = heartbeat_body(&app, &runner.attest(json!({"image": {"id": IMAGE_B}}))).await;
    assert_eq!(
        (hb["image_current"].clone(), hb["action"].clone()),
        (json!(true), json!("none"))
    );
}

async fn without_a_grace_the_previous_image_is_refused_at_once(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;
    let r = put_pool(
        &app,
        "linux",
        json!({"expected_image_ids": [IMAGE_B], "drift_grace_s": 0}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let body = refused(
        &app,
        "previous image, no grace",
        &runner.healthy(),
        "image_drift",
    )
    .await;
    assert!(
        detail(&body).contains(IMAGE_A) && detail(&body).contains(IMAGE_B),
        "{body}"
    );
    assert_eq!(app.job(&job).await["state"], "queued");
    let hb = heartbeat_body(&app, &runner.healthy()).await;
    assert_eq!(hb["status"], "drifted");
    assert_eq!(hb["action"], "recycle");
    let lease = app
        .lease(&runner.attest(json!({"image": {"id": IMAGE_B}})))
        .await;
    assert_eq!(lease.status(), StatusCode::OK);
}

//! What a runner's history keeps, on both engines: refusals in a row with one code are one
//! entry with its count (and the page counts them whole), a steady heartbeat adds nothing to
//! the attestation history while a change does, and status changes follow the status.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn refused(app: &TestApp, token: &str, code: &str) {
    expect_problem(app.lease(token).await, code, StatusCode::CONFLICT, code).await;
}

async fn cordon(app: &TestApp, runner: &TestRunner, action: &str) {
    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/{action}", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK, "{action}");
}

fn codes_and_counts(detail: &Value) -> Vec<(String, i64)> {
    detail["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["code"].as_str().unwrap().to_string(),
                r["count"].as_i64().unwrap(),
            )
        })
        .collect()
}

each_engine!(
    refusals_in_a_row_with_one_code_are_one_entry_with_their_count,
    a_steady_heartbeat_adds_no_history_and_a_change_does,
    a_runner_whose_clock_is_off_is_told_by_how_much_and_the_runner_records_why,
);

async fn refusals_in_a_row_with_one_code_are_one_entry_with_their_count(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    for _ in 0..5 {
        refused(&app, &runner.failing("crun not found"), "probe_failed").await;
    }
    let detail = app.runner(&runner.id).await;
    assert_eq!(
        codes_and_counts(&detail),
        vec![("probe_failed".into(), 5)],
        "{detail}"
    );
    let run = &detail["refusals"][0];
    let instant =
        |v: &Value| leasegate::domain::time::Millis::parse_rfc3339(v.as_str().unwrap()).unwrap();
    assert!(instant(&run["first_at"]) <= instant(&run["at"]), "{run}");
    assert!(
        run["detail"].as_str().unwrap().contains("crun not found"),
        "{run}"
    );

    // Another code opens the next entry; so does the same code after the runner was healthy.
    cordon(&app, &runner, "cordon").await;
    refused(&app, &runner.healthy(), "runner_cordoned").await;
    refused(&app, &runner.healthy(), "runner_cordoned").await;
    cordon(&app, &runner, "uncordon").await;
    assert_eq!(
        app.lease(&runner.healthy()).await.status(),
        StatusCode::NO_CONTENT
    );
    refused(&app, &runner.failing("crun not found"), "probe_failed").await;
    let detail = app.runner(&runner.id).await;
    assert_eq!(
        codes_and_counts(&detail),
        vec![
            ("probe_failed".into(), 1),
            ("runner_cordoned".into(), 2),
            ("probe_failed".into(), 5),
        ],
        "newest first: {detail}"
    );

    // The page counts the last hour's refusals whole, on the fleet and on the runner.
    for (path, cell) in [
        ("/admin".to_string(), r#"<td class="num">8</td>"#),
        (
            format!("/admin/runners/{}", runner.id),
            "<dt>Refusals, last hour</dt><dd>8</dd>",
        ),
    ] {
        let html = app
            .client
            .get(app.url(&path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(html.contains(cell), "{path}: {html}");
    }
}

async fn a_steady_heartbeat_adds_no_history_and_a_change_does(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    for _ in 0..10 {
        assert_eq!(
            app.heartbeat(&runner.healthy()).await.status(),
            StatusCode::OK
        );
    }
    let detail = app.runner(&runner.id).await;
    assert_eq!(
        detail["attestations"].as_array().unwrap().len(),
        1,
        "{detail}"
    );
    assert_eq!(
        detail["status_changes"].as_array().unwrap().len(),
        1,
        "{detail}"
    );

    assert_eq!(
        app.heartbeat(&runner.failing("crun not found"))
            .await
            .status(),
        StatusCode::OK
    );
    for _ in 0..3 {
        assert_eq!(
            app.heartbeat(&runner.healthy()).await.status(),
            StatusCode::OK
        );
    }
    let detail = app.runner(&runner.id).await;
    let kept: Vec<&str> = detail["attestations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        kept,
        ["healthy", "probe_failed", "healthy"],
        "newest first: {detail}"
    );
    let changes: Vec<(&Value, &str)> = detail["status_changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (&c["from"], c["to"].as_str().unwrap()))
        .collect();
    assert_eq!(
        changes,
        [
            (&json!("probe_failed"), "healthy"),
            (&json!("healthy"), "probe_failed"),
            (&Value::Null, "healthy"),
        ]
    );
    // The latest attestation is always the row's, whatever the history kept.
    assert_eq!(detail["status"], "healthy");
    assert!(detail["probe_error"].is_null(), "{detail}");
}

async fn a_runner_whose_clock_is_off_is_told_by_how_much_and_the_runner_records_why(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );

    let r = app.heartbeat(&skewed(&runner, 612)).await;
    assert_eq!(r.headers()["retry-after"], "30");
    let p = expect_problem(
        r,
        "ten minutes fast",
        StatusCode::UNAUTHORIZED,
        "clock_skew",
    )
    .await;
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("clock is 61") && detail.contains("s ahead"),
        "{p}"
    );
    let r = app.lease(&skewed(&runner, -600)).await;
    let p = expect_problem(
        r,
        "ten minutes slow",
        StatusCode::UNAUTHORIZED,
        "clock_skew",
    )
    .await;
    assert!(
        p["detail"].as_str().unwrap().contains("600 s behind"),
        "{p}"
    );

    // The runner's record says why it went quiet; nothing else about it changed.
    let detail = app.runner(&runner.id).await;
    let rejected = &detail["last_rejected_attestation"];
    assert_eq!(rejected["code"], "clock_skew", "{detail}");
    assert!(
        rejected["detail"].as_str().unwrap().contains("behind"),
        "{detail}"
    );
    assert_eq!(detail["status"], "healthy", "{detail}");
    let r = app
        .client
        .get(app.url(&format!("/admin/runners/{}", runner.id)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let html = r.text().await.unwrap();
    assert!(
        html.contains("its attestations are refused (clock_skew"),
        "{html}"
    );
    // A forged attestation (another key) for the runner notes nothing on it.
    let forger = TestRunner {
        id: runner.id.clone(),
        pool: "linux".into(),
        key: leasegate::agent::keys::RunnerKey::generate(),
    };
    let r = app
        .heartbeat(&forger.attest(json!({"iat": now_s() + 900})))
        .await;
    expect_problem(r, "forged", StatusCode::UNAUTHORIZED, "attestation_invalid").await;
    let again = app.runner(&runner.id).await;
    assert_eq!(
        again["last_rejected_attestation"],
        detail["last_rejected_attestation"]
    );
}

/// A runner whose clock is `offset_s` off, attesting as its agent would: every instant by its
/// own clock.
fn skewed(runner: &TestRunner, offset_s: i64) -> String {
    let t = now_s() + offset_s;
    runner.attest(json!({"iat": t, "exp": t + 60, "probe": {"checked_at": t}}))
}

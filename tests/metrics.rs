//! `/metrics` changes as expected across a grant, a refusal of each kind, an abandon, an
//! expiry before and after start, and rejected attestations; state gauges reflect the fleet.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::json;

/// `name{labels} value` lines, as (name, labels, value).
async fn scrape(app: &TestApp) -> Vec<(String, String, f64)> {
    let r = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("openmetrics-text")
    );
    let text = r.text().await.unwrap();
    assert!(text.trim_end().ends_with("# EOF"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = series
                .split_once('{')
                .map_or((series, ""), |(n, rest)| (n, rest.trim_end_matches('}')));
            (name.to_string(), labels.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// The value of `name` whose labels include every `k="v"` in `labels` (0 when absent).
fn value(samples: &[(String, String, f64)], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.split(',').any(|p| p == format!("{k}=\"{v}\"")))
        })
        .map(|(_, _, v)| v)
        .sum()
}

each_engine!(metrics_follow_grants_refusals_returns_and_expiries,);

async fn metrics_follow_grants_refusals_returns_and_expiries(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    app.admin_put(
        "/api/v1/admin/pools/later",
        json!({"image_ref": "r/x:1", "image_source": "registry"}),
    )
    .await;
    let runner = app.register("linux", "r1").await;
    let waiting = app.register("later", "r2").await;
    for _ in 0..3 {
        app.enqueue("linux").await;
    }

    // A grant, then an abandon (free return) that quarantines the runner.
    let lease = app.grant(&runner).await;
    let old_probe = runner.attest(json!({"probe": {"checked_at": now_s() - 1}}));
    app.call(&lease, "abandon", None).await;
    // One refusal of each kind rules 7-13 know.
    // The quarantine first: a later passing probe (image_unreported's, once the clock has
    // turned a second) lifts it, as the protocol says.
    let refusals = [
        (old_probe, "runner_quarantined"),
        (
            runner.attest(json!({"probe": {"ok": false, "error": "crun missing"}})),
            "probe_failed",
        ),
        (
            runner.attest(json!({"probe": {"checked_at": now_s() - 301}})),
            "probe_stale",
        ),
        (
            runner.attest(json!({"image": {"id": null}})),
            "image_unreported",
        ),
        (
            runner.attest(json!({"image": {"id": IMAGE_B}})),
            "image_drift",
        ),
    ];
    for (attestation, code) in &refusals {
        assert_eq!(
            code_of(app.lease(attestation).await, StatusCode::CONFLICT).await,
            *code
        );
    }
    assert_eq!(
        code_of(app.lease(&waiting.healthy()).await, StatusCode::CONFLICT).await,
        "pool_image_unresolved"
    );
    app.admin_post(
        &format!("/api/v1/admin/runners/{}/cordon", runner.id),
        json!({}),
    )
    .await;
    assert_eq!(
        code_of(app.lease(&runner.healthy()).await, StatusCode::CONFLICT).await,
        "runner_cordoned"
    );
    app.admin_post(
        &format!("/api/v1/admin/runners/{}/uncordon", runner.id),
        json!({}),
    )
    .await;
    // Rejected attestations are counted by code, and are not refusals.
    assert_eq!(
        app.heartbeat("not-a-jwt").await.status(),
        StatusCode::UNAUTHORIZED
    );

    // Expiry before start (free) and after start (attempt kept, requeued).
    let fresh = || {
        runner.attest(json!({"probe": {"checked_at": leasegate::domain::time::Millis::now().0 as f64 / 1000.0}}))
    };
    assert_eq!(app.lease(&fresh()).await.status(), StatusCode::OK);
    app.sweep_ahead(301).await;
    let r = app.lease(&fresh()).await;
    let body: serde_json::Value = r.json().await.unwrap();
    let started = Granted {
        lease_id: body["lease_id"].as_str().unwrap().into(),
        token: body["lease_token"].as_str().unwrap().into(),
        job_id: body["job"]["id"].as_str().unwrap().into(),
        body: body.clone(),
    };
    app.call(&started, "start", None).await;
    app.sweep_ahead(700).await;

    let m = scrape(&app).await;
    let linux = [("pool", "linux")];
    assert_eq!(value(&m, "leasegate_leases_granted_total", &linux), 3.0);
    for (_, code) in &refusals {
        assert_eq!(
            value(
                &m,
                "leasegate_lease_refusals_total",
                &[("pool", "linux"), ("code", code)]
            ),
            1.0,
            "{code}"
        );
    }
    assert_eq!(
        value(
            &m,
            "leasegate_lease_refusals_total",
            &[("pool", "linux"), ("code", "runner_cordoned")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "leasegate_lease_refusals_total",
            &[("pool", "later"), ("code", "pool_image_unresolved")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "leasegate_jobs_returned_total",
            &[("pool", "linux"), ("reason", "abandoned")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "leasegate_jobs_returned_total",
            &[("pool", "linux"), ("reason", "lease_expired")]
        ),
        1.0
    );
    assert_eq!(value(&m, "leasegate_attempts_used_total", &linux), 1.0);
    assert_eq!(
        value(&m, "leasegate_lease_expiry_requeues_total", &linux),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "leasegate_attestations_total",
            &[("result", "attestation_invalid")]
        ),
        1.0
    );
    assert!(
        value(
            &m,
            "leasegate_attestations_total",
            &[("result", "accepted")]
        ) >= 10.0
    );
    // State, read from the store at scrape time.
    assert_eq!(value(&m, "leasegate_queued_jobs", &linux), 3.0);
    assert!(value(&m, "leasegate_oldest_queued_job_age_seconds", &linux) >= 0.0);
    assert_eq!(
        value(
            &m,
            "leasegate_runners",
            &[("pool", "later"), ("status", "unknown")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &m,
            "leasegate_runners",
            &[("pool", "linux"), ("status", "healthy")]
        ),
        1.0
    );
    assert!(
        value(
            &m,
            "leasegate_http_request_duration_seconds_count",
            &[("route", "/api/v1/lease"), ("method", "POST")]
        ) >= 10.0
    );
    // No ids in labels.
    let text = app.metrics_text().await;
    assert!(
        !text.contains(&runner.id),
        "a runner id leaked into a label"
    );
}

/// Sends `count` requests with invented methods and paths over `connections` kept-alive
/// connections, as fast as they are answered.
async fn invented_requests(app: &TestApp, count: usize, connections: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr: std::net::SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let per = count / connections;
    let mut tasks = Vec::new();
    for c in 0..connections {
        tasks.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut buf = vec![0u8; 8192];
            for i in 0..per {
                // A new method and a new path each time; every tenth on a real route.
                let method = format!("M{c}X{i}{}", "Q".repeat(64));
                let path = if i % 10 == 0 {
                    "/metrics".to_string()
                } else {
                    format!("/made/up/{c}/{i}")
                };
                s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
                // Every answer here is a short problem with a content length: read one.
                let mut got = Vec::new();
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the service closed the connection");
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got);
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break;
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn metrics_size(app: &TestApp) -> usize {
    app.metrics_text().await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_methods_and_paths_add_no_series() {
    let app = spawn_app().await;
    // Every series a normal client makes, once.
    invented_requests(&app, 40, 4).await;
    metrics_size(&app).await;
    let before = metrics_size(&app).await;
    invented_requests(&app, 10_000, 8).await;
    let after = metrics_size(&app).await;
    // The counts grew; the series did not (a few digits more in the counters at most).
    assert!(
        after < before + 512,
        "/metrics grew from {before} to {after} bytes"
    );
    let text = app.metrics_text().await;
    assert!(text.contains("method=\"other\""));
    assert!(
        !text.contains("QQQQ") && !text.contains("/made/up"),
        "a client's text became a label"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_token_guards_metrics() {
    let app =
        spawn_app_with(|a| a.metrics_token = Some("metrics-token-0123456789abcdef0123".into()))
            .await;
    let r = app.client.get(app.url("/metrics")).send().await.unwrap();
    expect_problem(r, "no token", StatusCode::UNAUTHORIZED, "unauthorized").await;
    let r = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    expect_problem(r, "another token", StatusCode::UNAUTHORIZED, "unauthorized").await;
    let r = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth("metrics-token-0123456789abcdef0123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().trim_end().ends_with("# EOF"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_may_have_a_listener_of_their_own() {
    let app = spawn_app_with(|a| a.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let metrics = app.metrics_base.clone().expect("a metrics listener");
    let r = app.client.get(app.url("/metrics")).send().await.unwrap();
    expect_problem(
        r,
        "metrics on the main listener",
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let r = app
        .client
        .get(format!("{metrics}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("leasegate_open_connections")
    );
    let r = app
        .client
        .get(format!("{metrics}/api/v1/admin/pools"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "the metrics listener serves the API"
    );
}

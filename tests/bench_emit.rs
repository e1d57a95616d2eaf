//! `leasegate bench --emit-requests`, the Rust side of `bench/outside.sh`: the files it writes
//! parse, a live service takes each signed body once (a heartbeat accepted, a broken runner's
//! lease refused for its probe) and refuses it again as a replay, and the refused forge fetch
//! is answered by the gate without the forge, the admitted one's by the forge. Never a timing.

use crate::common;

use clap::Parser;
use common::forges::{self, FETCH_TASK};
use common::*;
use leasegate::bench::BenchArgs;
use reqwest::StatusCode;
use std::path::Path;

/// `leasegate bench`'s arguments, as the binary reads them.
#[derive(Parser)]
struct Bench {
    #[command(flatten)]
    args: BenchArgs,
}

each_engine!(emitted_requests_are_taken_once_then_refused_as_replays);

/// A `NAME.head` file: the method, the path and the header lines.
fn head(dir: &Path, name: &str) -> (String, String, Vec<(String, String)>) {
    let text = std::fs::read_to_string(dir.join(format!("{name}.head"))).unwrap();
    let mut lines = text.lines();
    let (method, path) = lines.next().unwrap().split_once(' ').unwrap();
    let headers = lines
        .map(|l| {
            let (name, value) = l.split_once(':').unwrap();
            (name.to_string(), value.trim().to_string())
        })
        .collect();
    (method.to_string(), path.to_string(), headers)
}

async fn send(app: &TestApp, dir: &Path, name: &str, body: &str) -> reqwest::Response {
    let (method, path, headers) = head(dir, name);
    assert_eq!(method, "POST");
    let mut request = app.client.post(app.url(&path)).body(body.to_string());
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.unwrap()
}

async fn emitted_requests_are_taken_once_then_refused_as_replays(engine: Engine) {
    let forgejo = forges::forgejo().await;
    let upstream = forgejo.base.clone();
    let Some(app) = spawn_app_on_with(engine, move |a| a.forgejo_upstream = Some(upstream)).await
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("requests");
    let secrets = app.state.secrets();
    let Bench { mut args } = Bench::parse_from([
        "bench",
        "--quiet",
        "--server",
        &app.base,
        "--admin-token",
        &secrets.admin,
        "--forge-token",
        &secrets.forge,
        "--runners",
        "2",
        "--broken",
        "1",
        "--jobs",
        "0",
        "--concurrency",
        "2",
        "--duration-s",
        "1",
        "--rate",
        "4",
        "--phases",
        "heartbeats,refusals,forge",
        "--emit-requests",
        dir.to_str().unwrap(),
    ]);
    args.database_url = None; // the service's own; nothing here needs its engine
    let report = leasegate::bench::run(args).await.expect("the bench runs");
    assert!(report.ops.is_empty(), "the phases were written, not sent");
    assert!(report.limits.verifications_per_second_per_core > 0.0);

    for (kind, path, first, code) in [
        (
            "heartbeats",
            "/api/v1/runners/heartbeat",
            StatusCode::OK,
            None,
        ),
        (
            "refusals",
            "/api/v1/lease",
            StatusCode::CONFLICT,
            Some("probe_failed"),
        ),
    ] {
        let (_, written_path, headers) = head(&dir, kind);
        assert_eq!(written_path, path);
        assert!(headers.contains(&("content-type".into(), "application/json".into())));
        let bodies = std::fs::read_to_string(dir.join(format!("{kind}.bodies"))).unwrap();
        let bodies: Vec<&str> = bodies.lines().collect();
        // `--rate` for `--duration-s`, and one for each client.
        assert_eq!(bodies.len(), 4 + 2, "{kind}");
        for body in &bodies {
            let parsed: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(
                parsed["attestation"].as_str().unwrap().split('.').count(),
                3
            );
        }
        for body in &bodies {
            let r = send(&app, &dir, kind, body).await;
            match code {
                None => assert_eq!(r.status(), first, "{kind}: {}", r.text().await.unwrap()),
                Some(code) => assert_eq!(code_of(r, first).await, code, "{kind}"),
            }
        }
        for body in &bodies {
            let r = send(&app, &dir, kind, body).await;
            assert_eq!(
                code_of(r, StatusCode::UNAUTHORIZED).await,
                "attestation_replayed",
                "{kind}: a second use"
            );
        }
    }

    fetch_three_times(&app, &dir, "forge-refused").await;
    assert_eq!(
        forgejo.calls_to(FETCH_TASK),
        0,
        "a refused fetch never reaches the forge"
    );

    // The admitted runner's fetch goes on to the forge, every time (the forge knows the runner
    // as Forgejo would: by the uuid and token the fetch carries).
    let (_, _, headers) = head(&dir, "forge-forwarded");
    let (_, _, refused_headers) = head(&dir, "forge-refused");
    assert_ne!(headers, refused_headers, "a forge runner of its own");
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
    };
    forgejo.add_runner(&header("x-runner-uuid"), &header("x-runner-token"));
    fetch_three_times(&app, &dir, "forge-forwarded").await;
    assert_eq!(
        forgejo.calls_to(FETCH_TASK),
        3,
        "an admitted runner's fetch reaches the forge"
    );
}

/// Sends the written fetch `name` (a `FetchTask`, one body for every request) three times;
/// each is answered 200, by the gate or by the forge.
async fn fetch_three_times(app: &TestApp, dir: &Path, name: &str) {
    let (_, path, _) = head(dir, name);
    assert_eq!(path, FETCH_TASK);
    let body = std::fs::read_to_string(dir.join(format!("{name}.body"))).unwrap();
    for _ in 0..3 {
        let r = send(app, dir, name, &body).await;
        assert_eq!(r.status(), StatusCode::OK, "{name}");
    }
}

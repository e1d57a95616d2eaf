//! The heartbeat loop on a machine whose clock is off: a small service on 127.0.0.1 that dates
//! its answers 612 s in the past (so this runner looks 612 s fast) and refuses the first
//! heartbeats as a clock skew, the way leasegate does (`401 clock_skew`, `Retry-After`) or did
//! (`401 attestation_invalid`, `probe.checked_at is in the future`). The loop must keep going,
//! log the offset at WARN, wait as told, and stop for a refusal about the key only.

use crate::common;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use common::agent::script;
use common::log::Captured;
use leasegate::agent::client::AgentClient;
use leasegate::agent::exit::Exit;
use leasegate::agent::heartbeat;
use leasegate::agent::keys::RunnerKey;
use leasegate::agent::probe::{Depth, ProbeSpec, Runtime};
use leasegate::agent::recycle::Recycler;
use leasegate::agent::state::RunnerState;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How far behind this machine the service's clock is.
const SKEW_S: i64 = 612;

/// An HTTP-date `secs_from_now` from now, as a service would put in `Date`.
fn http_date(secs_from_now: i64) -> String {
    let t = time::OffsetDateTime::now_utc() + time::Duration::seconds(secs_from_now);
    t.format(time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    ))
    .unwrap()
}

/// What the test service answers to the n-th heartbeat (0-based).
#[derive(Clone, Copy)]
enum Refusal {
    /// Today's service: `clock_skew` with `Retry-After: 1`.
    ClockSkew,
    /// An older service: `attestation_invalid` about the probe's time, no `Retry-After`.
    FutureProbe,
}

#[derive(Clone)]
struct Service {
    refusal: Refusal,
    /// How many heartbeats are refused before one is accepted.
    refuse: usize,
    /// Whether the refusals' `Date` shows the skew (else the service's clock agrees).
    skewed: bool,
    /// When each heartbeat arrived.
    seen: Arc<Mutex<Vec<Instant>>>,
    accepted: Arc<tokio::sync::Notify>,
}

async fn heartbeat_route(axum::extract::State(s): axum::extract::State<Service>) -> Response {
    let n = {
        let mut seen = s.seen.lock().unwrap();
        seen.push(Instant::now());
        seen.len() - 1
    };
    let mut headers = HeaderMap::new();
    if s.skewed {
        headers.insert(
            header::DATE,
            HeaderValue::from_str(&http_date(-SKEW_S)).unwrap(),
        );
    }
    if n < s.refuse {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let (code, detail) = match s.refusal {
            Refusal::ClockSkew => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                (
                    "clock_skew",
                    format!("the runner's clock is {SKEW_S} s ahead of the server's (leeway 30 s)"),
                )
            }
            Refusal::FutureProbe => (
                "attestation_invalid",
                "probe.checked_at is in the future".to_string(),
            ),
        };
        let body = json!({
            "type": format!("https://leasegate.dev/problems/{code}"),
            "title": "Unauthorized",
            "status": 401,
            "code": code,
            "detail": detail,
        });
        return (StatusCode::UNAUTHORIZED, headers, body.to_string()).into_response();
    }
    s.accepted.notify_one();
    let body = json!({
        "runner_id": "r-clock",
        "status": "healthy",
        "code": null,
        "detail": null,
        "expected_image_ids": [],
        "image_current": null,
        "next_heartbeat_s": 1,
        "action": "none",
    });
    (StatusCode::OK, headers, axum::Json(body)).into_response()
}

/// The test service on 127.0.0.1 and its base URL.
async fn serve(service: Service) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route(
            "/api/v1/runners/heartbeat",
            axum::routing::post(heartbeat_route),
        )
        .with_state(service);
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (base, task)
}

struct Runner {
    key: RunnerKey,
    state: RunnerState,
    spec: ProbeSpec,
    _dir: tempfile::TempDir,
}

fn runner(base: &str) -> Runner {
    let dir = tempfile::tempdir().unwrap();
    let rt = script(dir.path(), "fakepod", "echo 9.9.9-fake");
    Runner {
        key: RunnerKey::generate(),
        state: RunnerState {
            runner_id: "r-clock".into(),
            name: "build-clock".into(),
            pool: "linux".into(),
            server: base.into(),
            audience: "leasegate".into(),
            heartbeat_interval_s: 1,
            attestation_max_age_s: 60,
            probe_max_age_s: 300,
            registered_at: None,
        },
        spec: ProbeSpec {
            runtime: Runtime::new(rt.to_str().unwrap()),
            image: None,
            images: Vec::new(),
            depth: Depth::Info,
            timeout: Duration::from_secs(10),
            work_dir: None,
            disk: Default::default(),
        },
        _dir: dir,
    }
}

/// Runs the loop against `service` until just after its first accepted heartbeat (then stops
/// it), or until the loop returns by itself; gives the exit status, the log and the arrival times.
async fn beat(service: Service, once: bool) -> (Exit, String, Vec<Instant>) {
    let (base, server) = serve(service.clone()).await;
    let r = runner(&base);
    let client = AgentClient::new(&base).unwrap();
    // The loop, the client and the service all run on the test's single-threaded runtime.
    let (log, _guard) = Captured::start();

    let mut recycler = Recycler::beside(&r._dir.path().join("runner.json"));
    let stop = CancellationToken::new();
    let stopper = {
        let (stop, accepted) = (stop.clone(), service.accepted.clone());
        tokio::spawn(async move {
            accepted.notified().await;
            // Long enough for the answer to be read and logged, shorter than the next beat.
            tokio::time::sleep(Duration::from_millis(400)).await;
            stop.cancel();
        })
    };
    let exit = tokio::time::timeout(
        Duration::from_secs(30),
        heartbeat::run(
            &heartbeat::Beat {
                client: &client,
                key: &r.key,
                state: &r.state,
                spec: &r.spec,
                forge: &Default::default(),
            },
            &mut recycler,
            once,
            stop,
        ),
    )
    .await
    .expect("the loop ends within 30 s");
    stopper.abort();
    server.abort();
    let seen = service.seen.lock().unwrap().clone();
    (exit, log.text(), seen)
}

fn service(refusal: Refusal, refuse: usize, skewed: bool) -> Service {
    Service {
        refusal,
        refuse,
        skewed,
        seen: Arc::default(),
        accepted: Arc::default(),
    }
}

#[tokio::test]
async fn clock_skew_refusals_are_retried_after_retry_after_with_the_offset_at_warn() {
    let (exit, log, seen) = beat(service(Refusal::ClockSkew, 3, true), false).await;
    assert_eq!(exit, Exit::Ok, "stopped, not exited: {log}");
    assert_eq!(seen.len(), 4, "three refusals, then accepted: {log}");
    for pair in seen.windows(2) {
        let waited = pair[1] - pair[0];
        assert!(
            waited >= Duration::from_millis(900),
            "Retry-After: 1 was honoured: {waited:?}\n{log}"
        );
    }
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("clock is 612 s ahead of the server's"))
        .collect();
    assert!(
        warned
            .iter()
            .any(|l| l.contains("(by its Date header); fix this machine's time sync (NTP)")),
        "the measured offset, once: {log}"
    );
    let refusals: Vec<&&str> = warned
        .iter()
        .filter(|l| l.contains("refused for this machine's clock") && l.contains("retrying in 1 s"))
        .collect();
    assert_eq!(refusals.len(), 3, "one WARN per refusal: {log}");
    assert!(refusals[0].contains("code=clock_skew"), "{log}");
    assert!(!log.contains("exiting with status"), "{log}");
    assert!(
        log.contains(" INFO ") && log.contains("status=healthy"),
        "{log}"
    );
}

#[tokio::test]
async fn an_older_services_future_probe_refusal_is_the_clock_when_the_date_says_so() {
    let (exit, log, seen) = beat(service(Refusal::FutureProbe, 2, true), false).await;
    assert_eq!(exit, Exit::Ok, "{log}");
    assert_eq!(seen.len(), 3, "{log}");
    // No Retry-After: the heartbeat interval (1 s) instead.
    assert!(seen[1] - seen[0] >= Duration::from_millis(900), "{log}");
    assert!(
        log.contains("refused for this machine's clock: clock is 612 s ahead of the server's"),
        "{log}"
    );
    assert!(log.contains("code=attestation_invalid"), "{log}");
}

#[tokio::test]
async fn the_same_refusal_with_clocks_that_agree_is_about_the_key_and_exits_5() {
    let (exit, log, seen) = beat(service(Refusal::FutureProbe, 1, false), false).await;
    assert_eq!(exit, Exit::Error, "{log}");
    assert_eq!(seen.len(), 1);
    assert!(log.contains("exiting with status 5"), "{log}");
    assert!(!log.contains("clock is"), "{log}");
}

#[tokio::test]
async fn once_a_clock_refusal_is_status_1_not_5() {
    let (exit, log, seen) = beat(service(Refusal::ClockSkew, 1, true), true).await;
    assert_eq!(exit, Exit::Failed, "{log}");
    assert_eq!(seen.len(), 1);
    assert!(
        log.contains("refused for this machine's clock: clock is 612 s ahead of the server's")
            && log.contains("not retrying"),
        "{log}"
    );
}

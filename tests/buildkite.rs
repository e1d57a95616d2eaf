//! Buildkite agents under the gate, by pausing (issue 25), against a test double of
//! Buildkite's agents REST API that holds every request to its documented shape (the bearer
//! token, the organization's paths, the pause's `note` and `timeout_in_minutes` within
//! Buildkite's bounds, the resume's empty object) and records the calls, on both engines:
//!
//! - a refused runner's agent is paused within seconds with `leasegate: CODE: DETAIL` and the
//!   configured timeout, and resumed once its runner is admitted; another agent whose name only
//!   contains the bound one is never touched;
//! - a pause that lapsed while the refusal lasts is made again;
//! - an agent somebody else paused is left alone, and never resumed;
//! - a pool that observes pauses nothing, and counts what it would have paused;
//! - a failed call is retried after a back-off and shown on the runner until one goes through;
//! - the settings are refused at start with the setting named;
//! - `leasegate runner register --buildkite-agent-name` binds agents by name.

use crate::common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use common::*;
use leasegate::buildkite::Buildkite;
use leasegate::buildkite::watcher::watch_once;
use leasegate::domain::time::Millis;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ORG: &str = "acme";
const TOKEN: &str = "bkua_test_token_0123456789";

/// An agent as the double knows it.
#[derive(Clone, Debug)]
struct FakeAgent {
    id: String,
    name: String,
    paused: bool,
    note: Option<String>,
    by: Option<String>,
    timeout: Option<i64>,
}

impl FakeAgent {
    fn json(&self) -> Value {
        json!({
            "id": self.id, "graphql_id": format!("QWdlbnQ-{}", self.id),
            "url": format!("https://api.buildkite.com/v2/organizations/{ORG}/agents/{}", self.id),
            "web_url": format!("https://buildkite.com/organizations/{ORG}/agents/{}", self.id),
            "name": self.name, "connection_state": "connected", "hostname": self.name,
            "ip_address": "127.0.0.1", "user_agent": "buildkite-agent/3.100.0 (linux; amd64)",
            "version": "3.100.0", "created_at": "2026-12-01T09:00:00.000Z", "job": null,
            "priority": 0, "meta_data": ["queue=default"],
            "paused": self.paused,
            "paused_at": self.paused.then_some("2026-12-01T09:00:00.000Z"),
            "paused_by": self.by.as_ref().map(|n| json!({"id": "u1", "name": n, "email": "x@example.com"})),
            "paused_note": self.note, "paused_timeout_in_minutes": self.timeout,
        })
    }
}

/// A recorded call: `list`, `pause` or `resume`, the agent (or the name listed) and the body.
#[derive(Clone, Debug)]
struct Call {
    op: &'static str,
    target: String,
    body: Value,
}

#[derive(Default)]
struct Shared {
    agents: Vec<FakeAgent>,
    calls: Vec<Call>,
    violations: Vec<String>,
    failures: VecDeque<(&'static str, u16)>,
}

struct FakeBuildkite {
    url: String,
    shared: Arc<Mutex<Shared>>,
}

impl FakeBuildkite {
    async fn start(agents: &[(&str, &str)]) -> FakeBuildkite {
        let shared = Arc::new(Mutex::new(Shared {
            agents: agents
                .iter()
                .map(|(id, name)| FakeAgent {
                    id: id.to_string(),
                    name: name.to_string(),
                    paused: false,
                    note: None,
                    by: None,
                    timeout: None,
                })
                .collect(),
            ..Default::default()
        }));
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        FakeBuildkite {
            url: format!("http://{addr}"),
            shared,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> T {
        f(&mut self.shared.lock().unwrap())
    }

    fn calls_to(&self, op: &str) -> Vec<Call> {
        self.with(|s| s.calls.iter().filter(|c| c.op == op).cloned().collect())
    }

    fn agent(&self, id: &str) -> FakeAgent {
        self.with(|s| s.agents.iter().find(|a| a.id == id).unwrap().clone())
    }

    /// Somebody pauses the agent in Buildkite's UI.
    fn pause_by_person(&self, id: &str, note: &str) {
        self.with(|s| {
            let a = s.agents.iter_mut().find(|a| a.id == id).unwrap();
            a.paused = true;
            a.note = Some(note.into());
            a.by = Some("Ada Lovelace".into());
            a.timeout = Some(60);
        })
    }

    /// The pause's timeout passes: Buildkite lifts it.
    fn lapse(&self, id: &str) {
        self.with(|s| {
            let a = s.agents.iter_mut().find(|a| a.id == id).unwrap();
            a.paused = false;
            a.note = None;
            a.by = None;
            a.timeout = None;
        })
    }

    fn fail_next(&self, op: &'static str, status: u16) {
        self.with(|s| s.failures.push_back((op, status)));
    }

    fn assert_clean(&self) {
        let v = self.with(|s| s.violations.clone());
        assert!(v.is_empty(), "requests Buildkite would not take: {v:#?}");
    }
}

fn answer(status: u16, body: Value) -> Response {
    (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
}

async fn handle(State(shared): State<Arc<Mutex<Shared>>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let mut s = shared.lock().unwrap();
    let auth = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {TOKEN}")) {
        s.violations.push(format!("authorization {auth:?}"));
        return answer(401, json!({"message": "Authentication required"}));
    }
    let prefix = format!("/v2/organizations/{ORG}/agents");
    let path = parts.uri.path().to_string();
    let Some(rest) = path.strip_prefix(&prefix) else {
        s.violations.push(format!("path {path}"));
        return answer(404, json!({"message": "Not Found"}));
    };
    let segments: Vec<&str> = rest.split('/').filter(|x| !x.is_empty()).collect();
    let op: &'static str = match (&parts.method, segments.as_slice()) {
        (&Method::GET, []) => "list",
        (&Method::PUT, [_, "pause"]) => "pause",
        (&Method::PUT, [_, "resume"]) => "resume",
        _ => {
            s.violations.push(format!("{} {path}", parts.method));
            return answer(404, json!({"message": "Not Found"}));
        }
    };
    let json_body: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                s.violations.push(format!("{op}: body is not JSON: {e}"));
                return answer(400, json!({"message": "Problems parsing JSON"}));
            }
        }
    };
    if op != "list" {
        let ct = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok());
        if ct != Some("application/json") {
            s.violations.push(format!("{op}: content-type {ct:?}"));
        }
    }
    let target = match op {
        "list" => {
            let query: Vec<(String, String)> =
                reqwest::Url::parse(&format!("http://x{}", parts.uri))
                    .unwrap()
                    .query_pairs()
                    .into_owned()
                    .collect();
            for (k, v) in &query {
                let ok = match k.as_str() {
                    "name" => !v.is_empty(),
                    "per_page" => v.parse::<u32>().is_ok_and(|n| (1..=100).contains(&n)),
                    "page" => v.parse::<u32>().is_ok_and(|n| n >= 1),
                    _ => false,
                };
                if !ok {
                    s.violations.push(format!("list: query {k}={v}"));
                }
            }
            query
                .iter()
                .find(|(k, _)| k == "name")
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        }
        _ => segments[0].to_string(),
    };
    s.calls.push(Call {
        op,
        target: target.clone(),
        body: json_body.clone(),
    });
    if let Some(i) = s.failures.iter().position(|(o, _)| *o == op) {
        let (_, status) = s.failures.remove(i).unwrap();
        return answer(status, json!({"message": "Internal Server Error"}));
    }
    match op {
        "list" => {
            // Buildkite's name filter is not exact: every name containing the one asked.
            let found: Vec<Value> = s
                .agents
                .iter()
                .filter(|a| a.name.contains(&target))
                .map(FakeAgent::json)
                .collect();
            answer(200, Value::Array(found))
        }
        "pause" => {
            let shape_ok = json_body.as_object().is_some_and(|o| {
                o.keys().all(|k| k == "note" || k == "timeout_in_minutes")
                    && o.get("note")
                        .and_then(Value::as_str)
                        .is_some_and(|n| !n.is_empty())
                    && o.get("timeout_in_minutes")
                        .and_then(Value::as_i64)
                        .is_some_and(|t| (1..=10_080).contains(&t))
            });
            if !shape_ok {
                s.violations.push(format!("pause: body {json_body}"));
                return answer(422, json!({"message": "Validation failed"}));
            }
            let Some(a) = s.agents.iter_mut().find(|a| a.id == target) else {
                return answer(404, json!({"message": "No agent found"}));
            };
            if a.paused {
                return answer(422, json!({"message": "Agent is already paused"}));
            }
            a.paused = true;
            a.note = json_body["note"].as_str().map(String::from);
            a.by = Some("leasegate-bot".into());
            a.timeout = json_body["timeout_in_minutes"].as_i64();
            answer(200, a.json())
        }
        _ => {
            if json_body != json!({}) {
                s.violations.push(format!("resume: body {json_body}"));
            }
            let Some(a) = s.agents.iter_mut().find(|a| a.id == target) else {
                return answer(404, json!({"message": "No agent found"}));
            };
            if !a.paused {
                return answer(422, json!({"message": "Agent is not paused"}));
            }
            a.paused = false;
            a.note = None;
            a.by = None;
            a.timeout = None;
            answer(200, a.json())
        }
    }
}

/// The service with Buildkite's double, a runner in `gate_mode` bound to the agents named
/// `names`, its agents healthy.
struct Setup {
    app: TestApp,
    buildkite: FakeBuildkite,
    runner: TestRunner,
}

async fn setup(engine: Engine, gate_mode: &str, names: &[&str]) -> Option<Setup> {
    let buildkite = FakeBuildkite::start(&[("a1", "ci-1"), ("a10", "ci-10"), ("a2", "ci-2")]).await;
    let url = buildkite.url.clone();
    let app = spawn_app_on_with(engine, move |args| {
        args.buildkite_api_url = url;
        args.buildkite_org = Some(ORG.into());
        args.buildkite_token = Some(TOKEN.into());
        args.buildkite_pause_minutes = 10;
    })
    .await?;
    let r = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A], "gate_mode": gate_mode}),
        )
        .await;
    assert!(r.status().is_success());
    let runner = app.register("linux", "bk-1").await;
    // Healthy before its agents are bound: a bound runner that has not attested yet is
    // refused, and the watcher's own turn, which may come at any moment, would pause them.
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        reqwest::StatusCode::OK
    );
    let bindings: Vec<Value> = names
        .iter()
        .map(|n| json!({"kind": "buildkite", "agent_name": n}))
        .collect();
    let r = app
        .admin_put(
            &format!("/api/v1/admin/runners/{}/forge-runners", runner.id),
            json!({"forge_runners": bindings}),
        )
        .await;
    assert_eq!(r.status(), reqwest::StatusCode::OK, "binding");
    let view = app.runner(&runner.id).await;
    assert_eq!(
        view["forge_runners"][0],
        json!({"kind": "buildkite", "agent_name": names[0], "last_fetch_at": null})
    );
    Some(Setup {
        app,
        buildkite,
        runner,
    })
}

/// Holds the watcher's turn so that only the test's own looks run, and the Buildkite side
/// they run with.
async fn hold_the_watcher(app: &TestApp) -> Buildkite {
    let now = Millis::now();
    let held = app
        .state
        .store()
        .claim_task("buildkite", now, now.plus_secs(3600))
        .await
        .unwrap();
    // The background watcher may hold it for its look; it lets it go within moments.
    let mut held = held;
    for _ in 0..50 {
        if held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Millis::now();
        held = app
            .state
            .store()
            .claim_task("buildkite", now, now.plus_secs(3600))
            .await
            .unwrap();
    }
    assert!(held, "the watcher's turn is taken");
    Buildkite::new(app.state.settings().buildkite.clone().unwrap()).unwrap()
}

/// Waits up to 15 s for `n` calls of `op`.
async fn wait_for(buildkite: &FakeBuildkite, op: &str, n: usize) -> Vec<Call> {
    for _ in 0..150 {
        let calls = buildkite.calls_to(op);
        if calls.len() >= n {
            return calls;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no {n} `{op}` calls within 15 s");
}

fn metric(text: &str, action: &str, outcome: &str) -> f64 {
    let series = format!(
        "leasegate_forge_actions_total{{forge=\"buildkite\",action=\"{action}\",outcome=\"{outcome}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no series {series}"))
        .trim()
        .parse()
        .unwrap()
}

async fn paused_within_seconds_and_resumed_when_admitted(engine: Engine) {
    let Some(Setup {
        app,
        buildkite,
        runner,
    }) = setup(engine, "enforce", &["ci-1"]).await
    else {
        return;
    };
    let metrics = app.metrics_text().await;
    assert_eq!(metric(&metrics, "pause", "done"), 0.0);
    assert_eq!(metric(&metrics, "resume", "failed"), 0.0);
    // Admitted: looked at by the watcher, never paused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(buildkite.calls_to("pause").is_empty());

    let refused_at = std::time::Instant::now();
    app.heartbeat(&runner.failing("crun: executable file not found"))
        .await;
    let pauses = wait_for(&buildkite, "pause", 1).await;
    assert!(
        refused_at.elapsed() < Duration::from_secs(10),
        "paused within seconds, not {:?}",
        refused_at.elapsed()
    );
    assert_eq!(pauses[0].target, "a1");
    let note = pauses[0].body["note"].as_str().unwrap();
    assert!(
        note.starts_with("leasegate: probe_failed: ") && note.contains("crun"),
        "{note}"
    );
    assert_eq!(pauses[0].body["timeout_in_minutes"], 10);
    assert!(buildkite.agent("a1").paused);
    // `ci-10` came in the list for `ci-1` and is not it.
    assert!(!buildkite.agent("a10").paused);
    let detail = app.runner(&runner.id).await;
    let pause = &detail["buildkite_pauses"][0];
    assert_eq!(pause["agent_id"], "a1");
    assert_eq!(pause["code"], "probe_failed");
    assert_eq!(pause["end"], Value::Null);

    // Kept paused while the refusal lasts: no second pause of a held one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(buildkite.calls_to("pause").len(), 1);

    app.heartbeat(&runner.healthy()).await;
    let resumes = wait_for(&buildkite, "resume", 1).await;
    assert_eq!(resumes[0].target, "a1");
    assert!(!buildkite.agent("a1").paused);
    let detail = app.runner(&runner.id).await;
    assert_eq!(detail["buildkite_pauses"][0]["end"], "resumed");
    let page = app
        .client
        .get(app.url(&format!("/admin/runners/{}", runner.id)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Buildkite agents") && page.contains("paused, then resumed"));
    let metrics = app.metrics_text().await;
    assert_eq!(metric(&metrics, "pause", "done"), 1.0);
    assert_eq!(metric(&metrics, "resume", "done"), 1.0);
    buildkite.assert_clean();
}

async fn a_lapsed_pause_is_made_again_and_a_persons_pause_is_left_alone(engine: Engine) {
    let Some(Setup {
        app,
        buildkite,
        runner,
    }) = setup(engine, "enforce", &["ci-1", "ci-2"]).await
    else {
        return;
    };
    let bk = hold_the_watcher(&app).await;
    buildkite.pause_by_person("a2", "swapping its disk");
    app.heartbeat(&runner.failing("no space left on device"))
        .await;
    let now = Millis::now();
    let report = watch_once(&app.state.buildkite_context(), &bk, now)
        .await
        .unwrap();
    assert_eq!(report.paused, 1);
    let pauses = buildkite.calls_to("pause");
    assert_eq!(pauses.len(), 1, "only the free agent: {pauses:?}");
    assert_eq!(pauses[0].target, "a1");
    let detail = app.runner(&runner.id).await;
    let ci2 = detail["buildkite_agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent_name"] == "ci-2")
        .unwrap()
        .clone();
    let left = ci2["left_alone"].as_str().unwrap();
    assert!(
        left.contains("Ada Lovelace") && left.contains("swapping its disk"),
        "{left}"
    );

    // Held: the next looks call nothing new.
    watch_once(&app.state.buildkite_context(), &bk, now.plus_secs(1))
        .await
        .unwrap();
    assert_eq!(buildkite.calls_to("pause").len(), 1);

    // Ten minutes on, Buildkite lifted the pause; the refusal lasts (the runner's attestation
    // is now old, too): paused again.
    buildkite.lapse("a1");
    let later = now.plus_secs(10 * 60 + 1);
    let report = watch_once(&app.state.buildkite_context(), &bk, later)
        .await
        .unwrap();
    assert_eq!((report.ended, report.paused), (1, 1), "{report:?}");
    let pauses = buildkite.calls_to("pause");
    assert_eq!(pauses.len(), 2);
    assert_eq!(pauses[1].target, "a1");
    assert!(
        pauses[1].body["note"]
            .as_str()
            .unwrap()
            .starts_with("leasegate: attestation_expired: ")
    );
    let detail = app.runner(&runner.id).await;
    let ends: Vec<&Value> = detail["buildkite_pauses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["end"])
        .collect();
    assert_eq!(ends, [&Value::Null, &json!("lapsed")]);

    // Admitted again: leasegate's pause is resumed, the person's is not.
    app.heartbeat(&runner.healthy()).await;
    let report = watch_once(&app.state.buildkite_context(), &bk, Millis::now())
        .await
        .unwrap();
    assert_eq!(report.resumed, 1);
    let resumes = buildkite.calls_to("resume");
    assert_eq!(resumes.len(), 1);
    assert_eq!(resumes[0].target, "a1");
    let a2 = buildkite.agent("a2");
    assert!(a2.paused && a2.note.as_deref() == Some("swapping its disk"));
    let detail = app.runner(&runner.id).await;
    assert!(
        detail["buildkite_agents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["left_alone"].is_null())
    );
    buildkite.assert_clean();
}

async fn an_observing_pool_pauses_nothing(engine: Engine) {
    let Some(Setup {
        app,
        buildkite,
        runner,
    }) = setup(engine, "observe", &["ci-1"]).await
    else {
        return;
    };
    let bk = hold_the_watcher(&app).await;
    app.heartbeat(&runner.failing("crun not found")).await;
    let now = Millis::now();
    let report = watch_once(&app.state.buildkite_context(), &bk, now)
        .await
        .unwrap();
    assert_eq!((report.observed, report.paused), (1, 0));
    // Counted once for the refusal, not at every look.
    watch_once(&app.state.buildkite_context(), &bk, now.plus_secs(10))
        .await
        .unwrap();
    assert!(buildkite.calls_to("pause").is_empty());
    assert!(buildkite.calls_to("list").is_empty());
    assert_eq!(metric(&app.metrics_text().await, "pause", "observed"), 1.0);
    let detail = app.runner(&runner.id).await;
    assert_eq!(detail["buildkite_agents"][0]["would_pause"], "probe_failed");
    assert_eq!(detail["buildkite_pauses"], json!([]));
    buildkite.assert_clean();
}

async fn a_failed_call_is_retried_after_a_back_off_and_shown(engine: Engine) {
    let Some(Setup {
        app,
        buildkite,
        runner,
    }) = setup(engine, "enforce", &["ci-1"]).await
    else {
        return;
    };
    let bk = hold_the_watcher(&app).await;
    buildkite.fail_next("pause", 500);
    app.heartbeat(&runner.failing("crun not found")).await;
    let now = Millis::now();
    let report = watch_once(&app.state.buildkite_context(), &bk, now)
        .await
        .unwrap();
    assert_eq!((report.failed, report.paused), (1, 0));
    let detail = app.runner(&runner.id).await;
    let agent = &detail["buildkite_agents"][0];
    assert_eq!(agent["failures"], 1);
    let error = agent["error"].as_str().unwrap();
    assert!(error.contains("a1") && error.contains("500"), "{error}");
    assert!(agent["retry_at"].is_string());
    let page = app
        .client
        .get(app.url(&format!("/admin/runners/{}", runner.id)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("call failed (1 in a row)"));

    // Within the back-off: no call.
    watch_once(&app.state.buildkite_context(), &bk, now.plus_secs(1))
        .await
        .unwrap();
    assert_eq!(buildkite.calls_to("pause").len(), 1);
    // After it: made, and the failure is over.
    let report = watch_once(&app.state.buildkite_context(), &bk, now.plus_secs(3))
        .await
        .unwrap();
    assert_eq!(report.paused, 1);
    assert_eq!(buildkite.calls_to("pause").len(), 2);
    let detail = app.runner(&runner.id).await;
    assert_eq!(detail["buildkite_agents"][0]["failures"], 0);
    assert_eq!(detail["buildkite_agents"][0]["error"], Value::Null);
    let metrics = app.metrics_text().await;
    assert_eq!(metric(&metrics, "pause", "failed"), 1.0);
    assert_eq!(metric(&metrics, "pause", "done"), 1.0);
    buildkite.assert_clean();
}

each_engine!(
    paused_within_seconds_and_resumed_when_admitted,
    a_lapsed_pause_is_made_again_and_a_persons_pause_is_left_alone,
    an_observing_pool_pauses_nothing,
    a_failed_call_is_retried_after_a_back_off_and_shown,
);

#[test]
fn the_settings_are_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let base = || test_args(dir.path());
    assert!(
        base().buildkite_settings().unwrap().is_none(),
        "off by default"
    );
    type Adjust = Box<dyn Fn(&mut leasegate::config::ServeArgs)>;
    let cases: [(&str, Adjust); 5] = [
        (
            "LEASEGATE_BUILDKITE_ORG not set",
            Box::new(|a| a.buildkite_token = Some(TOKEN.into())),
        ),
        (
            "LEASEGATE_BUILDKITE_TOKEN (or LEASEGATE_BUILDKITE_TOKEN_FILE) not set",
            Box::new(|a| a.buildkite_org = Some(ORG.into())),
        ),
        (
            "LEASEGATE_BUILDKITE_PAUSE_MINUTES must be from 1 to 10080",
            Box::new(|a| {
                a.buildkite_token = Some(TOKEN.into());
                a.buildkite_org = Some(ORG.into());
                a.buildkite_pause_minutes = 10_081;
            }),
        ),
        (
            "LEASEGATE_BUILDKITE_ORG: `Acme Inc` is not an organization's slug",
            Box::new(|a| {
                a.buildkite_token = Some(TOKEN.into());
                a.buildkite_org = Some("Acme Inc".into());
            }),
        ),
        (
            "LEASEGATE_BUILDKITE_API_URL: `http://api.buildkite.com` must be an https:// URL",
            Box::new(|a| {
                a.buildkite_token = Some(TOKEN.into());
                a.buildkite_org = Some(ORG.into());
                a.buildkite_api_url = "http://api.buildkite.com".into();
            }),
        ),
    ];
    for (want, adjust) in cases {
        let mut args = base();
        adjust(&mut args);
        let e = args.buildkite_settings().unwrap_err().to_string();
        assert!(e.starts_with(want), "{want}: {e}");
        assert!(!e.contains(TOKEN), "the token is never shown: {e}");
    }
    let mut args = base();
    args.buildkite_token = Some(TOKEN.into());
    args.buildkite_org = Some(ORG.into());
    args.buildkite_pause_minutes = 1;
    let s = args.buildkite_settings().unwrap().unwrap();
    assert_eq!(
        (s.api_url.as_str(), s.org.as_str(), s.pause_minutes),
        ("https://api.buildkite.com", ORG, 1)
    );
}

/// `leasegate runner register --buildkite-agent-name` binds the machine's agents by name; a
/// name Buildkite cannot show stops the registration before the token is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_binds_buildkite_agents_by_name_at_registration() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let (_key, _state, id) = common::agent::registered(
        &app,
        dir.path(),
        "linux",
        "bk-1",
        &[
            "--buildkite-agent-name",
            "build-01-1",
            "--buildkite-agent-name",
            "build-01-2",
        ],
    )
    .await;
    let view = app.runner(&id).await;
    assert_eq!(
        view["forge_runners"],
        json!([
            {"kind": "buildkite", "agent_name": "build-01-1", "last_fetch_at": null},
            {"kind": "buildkite", "agent_name": "build-01-2", "last_fetch_at": null},
        ])
    );

    let other = tempfile::tempdir().unwrap();
    let key = other.path().join("runner.key");
    let keygen = common::agent::run(common::agent::runner(&[
        "keygen",
        "--key",
        key.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(keygen.code, 0);
    let state = other.path().join("runner.json");
    let mut register = common::agent::runner(&[
        "register",
        "--server",
        &app.base,
        "--name",
        "bk-2",
        "--key",
        key.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--buildkite-agent-name",
        " padded",
    ]);
    register.env(
        "LEASEGATE_REGISTRATION_TOKEN",
        app.registration_token("linux").await,
    );
    let ran = common::agent::run(register).await;
    assert_ne!(ran.code, 0, "{ran:?}");
    assert!(ran.stderr.contains("--buildkite-agent-name"), "{ran:?}");
    assert!(!state.exists());
}

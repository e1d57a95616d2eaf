//! Woodpecker behind the forge gate, spoken to by a real gRPC client: a test double of the
//! Woodpecker server (`tests/woodpecker/double.py`, Python `grpcio`, its code generated from
//! `tests/woodpecker/woodpecker.proto`, a subset of the published definitions) records every
//! call, and the same script makes an agent's calls through leasegate's HTTP/2 listener.
//!
//! An eligible agent's `Next` reaches the server and its workflow comes back intact; a refused
//! agent's never reaches it and comes back empty with status OK after the hold, or forwarded as
//! soon as its runner is eligible; a `Next` waiting at the server is cancelled when its runner
//! is refused; `Init`, `Update`, `Log` and `Done` pass for a refused agent; an unbound agent is
//! refused or passed as `LEASEGATE_FORGE_UNBOUND` says; an observing pool's agent gets its
//! workflow, marked with what would have been refused; and `leasegate runner register
//! --woodpecker-agent-config` binds the agent its config names. Without Python's `grpcio` and
//! `grpcio-tools` the tests say so and skip; `LEASEGATE_REQUIRE_GRPCIO=1` (set by `.ci/run`,
//! which installs them) makes that a failure.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

const AGENT: i64 = 7;

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/woodpecker")
}

fn grpcio_available() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("LEASEGATE_REQUIRE_GRPCIO").as_deref() != Ok("1"),
            "LEASEGATE_REQUIRE_GRPCIO=1 but python3 cannot import grpc and grpc_tools"
        );
        common::skip::skipped("grpcio not installed (python3 -m pip install grpcio grpcio-tools)");
    }
    ok
}

/// The Woodpecker server double, and the generated code its client shares.
struct Double {
    child: tokio::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Double {
    async fn start() -> Double {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("python3")
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(here())
            .arg(format!("--python_out={}", dir.path().display()))
            .arg(format!("--grpc_python_out={}", dir.path().display()))
            .arg("woodpecker.proto")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut child = tokio::process::Command::new("python3")
            .arg(here().join("double.py"))
            .arg("server")
            .arg(dir.path())
            .arg(dir.path().join("calls.jsonl"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the double starts within 20 s")
            .unwrap()
            .expect("the double says its port");
        let port = line.strip_prefix("PORT ").unwrap().parse().unwrap();
        Double { child, port, dir }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every call the server has seen, in order.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn calls_named(&self, call: &str) -> Vec<Value> {
        self.calls()
            .into_iter()
            .filter(|c| c["call"] == call && c.get("event").is_none())
            .collect()
    }

    /// Waits up to 10 s for a call matching `what`.
    async fn wait_for(&self, what: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            if let Some(c) = self.calls().into_iter().find(|c| what(c)) {
                return c;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the double never saw the call: {:?}",
                self.calls()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One call of agent `agent_id` through `target` (host:port), as the client saw it.
    async fn call(&self, target: &str, method: &str, agent_id: i64, labels: &[&str]) -> Value {
        let out = tokio::time::timeout(
            Duration::from_secs(90),
            tokio::process::Command::new("python3")
                .arg(here().join("double.py"))
                .arg("client")
                .arg(self.dir.path())
                .arg(target)
                .arg(method)
                .arg(agent_id.to_string())
                .args(labels)
                .output(),
        )
        .await
        .expect("a call ends within 90 s")
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Double {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The service in front of `double`, refused `Next`s held `hold_s`, and the address of its
/// agents' listener.
async fn gated(
    engine: Engine,
    double: &Double,
    hold_s: u64,
    adjust: impl FnOnce(&mut leasegate::config::ServeArgs),
) -> Option<(TestApp, String)> {
    let url = double.url();
    let app = spawn_app_on_with(engine, move |a| {
        a.woodpecker_upstream = Some(url);
        a.woodpecker_listen = Some("127.0.0.1:0".parse().unwrap());
        a.forge_hold_s = hold_s;
        adjust(a);
    })
    .await?;
    let gate = app.state.forge_gate().expect("a forge gate").clone();
    let started = Instant::now();
    let addr = loop {
        if let Some(addr) = gate.woodpecker_addr() {
            break addr;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no Woodpecker listener"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Some((app, addr.to_string()))
}

/// A runner of pool `linux` bound to Woodpecker agent `AGENT`.
async fn bound_runner(app: &TestApp) -> TestRunner {
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "wp-01").await;
    let r = app
        .admin_put(
            &format!("/api/v1/admin/runners/{}/forge-runners", runner.id),
            json!({"forge_runners": [{"kind": "woodpecker", "agent_id": AGENT}]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    runner
}

async fn attest(app: &TestApp, attestation: &str) {
    assert_eq!(app.heartbeat(attestation).await.status(), StatusCode::OK);
}

each_engine!(
    an_eligible_agent_gets_its_workflow_and_a_refused_one_an_empty_answer_after_the_hold,
    a_held_next_is_forwarded_once_the_runner_is_eligible,
    a_next_waiting_at_the_server_is_cancelled_when_the_runner_is_refused,
    unbound_agents_are_refused_or_passed_as_configured,
    a_pool_that_observes_forwards_next_marked_with_what_it_would_refuse,
);

async fn an_eligible_agent_gets_its_workflow_and_a_refused_one_an_empty_answer_after_the_hold(
    engine: Engine,
) {
    if !grpcio_available() {
        return;
    }
    let double = Double::start().await;
    let Some((app, target)) = gated(engine, &double, 2, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&app).await;
    attest(&app, &runner.healthy()).await;

    let eligible = double
        .call(&target, "Next", AGENT, &["platform=linux/amd64"])
        .await;
    assert_eq!(eligible["code"], "OK", "{eligible}");
    assert_eq!(
        eligible["workflow"],
        json!({"id": "wf-7", "timeout": 3600,
               "payload": r#"{"stages": [{"steps": [{"name": "build"}]}]}"#}),
    );
    let seen = double.calls_named("Next");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["agent_id"], AGENT);
    assert_eq!(seen[0]["labels"], json!({"platform": "linux/amd64"}));

    attest(&app, &runner.failing("crun not found")).await;
    let refused = double.call(&target, "Next", AGENT, &[]).await;
    assert_eq!(refused["code"], "OK", "{refused}");
    assert_eq!(refused["workflow"], Value::Null, "{refused}");
    assert_eq!(refused["trailing"]["x-leasegate-refusal"], "probe_failed");
    let seconds = refused["seconds"].as_f64().unwrap();
    assert!(seconds >= 1.8, "answered before the hold: {refused}");
    assert_eq!(
        double.calls_named("Next").len(),
        1,
        "the server saw a refused Next"
    );

    // A refused agent's other calls pass, so its running workflow finishes.
    for method in ["Init", "Update", "Log", "Done"] {
        let r = double.call(&target, method, AGENT, &[]).await;
        assert_eq!(r["code"], "OK", "{r}");
        assert!(
            r["seconds"].as_f64().unwrap() < 1.5,
            "{method} was held: {r}"
        );
        assert_eq!(double.calls_named(method).len(), 1, "{method}");
    }
    assert_eq!(double.calls_named("Log")[0]["lines"], json!(["hello"]));
    let init = double.call(&target, "Init", AGENT, &[]).await;
    assert_eq!(
        init["trailing"]["x-double"], "Init",
        "trailers relayed: {init}"
    );

    let view = app.runner(&runner.id).await;
    let refusal = &view["refusals"][0];
    assert_eq!(refusal["code"], "probe_failed");
    assert!(
        refusal["detail"]
            .as_str()
            .unwrap()
            .contains("woodpecker fetch"),
        "{refusal}"
    );
    assert_eq!(view["forge_runners"][0]["kind"], "woodpecker");
    assert_eq!(view["forge_runners"][0]["agent_id"], AGENT);
    let metrics = app.metrics_text().await;
    for line in [
        r#"leasegate_forge_fetches_total{forge="woodpecker",outcome="forwarded",code="none"} 1"#,
        r#"leasegate_forge_fetches_total{forge="woodpecker",outcome="refused",code="probe_failed"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

async fn a_held_next_is_forwarded_once_the_runner_is_eligible(engine: Engine) {
    if !grpcio_available() {
        return;
    }
    let double = Double::start().await;
    let Some((app, target)) = gated(engine, &double, 20, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&app).await;
    attest(&app, &runner.failing("crun not found")).await;
    let next = {
        let target = target.clone();
        let double = &double;
        async move { double.call(&target, "Next", AGENT, &[]).await }
    };
    let release = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            double.calls_named("Next").is_empty(),
            "forwarded while refused"
        );
        attest(&app, &runner.healthy()).await;
    };
    let (answer, ()) = tokio::join!(next, release);
    assert_eq!(answer["code"], "OK", "{answer}");
    assert_eq!(answer["workflow"]["id"], "wf-7", "{answer}");
    let seconds = answer["seconds"].as_f64().unwrap();
    assert!(seconds < 6.0, "not released early: {answer}");
    assert_eq!(double.calls_named("Next").len(), 1);
}

async fn a_next_waiting_at_the_server_is_cancelled_when_the_runner_is_refused(engine: Engine) {
    if !grpcio_available() {
        return;
    }
    let double = Double::start().await;
    let Some((app, target)) = gated(engine, &double, 2, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&app).await;
    attest(&app, &runner.healthy()).await;
    let next = {
        let target = target.clone();
        let double = &double;
        async move { double.call(&target, "Next", AGENT, &["wait=yes"]).await }
    };
    let refuse = async {
        double.wait_for(|c| c["call"] == "Next").await;
        attest(&app, &runner.failing("crun not found")).await;
        Instant::now()
    };
    let (answer, refused_at) = tokio::join!(next, refuse);
    assert_eq!(answer["code"], "OK", "{answer}");
    assert_eq!(answer["workflow"], Value::Null, "{answer}");
    assert_eq!(answer["trailing"]["x-leasegate-refusal"], "probe_failed");
    assert!(
        refused_at.elapsed() < Duration::from_secs(5),
        "answered long after the refusal: {answer}"
    );
    // The server saw its call cancelled: its waiting worker is gone.
    double
        .wait_for(|c| c["call"] == "Next" && c["event"] == "cancelled")
        .await;
    let metrics = app.metrics_text().await;
    let line = r#"leasegate_forge_fetches_total{forge="woodpecker",outcome="cancelled",code="probe_failed"} 1"#;
    assert!(metrics.contains(line), "{line} in {metrics}");
}

async fn unbound_agents_are_refused_or_passed_as_configured(engine: Engine) {
    if !grpcio_available() {
        return;
    }
    let double = Double::start().await;
    let Some((app, target)) = gated(engine, &double, 1, |_| {}).await else {
        return;
    };
    let refused = double.call(&target, "Next", 99, &[]).await;
    assert_eq!(refused["code"], "OK", "{refused}");
    assert_eq!(refused["workflow"], Value::Null);
    assert_eq!(refused["trailing"]["x-leasegate-refusal"], "unknown_runner");
    assert!(double.calls_named("Next").is_empty());
    app.shutdown.cancel();

    let Some((_app, target)) = gated(engine, &double, 1, |a| {
        a.forge_unbound = leasegate::config::ForgeUnbound::Pass;
    })
    .await
    else {
        return;
    };
    let passed = double.call(&target, "Next", 99, &[]).await;
    assert_eq!(passed["workflow"]["id"], "wf-99", "{passed}");
    assert_eq!(double.calls_named("Next").len(), 1);
}

async fn a_pool_that_observes_forwards_next_marked_with_what_it_would_refuse(engine: Engine) {
    if !grpcio_available() {
        return;
    }
    let double = Double::start().await;
    let Some((app, target)) = gated(engine, &double, 5, |_| {}).await else {
        return;
    };
    let runner = bound_runner(&app).await;
    let r = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A], "gate_mode": "observe"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    attest(&app, &runner.failing("crun not found")).await;
    let observed = double.call(&target, "Next", AGENT, &[]).await;
    assert_eq!(observed["workflow"]["id"], "wf-7", "{observed}");
    assert_eq!(
        observed["initial"]["x-leasegate-would-refuse"],
        "probe_failed"
    );
    assert!(
        observed["seconds"].as_f64().unwrap() < 3.0,
        "held: {observed}"
    );
    assert_eq!(
        app.runner(&runner.id).await["refusals"][0]["code"],
        "probe_failed"
    );
    let metrics = app.metrics_text().await;
    let line = r#"leasegate_forge_fetches_total{forge="woodpecker",outcome="observed",code="probe_failed"} 1"#;
    assert!(metrics.contains(line), "{line} in {metrics}");
}

/// `leasegate runner register --woodpecker-agent-config` binds the agent its config file names;
/// a config of an agent that has not registered with its server yet (`agent_id: -1`) stops the
/// registration, naming the flag, before the token is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_binds_its_woodpecker_agent_from_its_config_at_registration() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.conf");
    std::fs::write(&config, r#"{"agent_id": 42}"#).unwrap();
    let (_key, _state, id) = common::agent::registered(
        &app,
        dir.path(),
        "linux",
        "wp-1",
        &["--woodpecker-agent-config", config.to_str().unwrap()],
    )
    .await;
    let view = app.runner(&id).await;
    assert_eq!(
        view["forge_runners"],
        json!([{"kind": "woodpecker", "agent_id": 42, "last_fetch_at": null}])
    );

    let other = tempfile::tempdir().unwrap();
    let unregistered = other.path().join("agent.conf");
    std::fs::write(&unregistered, r#"{"agent_id": -1}"#).unwrap();
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
        "wp-2",
        "--key",
        key.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--woodpecker-agent-config",
        unregistered.to_str().unwrap(),
    ]);
    register.env(
        "LEASEGATE_REGISTRATION_TOKEN",
        app.registration_token("linux").await,
    );
    let ran = common::agent::run(register).await;
    assert_ne!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stderr.contains("--woodpecker-agent-config") && ran.stderr.contains("not registered"),
        "{ran:?}"
    );
    assert!(!state.exists());
}

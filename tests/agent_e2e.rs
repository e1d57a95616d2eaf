//! The runner agent end to end: the real service (`spawn_app()`), the real `leasegate` binary
//! as the runner, and, when podman is here, the real podman with a real local image (built
//! without network); otherwise a fake runtime printing a fixed image ID.

use crate::common;

use common::agent::*;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const FAKE_ID: &str = "sha256:5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";

/// A runtime to probe and the image it runs: real podman with a local image when podman is
/// installed, else a fake runtime (said so in the output; a missing podman fails instead under
/// `LEASEGATE_REQUIRE_PODMAN=1`).
struct Probed {
    runtime: String,
    image_ref: String,
    image_id: String,
    real_podman: bool,
    _image: Option<LocalImage>,
    _dir: tempfile::TempDir,
}

impl Probed {
    fn new() -> Probed {
        let dir = tempfile::tempdir().unwrap();
        if podman_installed() {
            let image = LocalImage::build();
            Probed {
                runtime: "podman".into(),
                image_ref: image.tag.clone(),
                image_id: image.id.clone(),
                real_podman: true,
                _image: Some(image),
                _dir: dir,
            }
        } else {
            println!("podman not installed: using a fake runtime");
            let rt = fake_runtime(dir.path(), "podman", FAKE_ID, &[]);
            Probed {
                runtime: rt.to_string_lossy().into_owned(),
                image_ref: "localhost/ci/runner:1".into(),
                image_id: FAKE_ID.into(),
                real_podman: false,
                _image: None,
                _dir: dir,
            }
        }
    }

    fn probe_args(&self) -> Vec<String> {
        vec![
            "--runtime".into(),
            self.runtime.clone(),
            "--image".into(),
            self.image_ref.clone(),
        ]
    }
}

/// A runner made with the agent's own commands: `keygen`, then `register`.
struct Agent {
    dir: tempfile::TempDir,
    runner_id: String,
    server: String,
}

impl Agent {
    fn key(&self) -> PathBuf {
        self.dir.path().join("runner.key")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state/runner.json")
    }

    /// `leasegate runner <cmd> --key … --state … <args>`.
    fn cmd(&self, cmd: &str, args: &[String]) -> tokio::process::Command {
        let mut all: Vec<String> = vec![
            cmd.into(),
            "--key".into(),
            self.key().display().to_string(),
            "--state".into(),
            self.state().display().to_string(),
        ];
        all.extend_from_slice(args);
        runner(&all.iter().map(String::as_str).collect::<Vec<_>>())
    }

    async fn register(app: &TestApp, pool: &str, name: &str) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("runner.key");
        let ran = run(runner(&["keygen", "--key", key.to_str().unwrap()])).await;
        assert_eq!(ran.code, 0, "{ran:?}");
        let jwk = ran.stdout_json();
        assert_eq!(
            (jwk["kty"].as_str(), jwk["crv"].as_str()),
            (Some("OKP"), Some("Ed25519"))
        );

        let token = app.registration_token(pool).await;
        let state = dir.path().join("state/runner.json");
        let mut cmd = runner(&[
            "register",
            "--server",
            &app.base,
            "--name",
            name,
            "--label",
            "os=linux",
            "--label",
            "runtime=podman",
            "--key",
            key.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ]);
        cmd.env("LEASEGATE_REGISTRATION_TOKEN", &token);
        let ran = run(cmd).await;
        assert_eq!(ran.code, 0, "{ran:?}");
        let answer = ran.stdout_json();
        let runner_id = answer["runner_id"].as_str().unwrap().to_string();
        Agent {
            dir,
            runner_id,
            server: app.base.clone(),
        }
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keygen_register_and_one_heartbeat_show_the_runner_healthy_on_its_real_image() {
    let app = spawn_app().await;
    let probed = Probed::new();
    app.pool("linux", &[&probed.image_id]).await;
    let agent = Agent::register(&app, "linux", "build-01").await;

    assert_eq!(mode(&agent.key()), 0o600);
    assert_eq!(mode(&agent.state()), 0o600);
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(agent.state()).unwrap()).unwrap();
    assert_eq!(state["runner_id"], agent.runner_id.as_str());
    assert_eq!(state["pool"], "linux");
    assert_eq!(state["audience"], "leasegate");
    assert_eq!(state["heartbeat_interval_s"], 15);
    assert_eq!(state["attestation_max_age_s"], 60);
    assert_eq!(state["probe_max_age_s"], 300);
    assert_eq!(state["server"], agent.server.as_str());

    let mut args = probed.probe_args();
    args.push("--once".into());
    let ran = run(agent.cmd("heartbeat", &args)).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let log: Vec<&str> = ran.stderr_lines();
    assert_eq!(log.len(), 1, "one line per heartbeat: {log:?}");
    assert!(
        log[0].contains("INFO") && log[0].contains("status=healthy"),
        "{log:?}"
    );

    let runner = app.runner(&agent.runner_id).await;
    assert_eq!(runner["status"], "healthy", "{runner}");
    assert_eq!(runner["image_id"], probed.image_id.as_str());
    assert_eq!(runner["image_ref"], probed.image_ref.as_str());
    assert_eq!(runner["image_current"], true);
    assert_eq!(
        runner["labels"],
        json!({"os": "linux", "runtime": "podman"})
    );
    assert_eq!(runner["runtime"], "podman");
    if probed.real_podman {
        let (_, version, _) = podman(&["version", "--format", "{{.Client.Version}}"]);
        assert_eq!(runner["runtime_version"], version.as_str());
    }
    assert_eq!(runner["attestations"][0]["probe_ok"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_failure_reaches_the_operator_as_probe_failed_in_the_runtimes_words() {
    let app = spawn_app().await;
    let probed = Probed::new();
    app.pool("linux", &[&probed.image_id]).await;
    let agent = Agent::register(&app, "linux", "build-02").await;

    // A runtime that lacks its OCI runtime: real podman with a containers.conf naming a
    // missing one, or a fake that says what podman says.
    let conf = agent.dir.path().join("containers.conf");
    std::fs::write(&conf, "[engine]\nruntime = \"crun-missing\"\n").unwrap();
    let fake_dir = tempfile::tempdir().unwrap();
    let runtime = if probed.real_podman {
        "podman".to_string()
    } else {
        let failing = "echo 'Error: default OCI runtime \"crun-missing\" not found: invalid argument' >&2; exit 125";
        fake_runtime(fake_dir.path(), "podman", FAKE_ID, &[("info", failing)])
            .display()
            .to_string()
    };
    let expected = r#"cannot run a container with podman: default OCI runtime "crun-missing" not found: invalid argument"#;

    // The runner unit's ExecStartPre: fails with podman's words and reports to the service.
    let mut cmd = runner(&[
        "preflight",
        "--runtime",
        &runtime,
        "--image",
        &probed.image_ref,
        "--server",
        &agent.server,
        "--key",
        agent.key().to_str().unwrap(),
        "--state",
        agent.state().to_str().unwrap(),
    ]);
    cmd.env("CONTAINERS_CONF", &conf);
    let ran = run(cmd).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(ran.stderr_lines()[0], expected, "{ran:?}");
    assert!(
        ran.stderr.contains("status=probe_failed"),
        "reported: {ran:?}"
    );

    let runner = app.runner(&agent.runner_id).await;
    assert_eq!(runner["status"], "probe_failed", "{runner}");
    assert_eq!(runner["code"], "probe_failed");
    assert_eq!(runner["detail"], expected);
    assert_eq!(
        runner["probe_error"],
        r#"default OCI runtime "crun-missing" not found: invalid argument"#
    );
    assert_eq!(runner["attestations"][0]["probe_ok"], false);

    // The heartbeat says the same, and a one-shot heartbeat of a failed probe exits 1.
    let mut cmd = agent.cmd(
        "heartbeat",
        &strings(&[
            "--runtime",
            &runtime,
            "--image",
            &probed.image_ref,
            "--once",
        ]),
    );
    cmd.env("CONTAINERS_CONF", &conf);
    let ran = run(cmd).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    let line = ran
        .stderr
        .lines()
        .find(|l| l.contains("status=probe_failed"))
        .unwrap_or_else(|| panic!("{ran:?}"));
    assert!(
        line.contains(" WARN "),
        "a failed probe is a warning: {line}"
    );
    assert!(ran.stderr.contains("crun-missing"), "{ran:?}");
    assert_eq!(app.runner(&agent.runner_id).await["status"], "probe_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keygen_never_overwrites_and_a_key_others_can_read_is_refused() {
    let app = spawn_app().await;
    app.pool("linux", &[FAKE_ID]).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("runner.key");
    let key_s = key.to_str().unwrap();

    let first = run(runner(&["keygen", "--key", key_s])).await;
    assert_eq!(first.code, 0);
    let pem = std::fs::read(&key).unwrap();
    let again = run(runner(&["keygen", "--key", key_s])).await;
    assert_eq!(again.code, 5, "{again:?}");
    assert!(again.stderr.contains("refusing to overwrite"), "{again:?}");
    assert_eq!(again.stdout, "");
    assert_eq!(std::fs::read(&key).unwrap(), pem, "the key is untouched");

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let token = app.registration_token("linux").await;
    let state = dir.path().join("runner.json");
    let register = || {
        runner(&[
            "register",
            "--server",
            &app.base,
            "--registration-token",
            &token,
            "--name",
            "build-03",
            "--key",
            key_s,
            "--state",
            state.to_str().unwrap(),
        ])
    };
    let ran = run(register()).await;
    assert_eq!(ran.code, 5, "{ran:?}");
    assert!(ran.stderr.contains("mode 0644"), "{ran:?}");
    assert!(!state.exists());

    // The token was not spent by the refusal.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ran = run(register()).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(state.exists());

    // A used token is the service's refusal, shown as its problem JSON.
    std::fs::remove_file(&state).unwrap();
    let ran = run(register()).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    let problem: Value = serde_json::from_str(ran.stderr.trim()).unwrap();
    assert_eq!(problem["code"], "registration_token_invalid");
    assert!(!state.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_exits_3_when_the_service_says_recycle() {
    let app = spawn_app().await;
    let probed = Probed::new();
    // The pool has moved on to another image; `report` never refuses, but still says recycle.
    let r = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_B], "image_policy": "report"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let agent = Agent::register(&app, "linux", "build-04").await;

    // Not --once: the loop itself must stop on recycle.
    let ran = run(agent.cmd("heartbeat", &probed.probe_args())).await;
    assert_eq!(ran.code, 3, "{ran:?}");
    assert!(ran.stderr.contains("action=recycle"), "{ran:?}");
    assert!(
        ran.stderr.contains(IMAGE_B),
        "names the expected image: {ran:?}"
    );
    let runner = app.runner(&agent.runner_id).await;
    assert_eq!(runner["image_current"], false);
    assert_eq!(runner["image_id"], probed.image_id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_exits_4_when_the_runner_is_revoked() {
    let app = spawn_app().await;
    let dir = tempfile::tempdir().unwrap();
    let rt = fake_runtime(dir.path(), "podman", FAKE_ID, &[]);
    app.pool("linux", &[FAKE_ID]).await;
    let agent = Agent::register(&app, "linux", "build-05").await;
    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/revoke", agent.runner_id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);

    let ran = run(agent.cmd("heartbeat", &strings(&["--runtime", rt.to_str().unwrap()]))).await;
    assert_eq!(ran.code, 4, "{ran:?}");
    assert!(ran.stderr.contains("runner_revoked"), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_backs_off_while_the_service_is_unreachable_and_stops_on_sigterm() {
    let app = spawn_app().await;
    let dir = tempfile::tempdir().unwrap();
    let rt = fake_runtime(dir.path(), "podman", FAKE_ID, &[]);
    app.pool("linux", &[FAKE_ID]).await;
    let agent = Agent::register(&app, "linux", "build-06").await;
    // A port nobody listens on.
    let (_refusing, closed) = refusing_address();
    let closed = format!("http://{closed}");
    let rt_s = rt.to_str().unwrap();

    let ran = run(agent.cmd(
        "heartbeat",
        &strings(&["--runtime", rt_s, "--server", &closed, "--once"]),
    ))
    .await;
    assert_eq!(ran.code, 5, "--once does not retry: {ran:?}");

    let mut cmd = agent.cmd(
        "heartbeat",
        &strings(&["--runtime", rt_s, "--server", &closed]),
    );
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    // 1 s, 2 s, then waiting for 4 s: three attempts, two announced retries, in 3.5 s.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("exits on SIGTERM")
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "SIGTERM is a clean stop");
    let log = String::from_utf8_lossy(&out.stderr);
    let delays: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split("retry_in_ms=").nth(1))
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(delays.len() >= 2, "{log}");
    assert!((800..=1200).contains(&delays[0]), "1 s ± 20 %: {delays:?}");
    assert!((1600..=2400).contains(&delays[1]), "2 s ± 20 %: {delays:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_service_is_named_by_its_cause() {
    let app = spawn_app().await;
    let (_refusing, closed) = refusing_address();
    let closed = format!("http://{closed}");
    // The real service speaks plain HTTP: https:// to it is a TLS mismatch.
    let tls_to_plain = app.base.replacen("http://", "https://", 1);
    let cases = [
        (
            closed.clone(),
            format!(
                "leasegate: cannot reach {closed}: connection refused (is leasegate running and listening there?)"
            ),
        ),
        (
            "http://nonexistent.invalid:8080".to_string(),
            "leasegate: cannot reach http://nonexistent.invalid:8080: the name nonexistent.invalid could not be resolved (".to_string(),
        ),
        (
            tls_to_plain.clone(),
            format!("leasegate: cannot reach {tls_to_plain}: TLS handshake failed: "),
        ),
    ];
    for (server, said) in cases {
        let ran = run(runner(&[
            "start",
            "--server",
            &server,
            "--lease-id",
            "l-1",
            "--lease-token",
            "lgl_x",
        ]))
        .await;
        assert_eq!(ran.code, 5, "{ran:?}");
        assert!(ran.stderr.starts_with(&said), "{said} in {ran:?}");
        assert!(!ran.stderr.contains("error sending request"), "{ran:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_start_complete_and_abandon_print_the_services_json() {
    let app = spawn_app().await;
    let probed = Probed::new();
    app.pool("linux", &[&probed.image_id]).await;
    let agent = Agent::register(&app, "linux", "build-07").await;
    let lease = |extra: &[&str]| {
        let mut args = probed.probe_args();
        args.extend(strings(extra));
        agent.cmd("lease", &args)
    };
    let call = |action: &str, lease_id: &str, token: &str, extra: &[&str]| {
        let mut args = strings(&[
            action,
            "--state",
            agent.state().to_str().unwrap(),
            "--lease-id",
            lease_id,
        ]);
        args.extend(strings(extra));
        let mut cmd = runner(&args.iter().map(String::as_str).collect::<Vec<_>>());
        cmd.env("LEASEGATE_LEASE_TOKEN", token);
        cmd
    };

    // No job: exit 2, nothing on stdout.
    let ran = run(lease(&["--wait-s", "1"])).await;
    assert_eq!(ran.code, 2, "{ran:?}");
    assert_eq!(ran.stdout, "");

    // A job: the lease JSON on stdout.
    let job = app.enqueue("linux").await;
    let ran = run(lease(&[])).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let granted = ran.stdout_json();
    assert_eq!(granted["job"]["id"], job.as_str());
    assert_eq!(granted["job"]["payload"], json!({"script": "make test"}));
    let lease_id = granted["lease_id"].as_str().unwrap();
    let token = granted["lease_token"].as_str().unwrap();
    assert!(!ran.stderr.contains(token), "the lease token is not logged");

    let ran = run(call("start", lease_id, token, &[])).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.stdout_json()["state"], "running");
    let ran = run(call("extend", lease_id, token, &["--ttl-s", "600"])).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let ran = run(call(
        "complete",
        lease_id,
        token,
        &[
            "--outcome",
            "succeeded",
            "--exit-code",
            "0",
            "--message",
            "all green",
        ],
    ))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.stdout_json()["state"], "completed");
    let story = app.job(&job).await;
    assert_eq!(story["state"], "succeeded");
    assert_eq!(story["attempts"], 1);

    // A second complete is the service's refusal: its problem JSON on stderr, exit 1.
    let ran = run(call("complete", lease_id, token, &["--outcome", "failed"])).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(ran.stdout, "");
    let problem: Value = serde_json::from_str(ran.stderr.trim()).unwrap();
    assert_eq!(problem["code"], "lease_finished");

    // Abandon before start: back to the queue at no cost; the runner is quarantined until a
    // probe newer than the abandon, which the next `lease` brings by probing afresh.
    let job2 = app
        .enqueue_with(json!({"pool": "linux", "idempotency_key": "second"}))
        .await;
    let granted = run(lease(&[])).await.stdout_json();
    let (id2, token2) = (
        granted["lease_id"].as_str().unwrap().to_string(),
        granted["lease_token"].as_str().unwrap().to_string(),
    );
    let ran = run(call(
        "abandon",
        &id2,
        &token2,
        &["--reason", "preflight_failed"],
    ))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.stdout_json()["state"], "abandoned");
    // The job it gave back is held from it for a while; the next one is not.
    let job3 = app
        .enqueue_with(json!({"pool": "linux", "idempotency_key": "third"}))
        .await;
    let ran = run(lease(&[])).await;
    assert_eq!(ran.code, 0, "a fresh probe lifts the quarantine: {ran:?}");
    assert_eq!(ran.stdout_json()["job"]["id"], job3.as_str());
    assert_eq!(app.job(&job2).await["state"], "queued");
    assert_eq!(app.job(&job2).await["attempts"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_with_a_failing_probe_is_refused_and_no_job_is_touched() {
    let app = spawn_app().await;
    let dir = tempfile::tempdir().unwrap();
    let failing =
        "echo 'Error: default OCI runtime \"crun\" not found: invalid argument' >&2; exit 125";
    let rt = fake_runtime(dir.path(), "podman", FAKE_ID, &[("info", failing)]);
    app.pool("linux", &[FAKE_ID]).await;
    let agent = Agent::register(&app, "linux", "build-08").await;
    let job = app.enqueue("linux").await;

    let ran = run(agent.cmd(
        "lease",
        &strings(&["--runtime", rt.to_str().unwrap(), "--image", "ci/runner:1"]),
    ))
    .await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(ran.stdout, "");
    let problem: Value = serde_json::from_str(ran.stderr.trim()).unwrap();
    assert_eq!(problem["code"], "probe_failed");
    assert_eq!(
        problem["detail"],
        r#"cannot run a container with podman: default OCI runtime "crun" not found: invalid argument"#
    );
    let story = app.job(&job).await;
    assert_eq!(story["state"], "queued");
    assert_eq!(story["returns"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_binds_the_forge_runners_it_reads_from_their_own_files() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let dot_runner = dir.path().join(".runner");
    std::fs::write(
        &dot_runner,
        r#"{"WARNING": "This file is automatically generated by act-runner.", "id": 12, "uuid": "7d1c9f0e-2b3a-4c5d-8e9f-0a1b2c3d4e5f", "name": "build-01", "token": "forgejo-secret", "address": "https://forge.example", "labels": ["docker:docker://node:20-bookworm"]}"#,
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "concurrent = 2\n\n[[runners]]\n  name = \"a\"\n  url = \"https://gitlab.example\"\n  id = 1\n  token = \"glrt-first\"\n  executor = \"shell\"\n\n[[runners]]\n  name = \"b\"\n  url = \"https://gitlab.example\"\n  id = 2\n  token = \"glrt-second\"\n  executor = \"docker\"\n",
    )
    .unwrap();
    let key = dir.path().join("runner.key");
    assert_eq!(
        run(runner(&["keygen", "--key", key.to_str().unwrap()]))
            .await
            .code,
        0
    );
    let token = app.registration_token("linux").await;
    let state = dir.path().join("runner.json");
    let mut cmd = runner(&[
        "register",
        "--server",
        &app.base,
        "--name",
        "build-01",
        "--key",
        key.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--forgejo-runner-file",
        dot_runner.to_str().unwrap(),
        "--gitlab-config",
        config.to_str().unwrap(),
    ]);
    cmd.env("LEASEGATE_REGISTRATION_TOKEN", &token);
    let ran = run(cmd).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let id = ran.stdout_json()["runner_id"].as_str().unwrap().to_string();
    let view = app.runner(&id).await;
    let sha = |t: &str| {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(t.as_bytes()))
    };
    let bound: Vec<(String, String)> = view["forge_runners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["kind"].as_str().unwrap().to_string(),
                b["uuid"]
                    .as_str()
                    .or(b["token_sha256"].as_str())
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    let mut expected = vec![
        (
            "forgejo".to_string(),
            "7d1c9f0e-2b3a-4c5d-8e9f-0a1b2c3d4e5f".to_string(),
        ),
        ("gitlab".to_string(), sha("glrt-first")),
        ("gitlab".to_string(), sha("glrt-second")),
    ];
    expected.sort();
    let mut bound = bound;
    bound.sort();
    assert_eq!(bound, expected);
    // Neither token left the machine.
    assert!(!view.to_string().contains("glrt-") && !view.to_string().contains("forgejo-secret"));

    // A file that is not what it should be stops the registration before the token is spent.
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "concurrent = 1\n").unwrap();
    let mut cmd = runner(&[
        "register",
        "--server",
        &app.base,
        "--name",
        "build-02",
        "--key",
        key.to_str().unwrap(),
        "--state",
        dir.path().join("other.json").to_str().unwrap(),
        "--gitlab-config",
        broken.to_str().unwrap(),
    ]);
    let spare = app.registration_token("linux").await;
    cmd.env("LEASEGATE_REGISTRATION_TOKEN", &spare);
    let ran = run(cmd).await;
    assert_ne!(ran.code, 0);
    assert!(ran.stderr.contains("no [[runners]]"), "{ran:?}");
    let r = app.post("/api/v1/runners", json!({"registration_token": spare, "name": "build-02", "public_key": leasegate::agent::keys::RunnerKey::generate().public_jwk()})).await;
    assert_eq!(
        r.status(),
        reqwest::StatusCode::CREATED,
        "the token was spent"
    );
}

/// The shipped heartbeat unit (`deploy/systemd/leasegate-heartbeat@.service`) as systemd runs
/// it, without its `RestartSec`: `ExecStart` with the unit's environment, then `ExecStopPost`
/// with `EXIT_STATUS`, and a restart on failure unless the status prevents it.
struct ShippedUnit {
    exec_start: Vec<String>,
    stop_post: String,
    prevent_restart: Vec<i32>,
    env: Vec<(String, String)>,
    /// Where the fake `systemctl` the unit calls writes its arguments.
    systemctl_log: PathBuf,
}

/// How one run of the unit's `ExecStart` ended.
struct UnitRun {
    exit: i32,
    log: String,
    /// Whether systemd would start it again.
    restarts: bool,
}

impl ShippedUnit {
    fn new(dir: &Path, env: &[(&str, &str)]) -> ShippedUnit {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("deploy/systemd/leasegate-heartbeat@.service"),
        )
        .unwrap();
        let value = |key: &str| {
            let found: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("{key}=")))
                .collect();
            assert_eq!(found.len(), 1, "one {key}= in the unit");
            found[0].to_string()
        };
        assert_eq!(value("Restart"), "on-failure");
        let exec_start = value("ExecStart")
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>();
        assert_eq!(
            exec_start[..3],
            ["/usr/local/bin/leasegate", "runner", "heartbeat"]
        );
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let systemctl_log = dir.join("systemctl.log");
        script(
            &bin,
            "systemctl",
            &format!("echo \"$*\" >> '{}'", systemctl_log.display()),
        );
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push((
            "PATH".into(),
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        ));
        ShippedUnit {
            exec_start,
            // systemd passes `$$` on as `$`.
            stop_post: value("ExecStopPost").replace("$$", "$"),
            prevent_restart: value("RestartPreventExitStatus")
                .split_whitespace()
                .map(|s| s.parse().unwrap())
                .collect(),
            env,
            systemctl_log,
        }
    }

    fn set(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
    }

    /// What the fake `systemctl` was asked, one call a line.
    fn systemctl_calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.systemctl_log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Starts the unit and lets it run until it exits, or until its log says `until` (then
    /// stops it as `systemctl stop` does, with SIGTERM); then its `ExecStopPost`.
    async fn run_until(&self, until: &str) -> UnitRun {
        use tokio::io::AsyncBufReadExt;
        let args: Vec<&str> = self.exec_start[1..].iter().map(String::as_str).collect();
        // `runner(["runner", "heartbeat"])` would say `runner` twice.
        let mut cmd = runner(&args[1..]);
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut log = String::new();
        let read = async {
            while let Ok(Some(line)) = lines.next_line().await {
                log.push_str(&line);
                log.push('\n');
                if line.contains(until) {
                    return true;
                }
            }
            false
        };
        let seen = tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("the heartbeat exited or logged what was awaited within 30 s");
        if seen {
            std::process::Command::new("kill")
                .args(["-TERM", &child.id().unwrap().to_string()])
                .status()
                .unwrap();
        }
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("the heartbeat ended")
            .unwrap();
        let exit = status.code().expect("exited, not killed");
        let post = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&self.stop_post)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("EXIT_STATUS", exit.to_string())
            .status()
            .await
            .unwrap();
        assert!(post.success(), "ExecStopPost failed");
        UnitRun {
            exit,
            log,
            restarts: exit != 0 && !self.prevent_restart.contains(&exit),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drifted_runner_under_the_shipped_unit_is_recycled_once_per_new_image() {
    let app = spawn_app().await;
    let dir = tempfile::tempdir().unwrap();
    let old = fake_runtime(dir.path(), "podman", FAKE_ID, &[]);
    // The pool has moved on; `report` keeps the runner leased to while it rolls.
    let r = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_B], "image_policy": "report"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let agent = Agent::register(&app, "linux", "build-07").await;
    let (key, state) = (agent.key(), agent.state());
    let mut unit = ShippedUnit::new(
        dir.path(),
        &[
            ("LEASEGATE_SERVER", &app.base),
            ("LEASEGATE_RUNNER_KEY", key.to_str().unwrap()),
            ("LEASEGATE_RUNNER_STATE", state.to_str().unwrap()),
            ("LEASEGATE_RUNTIME", old.to_str().unwrap()),
            ("LEASEGATE_IMAGE", "localhost/ci/runner:1"),
            ("LEASEGATE_RECYCLE_UNIT", "gitlab-runner.service"),
        ],
    );
    let recycle = "restart --no-block gitlab-runner.service";
    const WAITING: &str = "waiting for this runner to come onto its pool's current image";

    // Asked to recycle: exits 3, the runner's unit is restarted, the heartbeat comes back.
    let first = unit.run_until(WAITING).await;
    assert_eq!(first.exit, 3, "{}", first.log);
    assert!(first.restarts);
    assert_eq!(unit.systemctl_calls(), [recycle]);
    let memory = agent.dir.path().join("state/runner.recycled.json");
    let remembered: Value =
        serde_json::from_str(&std::fs::read_to_string(&memory).unwrap()).unwrap();
    assert_eq!(remembered["expected_image_ids"], json!([IMAGE_B]));
    assert_eq!(remembered["running"], FAKE_ID);
    assert_eq!(mode(&memory), 0o600);

    // Nothing pulled the image: the same answer, and the heartbeat stays up, saying at WARN
    // what it waits for, instead of restarting the runner every minute.
    let second = unit.run_until(WAITING).await;
    assert_eq!(
        second.exit, 0,
        "stopped, never exited by itself: {}",
        second.log
    );
    assert!(!second.restarts);
    let waiting = second.log.lines().find(|l| l.contains(WAITING)).unwrap();
    assert!(
        waiting.contains("WARN") && waiting.contains(IMAGE_B),
        "{waiting}"
    );
    assert_eq!(unit.systemctl_calls(), [recycle], "recycled once");
    let runner = app.runner(&agent.runner_id).await;
    assert_eq!(
        runner["image_current"], false,
        "still heart-beating: {runner}"
    );

    // The pool rolls on to another image: recycled for once more.
    let r = app
        .admin_patch(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let third = unit.run_until(WAITING).await;
    assert_eq!(third.exit, 3, "{}", third.log);
    assert!(third.log.contains(IMAGE_A), "{}", third.log);
    let fourth = unit.run_until(WAITING).await;
    assert_eq!(fourth.exit, 0, "{}", fourth.log);
    assert_eq!(unit.systemctl_calls(), [recycle, recycle]);

    // The runner comes onto the image: the memory is forgotten.
    let new_dir = dir.path().join("new");
    std::fs::create_dir(&new_dir).unwrap();
    let new = fake_runtime(&new_dir, "podman", IMAGE_A, &[]);
    unit.set("LEASEGATE_RUNTIME", new.to_str().unwrap());
    let fifth = unit.run_until("status=healthy").await;
    assert_eq!(fifth.exit, 0, "{}", fifth.log);
    assert!(!memory.exists(), "{}", fifth.log);
    assert_eq!(unit.systemctl_calls(), [recycle, recycle]);
    assert_eq!(app.runner(&agent.runner_id).await["image_current"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_bindings_follow_the_forge_runners_files_within_one_beat() {
    let app = spawn_app().await;
    app.pool("linux", &[FAKE_ID]).await;
    let dir = tempfile::tempdir().unwrap();
    let rt = fake_runtime(dir.path(), "podman", FAKE_ID, &[]);
    let sha = |t: &str| {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(t.as_bytes()))
    };
    let dot_runner = dir.path().join(".runner");
    let write_runner = |uuid: &str, token: &str| {
        std::fs::write(
            &dot_runner,
            format!(r#"{{"id": 12, "uuid": "{uuid}", "name": "build-01", "token": "{token}", "address": "https://forge.example"}}"#),
        )
        .unwrap()
    };
    let gitlab = dir.path().join("gitlab");
    std::fs::create_dir(&gitlab).unwrap();
    let config = gitlab.join("config.toml");
    let write_config = |token: &str| {
        std::fs::write(
            &config,
            format!("concurrent = 1\n\n[[runners]]\n  name = \"a\"\n  url = \"https://gitlab.example\"\n  token = \"{token}\"\n  executor = \"shell\"\n"),
        )
        .unwrap()
    };
    std::fs::write(gitlab.join(".runner_system_id"), "s_0123456789ab\n").unwrap();
    write_runner("7d1c9f0e-2b3a-4c5d-8e9f-0a1b2c3d4e5f", "forgejo-first");
    write_config("glrt-first");

    let files = [
        "--forgejo-runner-file",
        dot_runner.to_str().unwrap(),
        "--gitlab-config",
        config.to_str().unwrap(),
    ];
    let (key, state, id) = registered(&app, dir.path(), "linux", "build-01", &files).await;
    // What the runner is bound to: (kind, uuid or token hash, token hash or system id).
    let bound = |view: Value| -> Vec<(String, String, String)> {
        let mut b: Vec<_> = view["forge_runners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let s = |k: &str| b[k].as_str().unwrap_or("-").to_string();
                match b["kind"].as_str().unwrap() {
                    "forgejo" => (s("kind"), s("uuid"), s("token_sha256")),
                    _ => (s("kind"), s("token_sha256"), s("system_id")),
                }
            })
            .collect();
        b.sort();
        b
    };
    assert_eq!(
        bound(app.runner(&id).await),
        vec![
            (
                "forgejo".into(),
                "7d1c9f0e-2b3a-4c5d-8e9f-0a1b2c3d4e5f".into(),
                sha("forgejo-first")
            ),
            ("gitlab".into(), sha("glrt-first"), "s_0123456789ab".into()),
        ]
    );
    let beat = |extra: Vec<String>, env: Vec<(&'static str, String)>| {
        let mut args: Vec<String> = [
            "heartbeat",
            "--once",
            "--key",
            key.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
            "--runtime",
            rt.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra);
        let mut cmd = runner(&args.iter().map(String::as_str).collect::<Vec<_>>());
        for (k, v) in env {
            cmd.env(k, v);
        }
        run(cmd)
    };
    let with_files: Vec<String> = files.iter().map(|s| s.to_string()).collect();

    // The Forgejo runner re-registered and gitlab-runner renewed its token: one beat later,
    // the runner is bound to the new ones only.
    write_runner("1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9", "forgejo-second");
    write_config("glrt-renewed");
    let ran = beat(with_files.clone(), vec![]).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(
        bound(app.runner(&id).await),
        vec![
            (
                "forgejo".into(),
                "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9".into(),
                sha("forgejo-second")
            ),
            (
                "gitlab".into(),
                sha("glrt-renewed"),
                "s_0123456789ab".into()
            ),
        ]
    );

    // forgejo-runner 12 keeps its registration in config.yaml, named by the variable.
    let yaml = dir.path().join("config.yaml");
    std::fs::write(
        &yaml,
        "runner:\n  capacity: 1\nserver:\n  connections:\n    forge:\n      url: https://forge.example/\n      uuid: 33834eef-e758-48c4-a676-1745426747aa\n      token: forgejo-third\n",
    )
    .unwrap();
    let ran = beat(
        vec![],
        vec![
            ("LEASEGATE_FORGEJO_RUNNER_FILE", yaml.display().to_string()),
            ("LEASEGATE_GITLAB_CONFIG", config.display().to_string()),
        ],
    )
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let now = bound(app.runner(&id).await);
    assert_eq!(
        now[0],
        (
            "forgejo".into(),
            "33834eef-e758-48c4-a676-1745426747aa".into(),
            sha("forgejo-third")
        )
    );
    assert_eq!(now.len(), 2);

    // A beat naming no files claims nothing: the bindings stay.
    assert_eq!(beat(vec![], vec![]).await.code, 0);
    assert_eq!(bound(app.runner(&id).await), now);
    // Nor does one whose files cannot be read: it still beats, and says why at WARN.
    std::fs::remove_file(&yaml).unwrap();
    let ran = beat(
        vec!["--forgejo-runner-file".into(), yaml.display().to_string()],
        vec![],
    )
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stderr.contains("cannot read the forge runners' files"),
        "{ran:?}"
    );
    assert_eq!(bound(app.runner(&id).await), now);
    // Each change is in the runner's audit trail, by leasegate.
    let view = app.runner(&id).await;
    let follows = view["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "runner_forge_runners" && e["actor"] == "leasegate")
        .count();
    assert_eq!(follows, 2, "{view}");
}

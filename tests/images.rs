//! Several images per runner: a pool's `images`, each attested image judged against the
//! entry for its ref (one drifted of three refuses, naming it and its labels; a grace per
//! image; undescribed and absent images as the pool says), older single-image clients
//! unchanged, and the agent reading a real forgejo-runner `config.yml` and gitlab-runner
//! `config.toml` and attesting what the runtime has of each (never pulling).

use crate::common;

use common::agent::*;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const IMAGE_C: &str = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
const IMAGE_D: &str = "sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";
const IMAGE_E: &str = "sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

fn three(extra: Value) -> Value {
    let mut body = json!({"images": [
        {"ref": "node:20-bookworm", "expected_image_ids": [IMAGE_A]},
        {"ref": "postgres:16", "expected_image_ids": [IMAGE_B], "drift_grace_s": 0},
        {"ref": "redis:7", "expected_image_ids": [IMAGE_C]},
    ]});
    merge(&mut body, &extra);
    body
}

fn running(node: &str, postgres: &str, redis: &str) -> Value {
    json!({"images": [
        {"ref": "node:20-bookworm", "id": node, "labels": ["ubuntu-latest", "ubuntu-24.04"]},
        {"ref": "postgres:16", "id": postgres, "labels": ["db"]},
        {"ref": "redis:7", "id": redis},
    ]})
}

async fn put(app: &TestApp, body: Value) -> Value {
    let r = app.admin_put("/api/v1/admin/pools/docker", body).await;
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap()
}

async fn refused(app: &TestApp, attestation: &str) -> String {
    let r = app.lease(attestation).await;
    let p = expect_problem(r, "lease", StatusCode::CONFLICT, "image_drift").await;
    p["detail"].as_str().unwrap().to_string()
}

each_engine!(
    one_drifted_image_of_three_refuses_the_runner_naming_it_and_its_labels,
    each_image_rolls_with_its_own_grace,
    undescribed_and_absent_images_are_judged_as_the_pool_says,
    older_single_image_clients_and_pools_work_as_before,
    bad_image_entries_are_refused,
    the_agent_attests_what_a_forgejo_and_a_gitlab_runner_will_run,
);

async fn one_drifted_image_of_three_refuses_the_runner_naming_it_and_its_labels(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let pool = put(&app, three(json!({}))).await;
    assert_eq!(pool["undescribed_images"], "refuse");
    assert_eq!(pool["images"][1]["ref"], "postgres:16");
    assert_eq!(pool["images"][1]["drift_grace_s"], 0);
    assert_eq!(pool["images"][0]["drift_grace_s"], 900);
    let runner = app.register("docker", "build-01").await;
    app.enqueue("docker").await;

    let r = app
        .heartbeat(&runner.attest(running(IMAGE_A, IMAGE_B, IMAGE_C)))
        .await;
    let hb: Value = r.json().await.unwrap();
    assert_eq!(
        (hb["status"].as_str(), hb["action"].as_str()),
        (Some("healthy"), Some("none"))
    );
    assert_eq!(hb["pull"], json!([]));
    assert_eq!(hb["image_current"], true);

    let detail = refused(&app, &runner.attest(running(IMAGE_A, IMAGE_E, IMAGE_C))).await;
    assert_eq!(
        detail,
        format!("image postgres:16 (label db) runs {IMAGE_E} but its pool expects {IMAGE_B}")
    );
    let r = app
        .heartbeat(&runner.attest(running(IMAGE_A, IMAGE_E, IMAGE_C)))
        .await;
    let hb: Value = r.json().await.unwrap();
    assert_eq!(
        (hb["status"].as_str(), hb["code"].as_str()),
        (Some("drifted"), Some("image_drift"))
    );
    assert_eq!(
        (hb["action"].as_str(), hb["image_current"].as_bool()),
        (Some("recycle"), Some(false))
    );
    assert_eq!(hb["pull"], json!(["postgres:16"]));

    let view = app.runner(&runner.id).await;
    assert_eq!(view["status"], "drifted");
    let images = view["images"].as_array().unwrap();
    assert_eq!(images.len(), 3);
    assert_eq!(
        images[0]["labels"],
        json!(["ubuntu-latest", "ubuntu-24.04"])
    );
    assert_eq!(
        images
            .iter()
            .map(|i| i["current"].clone())
            .collect::<Vec<_>>(),
        [json!(true), json!(false), json!(true)]
    );
    let r = app.admin_get("/api/v1/admin/drift").await;
    let drift: Value = r.json().await.unwrap();
    assert_eq!(drift["drifted"][0]["runner_id"], runner.id.as_str());
    assert_eq!(drift["drifted"][0]["images"], json!(["postgres:16"]));
    assert_eq!(drift["drifted"][0]["running_image_id"], Value::Null);

    // Back on the expected image, it leases.
    let r = app
        .lease(&runner.attest(running(IMAGE_A, IMAGE_B, IMAGE_C)))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
}

async fn each_image_rolls_with_its_own_grace(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    put(&app, three(json!({}))).await;
    let runner = app.register("docker", "build-01").await;
    // node:20 rolls with its 900 s of grace, postgres:16 with none.
    let mut rolled = three(json!({}));
    rolled["images"][0]["expected_image_ids"] = json!([IMAGE_D]);
    rolled["images"][1]["expected_image_ids"] = json!([IMAGE_E]);
    let pool = put(&app, rolled).await;
    assert_eq!(pool["images"][0]["previous_image_ids"], json!([IMAGE_A]));
    assert!(pool["images"][0]["previous_valid_until"].is_string());
    assert_eq!(pool["images"][2]["previous_image_ids"], json!([]));

    app.enqueue("docker").await;
    let detail = refused(&app, &runner.attest(running(IMAGE_A, IMAGE_B, IMAGE_C))).await;
    assert!(
        detail.starts_with("image postgres:16 (label db) runs "),
        "{detail}"
    );
    // On the new postgres and the old node: inside node's grace, leased, told to pull node.
    let r = app
        .heartbeat(&runner.attest(running(IMAGE_A, IMAGE_E, IMAGE_C)))
        .await;
    let hb: Value = r.json().await.unwrap();
    assert_eq!(
        (hb["status"].as_str(), hb["action"].as_str()),
        (Some("healthy"), Some("recycle"))
    );
    assert_eq!(hb["pull"], json!(["node:20-bookworm"]));
    // What to come onto, by ref: an agent recycles once per such set, and the pool has
    // no set of its own to key on.
    assert_eq!(
        hb["expected_images"],
        json!([{"ref": "node:20-bookworm", "expected_image_ids": [IMAGE_D]}])
    );
    assert_eq!(hb["expected_image_ids"], json!([]));
    // Its roll counts it: one live runner, off one image.
    let drift: Value = app
        .admin_get("/api/v1/admin/drift")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        drift["pools"],
        json!([{"pool": "docker", "roll_stalled": true, "drifted": 1, "live": 1}])
    );
    let page = app.page_text("/admin").await;
    assert!(
        page.contains("3 images") && page.contains("<code>node:20-bookworm</code>"),
        "{page}"
    );
    let r = app
        .lease(&runner.attest(running(IMAGE_A, IMAGE_E, IMAGE_C)))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
}

async fn undescribed_and_absent_images_are_judged_as_the_pool_says(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    put(&app, three(json!({}))).await;
    let runner = app.register("docker", "build-01").await;
    app.enqueue("docker").await;
    let mut stray = running(IMAGE_A, IMAGE_B, IMAGE_C);
    stray["images"]
        .as_array_mut()
        .unwrap()
        .push(json!({"ref": "alpine:3", "id": IMAGE_D, "labels": ["tiny"]}));
    let detail = refused(&app, &runner.attest(stray.clone())).await;
    assert_eq!(
        detail,
        "image alpine:3 (label tiny) is not one its pool describes (undescribed_images: refuse)"
    );
    put(&app, three(json!({"undescribed_images": "ignore"}))).await;
    assert_eq!(
        app.heartbeat(&runner.attest(stray))
            .await
            .json::<Value>()
            .await
            .unwrap()["status"],
        "healthy"
    );

    let absent = json!({"images": [
        {"ref": "node:20-bookworm", "id": IMAGE_A},
        {"ref": "postgres:16", "absent": true, "labels": ["db"]},
    ]});
    let detail = refused(&app, &runner.attest(absent.clone())).await;
    assert_eq!(
        detail,
        "image postgres:16 (label db) is not present on the runner, and its pool does not accept it absent"
    );
    let mut force_pull = three(json!({}));
    force_pull["images"][1]["absent_ok"] = json!(true);
    put(&app, force_pull).await;
    let r = app.lease(&runner.attest(absent)).await;
    assert_eq!(r.status(), StatusCode::OK);
}

async fn older_single_image_clients_and_pools_work_as_before(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    // A pool describing images judges an older agent's single `image` by its ref.
    put(&app, three(json!({}))).await;
    let old = app.register("docker", "old-agent").await;
    let single = |id: &str, r: &str| json!({"image": {"id": id, "ref": r}});
    let r = app
        .heartbeat(&old.attest(single(IMAGE_A, "node:20-bookworm")))
        .await;
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "healthy");
    let r = app
        .heartbeat(&old.attest(single(IMAGE_B, "node:20-bookworm")))
        .await;
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "image_drift");
    let r = app
        .heartbeat(&old.attest(json!({"image": {"id": IMAGE_A}})))
        .await;
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "image_unreported");

    // A pool that describes no images judges `image` exactly as before; `images` is ignored.
    app.pool("plain", &[IMAGE_A]).await;
    let new = app.register("plain", "new-agent").await;
    let mut both = running(IMAGE_E, IMAGE_E, IMAGE_E);
    both["image"] = json!({"id": IMAGE_A, "ref": "ci/runner:1"});
    let r = app.heartbeat(&new.attest(both)).await;
    let hb: Value = r.json().await.unwrap();
    assert_eq!(
        (hb["status"].as_str(), hb["image_current"].as_bool()),
        (Some("healthy"), Some(true))
    );
    let plain: Value = app
        .admin_get("/api/v1/admin/pools/plain")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(plain["images"], json!([]));

    // A patch that does not name them keeps the images and their policy.
    put(&app, three(json!({"undescribed_images": "ignore"}))).await;
    let r = app
        .admin_patch("/api/v1/admin/pools/docker", json!({"drift_grace_s": 60}))
        .await;
    let pool: Value = r.json().await.unwrap();
    assert_eq!(pool["images"].as_array().unwrap().len(), 3);
    assert_eq!(pool["undescribed_images"], "ignore");
    let r = app
        .admin_patch(
            "/api/v1/admin/pools/docker",
            json!({"images": null, "expected_image_ids": [IMAGE_A]}),
        )
        .await;
    assert_eq!(r.json::<Value>().await.unwrap()["images"], json!([]));
}

async fn bad_image_entries_are_refused(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    for (body, case) in [
        (
            json!({"images": [{"ref": "x", "expected_image_ids": []}]}),
            "no ids",
        ),
        (
            json!({"images": [{"ref": "x", "expected_image_ids": [IMAGE_A], "pull": true}]}),
            "unknown field",
        ),
        (
            json!({"images": [{"ref": "x", "expected_image_ids": ["latest"]}]}),
            "not a digest",
        ),
        (
            json!({"images": [{"ref": "", "expected_image_ids": [IMAGE_A]}]}),
            "empty ref",
        ),
        (
            json!({"images": [["x", [IMAGE_A]]]}),
            "an entry as an array",
        ),
        (
            json!({"images": [{"ref": "x", "expected_image_ids": [IMAGE_A]}], "undescribed_images": "warn"}),
            "policy",
        ),
        (
            json!({"images": [{"ref": "x", "image_source": "mirror"}]}),
            "source",
        ),
        (
            json!({"images": [{"ref": "Not A/Reference", "image_source": "registry"}]}),
            "a registry entry's ref that does not parse",
        ),
    ] {
        let r = app.admin_put("/api/v1/admin/pools/p", body).await;
        expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
    }
    // A ref named twice is the later entry.
    let pool = put(
        &app,
        json!({"images": [
            {"ref": "x", "expected_image_ids": [IMAGE_A]},
            {"ref": "x", "expected_image_ids": [IMAGE_B]},
        ]}),
    )
    .await;
    assert_eq!(
        pool["images"],
        json!([{"ref": "x", "image_source": "manual", "expected_image_ids": [IMAGE_B],
            "previous_image_ids": [], "previous_valid_until": null, "drift_grace_s": 900, "absent_ok": false,
            "resolved_digest": null, "resolved_image_id": null, "last_resolution": null, "resolution_failures": 0}])
    );
    let runner = app.register("docker", "r").await;
    let r = app
        .heartbeat(&runner.attest(json!({"images": [{"ref": "x"}]})))
        .await;
    expect_problem(r, "no id", StatusCode::UNAUTHORIZED, "attestation_invalid").await;
    let r = app
        .heartbeat(&runner.attest(json!({"images": [{"ref": "x", "id": "latest"}]})))
        .await;
    expect_problem(r, "bad digest", StatusCode::BAD_REQUEST, "bad_request").await;
}

async fn the_agent_attests_what_a_forgejo_and_a_gitlab_runner_will_run(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    agent_reads_the_runners_configuration(app).await;
}

/// forgejo-runner's `config.yml` as `forgejo-runner generate-config` writes it, cut to what
/// matters here, with three labels on two images and one host label.
const FORGEJO_CONFIG: &str = r#"# Example configuration file, it's safe to copy this as the default config file without any modification.

log:
  # The level of logging, can be trace, debug, info, warn, error, fatal
  level: info
  job_level: info

runner:
  # Where to store the registration result.
  file: .runner
  # Execute how many tasks concurrently at the same time.
  capacity: 1
  envs:
    A_TEST_ENV_NAME_1: a_test_env_value_1
  env_file: .env
  timeout: 3h
  shutdown_timeout: 3h
  insecure: false
  fetch_timeout: 5s
  fetch_interval: 2s
  report_interval: 1s
  # The labels of a runner are used to determine which jobs the runner can run, and how to run them.
  labels:
    - "ubuntu-latest:docker://node:20-bookworm"
    - "ubuntu-24.04:docker://node:20-bookworm"
    - "ubuntu-22.04:docker://ghcr.io/catthehacker/ubuntu:act-22.04"
    - "self-hosted:host"

cache:
  enabled: true
  dir: ""

container:
  network: ""
  enable_ipv6: false
  privileged: false
  options:
  workdir_parent:
  valid_volumes: []
  docker_host: ""
  force_pull: false
  force_rebuild: false

host:
  workdir_parent:
"#;

/// gitlab-runner's `config.toml` with a docker executor, its image and services (both forms).
const GITLAB_CONFIG: &str = r#"concurrent = 4
check_interval = 0
shutdown_timeout = 0

[session_server]
  session_timeout = 1800

[[runners]]
  name = "docker-01"
  url = "https://gitlab.example.com"
  id = 12
  token = "glrt-t0k3n"
  token_obtained_at = 2026-11-30T10:00:00Z
  token_expires_at = 0001-01-01T00:00:00Z
  executor = "docker"
  [runners.cache]
    MaxUploadedArchiveSize = 0
  [runners.docker]
    tls_verify = false
    image = "ruby:3.3"
    privileged = false
    disable_entrypoint_overwrite = false
    oom_kill_disable = false
    disable_cache = false
    volumes = ["/cache"]
    shm_size = 0
    network_mtu = 0
    [[runners.docker.services]]
      name = "postgres:16"
      alias = "db"
    [[runners.docker.services]]
      name = "redis:7"
"#;

/// A fake podman that has node and ruby locally, not the others.
fn runtime(dir: &Path) -> PathBuf {
    let image = format!(
        r#"case "$5" in
    node:20-bookworm) echo '{}' ;;
    ruby:3.3) echo '{} docker.io/library/ruby@{}' ;;
    *) echo "Error: $5: image not known" >&2; exit 125 ;;
  esac"#,
        IMAGE_A.trim_start_matches("sha256:"),
        IMAGE_B,
        IMAGE_C
    );
    fake_runtime(dir, "podman", IMAGE_A, &[("image", &image)])
}

async fn agent_reads_the_runners_configuration(app: TestApp) {
    put(
        &app,
        json!({"images": [
            {"ref": "node:20-bookworm", "expected_image_ids": [IMAGE_A]},
            {"ref": "ghcr.io/catthehacker/ubuntu:act-22.04", "expected_image_ids": [IMAGE_D], "absent_ok": true},
            {"ref": "ruby:3.3", "expected_image_ids": [IMAGE_B]},
            {"ref": "postgres:16", "expected_image_ids": [IMAGE_D]},
            {"ref": "redis:7", "expected_image_ids": [IMAGE_E], "absent_ok": true},
        ]}),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (key, state, runner_id) = registered(&app, dir.path(), "docker", "docker-01", &[]).await;

    let forgejo = dir.path().join("config.yml");
    std::fs::write(&forgejo, FORGEJO_CONFIG).unwrap();
    let gitlab = dir.path().join("config.toml");
    std::fs::write(&gitlab, GITLAB_CONFIG).unwrap();
    let rt = runtime(dir.path());
    let beat = |extra: &[&str]| {
        let mut args = vec![
            "heartbeat",
            "--once",
            "--key",
            key.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
            "--runtime",
            rt.to_str().unwrap(),
            "--forgejo-runner-config",
            forgejo.to_str().unwrap(),
            "--gitlab-images-config",
            gitlab.to_str().unwrap(),
            "--min-free-disk",
            "0",
        ];
        args.extend_from_slice(extra);
        runner(&args)
    };
    let ran = run(beat(&[])).await;
    // postgres:16 is absent and the pool does not accept it absent: drifted, recycle (exit 3).
    assert_eq!(ran.code, 3, "{ran:?}");
    let view = app.runner(&runner_id).await;
    assert_eq!(view["status"], "drifted");
    assert_eq!(
        view["detail"],
        "image postgres:16 is not present on the runner, and its pool does not accept it absent"
    );
    let images: Vec<(String, Value, Value, Value)> = view["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["ref"].as_str().unwrap().to_string(),
                i["labels"].clone(),
                i["id"].clone(),
                i["absent"].clone(),
            )
        })
        .collect();
    assert_eq!(
        images,
        [
            (
                "node:20-bookworm".into(),
                json!(["ubuntu-latest", "ubuntu-24.04"]),
                json!(IMAGE_A),
                json!(false)
            ),
            (
                "ghcr.io/catthehacker/ubuntu:act-22.04".into(),
                json!(["ubuntu-22.04"]),
                Value::Null,
                json!(true)
            ),
            ("ruby:3.3".into(), json!([]), json!(IMAGE_B), json!(false)),
            ("postgres:16".into(), json!([]), Value::Null, json!(true)),
            ("redis:7".into(), json!([]), Value::Null, json!(true)),
        ]
    );
    assert_eq!(view["images"][2]["digest"], IMAGE_C);
    // Never pulled: only inspected.
    let calls = calls(dir.path());
    assert!(calls.iter().all(|c| !c.contains("pull")), "{calls:?}");
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.starts_with("image inspect"))
            .count(),
        5,
        "{calls:?}"
    );

    // The forgejo runner alone: every image it uses is accepted (the absent one may be).
    let ran = run(runner(&[
        "heartbeat",
        "--once",
        "--key",
        key.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--runtime",
        rt.to_str().unwrap(),
        "--forgejo-runner-config",
        forgejo.to_str().unwrap(),
        "--min-free-disk",
        "0",
    ]))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(app.runner(&runner_id).await["status"], "healthy");

    // A file that names no docker image says so.
    std::fs::write(&forgejo, "runner:\n  labels:\n    - \"self-hosted:host\"\n").unwrap();
    let ran = run(beat(&[])).await;
    assert_eq!(ran.code, 5, "{ran:?}");
    assert!(
        ran.stderr
            .contains("no runner.labels entry names a docker image"),
        "{}",
        ran.stderr
    );
}

//! The disk a runner runs on: the agent measures the runtime's storage and its work directory
//! on real filesystems (a small tmpfs where this test may mount one) and fails its probe below
//! `--min-free-disk` or `--min-free-inodes` in words an operator acts on; the figures travel in
//! `probe.disk` to the runner view and the page, and a pool's `disk_warning` warns (shown and
//! counted) while the status stays healthy.

use crate::common;

use common::agent::*;
use common::*;
use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const ID: &str = "sha256:1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef";

/// A tmpfs of `size` with `inodes` inodes mounted on a fresh directory, unmounted on drop;
/// `None` (said so) where this process may not mount one.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str, inodes: u32) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},nr_inodes={inodes}"),
            ])
            .arg("tmpfs")
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            println!("cannot mount a tmpfs here: measuring the temporary directory's filesystem");
            return None;
        }
        Some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// A fake podman whose `info` names `storage` as its graph root, as podman's template prints.
fn runtime_on(dir: &Path, storage: &Path) -> PathBuf {
    let info = format!("printf '9.9.9-fake\\t%s\\n' '{}'", storage.display());
    fake_runtime(dir, "fakepod", ID, &[("info", &info)])
}

fn preflight(runtime: &Path, extra: &[&str]) -> tokio::process::Command {
    let mut args = vec!["preflight", "--runtime", runtime.to_str().unwrap()];
    args.extend_from_slice(extra);
    runner(&args)
}

/// Free bytes to the caller on `path`'s filesystem, as the agent measures them.
fn free_bytes(path: &Path) -> u64 {
    let s = rustix::fs::statvfs(path).unwrap();
    s.f_bavail * s.f_frsize
}

#[tokio::test]
async fn a_nearly_full_work_dir_or_storage_fails_the_probe_naming_the_path_and_the_need() {
    let dir = tempfile::tempdir().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let rt = runtime_on(dir.path(), storage.path());
    let tmpfs = Tmpfs::mount("8m", 1024);
    let (small, need): (PathBuf, Option<String>) = match &tmpfs {
        Some(t) => (t.path().to_path_buf(), None),
        // No tmpfs: the threshold is set above what the filesystem has free.
        None => {
            let p = dir.path().to_path_buf();
            let above = (free_bytes(&p) + (1 << 30)).to_string();
            (p, Some(above))
        }
    };
    let work_dir = small.to_str().unwrap();
    let mut args = vec!["--work-dir", work_dir];
    if let Some(n) = &need {
        args.extend(["--min-free-disk", n]);
    }
    let ran = run(preflight(&rt, &args)).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    let line = ran.stderr_lines().join("\n");
    match &need {
        None => assert_eq!(
            line,
            format!(
                "cannot run a container with fakepod: disk: 8 MiB free on {work_dir}, needs 5 GiB"
            )
        ),
        Some(_) => {
            assert!(
                line.starts_with("cannot run a container with fakepod: disk: ")
                    && line.contains(&format!(" free on {work_dir}, needs ")),
                "{line}"
            )
        }
    }

    // Enough for a lower line: both filesystems measured, said on the one line of a pass.
    let ran = run(preflight(
        &rt,
        &["--work-dir", work_dir, "--min-free-disk", "1MiB"],
    ))
    .await;
    if need.is_none() {
        assert_eq!(ran.code, 0, "{ran:?}");
        assert!(
            ran.stdout
                .contains(&format!(" free on {}", storage.path().display()))
                && ran.stdout.contains(&format!("; 8 MiB free on {work_dir}")),
            "{}",
            ran.stdout
        );
    }

    // The runtime's storage is measured too, where `info` says it is.
    let Some(t) = &tmpfs else { return };
    let rt = runtime_on(dir.path(), t.path());
    let ran = run(preflight(&rt, &["--min-free-disk", "500MB"])).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [format!(
            "cannot run a container with fakepod: disk: 8 MiB free on {}, needs 500 MB",
            t.path().display()
        )]
    );
}

#[tokio::test]
async fn inodes_run_out_on_their_own_and_fail_the_probe_too() {
    let Some(t) = Tmpfs::mount("8m", 64) else {
        common::skip::skipped("cannot mount a tmpfs with few inodes here");
        return;
    };
    // 64 inodes, the root takes one: 61 files leave 2 free, 3 %.
    for i in 0..61 {
        std::fs::write(t.path().join(format!("f{i}")), b"").unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let rt = runtime_on(dir.path(), storage.path());
    let work_dir = t.path().to_str().unwrap();
    let ran = run(preflight(
        &rt,
        &["--work-dir", work_dir, "--min-free-disk", "0"],
    ))
    .await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [format!(
            "cannot run a container with fakepod: disk: 3% of inodes free on {work_dir} (2 of 64), needs 5%"
        )]
    );
    let ran = run(preflight(
        &rt,
        &[
            "--work-dir",
            work_dir,
            "--min-free-disk",
            "0",
            "--min-free-inodes",
            "3",
        ],
    ))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
}

#[tokio::test]
async fn bad_thresholds_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let rt = fake_runtime(dir.path(), "fakepod", ID, &[]);
    for args in [
        ["--min-free-disk", "5 parsecs"],
        ["--min-free-disk", "-1GiB"],
        ["--min-free-inodes", "101"],
    ] {
        let ran = run(preflight(&rt, &args)).await;
        assert_eq!(ran.code, 64, "{args:?}: {ran:?}");
    }
}

/// Logs in through the form and returns the session cookie (`name=value`).
async fn login(app: &TestApp) -> String {
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(app.url("/admin/login"))
        .form(&[("token", ADMIN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()[LOCATION], "/admin");
    let cookie = r.headers()[SET_COOKIE].to_str().unwrap().to_string();
    cookie.split(';').next().unwrap().to_string()
}

async fn page(app: &TestApp, path: &str) -> String {
    let cookie = login(app).await;
    let r = app
        .client
        .get(app.url(path))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{path}");
    r.text().await.unwrap()
}

fn storage(free_gib: u64, free_inodes: u64) -> Value {
    json!({"path": "/var/lib/containers/storage", "role": "storage",
           "free_bytes": free_gib << 30, "total_bytes": 100u64 << 30,
           "free_inodes": free_inodes, "total_inodes": 1000})
}

async fn disk_warned_metric(app: &TestApp) -> String {
    let text = app.metrics_text().await;
    text.lines()
        .find(|l| l.starts_with("leasegate_runners_disk_warned{pool=\"linux\"}"))
        .unwrap_or("absent")
        .to_string()
}

each_engine!(
    the_agent_sends_its_real_figures,
    the_figures_reach_the_runner_view_and_the_page_and_a_pool_warns_before_it_fails,
    a_bad_warning_or_bad_figures_are_refused,
);

async fn the_agent_sends_its_real_figures(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    an_agents_heartbeat_carries_the_work_dirs_real_figures(app).await;
}

async fn the_figures_reach_the_runner_view_and_the_page_and_a_pool_warns_before_it_fails(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let r = app
            .admin_put(
                "/api/v1/admin/pools/linux",
                json!({"expected_image_ids": [IMAGE_A],
                       "disk_warning": {"min_free_bytes": 10u64 << 30, "min_free_inodes_percent": 10}}),
            )
            .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let pool: Value = r.json().await.unwrap();
    assert_eq!(
        pool["disk_warning"],
        json!({"min_free_bytes": 10u64 << 30, "min_free_inodes_percent": 10})
    );
    let runner = app.register("linux", "build-01").await;

    // 6 GiB free: above what fails the runner's probe, under the pool's warning line.
    let r = app
        .heartbeat(&runner.attest(json!({"probe": {"disk": [storage(6, 500)]}})))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let view = app.runner(&runner.id).await;
    assert_eq!(view["status"], "healthy");
    assert_eq!(view["disk"], json!([storage(6, 500)]));
    assert_eq!(
        view["disk_warning"],
        "disk: 6 GiB free on /var/lib/containers/storage, the pool warns under 10 GiB"
    );
    let r = app.admin_get("/api/v1/admin/pools/linux").await;
    let pool: Value = r.json().await.unwrap();
    assert_eq!(pool["runners_disk_warned"], 1);
    assert_eq!(pool["runners_by_status"]["healthy"], 1);
    assert_eq!(
        disk_warned_metric(&app).await,
        "leasegate_runners_disk_warned{pool=\"linux\"} 1"
    );
    // The lease is not refused for a warning.
    let job = app.enqueue("linux").await;
    let r = app
        .lease(&runner.attest(json!({"probe": {"disk": [storage(6, 500)]}})))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["job"]["id"], job.as_str());

    let html = page(&app, &format!("/admin/runners/{}", runner.id)).await;
    assert!(
        html.contains(
            "6 GiB free of 100 GiB on /var/lib/containers/storage (storage), 50% of inodes free"
        ),
        "the page shows the figures"
    );
    assert!(html.contains("the pool warns under 10 GiB"));
    let fleet = page(&app, "/admin").await;
    assert!(
        fleet.contains("1 runner under the pool&#x27;s disk warning line")
            || fleet.contains("1 runner under the pool's disk warning line"),
        "the pool card counts it"
    );

    // Inodes under the line warn as well; plenty of both warns of nothing.
    app.heartbeat(&runner.attest(json!({"probe": {"disk": [storage(60, 50)]}})))
        .await;
    assert_eq!(
        app.runner(&runner.id).await["disk_warning"],
        "disk: 5% of inodes free on /var/lib/containers/storage, the pool warns under 10%"
    );
    app.heartbeat(&runner.attest(json!({"probe": {"disk": [storage(60, 500)]}})))
        .await;
    assert_eq!(app.runner(&runner.id).await["disk_warning"], Value::Null);
    assert_eq!(
        disk_warned_metric(&app).await,
        "leasegate_runners_disk_warned{pool=\"linux\"} 0"
    );

    // A patch that does not name the warning keeps it; null removes it.
    let r = app
        .admin_patch("/api/v1/admin/pools/linux", json!({"drift_grace_s": 60}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap()["disk_warning"]["min_free_inodes_percent"],
        10
    );
    let r = app
        .admin_patch("/api/v1/admin/pools/linux", json!({"disk_warning": null}))
        .await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["disk_warning"],
        Value::Null
    );

    // A runner that sends no figures (an older agent) shows none.
    let old = app.register("linux", "build-02").await;
    assert_eq!(app.heartbeat(&old.healthy()).await.status(), StatusCode::OK);
    assert_eq!(app.runner(&old.id).await["disk"], json!([]));
}

async fn a_bad_warning_or_bad_figures_are_refused(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    for (body, case) in [
        (
            json!({"image_policy": "off", "disk_warning": {"min_free_inodes_percent": 101}}),
            "over 100 %",
        ),
        (
            json!({"image_policy": "off", "disk_warning": {"min_free": 5}}),
            "unknown field",
        ),
        (
            json!({"image_policy": "off", "disk_warning": {"min_free_bytes": -1}}),
            "negative",
        ),
        (
            json!({"image_policy": "off", "disk_warning": {"min_free_bytes": "5GiB"}}),
            "text",
        ),
    ] {
        let r = app.admin_put("/api/v1/admin/pools/p", body).await;
        expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
    }
    app.admin_put("/api/v1/admin/pools/p", json!({"image_policy": "off"}))
        .await;
    let runner = app.register("p", "r").await;
    let mut as_text = storage(6, 500);
    as_text["free_bytes"] = json!("6 GiB");
    let r = app
        .heartbeat(&runner.attest(json!({"probe": {"disk": [as_text]}})))
        .await;
    let p = expect_problem(
        r,
        "free_bytes as text",
        StatusCode::UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("probe.disk"), "{p}");
}

async fn an_agents_heartbeat_carries_the_work_dirs_real_figures(app: TestApp) {
    app.admin_put("/api/v1/admin/pools/linux", json!({"image_policy": "off"}))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let (key, state, runner_id) = registered(&app, dir.path(), "linux", "build-01", &[]).await;

    let storage = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let rt = runtime_on(dir.path(), storage.path());
    let ran = run(runner(&[
        "heartbeat",
        "--once",
        "--key",
        key.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--runtime",
        rt.to_str().unwrap(),
        "--work-dir",
        work.path().to_str().unwrap(),
        "--min-free-disk",
        "1MiB",
    ]))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let view = app.runner(&runner_id).await;
    assert_eq!(view["status"], "healthy");
    let disk = view["disk"].as_array().unwrap();
    let roles: Vec<(&str, &str)> = disk
        .iter()
        .map(|d| (d["role"].as_str().unwrap(), d["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        roles,
        [
            ("storage", storage.path().to_str().unwrap()),
            ("work_dir", work.path().to_str().unwrap())
        ]
    );
    let free = disk[1]["free_bytes"].as_u64().unwrap();
    let now_free = free_bytes(work.path());
    // The same filesystem, measured a moment apart: within 1 GiB of each other.
    assert!(free.abs_diff(now_free) < 1 << 30, "{free} vs {now_free}");
    assert!(disk[1]["total_bytes"].as_u64().unwrap() >= free);
}

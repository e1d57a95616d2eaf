//! `leasegate runner github` end to end: the real binary as the machine, the real service
//! (`spawn_app()`, its GitHub watcher polling every second), the test double of GitHub's REST
//! API, a fake container runtime, and a stand-in for GitHub's `run.sh` that records the JIT
//! config it is given. The loop mints one registration per run, asks again after a job, gets
//! nothing while its runtime is broken (and loses the idle registration it held when the
//! runtime broke), and hands SIGTERM on to GitHub's runner.

use crate::common;

use common::agent::*;
use common::binary::sigterm;
use common::github::{Auth, FakeGithub};
use common::*;
use serde_json::json;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const IMAGE: &str = "sha256:5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";

/// GitHub's runner, standing in: records `--jitconfig` and the signal setting it was started
/// with, then waits while `hold` exists (leaving at once on SIGTERM, which it records), as a
/// listener waits for its job, or exits, as after its one job.
const RUN_SH: &str = r#"dir="$(dirname "$0")"
[ "$1" = "--jitconfig" ] && [ -n "$2" ] || { echo "usage: run.sh --jitconfig CONFIG" >&2; exit 2; }
printf '%s %s\n' "$2" "${RUNNER_MANUALLY_TRAP_SIG:-unset}" >> "$dir/jitconfigs"
trap 'echo TERM >> "$dir/signals"; exit 0' TERM
while [ -f "$dir/hold" ]; do sleep 0.1; done
exit 0"#;

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits (up to 30 s) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_runs_one_job_per_registration_gets_nothing_while_broken_and_passes_sigterm_on() {
    let github = FakeGithub::start(Auth::Token("github_pat_e2e".into())).await;
    let url = github.url.clone();
    let app = spawn_app_with(move |a| {
        a.github_api_url = url;
        a.github_token = Some("github_pat_e2e".into());
        a.github_poll_s = 1;
        a.heartbeat_interval_s = 1;
    })
    .await;
    let r = app
        .admin_put(
            "/api/v1/admin/pools/gh",
            json!({"expected_image_ids": [IMAGE], "github": {"scope": "orgs/acme", "labels": ["linux", "x64"]}}),
        )
        .await;
    assert!(r.status().is_success());

    // The machine: a key, its registration, a runtime that breaks when `broken` exists.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (key, state, runner_id) = registered(&app, d, "gh", "build-07", &[]).await;
    let broken = d.join("broken");
    let runtime = fake_runtime(
        d,
        "podman",
        IMAGE,
        &[(
            "info",
            &format!(
                "if [ -f '{}' ]; then echo 'Error: default OCI runtime \"crun\" not found: invalid argument' >&2; exit 125; else echo 9.9.9-fake; fi",
                broken.display()
            ),
        )],
    );
    let runner_dir = d.join("actions-runner");
    std::fs::create_dir(&runner_dir).unwrap();
    script(&runner_dir, "run.sh", RUN_SH);
    let (jitconfigs, signals, hold) = (
        runner_dir.join("jitconfigs"),
        runner_dir.join("signals"),
        runner_dir.join("hold"),
    );

    let log = d.join("agent.log");
    let mut agent = runner(&[
        "github",
        "--runtime",
        runtime.to_str().unwrap(),
        "--image",
        "localhost/ci/runner:1",
        "--key",
        key.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--runner-dir",
        runner_dir.to_str().unwrap(),
    ]);
    agent
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut agent = agent.spawn().unwrap();

    // 1. Minted and run; its run ends (as after its job), GitHub drops it, and the loop gets
    //    the next one once the watcher has seen the first done.
    eventually("the first registration runs", || {
        lines(&jitconfigs).len() == 1
    })
    .await;
    let first = github.runners();
    assert_eq!(first.len(), 1);
    assert!(first[0].name.starts_with("build-07-"), "{}", first[0].name);
    assert_eq!(first[0].labels, ["linux", "x64"]);
    assert_eq!(
        lines(&jitconfigs)[0],
        format!(
            "{} 1",
            common::github::jit_config_for(first[0].id, &first[0].name)
        ),
        "run.sh --jitconfig <GitHub's config>, with RUNNER_MANUALLY_TRAP_SIG=1"
    );
    std::fs::write(&hold, "").unwrap();
    github.remove_runner(first[0].id);
    eventually("the next registration runs", || {
        lines(&jitconfigs).len() == 2
    })
    .await;
    let second = github.runners();
    assert_eq!(second.len(), 1);
    assert_ne!(second[0].id, first[0].id);

    // 2. Its listener waits (online, idle) when the runtime breaks: the heartbeats carry it,
    //    and the watcher withdraws the idle registration.
    github.set_runner(second[0].id, true, false);
    std::fs::write(&broken, "").unwrap();
    eventually(
        "the broken machine's idle registration is withdrawn",
        || github.runners().is_empty(),
    )
    .await;
    let detail = app.runner(&runner_id).await;
    assert_eq!(
        detail["github_registrations"][0]["end_reason"], "probe_failed",
        "{detail}"
    );

    // 3. Its listener ends (its registration is gone); asked again, the broken machine gets
    //    nothing and GitHub is not called.
    std::fs::remove_file(&hold).unwrap();
    let minted_so_far = github.calls_to("generate-jitconfig").len();
    eventually("the refusal is logged with the runtime's words", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains("gets no GitHub registration")
                    && l.contains("crun")
                    && l.contains("probe_failed")
            })
    })
    .await;
    assert_eq!(github.calls_to("generate-jitconfig").len(), minted_so_far);

    // 4. Mended: a registration again; SIGTERM is handed to GitHub's runner and waited for.
    std::fs::write(&hold, "").unwrap();
    std::fs::remove_file(&broken).unwrap();
    eventually("a registration once mended", || {
        lines(&jitconfigs).len() == 3
    })
    .await;
    let status = sigterm(&mut agent).await;
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(lines(&signals), ["TERM"], "GitHub's runner got the SIGTERM");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("SIGTERM: passed on to GitHub's runner"),
        "{said}"
    );
    for config in lines(&jitconfigs) {
        assert!(
            !said.contains(config.split(' ').next().unwrap()),
            "a JIT config in the log"
        );
    }
    github.assert_clean();
}

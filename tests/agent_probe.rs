//! `leasegate runner preflight` against what a real runtime cannot be made to do here: fake
//! runtimes (shell scripts given as `--runtime /path`) that hang, fail with several lines of
//! stderr, lack the image or refuse to start a container; and the real docker client with no
//! daemon, and a runtime that is not installed at all.

use crate::common;

use common::agent::*;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const ID: &str = "sha256:1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef";

fn preflight(runtime: &std::path::Path, extra: &[&str]) -> tokio::process::Command {
    let mut args = vec!["preflight", "--runtime", runtime.to_str().unwrap()];
    args.extend_from_slice(extra);
    runner(&args)
}

#[tokio::test]
async fn a_hung_runtime_fails_after_the_timeout_with_its_own_message() {
    let dir = tempfile::tempdir().unwrap();
    let rt = script(dir.path(), "fakepod", "exec sleep 60");
    let started = Instant::now();
    let ran = run(preflight(&rt, &["--timeout-s", "1"])).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        ["cannot run a container with fakepod: fakepod info did not answer within 1 s"]
    );
    assert_eq!(ran.stdout, "");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the hang was cut short"
    );
}

#[tokio::test]
async fn exit_125_with_several_stderr_lines_quotes_the_last_one() {
    let dir = tempfile::tempdir().unwrap();
    let info = r#"echo 'time="2026-11-30T11:00:00Z" level=warning msg="RunRoot is pointing to a path (/run/user/1000/containers) which is not writable. Most likely podman will fail."' >&2
echo 'Error: default OCI runtime "crun" not found: invalid argument' >&2
echo >&2
exit 125"#;
    let rt = fake_runtime(dir.path(), "fakepod", ID, &[("info", info)]);
    let ran = run(preflight(&rt, &[])).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [
            r#"cannot run a container with fakepod: default OCI runtime "crun" not found: invalid argument"#
        ]
    );
}

#[tokio::test]
async fn a_missing_image_is_named_and_never_pulled() {
    let dir = tempfile::tempdir().unwrap();
    let image = "echo 'Error: inspecting object: registry.example/ci/runner:2: image not known' >&2; exit 125";
    let rt = fake_runtime(dir.path(), "fakepod", ID, &[("image", image)]);
    let ran = run(preflight(
        &rt,
        &[
            "--image",
            "registry.example/ci/runner:2",
            "--depth",
            "create",
        ],
    ))
    .await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [
            "cannot run a container with fakepod: image registry.example/ci/runner:2 is not present locally (preflight never pulls)"
        ]
    );
    let calls = calls(dir.path());
    assert!(
        calls
            .iter()
            .all(|c| !c.starts_with("pull") && !c.starts_with("create")),
        "{calls:?}"
    );
}

#[tokio::test]
async fn a_healthy_runtime_at_depth_create_creates_and_removes_a_container_without_pulling() {
    let dir = tempfile::tempdir().unwrap();
    let rt = fake_runtime(dir.path(), "fakepod", ID, &[]);
    let ran = run(preflight(
        &rt,
        &[
            "--image",
            "registry.example/ci/runner:1",
            "--depth",
            "create",
        ],
    ))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(
        ran.stdout,
        format!("fakepod 9.9.9-fake ok (created and removed a container); image {ID}\n")
    );
    let calls = calls(dir.path());
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(calls[0].starts_with("info --format"));
    assert!(calls[1].starts_with("image inspect --format"));
    assert!(calls[1].ends_with("registry.example/ci/runner:1"));
    assert!(calls[2].starts_with("create --pull=never "), "{calls:?}");
    assert!(calls[2].ends_with("registry.example/ci/runner:1 true"));
    assert_eq!(calls[3], "rm c0ffee0000");
}

#[tokio::test]
async fn a_container_start_refused_with_exit_126_is_a_failure_in_the_runtimes_words() {
    let dir = tempfile::tempdir().unwrap();
    let refused = "echo 'Error: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied' >&2; exit 126";
    let rt = fake_runtime(dir.path(), "fakepod", ID, &[("run", refused)]);
    let ran = run(preflight(
        &rt,
        &["--image", "ci/runner:1", "--depth", "run"],
    ))
    .await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [
            "cannot run a container with fakepod: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied"
        ]
    );
    assert!(calls(dir.path())[2].starts_with("run --rm --pull=never "));
}

#[tokio::test]
async fn a_failure_without_stderr_names_the_step_and_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let rt = fake_runtime(dir.path(), "fakepod", ID, &[("create", "exit 3")]);
    let ran = run(preflight(
        &rt,
        &["--image", "ci/runner:1", "--depth", "create"],
    ))
    .await;
    assert_eq!(ran.code, 1);
    assert_eq!(
        ran.stderr_lines(),
        ["cannot run a container with fakepod: fakepod create failed with exit status 3"]
    );
}

#[tokio::test]
async fn a_runtime_that_is_not_installed_says_so() {
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = runner(&["preflight", "--runtime", "docker"]);
    cmd.env("PATH", empty.path());
    let ran = run(cmd).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        ["cannot run a container with docker: docker is not installed (not found on PATH)"]
    );

    let missing = empty.path().join("bin/podman");
    let ran = run(preflight(&missing, &[])).await;
    assert_eq!(ran.code, 1);
    assert_eq!(
        ran.stderr_lines(),
        [format!(
            "cannot run a container with podman: {} is not installed (no such file)",
            missing.display()
        )]
    );
}

#[tokio::test]
async fn the_real_docker_client_without_a_daemon_is_quoted_in_its_own_words() {
    if std::process::Command::new("docker")
        .arg("--version")
        .output()
        .is_err()
    {
        common::skip::skipped("no docker client on PATH");
        return;
    }
    // A socket nobody listens on: the client's answer is the same on every machine.
    let dir = tempfile::tempdir().unwrap();
    let host = format!("unix://{}", dir.path().join("docker.sock").display());
    let direct = std::process::Command::new("docker")
        .arg("info")
        .env("DOCKER_HOST", &host)
        .output()
        .unwrap();
    assert!(!direct.status.success(), "docker info cannot succeed here");
    let last = String::from_utf8_lossy(&direct.stderr)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap()
        .trim()
        .to_string();
    assert!(
        last.contains("Cannot connect to the Docker daemon"),
        "{last}"
    );

    let mut cmd = runner(&["preflight", "--runtime", "docker"]);
    cmd.env("DOCKER_HOST", &host);
    let ran = run(cmd).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [format!("cannot run a container with docker: {last}")]
    );
    assert_eq!(
        last,
        format!("Cannot connect to the Docker daemon at {host}. Is the docker daemon running?")
    );
}

#[tokio::test]
async fn depth_create_without_an_image_and_bad_flags_are_refused_before_probing() {
    let dir = tempfile::tempdir().unwrap();
    let rt = fake_runtime(dir.path(), "fakepod", ID, &[]);
    let ran = run(preflight(&rt, &["--depth", "create"])).await;
    assert_eq!(ran.code, 5);
    assert!(
        ran.stderr.contains("--depth create needs --image"),
        "{ran:?}"
    );
    let ran = run(preflight(&rt, &["--timeout-s", "0"])).await;
    assert_eq!(ran.code, 64, "usage errors are EX_USAGE, not 2: {ran:?}");
    let ran = run(preflight(&rt, &["--server", "http://127.0.0.1:9"])).await;
    assert_eq!(ran.code, 5);
    assert!(ran.stderr.contains("--server needs --key and --state"));
    assert!(calls(dir.path()).is_empty(), "nothing was probed");
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A service address nobody listens on, refusing connections while the socket lives.
fn closed_server() -> (tokio::net::TcpSocket, String) {
    let (held, addr) = common::refusing_address();
    (held, format!("http://{addr}"))
}

#[tokio::test]
async fn a_key_it_may_not_read_is_warned_about_and_the_runtime_still_decides() {
    let Some(user) = Unprivileged::find() else {
        return;
    };
    // The runtime where the user may run it; the key and state where it may not enter, as
    // when they are in root's 0700 /etc/leasegate and the preflight runs as the runner's user.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let healthy = script(dir.path(), "fakepod", "echo 9.9.9-fake");
    let broken = script(
        dir.path(),
        "brokenpod",
        "echo 'Error: default OCI runtime \"crun\" not found: invalid argument' >&2; exit 125",
    );
    let private = dir.path().join("leasegate");
    std::fs::create_dir(&private).unwrap();
    let key = private.join("runner.key");
    let state = private.join("runner.json");
    let ran = run(runner(&["keygen", "--key", key.to_str().unwrap()])).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    std::fs::write(&state, "{}").unwrap();
    user.close(&private);

    let (_refusing, server) = closed_server();
    let args = |rt: &std::path::Path| {
        vec![
            "preflight".to_string(),
            "--runtime".into(),
            rt.display().to_string(),
            "--server".into(),
            server.clone(),
            "--key".into(),
            key.display().to_string(),
            "--state".into(),
            state.display().to_string(),
        ]
    };

    let healthy_args = args(&healthy);
    let ran = run(user.runner(&strs(&healthy_args))).await;
    assert_eq!(ran.code, 0, "a healthy runtime starts the runner: {ran:?}");
    assert_eq!(ran.stdout, "fakepod 9.9.9-fake ok\n");
    let warning = ran
        .stderr
        .lines()
        .find(|l| l.contains(" WARN "))
        .unwrap_or_else(|| panic!("a warning: {ran:?}"));
    for said in [
        format!(
            "{}: permission denied for {}",
            key.display(),
            user.described
        ),
        format!("it may not enter {}", private.display()),
        format!(
            "`chown {}: {} {}`",
            user.chown_name,
            private.display(),
            key.display()
        ),
        "`chmod 0600".to_string(),
        "The probe runs anyway and decides the exit status".to_string(),
    ] {
        assert!(warning.contains(&said), "{said:?} in {warning}");
    }

    let broken_args = args(&broken);
    let ran = run(user.runner(&strs(&broken_args))).await;
    assert_eq!(
        ran.code, 1,
        "a broken runtime still fails the unit: {ran:?}"
    );
    assert!(
        ran.stderr.contains(
            "cannot run a container with brokenpod: default OCI runtime \"crun\" not found"
        ),
        "{ran:?}"
    );

    // A command that cannot work without the key fails, saying the same.
    let ran = run(user.runner(&[
        "heartbeat",
        "--once",
        "--runtime",
        healthy.to_str().unwrap(),
        "--server",
        &server,
        "--key",
        key.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ]))
    .await;
    user.open(&private);
    assert_eq!(ran.code, 5, "{ran:?}");
    assert!(
        ran.stderr.starts_with(&format!(
            "leasegate: {}: permission denied for {}",
            key.display(),
            user.described
        )),
        "{ran:?}"
    );
}

#[tokio::test]
async fn a_missing_state_file_is_warned_about_and_the_probe_still_passes() {
    let dir = tempfile::tempdir().unwrap();
    let rt = script(dir.path(), "fakepod", "echo 9.9.9-fake");
    let key = dir.path().join("runner.key");
    assert_eq!(
        run(runner(&["keygen", "--key", key.to_str().unwrap()]))
            .await
            .code,
        0
    );
    let state = dir.path().join("not-registered-yet.json");
    let (_refusing, server) = closed_server();
    let ran = run(preflight(
        &rt,
        &[
            "--server",
            &server,
            "--key",
            key.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ],
    ))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stderr.contains(" WARN ") && ran.stderr.contains(&state.display().to_string()),
        "{ran:?}"
    );
}

#[tokio::test]
async fn under_journald_warnings_and_a_failed_probe_are_filed_as_warnings() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let rt = fake_runtime(
        dir.path(),
        "fakepod",
        ID,
        &[(
            "info",
            "echo 'Error: default OCI runtime \"crun\" not found: invalid argument' >&2; exit 125",
        )],
    );
    let missing = dir.path().join("missing");
    // stderr to a file that JOURNAL_STREAM names, as systemd does with the journal's socket.
    let journal = dir.path().join("journal");
    let file = std::fs::File::create(&journal).unwrap();
    let meta = file.metadata().unwrap();
    let (_refusing, server) = closed_server();
    let mut cmd = preflight(
        &rt,
        &[
            "--server",
            &server,
            "--key",
            missing.join("k").to_str().unwrap(),
            "--state",
            missing.join("s").to_str().unwrap(),
        ],
    );
    cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stdout(std::process::Stdio::null())
        .stderr(file);
    let status = cmd.status().await.unwrap();
    assert_eq!(status.code(), Some(1));
    let text = std::fs::read_to_string(&journal).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("<4>") && lines[0].contains(" WARN "),
        "the key's warning at priority 4: {text}"
    );
    assert_eq!(
        lines[1],
        "<4>cannot run a container with fakepod: default OCI runtime \"crun\" not found: invalid argument"
    );
}

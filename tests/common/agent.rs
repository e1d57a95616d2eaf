//! Helpers for the runner agent's tests: running `leasegate runner …` as a process, fake
//! container runtimes written as shell scripts, and a real local podman image built without
//! network.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Variables the agent reads; cleared so that the test's own environment cannot leak in.
const AGENT_VARS: &[&str] = &[
    "LEASEGATE_SERVER",
    "LEASEGATE_RUNNER_KEY",
    "LEASEGATE_RUNNER_STATE",
    "LEASEGATE_RUNNER_NAME",
    "LEASEGATE_REGISTRATION_TOKEN",
    "LEASEGATE_RUNTIME",
    "LEASEGATE_IMAGE",
    "LEASEGATE_PROBE_DEPTH",
    "LEASEGATE_PROBE_TIMEOUT_S",
    "LEASEGATE_LEASE_TOKEN",
    "LEASEGATE_LOG_FORMAT",
    "RUST_LOG",
    "CONTAINERS_CONF",
    // Set by systemd when a test runs under it: the agent would then tag its lines for journald.
    "JOURNAL_STREAM",
];

/// `leasegate runner <args>` as a child process.
pub fn runner(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasegate"));
    cmd.arg("runner").args(args);
    for v in AGENT_VARS {
        cmd.env_remove(v);
    }
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    cmd
}

/// A user that directories private to this one refuse: this user when it is not root, else
/// `nobody` (uid 65534, through `setpriv`). `None`, with the reason printed, when this is root
/// and there is no `setpriv`.
pub struct Unprivileged {
    /// How the agent names it: `user nobody (uid 65534)`.
    pub described: String,
    /// The name the agent gives `chown`.
    pub chown_name: String,
    /// Whether it is this very user (then its private directories are made so by mode 000).
    pub is_self: bool,
}

impl Unprivileged {
    pub fn find() -> Option<Unprivileged> {
        use leasegate::agent::file_access::User;
        let me = User::current();
        if me.uid != Some(0) {
            return Some(Unprivileged {
                described: me.to_string(),
                chown_name: me.chown_name(),
                is_self: true,
            });
        }
        let setpriv = std::process::Command::new("setpriv")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !setpriv {
            println!("skipped: running as root without setpriv to become another user");
            return None;
        }
        let nobody = User::of_uid(65534);
        Some(Unprivileged {
            described: nobody.to_string(),
            chown_name: nobody.chown_name(),
            is_self: false,
        })
    }

    /// `leasegate runner <args>` as this user.
    pub fn runner(&self, args: &[&str]) -> tokio::process::Command {
        if self.is_self {
            return runner(args);
        }
        let mut cmd = tokio::process::Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_leasegate"))
            .arg("runner")
            .args(args);
        for v in AGENT_VARS {
            cmd.env_remove(v);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        cmd
    }

    /// Makes `dir` one this user may not enter: root's and mode 0700 for `nobody`, mode 000 for
    /// this user (undone by [`Unprivileged::open`]).
    pub fn close(&self, dir: &Path) {
        let mode = if self.is_self { 0o000 } else { 0o700 };
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    pub fn open(&self, dir: &Path) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
}

/// How a command ended and what it printed.
#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// The stderr lines that are not tracing log lines.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    pub fn stdout_json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

/// Runs `cmd` to completion (at most 60 s).
pub async fn run(mut cmd: tokio::process::Command) -> Ran {
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the command finished within 60 s")
        .expect("the command ran");
    Ran {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Writes an executable shell script `dir/name` and returns its path, for `--runtime`.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A fake runtime that answers like a healthy podman with `image_id` present locally, and
/// appends each invocation's arguments to `dir/calls.log`. Steps named in `broken` (`info`,
/// `image`, `create`, `rm`, `run`) are replaced by the given shell snippet.
pub fn fake_runtime(dir: &Path, name: &str, image_id: &str, broken: &[(&str, &str)]) -> PathBuf {
    let hex = image_id.trim_start_matches("sha256:");
    let log = dir.join("calls.log");
    let step = |which: &str, healthy: &str| {
        broken
            .iter()
            .find(|(w, _)| *w == which)
            .map(|(_, s)| s.to_string())
            .unwrap_or_else(|| healthy.to_string())
    };
    let body = format!(
        r#"echo "$*" >> '{log}'
case "$1" in
  info) {info} ;;
  image) {image} ;;
  create) {create} ;;
  rm) {rm} ;;
  run) {run} ;;
  *) echo "Error: unexpected arguments: $*" >&2; exit 125 ;;
esac"#,
        log = log.display(),
        info = step("info", "echo 9.9.9-fake"),
        image = step(
            "image",
            &format!("echo '{hex} localhost/fake@sha256:{}'", "d".repeat(64))
        ),
        create = step("create", "echo c0ffee0000"),
        rm = step("rm", "echo \"$2\""),
        run = step("run", "exit 0"),
    );
    script(dir, name, &body)
}

/// The invocations a fake runtime recorded, one per line.
pub fn calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Is podman here? A missing podman fails the test under `LEASEGATE_REQUIRE_PODMAN=1`.
pub fn podman_installed() -> bool {
    let ok = std::process::Command::new("podman")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var("LEASEGATE_REQUIRE_PODMAN").as_deref() == Ok("1") {
        panic!("podman is required (LEASEGATE_REQUIRE_PODMAN=1) but not installed");
    }
    ok
}

/// For tests that need podman: when it is not installed, prints the skip reason and returns
/// false (or fails, under `LEASEGATE_REQUIRE_PODMAN=1`).
pub fn podman_available() -> bool {
    let ok = podman_installed();
    if !ok {
        super::skip::skipped("podman is not installed (apt-get install podman)");
    }
    ok
}

/// Runs podman (blocking) and returns (success, stdout, stderr).
pub fn podman(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("podman runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A tiny image built locally with `podman build` (`FROM scratch` + one file: no network),
/// with a unique tag, untagged again when dropped.
pub struct LocalImage {
    pub tag: String,
    /// Its image ID as a full digest.
    pub id: String,
}

impl LocalImage {
    pub fn build() -> LocalImage {
        let ctx = tempfile::tempdir().unwrap();
        let unique = uuid::Uuid::now_v7().simple().to_string();
        // Unique content, so that every test gets its own image ID.
        std::fs::write(ctx.path().join("hello.txt"), &unique).unwrap();
        std::fs::write(
            ctx.path().join("Containerfile"),
            "FROM scratch\nCOPY hello.txt /hello.txt\n",
        )
        .unwrap();
        let tag = format!("localhost/leasegate-test-{unique}:latest");
        let (ok, _, err) = podman(&["build", "-q", "-t", &tag, &ctx.path().to_string_lossy()]);
        assert!(ok, "podman build: {err}");
        let (ok, id, err) = podman(&["image", "inspect", "--format", "{{.Id}}", &tag]);
        assert!(ok, "podman image inspect: {err}");
        LocalImage {
            id: format!("sha256:{}", id.trim_start_matches("sha256:")),
            tag,
        }
    }
}

impl Drop for LocalImage {
    fn drop(&mut self) {
        let _ = podman(&["rmi", "-f", &self.tag]);
    }
}

/// A runner of `pool` named `name`, made by the real binary as an operator makes one: `keygen`
/// into `DIR/runner.key`, then `register` (with `extra` arguments) writing `DIR/runner.json`.
/// Its key file, its state file and its runner id.
pub async fn registered(
    app: &super::TestApp,
    dir: &Path,
    pool: &str,
    name: &str,
    extra: &[&str],
) -> (PathBuf, PathBuf, String) {
    let key = dir.join("runner.key");
    let state = dir.join("runner.json");
    let keygen = run(runner(&["keygen", "--key", key.to_str().unwrap()])).await;
    assert_eq!(keygen.code, 0, "{keygen:?}");
    let mut args = vec![
        "register",
        "--server",
        &app.base,
        "--name",
        name,
        "--key",
        key.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let mut register = runner(&args);
    register.env(
        "LEASEGATE_REGISTRATION_TOKEN",
        app.registration_token(pool).await,
    );
    let ran = run(register).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let runner_id = ran.stdout_json()["runner_id"].as_str().unwrap().to_string();
    (key, state, runner_id)
}

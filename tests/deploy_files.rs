//! The files in deploy/ as an operator uses them: the systemd unit passes `systemd-analyze`,
//! its environment file documents every setting of `serve`, the Containerfile uses known
//! instructions and builds a non-root image, the compose file, the Kubernetes manifest and the
//! Prometheus rules have what docs/OPERATIONS.md says they have, the proxy's configuration
//! works in front of two real replicas, and every metric the rules name is one the service
//! exports. External tools (systemd-analyze, kubectl, haproxy, promtool, docker compose) are
//! used where they are installed; a check that needs a missing one is skipped with a reason.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every YAML document of `text` as JSON, with merge keys (`<<: *anchor`) applied.
fn yaml_documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| {
            let mut v = serde_norway::Value::deserialize(doc).expect("valid YAML");
            v.apply_merge().expect("merge keys apply");
            serde_json::to_value(v).expect("YAML that JSON can hold")
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn yaml(text: &str) -> Value {
    let mut docs = yaml_documents(text);
    assert_eq!(docs.len(), 1, "one YAML document expected");
    docs.remove(0)
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

// ---------------------------------------------------------------------------------------------
// systemd

/// `(section, key, value)` for every `Key=value` line of a unit file, in order.
fn unit_entries(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not Key=value: {line}"));
        out.push((section.clone(), key.to_string(), value.to_string()));
    }
    out
}

#[test]
fn systemd_unit_is_hardened_and_runs_serve_on_its_state_directory() {
    let entries = unit_entries(&read("deploy/systemd/leasegate.service"));
    let service = |key: &str| -> Vec<String> {
        entries
            .iter()
            .filter(|(s, k, _)| s == "Service" && k == key)
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    let required = [
        ("ExecStart", "/usr/local/bin/leasegate serve"),
        ("DynamicUser", "yes"),
        ("StateDirectory", "leasegate"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("SystemCallFilter", "@system-service"),
        ("MemoryDenyWriteExecute", "yes"),
        ("LockPersonality", "yes"),
        ("RestrictNamespaces", "yes"),
        ("EnvironmentFile", "-/etc/leasegate/leasegate.env"),
        ("Restart", "on-failure"),
        // A usage error does not mend itself: no restart loop repeating it.
        ("RestartPreventExitStatus", "64"),
        ("KillSignal", "SIGTERM"),
        (
            "Environment",
            "DATABASE_URL=sqlite:///var/lib/leasegate/leasegate.db",
        ),
    ];
    for (key, value) in required {
        assert!(
            service(key).iter().any(|v| v == value),
            "[Service] {key}={value} missing (have {:?})",
            service(key)
        );
    }
    let stop = service("TimeoutStopSec");
    let stop_s: u64 = stop[0].trim_end_matches('s').parse().unwrap();
    assert!(
        stop_s >= 35,
        "TimeoutStopSec must outlast a drain: {stop_s}"
    );
    // The environment file is read after Environment=, so its values win; it is optional.
    let file_at = entries.iter().position(|(_, k, _)| k == "EnvironmentFile");
    let env_at = entries.iter().rposition(|(_, k, _)| k == "Environment");
    assert!(file_at.is_some() && env_at.is_some());
}

#[test]
fn systemd_analyze_verifies_the_unit_and_rates_its_sandbox() {
    let Some(analyze) = common::skip::deploy_tool(
        "systemd-analyze",
        "systemd-analyze verify of deploy/systemd/leasegate.service",
    ) else {
        return;
    };
    // verify needs ExecStart's binary to exist: point it at the binary under test.
    let binary = env!("CARGO_BIN_EXE_leasegate");
    let unit = read("deploy/systemd/leasegate.service").replace(
        "ExecStart=/usr/local/bin/leasegate serve",
        &format!("ExecStart={binary} serve"),
    );
    assert!(unit.contains(binary), "ExecStart was not rewritten");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leasegate.service");
    std::fs::write(&path, unit).unwrap();

    let (ok, _, stderr) = run(Command::new(&analyze)
        .args(["verify", "--man=no"])
        .arg(&path));
    // Unknown keys and bad values are only warnings (exit 0), so read what it says, too.
    let about_unit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("leasegate.service"))
        .collect();
    assert!(
        ok && about_unit.is_empty(),
        "systemd-analyze verify: {stderr}"
    );

    // The exposure score (0 safest, 10 worst), offline: at most 2.0 ("OK").
    let (ok, stdout, stderr) = run(Command::new(&analyze)
        .args(["security", "--offline=true", "--threshold=20"])
        .arg(&path));
    if stderr.contains("unrecognized option") {
        common::skip::skipped("systemd-analyze security --offline: this systemd is too old");
        return;
    }
    let overall = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("");
    assert!(
        ok,
        "systemd-analyze security: {overall}\n{stdout}\n{stderr}"
    );
}

const HEARTBEAT_ROOT: &str = "deploy/systemd/leasegate-heartbeat@.service";
const HEARTBEAT_ROOTLESS: &str = "deploy/systemd/leasegate-heartbeat-rootless@.service";
const PREFLIGHT_DROP_IN: &str = "deploy/systemd/runner-preflight.conf";
const GITHUB_RUNNER: &str = "deploy/systemd/leasegate-github-runner@.service";

/// The values of `[Service] key=` in `entries`.
fn service_values(entries: &[(String, String, String)], key: &str) -> Vec<String> {
    entries
        .iter()
        .filter(|(s, k, _)| s == "Service" && k == key)
        .map(|(_, _, v)| v.clone())
        .collect()
}

#[test]
fn the_rootless_heartbeat_runs_as_its_user_in_a_sandbox_rootless_podman_can_work_in() {
    let entries = unit_entries(&read(HEARTBEAT_ROOTLESS));
    let service = |key: &str| service_values(&entries, key);
    let user = service("User");
    assert_eq!(user.len(), 1, "one User=: {user:?}");
    assert!(
        !user[0].is_empty() && user[0] != "root" && user[0] != "0",
        "User={}",
        user[0]
    );
    for (key, value) in [
        ("ExecStart", "/usr/local/bin/leasegate runner heartbeat"),
        ("EnvironmentFile", "/etc/leasegate/runner-%i.env"),
        // The key and state: a directory the user owns, private to it.
        ("StateDirectory", "leasegate-runner/%i"),
        ("StateDirectoryMode", "0700"),
        ("UMask", "0077"),
        ("ProtectSystem", "full"),
        ("PrivateMounts", "yes"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "4 64"),
    ] {
        assert_eq!(service(key), [value], "[Service] {key}");
    }
    // Restarting the runner unit on "recycle" needs root: that one command has it ("+").
    let stop_post = service("ExecStopPost");
    assert!(
        stop_post.len() == 1
            && stop_post[0].starts_with("+/bin/sh -c ")
            && stop_post[0].contains("systemctl restart"),
        "{stop_post:?}"
    );

    // What would break rootless podman, as the unit's comments explain: anything implying
    // NoNewPrivileges= for a User= service (newuidmap is setuid), anything changing the mount
    // namespace the user's pause process may inherit, and RemoveIPC= (podman's locks).
    let breaks_rootless_podman = [
        "NoNewPrivileges",
        "SystemCallFilter",
        "SystemCallArchitectures",
        "RestrictAddressFamilies",
        "RestrictNamespaces",
        "RestrictSUIDSGID",
        "RestrictRealtime",
        "LockPersonality",
        "MemoryDenyWriteExecute",
        "PrivateDevices",
        "ProtectHostname",
        "ProtectClock",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "DynamicUser",
        "PrivateUsers",
        "PrivateTmp",
        "ProtectHome",
        "ProtectControlGroups",
        "ProtectProc",
        "ProcSubset",
        "RemoveIPC",
        "DevicePolicy",
    ];
    for key in breaks_rootless_podman {
        assert!(
            service(key).is_empty(),
            "[Service] {key}= breaks rootless podman"
        );
    }
    // The bounding set keeps what podman, newuidmap and containers' default capabilities need.
    let caps = service("CapabilityBoundingSet");
    assert_eq!(caps.len(), 1);
    let dropped = caps[0]
        .strip_prefix('~')
        .expect("a list of capabilities taken away");
    for needed in [
        "CAP_SYS_ADMIN",
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_SETPCAP",
        "CAP_SETFCAP",
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_NET_BIND_SERVICE",
        "CAP_NET_ADMIN",
        "CAP_NET_RAW",
        "CAP_SYS_CHROOT",
        "CAP_SYS_RESOURCE",
        "CAP_MKNOD",
        "CAP_AUDIT_WRITE",
    ] {
        assert!(
            !dropped.split_whitespace().any(|c| c == needed),
            "{needed} is taken away"
        );
    }

    // Both heartbeat units run the same command on the same terms, so RUNNERS.md's exit
    // statuses are true of either.
    let root = unit_entries(&read(HEARTBEAT_ROOT));
    for key in [
        "ExecStart",
        "EnvironmentFile",
        "Restart",
        "RestartSec",
        "RestartPreventExitStatus",
        "TimeoutStopSec",
    ] {
        assert_eq!(service_values(&root, key), service(key), "[Service] {key}");
    }
    assert!(
        service_values(&root, "User").is_empty(),
        "the other one runs as root"
    );
}

/// Both heartbeat units restart the runner's unit when the heartbeat exits 3, and on no other
/// status; they restart the heartbeat after it (so that it can wait, having recycled once:
/// `agent::recycle`), and only a revoked runner or a usage error keeps it down.
#[test]
fn the_heartbeat_units_restart_the_runner_on_recycle_alone() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("systemctl.log");
    let systemctl = dir.path().join("systemctl");
    std::fs::write(
        &systemctl,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", log.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap()
    );
    for unit in [HEARTBEAT_ROOT, HEARTBEAT_ROOTLESS] {
        let entries = unit_entries(&read(unit));
        let one = |key: &str| {
            let values = service_values(&entries, key);
            assert_eq!(values.len(), 1, "{unit}: one {key}=");
            values[0].clone()
        };
        assert_eq!(one("Restart"), "on-failure", "{unit}");
        let prevented: Vec<String> = one("RestartPreventExitStatus")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert!(!prevented.contains(&"3".to_string()), "{unit}: 3 restarts");
        // systemd's prefix "+" (run with full privileges) is not part of the command; `$$` is
        // systemd's escape of `$`.
        let stop_post = one("ExecStopPost");
        let command = stop_post.trim_start_matches('+').replace("$$", "$");
        for status in ["0", "1", "2", "3", "4", "5", "64"] {
            for recycle_unit in [Some("gitlab-runner.service"), None] {
                let _ = std::fs::remove_file(&log);
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(&command)
                    .env("PATH", &path)
                    .env("EXIT_STATUS", status)
                    .env_remove("LEASEGATE_RECYCLE_UNIT");
                if let Some(u) = recycle_unit {
                    sh.env("LEASEGATE_RECYCLE_UNIT", u);
                }
                let (ok, _, stderr) = run(&mut sh);
                assert!(ok, "{unit} ExecStopPost: {stderr}");
                let calls = std::fs::read_to_string(&log).unwrap_or_default();
                let expected = match (status, recycle_unit) {
                    ("3", Some(u)) => format!("restart --no-block {u}\n"),
                    _ => String::new(),
                };
                assert_eq!(calls, expected, "{unit}: status {status}, {recycle_unit:?}");
            }
        }
    }
    // RUNNERS.md says the heartbeat recycles once per image, and where it remembers it.
    let doc = read("docs/RUNNERS.md");
    assert!(
        doc.contains(".recycled.json"),
        "RUNNERS.md names the memory file"
    );
}

#[test]
fn the_github_runner_unit_runs_the_loop_as_its_user_and_stops_it_through_leasegate() {
    let entries = unit_entries(&read(GITHUB_RUNNER));
    let service = |key: &str| service_values(&entries, key);
    let user = service("User");
    assert!(
        user.len() == 1 && !user[0].is_empty() && user[0] != "root" && user[0] != "0",
        "GitHub's runner refuses root: User={user:?}"
    );
    for (key, value) in [
        ("ExecStart", "/usr/local/bin/leasegate runner github"),
        ("EnvironmentFile", "/etc/leasegate/runner-%i.env"),
        ("StateDirectory", "leasegate-runner/%i"),
        ("StateDirectoryMode", "0700"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "4 64"),
        // SIGTERM to leasegate alone, which hands it on and waits for GitHub's runner.
        ("KillMode", "mixed"),
        ("KillSignal", "SIGTERM"),
    ] {
        assert_eq!(service(key), [value], "[Service] {key}");
    }
    let text = read(GITHUB_RUNNER);
    for said in [
        "LEASEGATE_GITHUB_RUNNER_DIR=",
        "LEASEGATE_SERVER=",
        "LEASEGATE_RUNNER_KEY=",
        "LEASEGATE_RUNTIME=",
    ] {
        assert!(
            text.contains(said),
            "the unit's example environment sets {said}"
        );
    }
    let doc = read("docs/RUNNERS.md");
    assert!(
        doc.contains(&format!("../{GITHUB_RUNNER}")),
        "RUNNERS.md links {GITHUB_RUNNER}"
    );
    assert!(read("docs/FORGES.md").contains(&format!("../{GITHUB_RUNNER}")));
}

#[test]
fn runners_doc_says_which_heartbeat_unit_to_choose_and_who_owns_the_key() {
    let doc = read("docs/RUNNERS.md");
    for file in [HEARTBEAT_ROOT, HEARTBEAT_ROOTLESS, PREFLIGHT_DROP_IN] {
        assert!(repo(file).exists(), "{file}");
        assert!(
            doc.contains(&format!("../{file}")),
            "RUNNERS.md links {file}"
        );
    }
    // The agent's own messages point at this section by name.
    assert!(doc.contains("\n## Who owns the key\n"));
    for said in [
        "/var/lib/leasegate-runner/",
        "StateDirectory=leasegate-runner/%i",
        "loginctl enable-linger",
        "`clock_skew`",
        "clock is 612 s ahead of the server's",
        "connection refused (is leasegate running and listening there?)",
        "journalctl -p warning",
    ] {
        assert!(doc.contains(said), "RUNNERS.md: {said}");
    }
}

/// `systemd-analyze security --offline`'s overall exposure for `path` (0 safest, 10 worst).
fn exposure(analyze: &Path, path: &Path) -> Option<f64> {
    let (_, stdout, stderr) = run(Command::new(analyze)
        .args(["security", "--offline=true"])
        .arg(path));
    if stderr.contains("unrecognized option") {
        return None;
    }
    let line = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no exposure for {}: {stdout}\n{stderr}", path.display()));
    let score = line
        .rsplit(':')
        .next()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    Some(score.parse().unwrap())
}

#[test]
fn systemd_analyze_verifies_the_runner_units_and_the_preflight_drop_in() {
    let Some(analyze) = common::skip::deploy_tool(
        "systemd-analyze",
        "systemd-analyze verify of the runner units and the preflight drop-in",
    ) else {
        return;
    };
    // verify needs the commands' binaries to exist: point them at the binary under test.
    let binary = env!("CARGO_BIN_EXE_leasegate");
    let dir = tempfile::tempdir().unwrap();
    let verify = |path: &Path, names: &[&str]| {
        let (ok, _, stderr) = run(Command::new(&analyze)
            .args(["verify", "--man=no"])
            .arg(path));
        // Unknown keys and bad values are only warnings (exit 0), so read what it says, too.
        let about: Vec<&str> = stderr
            .lines()
            .filter(|l| names.iter().any(|n| l.contains(n)))
            .collect();
        assert!(
            ok && about.is_empty(),
            "systemd-analyze verify {}: {stderr}",
            path.display()
        );
    };
    let mut placed = Vec::new();
    for unit in [HEARTBEAT_ROOT, HEARTBEAT_ROOTLESS, GITHUB_RUNNER] {
        let text = read(unit).replace("/usr/local/bin/leasegate ", &format!("{binary} "));
        assert!(text.contains(binary), "{unit}: ExecStart was not rewritten");
        let name = Path::new(unit).file_name().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        verify(&path, &[name.to_str().unwrap()]);
        placed.push(path);
    }

    // The drop-in, on a stand-in for the runner's unit.
    let runner_unit = dir.path().join("ci-runner.service");
    std::fs::write(
        &runner_unit,
        "[Unit]\nDescription=a CI runner\n\n[Service]\nExecStart=/bin/sleep infinity\n",
    )
    .unwrap();
    let drop_ins = dir.path().join("ci-runner.service.d");
    std::fs::create_dir(&drop_ins).unwrap();
    let text = read(PREFLIGHT_DROP_IN).replace("/usr/local/bin/leasegate ", &format!("{binary} "));
    assert!(text.contains(binary), "ExecStartPre was not rewritten");
    std::fs::write(drop_ins.join("leasegate-preflight.conf"), text).unwrap();
    verify(
        &runner_unit,
        &["ci-runner.service", "leasegate-preflight.conf"],
    );

    // The rootless unit's sandbox rates better than the root one's, and within a bound: the
    // rest of the scale is what rootless podman needs (see the unit's comments).
    let (Some(root), Some(rootless)) = (
        exposure(&analyze, &placed[0]),
        exposure(&analyze, &placed[1]),
    ) else {
        eprintln!("skipped: systemd-analyze security --offline: this systemd is too old");
        return;
    };
    assert!(rootless < root, "rootless {rootless} vs root {root}");
    assert!(rootless <= 8.5, "rootless heartbeat exposure {rootless}");
}

/// `serve --help`: each environment variable with its default, when it has one.
fn serve_settings() -> BTreeMap<String, Option<String>> {
    let (ok, help, stderr) = run(Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .args(["serve", "--help"])
        .env_clear());
    assert!(ok, "serve --help: {stderr}");
    let mut settings = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines().map(str::trim) {
        if line.starts_with('-') {
            current = None;
        } else if let Some(rest) = line.strip_prefix("[env: ") {
            let name = rest.split(['=', ']']).next().unwrap().to_string();
            settings.insert(name.clone(), None);
            current = Some(name);
        } else if let (Some(rest), Some(name)) = (line.strip_prefix("[default: "), &current) {
            settings.insert(name.clone(), Some(rest.trim_end_matches(']').to_string()));
        }
    }
    settings
}

#[test]
fn the_environment_file_documents_every_setting_with_its_default() {
    let settings = serve_settings();
    assert!(settings.contains_key("DATABASE_URL") && settings.len() >= 15);
    let example = read("deploy/systemd/leasegate.env.example");
    // `VAR=value` or `#VAR=value` lines.
    let documented: BTreeMap<&str, &str> = example
        .lines()
        .map(|l| l.trim().trim_start_matches('#'))
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    let mut missing: Vec<&str> = settings
        .keys()
        .map(String::as_str)
        .filter(|k| !documented.contains_key(k))
        .collect();
    // Read outside the flags: by the log filter.
    for extra in ["RUST_LOG"] {
        if !documented.contains_key(extra) {
            missing.push(extra);
        }
    }
    assert!(
        missing.is_empty(),
        "undocumented in leasegate.env.example: {missing:?}"
    );
    for (name, default) in &settings {
        if let (Some(default), Some(shown)) = (default, documented.get(name.as_str()))
            && name != "DATABASE_URL"
        {
            assert_eq!(shown, default, "{name}: the example shows a wrong default");
        }
    }
    // What the unit sets is what the service reads.
    for (_, key, value) in unit_entries(&read("deploy/systemd/leasegate.service")) {
        if key == "Environment" {
            let name = value.split('=').next().unwrap();
            assert!(
                settings.contains_key(name) || name == "NO_COLOR",
                "the unit sets {name}, which serve does not read"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Containerfile

const INSTRUCTIONS: [&str; 18] = [
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "MAINTAINER",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
];

/// `(INSTRUCTION, arguments)` with continuation lines joined and comments dropped.
fn container_instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (current.is_empty() && trimmed.is_empty()) {
            continue;
        }
        if let Some(body) = trimmed.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (keyword, args) = current
            .split_once(char::is_whitespace)
            .unwrap_or((current.as_str(), ""));
        assert_eq!(
            keyword,
            keyword.to_ascii_uppercase(),
            "instructions are upper case: {current}"
        );
        out.push((keyword.to_string(), args.trim().to_string()));
        current.clear();
    }
    assert!(
        current.is_empty(),
        "a continuation runs off the end: {current}"
    );
    out
}

/// One stage of a multi-stage build: its base image, its name, and its instructions.
struct Stage {
    image: String,
    name: Option<String>,
    steps: Vec<(String, String)>,
}

/// `KEY=value KEY2=value2` (no quoting used in our files).
fn pairs(args: &str) -> BTreeMap<String, String> {
    args.split_whitespace()
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=value: {p}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn containerfile_builds_release_locked_and_runs_as_a_non_root_user_on_all_interfaces() {
    let instructions = container_instructions(&read("deploy/container/Containerfile"));
    for (keyword, args) in &instructions {
        assert!(
            INSTRUCTIONS.contains(&keyword.as_str()),
            "unknown instruction {keyword} {args}"
        );
    }
    // Only ARG may come before the first FROM; those ARGs may be used in FROM lines.
    let first_from = instructions.iter().position(|(k, _)| k == "FROM").unwrap();
    let mut global_args = BTreeMap::new();
    for (keyword, args) in &instructions[..first_from] {
        assert_eq!(keyword, "ARG", "only ARG may precede FROM");
        let (name, default) = args.split_once('=').expect("global ARGs have defaults");
        global_args.insert(format!("${{{name}}}"), default.to_string());
    }

    let mut stages: Vec<Stage> = Vec::new();
    for (keyword, args) in &instructions[first_from..] {
        if keyword == "FROM" {
            let words: Vec<&str> = args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let image = global_args
                .get(words[0])
                .cloned()
                .unwrap_or(words[0].to_string());
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                [_] => None,
                _ => panic!("FROM {args}"),
            };
            stages.push(Stage {
                image,
                name,
                steps: Vec::new(),
            });
        } else {
            let stage = stages.last_mut().unwrap();
            stage.steps.push((keyword.clone(), args.clone()));
        }
    }
    assert!(stages.len() >= 2, "a multi-stage build");
    let builder = &stages[0];
    assert_eq!(builder.image, "docker.io/library/rust:1-bookworm");
    assert!(
        builder
            .steps
            .iter()
            .any(|(k, a)| k == "RUN" && a.contains("cargo build --release --locked")),
        "the builder runs cargo build --release --locked"
    );
    let Stage {
        image: runtime,
        steps,
        ..
    } = stages.last().unwrap();
    assert!(
        runtime == "gcr.io/distroless/cc-debian12:nonroot" || runtime == "debian:bookworm-slim",
        "runtime image {runtime}"
    );

    // COPY --from names an earlier stage.
    let earlier: BTreeSet<&str> = stages[..stages.len() - 1]
        .iter()
        .filter_map(|stage| stage.name.as_deref())
        .collect();
    for (_, args) in steps.iter().filter(|(k, _)| k == "COPY") {
        if let Some(from) = args
            .split_whitespace()
            .find_map(|w| w.strip_prefix("--from="))
        {
            assert!(earlier.contains(from), "COPY --from={from}: no such stage");
        }
    }
    assert_eq!(builder.name.as_deref(), Some("build"));

    let last = |keyword: &str| {
        steps
            .iter()
            .rev()
            .find(|(k, _)| k == keyword)
            .map(|(_, a)| a.clone())
    };
    // A numeric, non-root user, so that Kubernetes' runAsNonRoot can verify it.
    let user = last("USER").expect("USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("numeric USER");
    assert_ne!(uid, 0);
    assert_eq!(last("EXPOSE").as_deref(), Some("8080"));
    let env: BTreeMap<String, String> = steps
        .iter()
        .filter(|(k, _)| k == "ENV")
        .flat_map(|(_, a)| pairs(a))
        .collect();
    assert_eq!(env["LEASEGATE_LISTEN"], "0.0.0.0:8080");
    assert!(env["DATABASE_URL"].starts_with("sqlite:///"));
    assert_eq!(last("STOPSIGNAL").as_deref(), Some("SIGTERM"));
    // Exec form, so that SIGTERM reaches leasegate itself (there is no shell anyway).
    let entrypoint: Vec<String> =
        serde_json::from_str(&last("ENTRYPOINT").expect("ENTRYPOINT")).expect("exec form");
    let cmd: Vec<String> = serde_json::from_str(&last("CMD").expect("CMD")).expect("exec form");
    assert_eq!(cmd, ["serve"]);
    assert!(
        steps.iter().any(
            |(k, a)| k == "COPY" && a.split_whitespace().last() == Some(entrypoint[0].as_str())
        ),
        "the entrypoint {} is copied into the image",
        entrypoint[0]
    );
    if runtime.contains("distroless") {
        assert!(
            last("HEALTHCHECK").is_none(),
            "distroless has no shell or curl for a HEALTHCHECK"
        );
    }
    // The build context leaves the target directory and local secrets out.
    let ignore = read(".dockerignore");
    for pattern in ["target", ".git", "*.db", "leasegate-*.token"] {
        assert!(
            ignore.lines().any(|l| l.trim() == pattern),
            ".dockerignore: {pattern}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// compose and its proxy

#[test]
fn compose_runs_postgres_two_replicas_and_a_proxy_that_alone_publishes_a_port() {
    let compose = yaml(&read("deploy/compose/compose.yaml"));
    let services = compose["services"].as_object().expect("services");

    let postgres = &services["postgres"];
    assert!(str_of(&postgres["image"], "postgres image").contains("postgres:15"));
    assert!(postgres["healthcheck"]["test"].is_array());
    let volume = str_of(&postgres["volumes"][0], "postgres volume");
    let volume_name = volume.split(':').next().unwrap();
    assert!(
        compose["volumes"].get(volume_name).is_some(),
        "postgres keeps its data in the named volume {volume_name}"
    );

    let replicas: Vec<(&String, &Value)> = services
        .iter()
        .filter(|(_, s)| s["environment"].get("DATABASE_URL").is_some())
        .collect();
    assert_eq!(replicas.len(), 2, "two leasegate replicas");
    let url = &replicas[0].1["environment"]["DATABASE_URL"];
    for (name, replica) in &replicas {
        let env = &replica["environment"];
        assert_eq!(&env["DATABASE_URL"], url, "{name}: the same database");
        assert!(str_of(url, "DATABASE_URL").starts_with("postgres://"));
        assert_eq!(env["LEASEGATE_LISTEN"], "0.0.0.0:8080");
        assert_eq!(
            replica["depends_on"]["postgres"]["condition"], "service_healthy",
            "{name} waits for a healthy postgres"
        );
        for (var, secret) in [
            ("LEASEGATE_ADMIN_TOKEN_FILE", "leasegate_admin_token"),
            ("LEASEGATE_FORGE_TOKEN_FILE", "leasegate_forge_token"),
        ] {
            assert_eq!(env[var], format!("/run/secrets/{secret}"), "{name}: {var}");
            assert!(
                replica["secrets"]
                    .as_array()
                    .unwrap()
                    .contains(&json!(secret))
            );
            assert!(compose["secrets"][secret]["file"].is_string());
        }
        assert!(replica.get("ports").is_none(), "{name} publishes no port");
    }

    let publishing: Vec<&String> = services
        .iter()
        .filter(|(_, s)| s.get("ports").is_some())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(publishing, ["proxy"], "only the proxy publishes a port");
    let proxy = &services["proxy"];
    let port = str_of(&proxy["ports"][0], "proxy port");
    assert!(
        port.starts_with("${LEASEGATE_PUBLISH:-127.0.0.1:"),
        "loopback by default: {port}"
    );
    let config = proxy["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| str_of(v, "volume"))
        .find(|v| v.contains("haproxy.cfg"))
        .expect("the proxy mounts haproxy.cfg");
    assert!(
        repo("deploy/compose")
            .join(config.split(':').next().unwrap())
            .exists()
    );
    // The proxy's backends are the replicas, by their service names.
    let haproxy = read("deploy/compose/haproxy.cfg");
    for (name, _) in &replicas {
        assert!(
            haproxy.contains(&format!("server {name} {name}:8080")),
            "haproxy.cfg routes to {name}"
        );
    }
}

#[test]
fn compose_tool_accepts_the_file_where_installed() {
    // docker compose (v2) or docker-compose (v1), whichever answers.
    let candidates: [(&str, &[&str]); 2] = [("docker", &["compose"]), ("docker-compose", &[])];
    let found = candidates.iter().find(|(bin, prefix)| {
        Command::new(bin)
            .args(*prefix)
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some((bin, prefix)) = found else {
        common::skip::skipped(
            "`compose config` of deploy/compose/compose.yaml: no docker compose or docker-compose here",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for file in ["compose.yaml", "haproxy.cfg"] {
        std::fs::copy(repo("deploy/compose").join(file), dir.path().join(file)).unwrap();
    }
    std::fs::create_dir(dir.path().join("secrets")).unwrap();
    for secret in ["admin_token", "forge_token"] {
        std::fs::write(dir.path().join("secrets").join(secret), "x\n").unwrap();
    }
    let (ok, stdout, stderr) = run(Command::new(bin)
        .args(*prefix)
        .args(["-f", "compose.yaml", "config"])
        .current_dir(dir.path())
        .env("POSTGRES_PASSWORD", "test-password"));
    assert!(ok, "{bin} config: {stderr}");
    assert!(stdout.contains("postgres://leasegate:test-password@postgres:5432/leasegate"));
    // Without the password, compose refuses to start anything.
    let (ok, _, _) = run(Command::new(bin)
        .args(*prefix)
        .args(["-f", "compose.yaml", "config"])
        .current_dir(dir.path())
        .env_remove("POSTGRES_PASSWORD"));
    assert!(!ok, "compose must insist on POSTGRES_PASSWORD");
}

/// `timeout <name> <n>s` of the proxy's configuration, in seconds.
fn haproxy_timeout(config: &str, name: &str) -> u64 {
    config
        .lines()
        .map(str::split_whitespace)
        .find_map(|mut w| {
            (w.next() == Some("timeout") && w.next() == Some(name)).then(|| w.next().unwrap())
        })
        .and_then(|v| v.strip_suffix('s'))
        .unwrap_or_else(|| panic!("timeout {name} in seconds"))
        .parse()
        .unwrap()
}

#[test]
fn haproxy_config_balances_round_robin_checks_readyz_and_outlasts_long_polls() {
    let config = read("deploy/compose/haproxy.cfg");
    assert!(config.contains("balance roundrobin"));
    assert!(config.contains("http-check send meth GET uri /readyz"));
    // Lease long polls wait up to 30 s.
    assert!(haproxy_timeout(&config, "server") >= 35);
    assert!(haproxy_timeout(&config, "client") >= 35);
    let Some(haproxy) =
        common::skip::deploy_tool("haproxy", "haproxy -c of deploy/compose/haproxy.cfg")
    else {
        return;
    };
    let (ok, _, stderr) = run(Command::new(haproxy)
        .args(["-c", "-f"])
        .arg(repo("deploy/compose/haproxy.cfg")));
    assert!(ok, "haproxy -c: {stderr}");
}

/// The compose proxy's configuration, listening on `port`, in front of `backends`.
fn local_haproxy_config(port: u16, backends: &[&TestApp]) -> String {
    let mut config = read("deploy/compose/haproxy.cfg")
        .replace("    bind :8080", &format!("    bind 127.0.0.1:{port}"));
    for (i, app) in backends.iter().enumerate() {
        let name = format!("leasegate-{}", i + 1);
        let addr = app.base.trim_start_matches("http://");
        config = config.replace(
            &format!("server {name} {name}:8080"),
            &format!("server {name} {addr}"),
        );
    }
    config
}

/// How many requests to `route` this replica has answered, from its own /metrics.
async fn served(app: &TestApp, route: &str) -> f64 {
    let text = app.metrics_text().await;
    let route = format!("route=\"{route}\"");
    text.lines()
        .filter(|l| {
            l.starts_with("leasegate_http_request_duration_seconds_count{") && l.contains(&route)
        })
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_in_front_of_two_replicas_balances_hides_metrics_holds_long_polls_and_fails_over() {
    let Some(haproxy) = common::skip::deploy_tool(
        "haproxy",
        "deploy/compose/haproxy.cfg in front of two live replicas",
    ) else {
        return;
    };
    let first = spawn_app().await;
    let second = spawn_app().await;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(&cfg, local_haproxy_config(port, &[&first, &second])).unwrap();
    let mut proxy = tokio::process::Command::new(haproxy)
        .args(["-db", "-f"])
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("haproxy.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(dir.path().join("haproxy.log")).unwrap_or_default();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await
            && r.status() == StatusCode::OK
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy did not become ready: {}",
            log()
        );
        assert!(
            proxy.try_wait().unwrap().is_none(),
            "haproxy exited: {}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Round robin: both replicas serve.
    for _ in 0..10 {
        let r = client.get(format!("{base}/livez")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let (a, b) = (
        served(&first, "/livez").await,
        served(&second, "/livez").await,
    );
    assert!(a >= 3.0 && b >= 3.0, "round robin: {a} and {b} of 10");

    // /metrics is per replica: not through the proxy.
    let r = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // A lease long poll of the full 30 s ends with leasegate's 204, not a proxy timeout.
    // (Each replica here has its own SQLite database: register on the one that answers.)
    first.pool("linux", &[IMAGE_A]).await;
    let runner = first.register("linux", "r1").await;
    let mut answered = None;
    for _ in 0..2 {
        // Round robin alternates, so one of two tries lands on the replica that knows it.
        let started = Instant::now();
        let r = client
            .post(format!("{base}/api/v1/lease"))
            .json(&json!({"attestation": runner.healthy(), "wait_s": 30}))
            .send()
            .await
            .unwrap();
        if r.status() != StatusCode::UNAUTHORIZED {
            answered = Some((r.status(), started.elapsed()));
            break;
        }
    }
    let (status, waited) = answered.expect("one replica knows the runner");
    assert_eq!(status, StatusCode::NO_CONTENT, "after {waited:?}");
    assert!(waited >= Duration::from_secs(29), "waited {waited:?}");

    // One replica shuts down: requests keep succeeding on the other.
    first.shutdown.cancel();
    for i in 0..20 {
        let r = client.get(format!("{base}/livez")).send().await.unwrap();
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "request {i} after one replica stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.kill().await.ok();
}

// ---------------------------------------------------------------------------------------------
// Kubernetes

#[test]
fn kubernetes_manifest_has_probes_pdb_service_and_a_placeholder_secret() {
    let text = read("deploy/kubernetes/leasegate.yaml");
    let docs = yaml_documents(&text);
    let by_kind =
        |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };
    for d in &docs {
        assert!(
            d["apiVersion"].is_string() && d["metadata"]["name"].is_string(),
            "{d}"
        );
    }

    let deployment = by_kind("Deployment");
    let deployment = deployment.first().expect("a Deployment");
    assert_eq!(deployment["apiVersion"], "apps/v1");
    assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2);
    let pod = &deployment["spec"]["template"];
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    let selects = |selector: &Value| {
        selector
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(selects(&deployment["spec"]["selector"]["matchLabels"]));
    let spec = &pod["spec"];
    assert!(spec["terminationGracePeriodSeconds"].as_u64().unwrap() >= 40);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
    let ports = c["ports"].as_array().unwrap();
    let port_names: Vec<&Value> = ports.iter().map(|p| &p["name"]).collect();
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        assert!(
            port_names.contains(&&c[probe]["httpGet"]["port"]),
            "{probe} port"
        );
    }
    assert_eq!(ports[0]["containerPort"], 8080);
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());

    let env: BTreeMap<&str, &Value> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (str_of(&e["name"], "env name"), e))
        .collect();
    assert_eq!(env["LEASEGATE_LISTEN"]["value"], "0.0.0.0:8080");
    let secret = by_kind("Secret");
    let secret = secret.first().expect("a Secret example");
    for var in [
        "DATABASE_URL",
        "LEASEGATE_ADMIN_TOKEN",
        "LEASEGATE_FORGE_TOKEN",
    ] {
        let from = &env[var]["valueFrom"]["secretKeyRef"];
        assert_eq!(from["name"], secret["metadata"]["name"], "{var}");
        let value = str_of(&secret["stringData"][str_of(&from["key"], "key")], var);
        assert!(value.contains("CHANGE-ME"), "{var} is a marked placeholder");
    }

    let service = by_kind("Service");
    let service = service.first().expect("a Service");
    assert!(selects(&service["spec"]["selector"]));
    assert_eq!(service["spec"]["ports"][0]["targetPort"], ports[0]["name"]);

    let pdb = by_kind("PodDisruptionBudget");
    let pdb = pdb.first().expect("a PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"]));

    // kubectl's own reading, offline. (`kubectl apply --dry-run=client` needs an API server for
    // discovery even with --validate=false; `kubectl kustomize` does not.)
    let Some(kubectl) = common::skip::deploy_tool(
        "kubectl",
        "kubectl kustomize of deploy/kubernetes/leasegate.yaml",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("leasegate.yaml"), &text).unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "resources:\n  - leasegate.yaml\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = run(Command::new(kubectl)
        .arg("kustomize")
        .arg(dir.path())
        // Never reach for a cluster.
        .env("KUBECONFIG", dir.path().join("no-kubeconfig")));
    assert!(ok, "kubectl kustomize: {stderr}");
    let kinds: BTreeSet<String> = yaml_documents(&stdout)
        .iter()
        .map(|d| d["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        ["Deployment", "PodDisruptionBudget", "Secret", "Service"]
            .map(String::from)
            .into()
    );
}

// ---------------------------------------------------------------------------------------------
// Prometheus rules

/// Identifiers in a PromQL expression, string literals removed.
fn promql_identifiers(expr: &str) -> Vec<String> {
    let mut without_strings = String::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in expr.chars() {
        match (in_string, c) {
            (true, '\\') if !escaped => escaped = true,
            (true, '"') if !escaped => in_string = false,
            (true, _) => escaped = false,
            (false, '"') => in_string = true,
            (false, c) => without_strings.push(c),
        }
    }
    without_strings
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

/// `label="value"` matchers (equality and inequality) in a PromQL expression.
fn promql_matchers(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find('"') {
        let before = rest[..at].trim_end();
        let after = &rest[at + 1..];
        let end = after.find('"').expect("closed string");
        let value = &after[..end];
        let is_eq = before.ends_with('=') && !before.ends_with("!=") && !before.ends_with("=~");
        let is_ne = before.ends_with("!=");
        if is_eq || is_ne {
            let label = before
                .trim_end_matches(['=', '!'])
                .trim_end()
                .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap();
            out.push((label.to_string(), value.to_string()));
        }
        rest = &after[end + 1..];
    }
    out
}

/// One rule of the rules file: an alert or a recording rule.
struct Rule {
    name: String,
    expr: String,
    is_alert: bool,
    body: Value,
}

struct Rules {
    rules: Vec<Rule>,
    /// The names of the recording rules.
    recorded: BTreeSet<String>,
}

fn rules() -> Rules {
    let file = yaml(&read("deploy/prometheus/leasegate-rules.yaml"));
    let mut rules = Vec::new();
    let mut recorded = BTreeSet::new();
    for group in file["groups"].as_array().expect("groups") {
        assert!(group["name"].is_string(), "a group has a name");
        for rule in group["rules"].as_array().expect("rules") {
            let expr = str_of(&rule["expr"], "expr").to_string();
            let (name, is_alert) = match (rule.get("alert"), rule.get("record")) {
                (Some(a), None) => (str_of(a, "alert").to_string(), true),
                (None, Some(r)) => {
                    recorded.insert(str_of(r, "record").to_string());
                    (str_of(r, "record").to_string(), false)
                }
                _ => panic!("a rule is an alert or a record: {rule}"),
            };
            rules.push(Rule {
                name,
                expr,
                is_alert,
                body: rule.clone(),
            });
        }
    }
    Rules { rules, recorded }
}

#[test]
fn prometheus_rules_are_well_formed_and_pass_promtool_where_installed() {
    let Rules { rules, .. } = rules();
    let alerts: Vec<&Rule> = rules.iter().filter(|r| r.is_alert).collect();
    assert!(alerts.len() >= 10);
    let mut names = BTreeSet::new();
    for Rule {
        name, body: rule, ..
    } in &alerts
    {
        assert!(names.insert(name.clone()), "alert {name} twice");
        assert!(
            ["critical", "warning", "info"]
                .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity"
        );
        assert!(
            rule["annotations"]["summary"].is_string(),
            "{name}: summary"
        );
        assert!(
            rule["annotations"]["description"].is_string(),
            "{name}: description"
        );
    }
    // The things OPERATIONS.md promises to alert on.
    let exprs: String = alerts
        .iter()
        .map(|r| r.expr.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    for needle in [
        "pool_code:leasegate_lease_refusals:rate10m",
        "status=\"stale\"",
        "status=\"probe_failed\"",
        "leasegate_oldest_queued_job_age_seconds",
        "leasegate_leases_granted_total",
        "status=~\"5..\"",
        // GET /readyz through the proxy, probed by the blackbox exporter.
        "probe_success{job=\"leasegate-readyz\"}",
    ] {
        assert!(exprs.contains(needle), "no alert on {needle}");
    }

    let Some(promtool) =
        common::skip::deploy_tool("promtool", "promtool check/test rules of deploy/prometheus")
    else {
        return;
    };
    let (ok, stdout, stderr) = run(Command::new(&promtool)
        .args(["check", "rules"])
        .arg(repo("deploy/prometheus/leasegate-rules.yaml")));
    assert!(ok, "promtool check rules: {stdout}{stderr}");
    let (ok, stdout, stderr) = run(Command::new(&promtool)
        .args(["test", "rules"])
        .arg(repo("deploy/prometheus/leasegate-rules.test.yaml")));
    assert!(ok, "promtool test rules: {stdout}{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_value_the_rules_name_is_exported_by_the_service() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    for _ in 0..2 {
        app.enqueue("linux").await;
    }
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    // A grant, handed back before start (a free return).
    let lease = app.grant(&runner).await;
    assert_eq!(
        app.call(&lease, "abandon", None).await.status(),
        StatusCode::OK
    );
    // A refusal, and a rejected attestation.
    let r = app
        .lease(&runner.failing("default OCI runtime \"crun\" not found"))
        .await;
    assert_eq!(code_of(r, StatusCode::CONFLICT).await, "probe_failed");
    assert_eq!(
        app.heartbeat("not-a-jwt").await.status(),
        StatusCode::UNAUTHORIZED
    );
    // A started lease that expires: an attempt used, then a requeue.
    let fresh = runner.attest(
        json!({"probe": {"checked_at": leasegate::domain::time::Millis::now().0 as f64 / 1000.0}}),
    );
    let r = app.lease(&fresh).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let started = Granted {
        lease_id: body["lease_id"].as_str().unwrap().into(),
        token: body["lease_token"].as_str().unwrap().into(),
        job_id: body["job"]["id"].as_str().unwrap().into(),
        body: body.clone(),
    };
    assert_eq!(
        app.call(&started, "start", None).await.status(),
        StatusCode::OK
    );
    app.sweep_ahead(700).await;

    let text = app.metrics_text().await;
    let samples: Vec<(&str, &str)> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let series = l.rsplit_once(' ').unwrap().0;
            series
                .split_once('{')
                .map_or((series, ""), |(n, rest)| (n, rest))
        })
        .collect();
    let exported: BTreeSet<&str> = samples.iter().map(|(n, _)| *n).collect();

    let Rules { rules, recorded } = rules();
    let mut checked = BTreeSet::new();
    for Rule {
        name,
        expr,
        body: rule,
        ..
    } in &rules
    {
        let mut words = promql_identifiers(expr);
        // Metric names quoted in the annotations' prose, too.
        for text in rule["annotations"]
            .as_object()
            .into_iter()
            .flat_map(|a| a.values())
        {
            words.extend(
                str_of(text, "annotation")
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("leasegate_"))
                    .map(String::from),
            );
        }
        for word in words {
            if word.contains(':') {
                assert!(
                    recorded.contains(&word),
                    "{name}: {word} is recorded nowhere"
                );
            } else if word.starts_with("leasegate_") {
                let known = exported.contains(word.as_str())
                    || ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| exported.contains(format!("{word}{s}").as_str()));
                assert!(
                    known,
                    "{name}: {word} is not exported; /metrics has {exported:?}"
                );
                checked.insert(word);
            }
        }
        // Label values the rules select on are values the service emits.
        for (label, value) in promql_matchers(expr) {
            if ["status", "result", "code", "route", "method"].contains(&label.as_str()) {
                let pair = format!("{label}=\"{value}\"");
                assert!(
                    samples.iter().any(|(_, labels)| labels.contains(&pair)),
                    "{name}: no exported series has {pair}"
                );
            }
        }
    }
    assert!(
        checked.len() >= 8,
        "the rules use the service's metrics: {checked:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// docs

#[test]
fn operations_doc_explains_every_alert_code_and_status_and_is_linked() {
    let doc = read("docs/OPERATIONS.md");
    for rule in rules().rules.iter().filter(|r| r.is_alert) {
        assert!(
            doc.contains(&format!("`{}`", rule.name)),
            "OPERATIONS.md does not explain {}",
            rule.name
        );
    }
    let codes = [
        "runner_cordoned",
        "probe_failed",
        "probe_stale",
        "pool_image_unresolved",
        "image_unreported",
        "image_drift",
        "runner_quarantined",
        "attestation_invalid",
        "attestation_expired",
        "attestation_replayed",
        "runner_revoked",
        "unavailable",
    ];
    for code in codes {
        assert!(
            doc.contains(&format!("`{code}`")),
            "OPERATIONS.md: code {code}"
        );
    }
    for status in leasegate::domain::status::RunnerStatus::ALL {
        assert!(
            doc.contains(&format!("`{}`", status.as_str())),
            "OPERATIONS.md: status {}",
            status.as_str()
        );
    }
    assert!(doc.contains("\n## Registry-backed pools\n"));
    for file in [
        "deploy/systemd/leasegate.service",
        "deploy/systemd/leasegate.env.example",
        "deploy/container/Containerfile",
        "deploy/compose/compose.yaml",
        "deploy/kubernetes/leasegate.yaml",
        "deploy/prometheus/leasegate-rules.yaml",
    ] {
        assert!(repo(file).exists(), "{file}");
        assert!(doc.contains(file), "OPERATIONS.md does not mention {file}");
    }
    assert!(read("README.md").contains("(docs/OPERATIONS.md)"));
    assert!(read("docs/ARCHITECTURE.md").contains("deploy/"));
}

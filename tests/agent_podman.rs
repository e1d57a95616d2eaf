//! `leasegate runner preflight` against the real podman: a healthy `podman info`, a missing OCI
//! runtime (podman's own words), a real local image's ID, a container created and removed, a
//! missing image that is not pulled, and a container start the machine refuses.
//!
//! Skipped, with a printed reason, when podman is not installed; failed instead when
//! `LEASEGATE_REQUIRE_PODMAN=1` (as `.ci/run` sets).

use crate::common;

use common::agent::*;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_healthy_podman_info_passes() {
    if !podman_available() {
        return;
    }
    let (_, version, _) = podman(&["version", "--format", "{{.Client.Version}}"]);
    let ran = run(runner(&["preflight", "--runtime", "podman"])).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    // The verdict, then the free space of podman's storage (the probe's disk figures).
    let line = ran.stdout.strip_suffix('\n').expect("one line");
    let (verdict, disk) = line.split_once("; ").expect("a verdict and disk figures");
    assert_eq!(verdict, format!("podman {version} ok"));
    assert!(disk.contains(" free on /"), "{line}");
    assert_eq!(ran.stderr, "");
}

#[tokio::test]
async fn a_missing_oci_runtime_fails_in_podmans_own_words() {
    if !podman_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("containers.conf");
    std::fs::write(&conf, "[engine]\nruntime = \"crun-missing\"\n").unwrap();
    let mut cmd = runner(&["preflight", "--runtime", "podman"]);
    cmd.env("CONTAINERS_CONF", &conf);
    let ran = run(cmd).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(ran.stdout, "");
    assert_eq!(
        ran.stderr_lines(),
        [
            r#"cannot run a container with podman: default OCI runtime "crun-missing" not found: invalid argument"#
        ]
    );
}

/// Rootless podman that cannot use its runtime directory. It says so through logrus
/// (`time="…" level=error msg="XDG_RUNTIME_DIR directory \"/run\" is not owned by the
/// current user"`, exit 1), not as an `Error: ` line; the probe reports the message. As root,
/// podman runs as `nobody` (which makes it rootless); as any other user, as that user.
#[tokio::test]
async fn a_rootless_podman_error_in_logrus_framing_is_reported_as_its_message() {
    if !podman_available() {
        return;
    }
    let Some(user) = Unprivileged::find() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A runtime directory this user does not own: root's.
    let (wrapper, runtime_dir) = if user.is_self {
        ("exec env XDG_RUNTIME_DIR=/ podman \"$@\"".to_string(), "/")
    } else {
        // nobody's home, and its temporary directory, so that nothing is left outside.
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
        (
            format!(
                "exec setpriv --reuid=65534 --regid=65534 --clear-groups env -i PATH=\"$PATH\" HOME={h} TMPDIR={h} XDG_RUNTIME_DIR=/run podman \"$@\"",
                h = home.display()
            ),
            "/run",
        )
    };
    let rt = script(dir.path(), "podman", &wrapper);

    // podman itself: the frame on stderr.
    let direct = std::process::Command::new(&rt)
        .arg("info")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&direct.stderr);
    let message =
        format!("XDG_RUNTIME_DIR directory \"{runtime_dir}\" is not owned by the current user");
    let framed = format!("level=error msg=\"{}\"", message.replace('"', "\\\""));
    assert!(!direct.status.success());
    assert!(
        stderr
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("time=\"") && l.ends_with(&framed)),
        "podman's own framing: {stderr}"
    );

    let ran = run(runner(&["preflight", "--runtime", rt.to_str().unwrap()])).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [format!("cannot run a container with podman: {message}")]
    );
}

#[tokio::test]
async fn a_local_image_reports_its_real_id_and_create_leaves_no_container() {
    if !podman_available() {
        return;
    }
    let image = LocalImage::build();
    let ran = run(runner(&[
        "preflight",
        "--runtime",
        "podman",
        "--image",
        &image.tag,
        "--depth",
        "create",
    ]))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stdout.contains(&format!(
            "ok (created and removed a container); image {}; ",
            image.id
        )),
        "{ran:?}"
    );
    assert!(ran.stdout.contains(" free on /"), "{ran:?}");
    let (_, left, _) = podman(&[
        "ps",
        "-a",
        "-q",
        "--filter",
        &format!("ancestor={}", image.tag),
    ]);
    assert_eq!(left, "", "the probe's container was removed");
}

#[tokio::test]
async fn a_missing_image_fails_clearly_and_is_not_pulled() {
    if !podman_available() {
        return;
    }
    let absent = format!(
        "localhost/leasegate-absent-{}:1",
        uuid::Uuid::now_v7().simple()
    );
    let ran = run(runner(&[
        "preflight",
        "--runtime",
        "podman",
        "--image",
        &absent,
        "--depth",
        "create",
    ]))
    .await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [format!(
            "cannot run a container with podman: image {absent} is not present locally (preflight never pulls)"
        )]
    );
    let (exists, _, _) = podman(&["image", "exists", &absent]);
    assert!(!exists);
}

/// Starting a container may be refused on this machine (crun's setrlimit, exit 126). Whatever
/// podman says when asked directly, the preflight must say the same.
#[tokio::test]
async fn a_container_start_is_judged_as_podman_itself_judges_it() {
    if !podman_available() {
        return;
    }
    let image = LocalImage::build();
    let direct = std::process::Command::new("podman")
        .args(["run", "--rm", "--pull=never", &image.tag, "true"])
        .output()
        .unwrap();
    let ran = run(runner(&[
        "preflight",
        "--runtime",
        "podman",
        "--image",
        &image.tag,
        "--depth",
        "run",
    ]))
    .await;
    if direct.status.success() {
        assert_eq!(ran.code, 0, "{ran:?}");
        return;
    }
    let stderr = String::from_utf8_lossy(&direct.stderr);
    let last = leasegate::agent::probe::last_error_line(&stderr).unwrap();
    println!("podman run here: exit {:?}: {last}", direct.status.code());
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(
        ran.stderr_lines(),
        [format!("cannot run a container with podman: {last}")]
    );
}

/// Not a timing assertion: prints the numbers behind docs/BENCHMARKS.md ("Runner preflight
/// overhead"). Run with
/// `cargo test --release --test agent_podman -- --ignored --nocapture preflight_overhead`.
#[tokio::test]
#[ignore]
async fn preflight_overhead() {
    if !podman_available() {
        return;
    }
    let runs: usize = std::env::var("LEASEGATE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2
        }
    }
    fn time(mut f: impl FnMut()) -> Duration {
        let t = Instant::now();
        f();
        t.elapsed()
    }
    let bin = env!("CARGO_BIN_EXE_leasegate");
    let ok = |cmd: &mut std::process::Command| {
        let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let image = LocalImage::build();
    // One warm-up each, then interleaved runs so that drift on the machine hits both alike.
    let mut cases: Vec<(&str, Vec<Duration>)> = vec![
        ("podman info", vec![]),
        ("leasegate runner preflight --runtime podman", vec![]),
        ("podman info + podman image inspect", vec![]),
        (
            "leasegate runner preflight --runtime podman --image IMG",
            vec![],
        ),
        ("leasegate --version (the binary's own start-up)", vec![]),
    ];
    for round in 0..=runs {
        let d = [
            time(|| ok(std::process::Command::new("podman").arg("info"))),
            time(|| {
                ok(std::process::Command::new(bin).args([
                    "runner",
                    "preflight",
                    "--runtime",
                    "podman",
                ]))
            }),
            time(|| {
                ok(std::process::Command::new("podman").arg("info"));
                ok(std::process::Command::new("podman").args(["image", "inspect", &image.tag]));
            }),
            time(|| {
                ok(std::process::Command::new(bin).args([
                    "runner",
                    "preflight",
                    "--runtime",
                    "podman",
                    "--image",
                    &image.tag,
                ]))
            }),
            time(|| ok(std::process::Command::new(bin).arg("--version"))),
        ];
        if round > 0 {
            for (case, d) in cases.iter_mut().zip(d) {
                case.1.push(d);
            }
        }
    }
    let medians: Vec<(&str, Duration)> = cases.into_iter().map(|(n, v)| (n, median(v))).collect();
    for (name, m) in &medians {
        println!(
            "{name}: median of {runs}: {:.1} ms",
            m.as_secs_f64() * 1000.0
        );
    }
    println!(
        "ratio preflight / podman info: {:.3}",
        medians[1].1.as_secs_f64() / medians[0].1.as_secs_f64()
    );
    println!(
        "ratio preflight --image / (podman info + image inspect): {:.3}",
        medians[3].1.as_secs_f64() / medians[2].1.as_secs_f64()
    );
}

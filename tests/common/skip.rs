//! Saying that a case skipped, where `cargo test` shows it without `--nocapture`.
//!
//! libtest captures what `println!` and `eprintln!` write while a test runs, and shows it only
//! for a test that fails: a case that returned early for want of PostgreSQL, podman or
//! Chromium would read as `ok` and nothing else. Written to the process's stderr directly,
//! the line escapes the capture and stands in the normal output beside the test's own line:
//! `SKIPPED postgres::the_case: no PostgreSQL (set LEASEGATE_TEST_DATABASE_URL=…)`.

use std::io::Write;

/// Reports that the running test skips, and why.
pub fn skipped(reason: impl std::fmt::Display) {
    let thread = std::thread::current();
    let case = thread.name().unwrap_or("a test");
    let line = format!("SKIPPED {case}: {reason}\n");
    // Straight to the file descriptor: `std::io::stderr()` is not redirected by the capture.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The path of `name`, a tool `.ci/run` installs with the deployment checkers (haproxy,
/// promtool, docker-compose, systemd-analyze, kubectl), when it is on PATH; otherwise says what
/// is skipped (`check`) and why, or fails under `LEASEGATE_REQUIRE_DEPLOY_TOOLS=1`, which CI
/// sets so that nothing skips there.
pub fn deploy_tool(name: &str, check: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let required = std::env::var("LEASEGATE_REQUIRE_DEPLOY_TOOLS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "LEASEGATE_REQUIRE_DEPLOY_TOOLS=1 but `{name}` is missing ({check})"
        );
        skipped(format!("{check}: `{name}` is not installed here"));
    }
    found
}

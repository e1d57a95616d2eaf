//! The `leasegate` binary as an operator runs it: `serve` in a directory of its own, with no
//! configuration but the address, and the helpers to wait for it and stop it.

use reqwest::StatusCode;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

pub use super::free_port;

/// `leasegate serve` in `dir` on `127.0.0.1:port`, with none of the caller's own settings.
pub fn serve(dir: &Path, port: u16) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasegate"));
    cmd.arg("serve");
    clear_settings(&mut cmd);
    cmd.env("LEASEGATE_LISTEN", format!("127.0.0.1:{port}"))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Removes the settings a test's environment may carry into the binary.
pub fn clear_settings(cmd: &mut tokio::process::Command) {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if (name.starts_with("LEASEGATE_") || name == "DATABASE_URL" || name == "RUST_LOG")
            && !name.starts_with("LEASEGATE_TEST_")
            && !name.starts_with("LEASEGATE_REQUIRE_")
        {
            cmd.env_remove(name.as_ref());
        }
    }
}

pub async fn wait_ready(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(r) = reqwest::get(format!("{base}/readyz")).await
            && r.status() == StatusCode::OK
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("leasegate serve did not become ready");
}

pub async fn sigterm(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap()
}

/// The names in `dir`, sorted.
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

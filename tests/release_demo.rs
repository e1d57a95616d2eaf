//! The README's first command, `cargo run --release -- demo`, on this checkout: the release
//! build exists (it is built here when missing, as on a fresh clone, so that the README's
//! command then starts at once) and its `demo` becomes ready and stops cleanly on SIGTERM.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `<target>/release/leasegate`, beside this test's own `<target>/debug/leasegate`.
fn release_binary() -> PathBuf {
    let debug = PathBuf::from(env!("CARGO_BIN_EXE_leasegate"));
    let target = debug
        .parent()
        .and_then(|d| d.parent())
        .expect("a target directory");
    target.join("release").join("leasegate")
}

#[test]
fn the_release_build_runs_the_demo() {
    let binary = release_binary();
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let target = binary.parent().and_then(|d| d.parent()).unwrap();
        let status = Command::new(cargo)
            .args(["build", "--release", "--quiet", "--bin", "leasegate"])
            .env("CARGO_TARGET_DIR", target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build --release");
        assert!(status.success(), "cargo build --release failed");
    }
    let port = crate::common::free_port();
    let mut child = Command::new(&binary)
        .arg("demo")
        .env_remove("DATABASE_URL")
        .env("LEASEGATE_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the release demo");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ready = false;
    while Instant::now() < deadline && !ready {
        ready = std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .and_then(|mut s| {
                use std::io::{Read, Write};
                s.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").ok()?;
                let mut answer = String::new();
                s.read_to_string(&mut answer).ok()?;
                Some(answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"))
            })
            .unwrap_or(false);
        std::thread::sleep(Duration::from_millis(200));
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(ready, "the release demo did not become ready");
    assert!(
        status.success(),
        "the release demo did not exit cleanly: {status:?}"
    );
}

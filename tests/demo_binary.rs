//! `leasegate demo` as a newcomer runs it: within seconds the page tells the story of a
//! broken runner, a superseded image and a stale runner, all labelled simulated, and its
//! metrics and logs show the simulated runners' leases as `serve` shows any runner's.

use reqwest::StatusCode;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_shows_the_whole_story_on_the_page() {
    let port = crate::common::free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .arg("demo")
        .env_remove("DATABASE_URL")
        .env("LEASEGATE_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "LEASEGATE_ADMIN_TOKEN",
            "demo-admin-token-0123456789abcdef0123",
        )
        .env(
            "LEASEGATE_FORGE_TOKEN",
            "demo-forge-token-0123456789abcdef0123",
        )
        // Faster staleness than the default, so the test need not wait 45 s.
        .env("LEASEGATE_HEARTBEAT_INTERVAL_S", "2")
        .env_remove("RUST_LOG")
        .env_remove("LEASEGATE_METRICS_TOKEN")
        .env_remove("LEASEGATE_METRICS_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Read as it comes, so that the demo never waits on a full pipe.
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = child.stderr.take().unwrap();
    let reading = log.clone();
    tokio::spawn(async move {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut chunk).await
            && n > 0
        {
            reading
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
    {
        printed.push_str(&line);
        printed.push('\n');
        if line.starts_with("forge token") {
            break;
        }
    }
    assert!(
        printed.contains(&format!(
            "http://127.0.0.1:{port}/admin/login?token=demo-admin-token-0123456789abcdef0123"
        )),
        "{printed}"
    );

    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut seen = String::new();
    while Instant::now() < deadline {
        let r = client
            .get(format!("http://127.0.0.1:{port}/admin"))
            .bearer_auth("demo-admin-token-0123456789abcdef0123")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        seen = r.text().await.unwrap();
        let story = [
            "data-status=\"probe_failed\"",
            "default OCI runtime &#34;crun&#34; not found",
            "superseded",
            "data-status=\"stale\"",
            "simulated",
            // Two pools, and a runner whose clock is off says so.
            "id=\"pool-linux-arm64\"",
            "its attestations are refused (clock_skew",
            "s ahead of the server",
        ];
        let metrics = client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let granted = metrics
            .lines()
            .any(|l| l.starts_with("leasegate_leases_granted_total{") && !l.ends_with(" 0"));
        let logged = log.lock().unwrap().contains("lease granted");
        if story.iter().all(|s| seen.contains(s)) && granted && logged {
            let mut runners = 0;
            for line in seen.lines().filter(|l| l.contains("class=\"runner\"")) {
                runners += 1;
                assert!(line.contains("data-runner"), "{line}");
            }
            // What needs attention is listed (no crun, superseded, stale, clock ahead); the
            // three healthy ones are a count.
            assert_eq!(runners, 4, "{seen}");
            assert!(seen.contains("3 healthy runners</a> not listed"), "{seen}");
            assert_eq!(
                seen.matches("<span class=\"badge\">simulated</span>")
                    .count(),
                4,
                "every simulated runner listed is labelled"
            );
            let pid = child.id().unwrap().to_string();
            std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap();
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .unwrap()
                .unwrap();
            assert!(status.success());
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!(
        "the demo did not tell the whole story in time (leasegate_leases_granted_total and \
         `lease granted` in its log included): {seen}\n{}",
        log.lock().unwrap()
    );
}

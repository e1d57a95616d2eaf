//! `leasegate serve` as an operator runs it: a fresh directory, no configuration, SIGTERM.

use crate::common;

use common::binary::*;
use common::*;
use reqwest::StatusCode;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// Registers runner `r1` in pool `linux` of the service at `base`, over HTTP.
async fn register_runner(client: &reqwest::Client, base: &str, admin: &str) -> TestRunner {
    let token: serde_json::Value = client
        .post(format!(
            "{base}/api/v1/admin/pools/linux/registration-tokens"
        ))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = leasegate::agent::keys::RunnerKey::generate();
    let body =
        json!({"registration_token": token["token"], "name": "r1", "public_key": key.public_jwk()});
    let reg: serde_json::Value = client
        .post(format!("{base}/api/v1/runners"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    TestRunner {
        id: reg["runner_id"].as_str().unwrap().into(),
        pool: "linux".into(),
        key,
    }
}

#[tokio::test]
async fn first_start_creates_the_database_and_private_secrets_and_sigterm_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = serve(dir.path(), port).spawn().unwrap();
    wait_ready(&base).await;

    assert!(dir.path().join("leasegate.db").exists());
    let admin_file = dir.path().join("leasegate-admin.token");
    let forge_file = dir.path().join("leasegate-forge.token");
    for f in [&admin_file, &forge_file] {
        assert_eq!(
            std::fs::metadata(f).unwrap().permissions().mode() & 0o777,
            0o600,
            "{f:?}"
        );
    }
    let admin = std::fs::read_to_string(&admin_file)
        .unwrap()
        .trim()
        .to_string();
    let client = reqwest::Client::new();
    let r = client
        .put(format!("{base}/api/v1/admin/pools/linux"))
        .bearer_auth(&admin)
        .json(&json!({"expected_image_ids": [IMAGE_A]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);

    // A waiting long poll is answered at once when SIGTERM arrives.
    let runner = register_runner(&client, &base, &admin).await;
    let waiting = {
        let (client, base, att) = (client.clone(), base.clone(), runner.healthy());
        tokio::spawn(async move {
            client
                .post(format!("{base}/api/v1/lease"))
                .json(&json!({"attestation": att, "wait_s": 30}))
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    let status = sigterm(&mut child).await;
    assert!(status.success(), "exit status {status:?}");
    assert_eq!(
        waiting.await.unwrap().unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert!(stopping.elapsed() < Duration::from_secs(5));

    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .await
        .unwrap();
    assert!(
        log.contains("leasegate-admin.token"),
        "the secret's path is logged: {log}"
    );
    assert!(!log.contains(&admin), "the secret itself is never logged");

    // A second start keeps the same secrets.
    let mut again = serve(dir.path(), port).spawn().unwrap();
    wait_ready(&base).await;
    let r = client
        .get(format!("{base}/api/v1/admin/pools/linux"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(sigterm(&mut again).await.success());
}

#[tokio::test]
async fn json_logs_on_request_and_bad_settings_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = serve(dir.path(), port)
        .env("LEASEGATE_LOG_FORMAT", "json")
        .spawn()
        .unwrap();
    wait_ready(&base).await;
    assert!(sigterm(&mut child).await.success());
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .await
        .unwrap();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert!(v.get("level").is_some());
    }

    let out = serve(dir.path(), free_port())
        .env("LEASEGATE_LEASE_TTL_S", "0")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("LEASEGATE_LEASE_TTL_S must be positive"),
        "{stderr}"
    );
}

#[tokio::test]
async fn postgres_without_shared_secrets_refuses_to_start_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = serve(dir.path(), free_port())
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "with PostgreSQL every replica must share the secrets: set LEASEGATE_ADMIN_TOKEN"
        ),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing may be written"
    );
}

#[tokio::test]
async fn a_refusal_is_logged_once_with_its_code_and_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = serve(dir.path(), port)
        .env("LEASEGATE_LOG_FORMAT", "json")
        .env("LEASEGATE_ADMIN_TOKEN", ADMIN)
        .env("LEASEGATE_FORGE_TOKEN", FORGE)
        .spawn()
        .unwrap();
    wait_ready(&base).await;
    let client = reqwest::Client::new();
    client
        .put(format!("{base}/api/v1/admin/pools/linux"))
        .bearer_auth(ADMIN)
        .json(&json!({"expected_image_ids": [IMAGE_A]}))
        .send()
        .await
        .unwrap();
    let runner = register_runner(&client, &base, ADMIN).await;
    let r = client
        .post(format!("{base}/api/v1/lease"))
        .json(&json!({"attestation": runner.failing("default OCI runtime \"crun\" not found: invalid argument")}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert!(sigterm(&mut child).await.success());
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .await
        .unwrap();
    let refusals: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "refused")
        .collect();
    assert_eq!(refusals.len(), 1, "{log}");
    assert_eq!(refusals[0]["code"], "probe_failed");
    assert_eq!(refusals[0]["level"], "INFO");
    assert_eq!(refusals[0]["runner_id"], runner.id.as_str());
    assert_eq!(
        refusals[0]["span"]["route"], "/api/v1/lease",
        "the request span: {}",
        refusals[0]
    );
}

#[tokio::test]
async fn a_weak_operator_token_refuses_to_start_and_says_why() {
    for (variable, other) in [
        ("LEASEGATE_ADMIN_TOKEN", "LEASEGATE_FORGE_TOKEN"),
        ("LEASEGATE_FORGE_TOKEN", "LEASEGATE_ADMIN_TOKEN"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = serve(dir.path(), free_port())
            .env(variable, "adm-secret")
            .env(other, "a-strong-enough-token-0123456789abcdef")
            .output()
            .await
            .unwrap();
        assert!(!out.status.success(), "{variable}=adm-secret started");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(variable)
                && stderr.contains("10 characters long; it must be at least 32"),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn a_second_serve_on_one_sqlite_file_refuses_to_start_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut first = serve(dir.path(), port).spawn().unwrap();
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    let files = files_in(dir.path());
    let out = serve(dir.path(), free_port()).output().await.unwrap();
    assert!(!out.status.success());
    assert_eq!(
        files_in(dir.path()),
        files,
        "the second start writes nothing"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("another leasegate process is serving the SQLite database"),
        "{stderr}"
    );
    assert!(stderr.contains("use PostgreSQL for replicas"), "{stderr}");
    // Once the first has stopped, the file may be served again.
    assert!(sigterm(&mut first).await.success());
    let port = free_port();
    let mut again = serve(dir.path(), port).spawn().unwrap();
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    assert!(sigterm(&mut again).await.success());
}

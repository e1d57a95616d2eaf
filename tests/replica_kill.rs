//! Three `leasegate serve` processes on one PostgreSQL database, two dozen runners and
//! hundreds of jobs; one replica is killed with SIGKILL half way. Afterwards every job
//! succeeded exactly once, no job was ever held by two live leases, and the attempts used
//! equal the starts made. Skipped (with the reason printed) without a PostgreSQL to use.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const REPLICAS: usize = 3;
const RUNNERS: usize = 24;
const JOBS: u64 = 300;

struct Replica {
    child: tokio::process::Child,
    base: String,
}

async fn spawn_serve(database_url: &str, dir: &std::path::Path, n: usize) -> Replica {
    let port = free_port();
    let log = std::fs::File::create(dir.join(format!("replica-{n}.log"))).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .arg("serve")
        .env("LEASEGATE_LISTEN", format!("127.0.0.1:{port}"))
        .env("DATABASE_URL", database_url)
        .env("LEASEGATE_ADMIN_TOKEN", ADMIN)
        .env("LEASEGATE_FORGE_TOKEN", FORGE)
        .env("LEASEGATE_LEASE_TTL_S", "3")
        .env("RUST_LOG", "warn")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start leasegate serve");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await
            && r.status() == StatusCode::OK
        {
            return Replica { child, base };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("replica {n} did not become ready");
}

/// Posts to the first live replica from `start`, moving on when one cannot be reached.
async fn post_any(
    client: &reqwest::Client,
    bases: &[String],
    start: usize,
    path: &str,
    bearer: Option<&str>,
    body: &Value,
) -> (usize, reqwest::Response) {
    for k in 0..bases.len() * 20 {
        let i = (start + k) % bases.len();
        let mut req = client.post(format!("{}{path}", bases[i])).json(body);
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) if r.status() != StatusCode::SERVICE_UNAVAILABLE => return (i, r),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("no replica answered {path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_a_replica_loses_nothing_and_never_double_leases() {
    let Some(db) = pg::TestDatabase::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for n in 0..REPLICAS {
        replicas.push(spawn_serve(&db.url, dir.path(), n).await);
    }
    let bases: Arc<Vec<String>> = Arc::new(replicas.iter().map(|r| r.base.clone()).collect());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let admin = |path: &str| format!("{}{path}", bases[0]);

    let r = client
        .put(admin("/api/v1/admin/pools/linux"))
        .bearer_auth(ADMIN)
        .json(&json!({"expected_image_ids": [IMAGE_A]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let mut jobs = Vec::new();
    for i in 0..JOBS {
        let r = client
            .post(admin("/api/v1/jobs"))
            .bearer_auth(FORGE)
            .json(&json!({"pool": "linux", "payload": {"n": i}, "max_attempts": 5}))
            .send()
            .await
            .unwrap();
        jobs.push(
            r.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let mut runners = Vec::new();
    for i in 0..RUNNERS {
        let token: Value = client
            .post(admin("/api/v1/admin/pools/linux/registration-tokens"))
            .bearer_auth(ADMIN)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let key = leasegate::agent::keys::RunnerKey::generate();
        let body = json!({"registration_token": token["token"], "name": format!("r{i}"), "public_key": key.public_jwk()});
        let reg: Value = client
            .post(admin("/api/v1/runners"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        runners.push(TestRunner {
            id: reg["runner_id"].as_str().unwrap().into(),
            pool: "linux".into(),
            key,
        });
    }

    let finished = Arc::new(AtomicU64::new(0));
    let starts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, runner) in runners.into_iter().enumerate() {
        let (bases, client, finished, starts, stop) = (
            bases.clone(),
            client.clone(),
            finished.clone(),
            starts.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut home = i % REPLICAS;
            while !stop.load(Ordering::SeqCst) {
                let now_ms = leasegate::domain::time::Millis::now().0 as f64 / 1000.0;
                let att = runner.attest(json!({"probe": {"checked_at": now_ms}}));
                let (at, r) = post_any(
                    &client,
                    &bases,
                    home,
                    "/api/v1/lease",
                    None,
                    &json!({"attestation": att, "wait_s": 1}),
                )
                .await;
                home = at;
                if r.status() != StatusCode::OK {
                    continue;
                }
                let body: Value = r.json().await.unwrap();
                let lease_id = body["lease_id"].as_str().unwrap().to_string();
                let token = body["lease_token"].as_str().unwrap().to_string();
                let job_id = body["job"]["id"].as_str().unwrap().to_string();

                let path = format!("/api/v1/leases/{lease_id}/start");
                let (_, r) = post_any(&client, &bases, home, &path, Some(&token), &json!({})).await;
                let started =
                    match r.status() {
                        StatusCode::OK => true,
                        _ => {
                            // The answer was lost or the lease moved on: the job's story says whether
                            // this lease started.
                            let story = job_story(&client, &bases, &job_id).await;
                            story["events"].as_array().unwrap().iter().any(|e| {
                                e["kind"] == "started" && e["lease_id"] == lease_id.as_str()
                            })
                        }
                    };
                if started {
                    starts.fetch_add(1, Ordering::SeqCst);
                } else {
                    continue;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                let path = format!("/api/v1/leases/{lease_id}/complete");
                let (_, r) = post_any(
                    &client,
                    &bases,
                    home,
                    &path,
                    Some(&token),
                    &json!({"outcome": "succeeded"}),
                )
                .await;
                let done = r.status() == StatusCode::OK || {
                    let story = job_story(&client, &bases, &job_id).await;
                    story["events"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|e| e["kind"] == "completed" && e["lease_id"] == lease_id.as_str())
                };
                if done {
                    finished.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }

    let deadline = Instant::now() + Duration::from_secs(150);
    let mut killed = false;
    while finished.load(Ordering::SeqCst) < JOBS {
        assert!(
            Instant::now() < deadline,
            "only {} of {JOBS} jobs finished",
            finished.load(Ordering::SeqCst)
        );
        if !killed && finished.load(Ordering::SeqCst) >= JOBS / 2 {
            replicas[1].child.start_kill().unwrap();
            replicas[1].child.wait().await.unwrap();
            killed = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(killed);
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }

    let mut attempts = 0;
    for id in &jobs {
        let job = job_story(&client, &bases, id).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        attempts += job["attempts"].as_u64().unwrap();
        let mut live: Option<String> = None;
        let mut completions = 0;
        for e in job["events"].as_array().unwrap() {
            let lease = e["lease_id"].as_str().map(str::to_string);
            match e["kind"].as_str().unwrap() {
                "leased" => {
                    assert!(live.is_none(), "job {id} held by two live leases: {job}");
                    live = lease;
                }
                "returned" | "requeued" | "failed" | "completed" => {
                    assert_eq!(
                        live.take(),
                        lease,
                        "job {id}: an end for a lease that was not live"
                    );
                    completions += u32::from(e["kind"] == "completed");
                }
                _ => {}
            }
        }
        assert_eq!(completions, 1, "job {id}");
    }
    assert_eq!(
        attempts,
        starts.load(Ordering::SeqCst),
        "attempts must equal the starts made"
    );
}

async fn job_story(client: &reqwest::Client, bases: &[String], id: &str) -> Value {
    for k in 0..bases.len() * 20 {
        let base = &bases[k % bases.len()];
        if let Ok(r) = client
            .get(format!("{base}/api/v1/jobs/{id}"))
            .bearer_auth(FORGE)
            .send()
            .await
            && r.status() == StatusCode::OK
        {
            return r.json().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no replica answered for job {id}");
}

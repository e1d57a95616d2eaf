//! Many runners leasing from one pool at once: no job is ever held by two live leases, every
//! job finishes exactly once, and the attempts used equal the starts made.

use crate::common;

use common::*;
use leasegate::domain::time::Millis;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const RUNNERS: usize = 12;
const JOBS: usize = 150;

fn fresh(runner: &TestRunner) -> String {
    // Sub-second checked_at, so a probe right after an abandon lifts the quarantine.
    runner.attest(json!({"probe": {"checked_at": Millis::now().0 as f64 / 1000.0}}))
}

each_engine!(concurrent_runners_never_share_a_job_and_attempts_equal_starts,);

async fn concurrent_runners_never_share_a_job_and_attempts_equal_starts(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let app = Arc::new(app);
    app.pool("linux", &[IMAGE_A]).await;
    let mut jobs = Vec::new();
    for _ in 0..JOBS {
        jobs.push(
            app.enqueue_with(json!({"pool": "linux", "payload": {}, "max_attempts": 5}))
                .await,
        );
    }
    let mut runners = Vec::new();
    for i in 0..RUNNERS {
        runners.push(app.register("linux", &format!("r{i}")).await);
    }
    let starts = Arc::new(AtomicU64::new(0));

    let mut tasks = Vec::new();
    for (i, runner) in runners.into_iter().enumerate() {
        let app = app.clone();
        let starts = starts.clone();
        tasks.push(tokio::spawn(async move {
            let mut empty_polls = 0;
            let mut n = 0u64;
            while empty_polls < 3 {
                n += 1;
                let r = app.lease(&fresh(&runner)).await;
                match r.status() {
                    StatusCode::NO_CONTENT => {
                        empty_polls += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                    StatusCode::OK => empty_polls = 0,
                    StatusCode::CONFLICT => continue, // quarantined by our own abandon: re-probe
                    other => panic!("unexpected lease answer {other}"),
                }
                let body: Value = r.json().await.unwrap();
                let lease = Granted {
                    lease_id: body["lease_id"].as_str().unwrap().into(),
                    token: body["lease_token"].as_str().unwrap().into(),
                    job_id: body["job"]["id"].as_str().unwrap().into(),
                    body: body.clone(),
                };
                // A deterministic mix: some abandon before start, some error on the first attempt.
                if (n + i as u64).is_multiple_of(7) {
                    assert_eq!(
                        app.call(&lease, "abandon", Some(json!({"reason": "test"})))
                            .await
                            .status(),
                        StatusCode::OK
                    );
                    continue;
                }
                assert_eq!(
                    app.call(&lease, "start", None).await.status(),
                    StatusCode::OK
                );
                starts.fetch_add(1, Ordering::SeqCst);
                let outcome = if body["job"]["attempt"] == 1 && (n + i as u64).is_multiple_of(5) {
                    "errored"
                } else {
                    "succeeded"
                };
                let r = app
                    .call(&lease, "complete", Some(json!({"outcome": outcome})))
                    .await;
                assert_eq!(r.status(), StatusCode::OK);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    let mut total_attempts = 0;
    for id in &jobs {
        let job = app.job(id).await;
        assert_eq!(job["state"], "succeeded", "job {id} did not finish: {job}");
        total_attempts += job["attempts"].as_i64().unwrap();
        // The story never shows a second lease while one is live.
        let mut live: HashMap<String, ()> = HashMap::new();
        let mut completions = 0;
        for e in job["events"].as_array().unwrap() {
            let lease = e["lease_id"].as_str().unwrap_or_default().to_string();
            match e["kind"].as_str().unwrap() {
                "leased" => {
                    assert!(live.is_empty(), "job {id} leased twice at once: {job}");
                    live.insert(lease, ());
                }
                "returned" | "requeued" | "failed" | "completed" => {
                    assert!(
                        live.remove(&lease).is_some(),
                        "job {id}: end of a lease that was not live"
                    );
                    if e["kind"] == "completed" {
                        completions += 1;
                    }
                }
                _ => {}
            }
        }
        assert_eq!(completions, 1, "job {id} completed {completions} times");
    }
    assert_eq!(
        total_attempts as u64,
        starts.load(Ordering::SeqCst),
        "attempts must equal the starts made"
    );
}

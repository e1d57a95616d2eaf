//! The gate judges at most `JUDGED_AT_ONCE` attestations at once; the rest wait for a turn.
//! A burst larger than that is judged whole, and every way an admission ends gives its turn
//! back: a turn kept would, after that many, leave every later request waiting for ever.

use crate::common;

use common::*;
use leasegate::gate::JUDGED_AT_ONCE;
use reqwest::StatusCode;
use std::collections::HashSet;
use std::time::Duration;

each_engine!(
    a_burst_larger_than_the_turns_is_judged_whole,
    every_way_an_admission_ends_gives_its_turn_back,
);

async fn a_burst_larger_than_the_turns_is_judged_whole(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let polls = JUDGED_AT_ONCE + 64;
    // Every poll is made (and signed) before any is sent, so that they arrive as one burst.
    let attestations: Vec<String> = (0..polls).map(|_| runner.healthy()).collect();
    let waiting: Vec<_> = attestations
        .into_iter()
        .map(|attestation| app.spawn_lease_wait(attestation, 30))
        .collect();
    // Every poll admitted and waiting, then a job for each.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while accepted(&app).await < polls {
        assert!(
            std::time::Instant::now() < deadline,
            "the burst was not all admitted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..polls {
        app.enqueue("linux").await;
    }
    let mut jobs = HashSet::new();
    for poll in waiting {
        let r = tokio::time::timeout(Duration::from_secs(60), poll)
            .await
            .expect("a poll was never answered")
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(jobs.insert(body["job"]["id"].as_str().unwrap().to_string()));
    }
    assert_eq!(jobs.len(), polls);
    assert_eq!(
        series(&app, "leasegate_admissions_waiting").await,
        Some(0),
        "no request waits for a turn once the burst is judged"
    );
}

async fn every_way_an_admission_ends_gives_its_turn_back(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let replayed = runner.healthy();
    assert_eq!(app.heartbeat(&replayed).await.status(), StatusCode::OK);
    let mut bad_signature = runner.healthy();
    let last = bad_signature.pop().unwrap();
    bad_signature.push(if last == 'A' { 'B' } else { 'A' });
    // More of each than there are turns: one kept per request would stop the gate.
    for _ in 0..=JUDGED_AT_ONCE {
        let answers = tokio::time::timeout(Duration::from_secs(30), async {
            (
                app.heartbeat(&bad_signature).await.status(),
                app.heartbeat(&replayed).await.status(),
                app.lease(&runner.attest(serde_json::json!({"image": {"id": IMAGE_B}})))
                    .await
                    .status(),
            )
        })
        .await
        .expect("a request waited for a turn nobody gave back");
        assert_eq!(
            answers,
            (
                StatusCode::UNAUTHORIZED,
                StatusCode::UNAUTHORIZED,
                StatusCode::CONFLICT
            )
        );
    }
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
}

/// Attestations accepted so far, from the service's own count.
async fn accepted(app: &TestApp) -> usize {
    series(app, "leasegate_attestations_total{result=\"accepted\"}")
        .await
        .unwrap_or(0)
}

/// The value of the series `name` (with its labels) in the service's metrics.
async fn series(app: &TestApp, name: &str) -> Option<usize> {
    let text = app.metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|n| n.parse().unwrap())
}

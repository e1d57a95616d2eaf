//! A request whose client went away while it waited for its round is not written: its claim
//! would hand a job to nobody, leased until the lease expired. The lanes are one piece of code
//! for both engines (`store::group_commit`); the case stalls SQLite's one writer with a write
//! lock of the test's own, so that a request is seen to wait behind a round and be dropped.

use crate::common;

use common::records;
use common::*;
use leasegate::domain::ids::{LeaseId, RunnerId};
use leasegate::domain::pool_name::PoolName;
use leasegate::domain::time::Millis;
use leasegate::store::{Claim, RoundItem};
use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_request_went_away_while_it_waited_leases_nothing() {
    let Some(app) = spawn_app_on_with(Engine::Sqlite, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r0").await;
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    let job = app
        .enqueue_with(json!({"pool": "linux", "payload": {}}))
        .await;

    // Another writer holds the database: the lane's next round waits for it.
    let path = app.database_url.trim_start_matches("sqlite://").to_string();
    let blocker = rusqlite::Connection::open(&path).expect("the database file");
    blocker
        .execute_batch("BEGIN IMMEDIATE")
        .expect("the write lock");
    // A round the lane is held in: an attestation handed to the store itself, so that it
    // reaches the lane at once.
    let store = app.state.store().clone();
    let id = RunnerId(runner.id.clone());
    let now = Millis::now();
    let record = records::healthy(&id, "jti-stalled-0123456789", now, now.plus_secs(60));
    let stalled = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .submit(RoundItem {
                    attestation: Some(record),
                    claim: None,
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A claim queued behind that round, whose request is dropped while it waits.
    let claim = Claim {
        runner_id: id,
        pool: PoolName::parse("linux").unwrap(),
        lease_id: LeaseId::generate(),
        token_hash: leasegate::secrets::hash_token("abandoned"),
        ttl_s: 300,
        now: Millis::now(),
    };
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        store.submit(RoundItem {
            attestation: None,
            claim: Some(claim),
        }),
    )
    .await;
    assert!(waited.is_err(), "the claim waited behind the stalled round");

    blocker
        .execute_batch("ROLLBACK")
        .expect("the lock given up");
    let stalled = stalled.await.unwrap().expect("the stalled round's answer");
    assert_eq!(stalled.attestation, Some(Ok(())));
    // The lane has gone past the dropped claim: a round after it is answered.
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    assert_eq!(app.job(&job).await["state"], "queued");
}

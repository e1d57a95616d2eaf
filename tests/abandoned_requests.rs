//! A request whose client went away while it waited for its round is not written: its claim
//! would hand a job to nobody, leased until the lease expired. The lanes are one piece of code
//! for both engines (`store::group_commit`). An operator's write whose client went away is
//! written all the same (SQLite's writer has it queued), and what it changed still reaches the
//! verdict cache. The cases stall SQLite's one writer with a write lock of the test's own, so
//! that a request is seen to wait and be dropped.

use crate::common;

use common::records;
use common::*;
use leasegate::domain::audit::{Action, Entry};
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
    let runner = app.one_healthy_runner().await;
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

/// An operator's cordon whose client gave up while SQLite's writer was held (a `curl -m`, a
/// proxy's timeout, a tab closed) is committed once the writer is free, as its request was
/// already queued there; what it changed reaches the verdict cache then too. Were it lost
/// with the request, the cache would go on admitting the runner on every path that judges
/// from it (forge fetches, gate checks), each heartbeat renewing the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_write_whose_client_went_away_still_reaches_the_cache() {
    let Some(app) = spawn_app_on_with(Engine::Sqlite, |_| {}).await else {
        return;
    };
    let runner = app.one_healthy_runner().await;
    let store = app.state.store().clone();
    let id = RunnerId(runner.id.clone());
    let cordoned = || async {
        let held = store.gate_runner(&id).await.unwrap().expect("the runner");
        held.record.gate.cordoned
    };
    assert!(!cordoned().await, "held by the cache, not cordoned");

    let path = app.database_url.trim_start_matches("sqlite://").to_string();
    let blocker = rusqlite::Connection::open(&path).expect("the database file");
    blocker
        .execute_batch("BEGIN IMMEDIATE")
        .expect("the write lock");
    let audit = Entry {
        at: Millis::now(),
        actor: "abandoned-test".into(),
        action: Action::RunnerCordon,
        target: runner.id.clone(),
        detail: None,
        client: "127.0.0.1".into(),
    };
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        store.set_cordoned(&id, true, &audit),
    )
    .await;
    assert!(waited.is_err(), "the cordon waited for the writer");
    blocker
        .execute_batch("ROLLBACK")
        .expect("the lock given up");

    let started = std::time::Instant::now();
    loop {
        let in_database: bool = blocker
            .query_row(
                "SELECT cordoned <> 0 FROM runners WHERE id = ?1",
                [&runner.id],
                |row| row.get(0),
            )
            .expect("the runner's row");
        if in_database {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the cordon was committed once the writer was free"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Applied with its commit, on the writer's answer.
    let started = std::time::Instant::now();
    while !cordoned().await {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the cache still holds the runner as it was before the cordon"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

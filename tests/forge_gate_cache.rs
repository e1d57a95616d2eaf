//! The forge gate judges a fetch from the gate's cache (the binding, the runner, its pool), and
//! the cache is never stale: whatever an operator, an agent or a heartbeat changes is seen by
//! the very next fetch, here and, on PostgreSQL, at another replica. And forwarded bodies of
//! several MB pass intact both ways.

use crate::common;
use crate::forge_gate::{
    GITLAB_TOKEN, bound_runner, fetch_task, futures_stream, gated, header, heartbeat_broken,
    heartbeat_healthy, sha256_hex,
};

use common::forges::{self, FETCH_TASK, FORGEJO_TOKEN, UUID};
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

each_engine!(
    every_change_to_the_runner_or_its_pool_is_seen_by_the_next_fetch,
    a_binding_removed_moved_or_rekeyed_is_seen_by_the_next_fetch,
    bodies_of_several_mb_pass_intact_both_ways,
);

/// A Forgejo fetch through the gate: the refusal's code, `None` when it was forwarded (and the
/// forge then saw one more fetch).
async fn fetch(g: &forges::Gated) -> Option<String> {
    let before = g.forgejo.calls_to(FETCH_TASK);
    let r = fetch_task(&g.app, UUID, FORGEJO_TOKEN, true).await;
    assert_eq!(r.status(), StatusCode::OK);
    let refusal = header(&r, "x-leasegate-refusal").map(String::from);
    let forwarded = g.forgejo.calls_to(FETCH_TASK) - before;
    assert_eq!(forwarded, usize::from(refusal.is_none()), "{refusal:?}");
    refusal
}

async fn every_change_to_the_runner_or_its_pool_is_seen_by_the_next_fetch(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let app = &g.app;
    let runner = bound_runner(app).await;
    heartbeat_healthy(app, &runner).await;
    // Twice: the second is judged from what the first put in the cache.
    assert_eq!(fetch(&g).await, None);
    assert_eq!(fetch(&g).await, None);

    let admin = |action: &str| format!("/api/v1/admin/runners/{}/{action}", runner.id);
    let r = app.admin_post(&admin("cordon"), json!({})).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await.as_deref(), Some("runner_cordoned"));
    let r = app.admin_post(&admin("uncordon"), json!({})).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await, None);

    // A heartbeat with other facts, then the healthy ones again.
    heartbeat_broken(app, &runner).await;
    assert_eq!(fetch(&g).await.as_deref(), Some("probe_failed"));
    heartbeat_healthy(app, &runner).await;
    assert_eq!(fetch(&g).await, None);

    // The pool: rolled to another image with no grace, then back.
    let pool = |images: &[&str]| {
        app.admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": images, "drift_grace_s": 0}),
        )
    };
    assert_eq!(pool(&[IMAGE_B]).await.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await.as_deref(), Some("image_drift"));
    assert_eq!(pool(&[IMAGE_A]).await.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await, None);
    // ... and set to observe: a broken runner's fetch goes through, marked.
    heartbeat_broken(app, &runner).await;
    let r = app
        .admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A], "gate_mode": "observe"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = fetch_task(app, UUID, FORGEJO_TOKEN, true).await;
    assert_eq!(header(&r, "x-leasegate-would-refuse"), Some("probe_failed"));

    // Revoked: its bindings are gone with it, and so is the forge runner's work.
    let r = app.admin_post(&admin("revoke"), json!({})).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await.as_deref(), Some("unknown_runner"));
}

async fn a_binding_removed_moved_or_rekeyed_is_seen_by_the_next_fetch(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let app = &g.app;
    let first = bound_runner(app).await;
    heartbeat_healthy(app, &first).await;
    assert_eq!(fetch(&g).await, None);
    let put = |id: &str, body: Value| {
        let path = format!("/api/v1/admin/runners/{id}/forge-runners");
        async move { app.admin_put(&path, body).await }
    };
    // Unbound: the uuid names no runner any more.
    let r = put(
        &first.id,
        json!({"forge_runners": [{"kind": "gitlab", "token_sha256": sha256_hex(GITLAB_TOKEN)}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await.as_deref(), Some("unknown_runner"));
    // ... and so is that remembered: bound to a broken runner now, it is that runner's.
    let second = app.register("linux", "build-02").await;
    heartbeat_broken(app, &second).await;
    let r = put(
        &second.id,
        json!({"forge_runners": [{"kind": "forgejo", "uuid": UUID}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await.as_deref(), Some("probe_failed"));
    heartbeat_healthy(app, &second).await;
    assert_eq!(fetch(&g).await, None);
    // The binding now holds another token's hash: a fetch with this token is not its
    // runner's, and goes to the forge untouched even from a broken runner.
    heartbeat_broken(app, &second).await;
    assert_eq!(fetch(&g).await.as_deref(), Some("probe_failed"));
    let r = put(
        &second.id,
        json!({"forge_runners": [{"kind": "forgejo", "uuid": UUID,
                                  "token_sha256": sha256_hex("another-token")}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await, None);
    // Back to its own token's hash: judged again.
    let r = put(
        &second.id,
        json!({"forge_runners": [{"kind": "forgejo", "uuid": UUID,
                                  "token_sha256": sha256_hex(FORGEJO_TOKEN)}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fetch(&g).await.as_deref(), Some("probe_failed"));
}

async fn bodies_of_several_mb_pass_intact_both_ways(engine: Engine) {
    use sha2::{Digest, Sha256};
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    // Up: 24 MiB in uneven pieces, hashed on both sides.
    const PIECE: usize = 100_003;
    const PIECES: usize = 250;
    let piece: Vec<u8> = (0..PIECE).map(forges::blob_byte).collect();
    let mut hasher = Sha256::new();
    for _ in 0..PIECES {
        hasher.update(&piece);
    }
    let r = g
        .app
        .client
        .post(g.app.url("/api/actions_pipeline/upload"))
        .body(reqwest::Body::wrap_stream(futures_stream(piece, PIECES)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let got: Value = r.json().await.unwrap();
    assert_eq!(got["bytes"], (PIECE * PIECES) as u64);
    assert_eq!(got["sha256"], hex::encode(hasher.finalize()));
    // Down: 24 MiB and a few bytes, each where the forge put it.
    let bytes = (24 << 20) + 7;
    for forge in ["/api/actions_pipeline", "/api/v4"] {
        let r = g
            .app
            .client
            .get(g.app.url(&format!("{forge}/blob/{bytes}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let body = r.bytes().await.unwrap();
        assert_eq!(body.len(), bytes, "{forge}");
        let misplaced = body
            .iter()
            .enumerate()
            .position(|(i, b)| *b != forges::blob_byte(i));
        assert_eq!(misplaced, None, "{forge}");
    }
}

/// A heartbeat at one replica, and a cordon there, reach the forge gate of another by the time
/// their notification does; an attestation that repeats the last one's facts is not announced,
/// yet never leaves another replica judging it too old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_replica_records_reaches_the_forge_gate_of_another() {
    let Some(g) = gated(Engine::Postgres, |a| a.attestation_max_age_s = 3).await else {
        return;
    };
    let (f, gl) = (g.forgejo.base.clone(), g.gitlab.base.clone());
    let b = spawn_replica_with(&g.app, move |a| {
        a.forgejo_upstream = Some(f);
        a.gitlab_upstream = Some(gl);
        a.attestation_max_age_s = 3;
    })
    .await;
    let runner = bound_runner(&g.app).await;
    heartbeat_healthy(&g.app, &runner).await;
    let at_b = || async {
        let r = fetch_task(&b, UUID, FORGEJO_TOKEN, true).await;
        assert_eq!(r.status(), StatusCode::OK);
        header(&r, "x-leasegate-refusal").map(String::from)
    };
    // B caches the runner as healthy.
    assert_eq!(at_b().await, None);
    // Broken at A: announced, since the facts changed.
    heartbeat_broken(&g.app, &runner).await;
    eventually(|| async { at_b().await.as_deref() == Some("probe_failed") }).await;
    heartbeat_healthy(&g.app, &runner).await;
    eventually(|| async { at_b().await.is_none() }).await;
    // Healthy heartbeats at A only, past the age an attestation may have: B, whose entry holds
    // an older one, still forwards.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        heartbeat_healthy(&g.app, &runner).await;
        assert_eq!(at_b().await, None);
    }
    let r = g
        .app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/cordon", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    eventually(|| async { at_b().await.as_deref() == Some("runner_cordoned") }).await;
}

/// Waits until `done`; panics after 10 s.
async fn eventually<F: Future<Output = bool>>(done: impl Fn() -> F) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < Duration::from_secs(10), "never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

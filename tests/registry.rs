//! Registry-backed pools end to end: a real distribution registry (Debian's `docker-registry`)
//! with images built and pushed by podman, a tiny axum registry for the basic and bearer-token
//! challenges, and the service over its real listener.
//!
//! Cases that need `docker-registry` or podman skip with a printed reason when they are
//! missing, unless `LEASEGATE_REQUIRE_REGISTRY=1` (CI). Store-touching cases run on SQLite and
//! PostgreSQL; the registry is started before the service, so that the service can be told to
//! reach it over plain HTTP (`LEASEGATE_INSECURE_REGISTRIES`).

use crate::common;

use common::oci::*;
use common::*;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

each_engine!(
    a_pool_follows_its_tag_through_a_roll,
    a_registry_outage_keeps_the_last_known_good_set,
    two_pools_resolve_independently,
    an_images_entry_follows_its_tag_as_a_pool_does,
);

/// A service on `engine` that reaches `insecure` over plain HTTP.
async fn app_for(engine: Engine, insecure: &[String]) -> Option<TestApp> {
    let insecure = insecure.to_vec();
    spawn_app_on_with(engine, move |args| {
        args.insecure_registries = insecure;
        args.registry_resolver = true;
    })
    .await
}

async fn put_registry_pool(app: &TestApp, name: &str, image_ref: &str, grace_s: i64) -> Value {
    let r = app
        .admin_put(
            &format!("/api/v1/admin/pools/{name}"),
            json!({"image_ref": image_ref, "image_source": "registry", "drift_grace_s": grace_s}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED, "PUT pool {name}");
    r.json().await.unwrap()
}

async fn get_pool(app: &TestApp, name: &str) -> Value {
    let r = app.admin_get(&format!("/api/v1/admin/pools/{name}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

async fn resolve(app: &TestApp, name: &str) -> Response {
    app.admin_post(&format!("/api/v1/admin/pools/{name}/resolve"), json!({}))
        .await
}

async fn resolve_ok(app: &TestApp, name: &str) -> Value {
    let r = resolve(app, name).await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "resolve {name}: {body}");
    body
}

/// Polls the pool until `done` holds (the background resolver, a notification), or fails.
async fn wait_for_pool(
    app: &TestApp,
    name: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pool = get_pool(app, name).await;
        if done(&pool) {
            return pool;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pool {name}: {what} did not happen: {pool}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sleeps until just after the instant `at` (an RFC 3339 string).
async fn sleep_past(at: &Value) {
    let at = time::OffsetDateTime::parse(
        at.as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let left = at - time::OffsetDateTime::now_utc();
    if left.is_positive() {
        tokio::time::sleep(left.unsigned_abs()).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
}

fn set(pool: &Value, field: &str) -> Vec<String> {
    pool[field]
        .as_array()
        .unwrap_or_else(|| panic!("{field} is not an array: {pool}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn has(pool: &Value, field: &str, digest: &str) -> bool {
    set(pool, field).iter().any(|d| d == digest)
}

/// Enqueues a job in the runner's pool, then asks for a lease attesting `image_id`.
async fn lease_on(app: &TestApp, runner: &TestRunner, image_id: &str) -> Response {
    app.enqueue(&runner.pool).await;
    app.lease(&runner.attest(json!({"image": {"id": image_id}})))
        .await
}

/// A lease is granted; the job is then run to completion, so that the runner holds no lease.
async fn leased(app: &TestApp, runner: &TestRunner, image_id: &str, case: &str) {
    let r = lease_on(app, runner, image_id).await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{case}: {body}");
    let (id, token) = (
        body["lease_id"].as_str().unwrap(),
        body["lease_token"].as_str().unwrap(),
    );
    for (action, call) in [
        ("start", None),
        ("complete", Some(json!({"outcome": "succeeded"}))),
    ] {
        let r = app.call_with(id, token, action, call).await;
        assert_eq!(r.status(), StatusCode::OK, "{case}: {action}");
    }
}

async fn refused(
    app: &TestApp,
    runner: &TestRunner,
    image_id: &str,
    code: &str,
    case: &str,
) -> Value {
    let r = lease_on(app, runner, image_id).await;
    let body = problem(r, StatusCode::CONFLICT).await;
    assert_eq!(body["code"], code, "{case}: {body}");
    body
}

// ---------------------------------------------------------------------------------------------
// A real registry
// ---------------------------------------------------------------------------------------------

/// The whole roll: the pool resolves `ci/runner:stable` to image A and leases to a runner on
/// A; B is pushed to the same tag; after `resolve` the pool expects B, a runner on A still
/// leases inside the grace (and is told to recycle) and is refused with `image_drift` after
/// it, a runner on B leases. With two of three live runners on A the roll is stalled.
async fn a_pool_follows_its_tag_through_a_roll(engine: Engine) {
    if !tools().await {
        return;
    }
    let registry = TestRegistry::start().await;
    let Some(app) = app_for(engine, &[registry.host()]).await else {
        return;
    };
    let image_ref = registry.image_ref("ci/runner:stable");
    let a = LocalImage::build("image A", None).await;
    a.push(&image_ref).await;

    // Before the first resolution, the pool has nothing to gate on.
    put_registry_pool(&app, "roll", &image_ref, 6).await;
    // The background resolver resolves a new registry pool at once.
    let pool = wait_for_pool(&app, "roll", "first resolution", |p| {
        p["resolver_status"] == "ok"
    })
    .await;
    assert!(has(&pool, "expected_image_ids", &a.id), "{pool}");
    assert_eq!(
        set(&pool, "expected_image_ids").len(),
        2,
        "manifest and config: {pool}"
    );
    assert_eq!(pool["resolved_image_id"], a.id.as_str());
    assert_eq!(pool["last_resolution"]["ok"], true);
    assert_eq!(pool["resolution_failures"], 0);
    assert!(set(&pool, "previous_image_ids").is_empty());

    let on_a = app.register("roll", "on-a").await;
    let on_a_too = app.register("roll", "on-a-too").await;
    let on_b = app.register("roll", "on-b").await;
    leased(&app, &on_a, &a.id, "a runner on A before the push").await;

    // The tag moves.
    let b = LocalImage::build("image B", None).await;
    b.push(&image_ref).await;
    let pool = resolve_ok(&app, "roll").await;
    assert!(has(&pool, "expected_image_ids", &b.id), "{pool}");
    assert!(!has(&pool, "expected_image_ids", &a.id), "{pool}");
    assert!(has(&pool, "previous_image_ids", &a.id), "{pool}");
    assert!(pool["previous_valid_until"].is_string(), "{pool}");
    assert_eq!(pool["resolved_image_id"], b.id.as_str());

    // Inside the grace: A still leases, but is told to recycle.
    leased(&app, &on_a, &a.id, "a runner on A inside the grace").await;
    leased(
        &app,
        &on_a_too,
        &a.id,
        "another runner on A inside the grace",
    )
    .await;
    let hb: Value = app
        .heartbeat(&on_a.attest(json!({"image": {"id": a.id}})))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(hb["image_current"], false, "{hb}");
    assert_eq!(hb["action"], "recycle", "{hb}");
    leased(&app, &on_b, &b.id, "a runner on B").await;

    // Two of the three live runners are on A: refused once the grace is over.
    let pool = get_pool(&app, "roll").await;
    assert_eq!(pool["roll_stalled"], true, "{pool}");

    sleep_past(&pool["previous_valid_until"]).await;
    let body = refused(
        &app,
        &on_a,
        &a.id,
        "image_drift",
        "a runner on A after the grace",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains(&b.id), "{body}");
    leased(&app, &on_b, &b.id, "a runner on B after the grace").await;

    let drift: Value = app
        .admin_get("/api/v1/admin/drift")
        .await
        .json()
        .await
        .unwrap();
    let drifted: Vec<&str> = drift["drifted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["runner_id"].as_str().unwrap())
        .collect();
    assert!(
        drifted.contains(&on_a.id.as_str()) && !drifted.contains(&on_b.id.as_str()),
        "{drift}"
    );
    assert_eq!(
        drift["pools"],
        json!([{"pool": "roll", "roll_stalled": true, "drifted": 2, "live": 3}]),
        "{drift}"
    );
    assert!(drift["skipped"].is_array());

    // The fleet catches up: the roll is no longer stalled.
    app.heartbeat(&on_a.attest(json!({"image": {"id": b.id}})))
        .await;
    app.heartbeat(&on_a_too.attest(json!({"image": {"id": b.id}})))
        .await;
    let pool = get_pool(&app, "roll").await;
    assert_eq!(pool["roll_stalled"], false, "{pool}");
    assert_eq!(pool["runners_by_status"]["healthy"], 3, "{pool}");
}

/// The registry goes away: the accepted set does not change, `resolve` answers 502
/// `pool_resolution_failed`, the pool shows each failure, and after three it is
/// `resolver_failing` while it still leases on its last known good set. An unknown tag fails
/// the same way and leaves a never-resolved pool unresolved. The registry comes back: one
/// success clears the count.
async fn a_registry_outage_keeps_the_last_known_good_set(engine: Engine) {
    if !tools().await {
        return;
    }
    let mut registry = TestRegistry::start().await;
    let Some(app) = app_for(engine, &[registry.host()]).await else {
        return;
    };
    let image_ref = registry.image_ref("ci/runner:stable");
    let a = LocalImage::build("image A", None).await;
    a.push(&image_ref).await;
    put_registry_pool(&app, "lkg", &image_ref, 900).await;
    let good = wait_for_pool(&app, "lkg", "first resolution", |p| {
        p["resolver_status"] == "ok"
    })
    .await;
    assert!(has(&good, "expected_image_ids", &a.id));
    let runner = app.register("lkg", "r1").await;
    leased(&app, &runner, &a.id, "before the outage").await;

    // An unknown tag: never resolved, nothing to gate on, the registry's reason recorded.
    put_registry_pool(&app, "typo", &registry.image_ref("ci/runner:nosuch"), 900).await;
    let typo = wait_for_pool(&app, "typo", "a failed resolution", |p| {
        p["last_resolution"]["ok"] == false
    })
    .await;
    assert_eq!(typo["resolver_status"], "never_resolved", "{typo}");
    assert!(set(&typo, "expected_image_ids").is_empty());
    let error = typo["last_resolution"]["error"].as_str().unwrap();
    assert!(
        error.contains("not found") && error.contains("MANIFEST_UNKNOWN"),
        "{error}"
    );
    let body = problem(resolve(&app, "typo").await, StatusCode::BAD_GATEWAY).await;
    assert_eq!(body["code"], "pool_resolution_failed");
    let stranded = app.register("typo", "r2").await;
    refused(
        &app,
        &stranded,
        &a.id,
        "pool_image_unresolved",
        "an unresolved registry pool",
    )
    .await;

    registry.kill().await;
    for n in 1..=3 {
        let body = problem(resolve(&app, "lkg").await, StatusCode::BAD_GATEWAY).await;
        assert_eq!(body["code"], "pool_resolution_failed", "{body}");
        assert!(
            body["detail"].as_str().unwrap().contains("cannot reach"),
            "{body}"
        );
        let pool = get_pool(&app, "lkg").await;
        assert_eq!(
            pool["expected_image_ids"], good["expected_image_ids"],
            "{pool}"
        );
        assert_eq!(
            pool["previous_image_ids"], good["previous_image_ids"],
            "{pool}"
        );
        assert_eq!(
            pool["previous_valid_until"], good["previous_valid_until"],
            "{pool}"
        );
        assert_eq!(pool["last_resolution"]["ok"], false, "{pool}");
        assert!(pool["last_resolution"]["at"].is_string(), "{pool}");
        assert!(
            pool["last_resolution"]["error"]
                .as_str()
                .unwrap()
                .contains("cannot reach"),
            "{pool}"
        );
        assert_eq!(pool["resolution_failures"], n, "{pool}");
        let status = if n < 3 { "ok" } else { "resolver_failing" };
        assert_eq!(pool["resolver_status"], status, "{pool}");
    }
    leased(
        &app,
        &runner,
        &a.id,
        "during the outage, on the last known good set",
    )
    .await;
    let listed: Value = app
        .admin_get("/api/v1/admin/pools")
        .await
        .json()
        .await
        .unwrap();
    let lkg = listed["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "lkg")
        .unwrap();
    assert_eq!(lkg["resolver_status"], "resolver_failing");

    registry.restart().await;
    let pool = resolve_ok(&app, "lkg").await;
    assert_eq!(pool["resolution_failures"], 0, "{pool}");
    assert_eq!(pool["resolver_status"], "ok", "{pool}");
    assert_eq!(pool["last_resolution"]["ok"], true, "{pool}");
    assert_eq!(
        pool["expected_image_ids"], good["expected_image_ids"],
        "{pool}"
    );
}

/// A pool of several images, one of them resolved from the registry (`image_source:
/// registry` on the entry) and one named by its operator: the entry resolves at once, a runner
/// on it is healthy; the tag moves and, after `resolve`, the runner still on the old image is
/// told to recycle naming the ref and its new set, counted in the roll (stalled), and refused
/// `image_drift` naming the ref and its label after the entry's grace. An entry whose tag does
/// not exist is `pool_image_unresolved`, naming it. The registry goes away: `resolve` is a 502
/// naming the entry, which keeps its set and counts the failure.
async fn an_images_entry_follows_its_tag_as_a_pool_does(engine: Engine) {
    if !tools().await {
        return;
    }
    let mut registry = TestRegistry::start().await;
    let Some(app) = app_for(engine, &[registry.host()]).await else {
        return;
    };
    let node = registry.image_ref("ci/node:20");
    let a = LocalImage::build("node image A", None).await;
    a.push(&node).await;
    let r = app
        .admin_put(
            "/api/v1/admin/pools/docker",
            json!({"images": [
                {"ref": node, "image_source": "registry", "drift_grace_s": 6},
                {"ref": "postgres:16", "expected_image_ids": [IMAGE_B]},
            ]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let pool = wait_for_pool(&app, "docker", "the entry's first resolution", |p| {
        p["images"][0]["last_resolution"]["ok"] == true
    })
    .await;
    let entry = &pool["images"][0];
    assert_eq!(entry["image_source"], "registry", "{pool}");
    assert!(has(entry, "expected_image_ids", &a.id), "{pool}");
    assert_eq!(entry["resolved_image_id"], a.id.as_str(), "{pool}");
    assert_eq!(entry["resolution_failures"], 0, "{pool}");
    assert_eq!(pool["images"][1]["image_source"], "manual", "{pool}");
    assert_eq!(
        pool["resolver_status"],
        Value::Null,
        "a manual pool: {pool}"
    );
    // A patch keeps the entry's resolved set as the registry's, as it does a pool's own.
    let r = app
        .admin_patch(
            "/api/v1/admin/pools/docker",
            json!({"undescribed_images": "ignore"}),
        )
        .await;
    let patched: Value = r.json().await.unwrap();
    assert_eq!(
        patched["images"][0]["image_source"], "registry",
        "{patched}"
    );
    for field in ["expected_image_ids", "resolved_digest", "last_resolution"] {
        assert_eq!(
            patched["images"][0][field], entry[field],
            "{field}: {patched}"
        );
    }

    let runner = app.register("docker", "build-01").await;
    let on = |node_id: &str| {
        json!({"images": [
            {"ref": node, "id": node_id, "labels": ["ubuntu-latest"]},
            {"ref": "postgres:16", "id": IMAGE_B},
        ]})
    };
    let hb: Value = app
        .heartbeat(&runner.attest(on(&a.id)))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (hb["status"].as_str(), hb["image_current"].as_bool()),
        (Some("healthy"), Some(true)),
        "{hb}"
    );

    // The tag moves: the entry rolls with its own grace.
    let b = LocalImage::build("node image B", None).await;
    b.push(&node).await;
    let pool = resolve_ok(&app, "docker").await;
    let entry = &pool["images"][0];
    assert!(has(entry, "expected_image_ids", &b.id), "{pool}");
    assert!(has(entry, "previous_image_ids", &a.id), "{pool}");
    let hb: Value = app
        .heartbeat(&runner.attest(on(&a.id)))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (hb["status"].as_str(), hb["action"].as_str()),
        (Some("healthy"), Some("recycle")),
        "{hb}"
    );
    assert_eq!(hb["pull"], json!([node]), "{hb}");
    assert_eq!(hb["expected_images"][0]["ref"], node.as_str(), "{hb}");
    assert!(
        has(&hb["expected_images"][0], "expected_image_ids", &b.id),
        "{hb}"
    );
    let drift: Value = app
        .admin_get("/api/v1/admin/drift")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(drift["drifted"][0]["images"], json!([node]), "{drift}");
    assert_eq!(
        drift["pools"],
        json!([{"pool": "docker", "roll_stalled": true, "drifted": 1, "live": 1}]),
        "{drift}"
    );

    sleep_past(&entry["previous_valid_until"]).await;
    app.enqueue("docker").await;
    let body = problem(
        app.lease(&runner.attest(on(&a.id))).await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_eq!(body["code"], "image_drift", "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!("image {node} (label ubuntu-latest) runs {}", a.id))
            && detail.contains(&b.id),
        "{detail}"
    );
    let r = app.lease(&runner.attest(on(&b.id))).await;
    assert_eq!(r.status(), StatusCode::OK, "on the new image");

    // A tag that does not exist: nothing to judge that image with.
    let nosuch = registry.image_ref("ci/node:nosuch");
    let r = app
        .admin_put(
            "/api/v1/admin/pools/typo",
            json!({"images": [{"ref": nosuch, "image_source": "registry"}]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    wait_for_pool(&app, "typo", "a failed resolution", |p| {
        p["images"][0]["last_resolution"]["ok"] == false
    })
    .await;
    let stranded = app.register("typo", "r2").await;
    app.enqueue("typo").await;
    let attest = stranded.attest(json!({"images": [{"ref": nosuch, "id": a.id}]}));
    let body = problem(app.lease(&attest).await, StatusCode::CONFLICT).await;
    assert_eq!(body["code"], "pool_image_unresolved", "{body}");
    assert!(body["detail"].as_str().unwrap().contains(&nosuch), "{body}");

    // The registry goes away: the entry keeps its set and counts the failure.
    let good = get_pool(&app, "docker").await;
    registry.kill().await;
    let body = problem(resolve(&app, "docker").await, StatusCode::BAD_GATEWAY).await;
    assert_eq!(body["code"], "pool_resolution_failed", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("image {node}: ")),
        "{body}"
    );
    let pool = get_pool(&app, "docker").await;
    assert_eq!(
        pool["images"][0]["expected_image_ids"], good["images"][0]["expected_image_ids"],
        "{pool}"
    );
    assert_eq!(pool["images"][0]["resolution_failures"], 1, "{pool}");
    assert_eq!(pool["images"][0]["last_resolution"]["ok"], false, "{pool}");
}

/// Two pools on two references: each resolves to its own image, gates on its own set, and a
/// push to one reference moves only its pool (no global expected image).
async fn two_pools_resolve_independently(engine: Engine) {
    if !tools().await {
        return;
    }
    let registry = TestRegistry::start().await;
    let Some(app) = app_for(engine, &[registry.host()]).await else {
        return;
    };
    let (runner_ref, other_ref) = (
        registry.image_ref("ci/runner:stable"),
        registry.image_ref("ci/other:stable"),
    );
    let a = LocalImage::build("runner image", None).await;
    let b = LocalImage::build("other image", None).await;
    a.push(&runner_ref).await;
    b.push(&other_ref).await;
    put_registry_pool(&app, "p1", &runner_ref, 900).await;
    put_registry_pool(&app, "p2", &other_ref, 900).await;
    let p1 = wait_for_pool(&app, "p1", "resolution", |p| p["resolver_status"] == "ok").await;
    let p2 = wait_for_pool(&app, "p2", "resolution", |p| p["resolver_status"] == "ok").await;
    assert!(has(&p1, "expected_image_ids", &a.id) && !has(&p1, "expected_image_ids", &b.id));
    assert!(has(&p2, "expected_image_ids", &b.id) && !has(&p2, "expected_image_ids", &a.id));

    let r1 = app.register("p1", "r1").await;
    let r2 = app.register("p2", "r2").await;
    leased(&app, &r1, &a.id, "p1 on its image").await;
    refused(&app, &r2, &a.id, "image_drift", "p2 on p1's image").await;
    leased(&app, &r2, &b.id, "p2 on its image").await;

    let c = LocalImage::build("other image, next", None).await;
    c.push(&other_ref).await;
    let p1_after = resolve_ok(&app, "p1").await;
    let p2_after = resolve_ok(&app, "p2").await;
    assert_eq!(p1_after["expected_image_ids"], p1["expected_image_ids"]);
    assert!(
        set(&p1_after, "previous_image_ids").is_empty(),
        "{p1_after}"
    );
    assert!(has(&p2_after, "expected_image_ids", &c.id), "{p2_after}");
    assert!(has(&p2_after, "previous_image_ids", &b.id), "{p2_after}");
}

/// An image index with two platforms: the pool accepts the index digest and both platforms'
/// manifest and config digests (runners of both architectures lease), and the service's
/// platform decides which config is the pool's image ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_resolves_every_platform_and_names_the_service_platform() {
    if !tools().await {
        return;
    }
    let registry = TestRegistry::start().await;
    let image_ref = registry.image_ref("ci/multi:stable");
    let amd = LocalImage::build("amd64 image", Some("linux/amd64")).await;
    let arm = LocalImage::build("arm64 image", Some("linux/arm64")).await;
    let index = LocalIndex::create(&[&amd, &arm]).await;
    index.push(&image_ref).await;

    let app = spawn_app_with(|args| {
        args.insecure_registries = vec![registry.host()];
        args.registry_resolver = true;
    })
    .await;
    put_registry_pool(&app, "multi", &image_ref, 900).await;
    let pool = wait_for_pool(&app, "multi", "resolution", |p| {
        p["resolver_status"] == "ok"
    })
    .await;
    let expected = set(&pool, "expected_image_ids");
    assert_eq!(
        expected.len(),
        5,
        "index, two manifests, two configs: {pool}"
    );
    assert!(has(&pool, "expected_image_ids", &amd.id) && has(&pool, "expected_image_ids", &arm.id));
    let index_digest = pool["resolved_digest"].as_str().unwrap().to_string();
    assert!(expected.contains(&index_digest));
    assert_eq!(pool["resolved_image_id"], amd.id.as_str(), "{pool}");

    let amd_runner = app.register("multi", "amd").await;
    let arm_runner = app.register("multi", "arm").await;
    leased(&app, &amd_runner, &amd.id, "an amd64 runner").await;
    leased(&app, &arm_runner, &arm.id, "an arm64 runner").await;

    let arm_app = spawn_app_with(|args| {
        args.insecure_registries = vec![registry.host()];
        args.registry_platform = "linux/arm64".into();
    })
    .await;
    put_registry_pool(&arm_app, "multi", &image_ref, 900).await;
    let pool = resolve_ok(&arm_app, "multi").await;
    assert_eq!(pool["resolved_image_id"], arm.id.as_str(), "{pool}");
    assert_eq!(pool["resolved_digest"], index_digest.as_str());
    assert_eq!(set(&pool, "expected_image_ids"), expected);
}

/// The registry notifies pushes: a push of the pool's tag resolves it without waiting for its
/// interval; the endpoint answers 202 with the pools it resolves, whatever the content type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_notification_resolves_the_pools_of_that_tag() {
    if !tools().await {
        return;
    }
    let port = free_port();
    let host = format!("127.0.0.1:{port}");
    let app = spawn_app_with(|args| {
        args.insecure_registries = vec![host.clone()];
        args.registry_resolver = true;
    })
    .await;
    let registry = TestRegistry::start_on(
        port,
        Some(Notify {
            url: app.url("/api/v1/admin/registry-events"),
            bearer: ADMIN.into(),
        }),
    )
    .await;
    let image_ref = registry.image_ref("ci/runner:stable");
    let a = LocalImage::build("image A", None).await;
    a.push(&image_ref).await;
    let r = app
        .admin_put(
            "/api/v1/admin/pools/notified",
            json!({"image_ref": image_ref, "image_source": "registry", "resolve_interval_s": 86400}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    wait_for_pool(&app, "notified", "first resolution", |p| {
        has(p, "expected_image_ids", &a.id)
    })
    .await;
    // A pool one of whose images follows another tag is notified of that tag's pushes too.
    let node = registry.image_ref("ci/node:20");
    a.push(&node).await;
    let r = app
        .admin_put(
            "/api/v1/admin/pools/entries",
            json!({"images": [{"ref": node, "image_source": "registry"}], "resolve_interval_s": 86400}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    wait_for_pool(&app, "entries", "the entry's first resolution", |p| {
        has(&p["images"][0], "expected_image_ids", &a.id)
    })
    .await;

    let b = LocalImage::build("image B", None).await;
    b.push(&image_ref).await;
    let pool = wait_for_pool(
        &app,
        "notified",
        "resolution on the push notification",
        |p| has(p, "expected_image_ids", &b.id),
    )
    .await;
    assert!(has(&pool, "previous_image_ids", &a.id), "{pool}");
    b.push(&node).await;
    let pool = wait_for_pool(
        &app,
        "entries",
        "the entry's resolution on the push notification",
        |p| has(&p["images"][0], "expected_image_ids", &b.id),
    )
    .await;
    assert!(
        has(&pool["images"][0], "previous_image_ids", &a.id),
        "{pool}"
    );

    // The envelope by hand: only a push of the pool's repository and tag names it.
    let envelope = |repository: &str, tag: &str| {
        json!({"events": [{"id": "e1", "action": "push", "target": {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "repository": repository, "tag": tag,
            "digest": "sha256:0fe3c799a0f15af08aae8de219301ea0d02ec887bd9ff650cda30239a4aa6982"},
            "request": {"host": host, "method": "PUT"}}]})
        .to_string()
    };
    let post = |body: String, token: &'static str| {
        app.client
            .post(app.url("/api/v1/admin/registry-events"))
            .bearer_auth(token)
            .header(
                "content-type",
                "application/vnd.docker.distribution.events.v1+json",
            )
            .body(body)
            .send()
    };
    let r = post(envelope("ci/runner", "stable"), ADMIN).await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"pools": ["notified"]})
    );
    let r = post(envelope("ci/node", "20"), ADMIN).await.unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"pools": ["entries"]})
    );
    let r = post(envelope("ci/runner", "other"), ADMIN).await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"pools": []}));
    let r = post(envelope("ci/other", "stable"), ADMIN).await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"pools": []}));
    let r = post(envelope("ci/runner", "stable"), FORGE).await.unwrap();
    assert_eq!(problem(r, StatusCode::FORBIDDEN).await["code"], "forbidden");
    let r = post("not json".into(), ADMIN).await.unwrap();
    assert_eq!(
        problem(r, StatusCode::BAD_REQUEST).await["code"],
        "bad_request"
    );
}

// ---------------------------------------------------------------------------------------------
// Authentication, against a registry of the test's own
// ---------------------------------------------------------------------------------------------

/// The bearer-token challenge: 401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…`,
/// a token fetched from the realm with the auth file's basic credentials, the manifest served
/// with the token. The token is kept: a second resolution fetches none. Wrong or missing
/// credentials fail the resolution without naming the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_token_challenge_with_an_auth_file() {
    let fake = FakeRegistry::start(FakeAuth::Bearer).await;
    let dir = tempfile::tempdir().unwrap();
    let auth_file = fake.auth_file(dir.path(), PASSWORD);
    let app = spawn_app_with(|args| {
        args.insecure_registries = vec![fake.host()];
        args.registry_auth_file = Some(auth_file.clone());
        args.registry_resolver = true;
    })
    .await;
    put_registry_pool(&app, "private", &fake.image_ref(), 900).await;
    let pool = wait_for_pool(&app, "private", "resolution", |p| {
        p["resolver_status"] == "ok"
    })
    .await;
    let mut expected = vec![fake.manifest_digest(), CONFIG_DIGEST.to_string()];
    expected.sort();
    assert_eq!(set(&pool, "expected_image_ids"), expected, "{pool}");
    assert_eq!(pool["resolved_digest"], fake.manifest_digest().as_str());
    assert_eq!(pool["resolved_image_id"], CONFIG_DIGEST);
    assert_eq!(fake.token_requests(), 1);

    // Again: the token is reused, and a HEAD that names the same digest is enough.
    let before = fake.manifest_requests();
    let pool = resolve_ok(&app, "private").await;
    assert_eq!(set(&pool, "expected_image_ids"), expected);
    assert_eq!(fake.token_requests(), 1, "the token was fetched again");
    assert_eq!(
        fake.manifest_requests(),
        before + 1,
        "one HEAD with the kept token"
    );

    // The registry fails: 502, and the set stays.
    fake.fail_with(Some(503));
    let body = problem(resolve(&app, "private").await, StatusCode::BAD_GATEWAY).await;
    assert!(body["detail"].as_str().unwrap().contains("503"), "{body}");
    assert_eq!(
        set(&get_pool(&app, "private").await, "expected_image_ids"),
        expected
    );
    fake.fail_with(None);
    resolve_ok(&app, "private").await;

    for (case, password) in [
        ("wrong password", Some("not-the-password")),
        ("no credentials", None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = password.map(|p| fake.auth_file(dir.path(), p));
        let other = spawn_app_with(|args| {
            args.insecure_registries = vec![fake.host()];
            args.registry_auth_file = file.clone();
        })
        .await;
        put_registry_pool(&other, "private", &fake.image_ref(), 900).await;
        let body = problem(resolve(&other, "private").await, StatusCode::BAD_GATEWAY).await;
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("refused access") && detail.contains("token realm"),
            "{case}: {detail}"
        );
        assert!(
            !detail.contains(PASSWORD) && !detail.contains(TOKEN),
            "{case}: {detail}"
        );
        let pool = get_pool(&other, "private").await;
        assert!(
            set(&pool, "expected_image_ids").is_empty(),
            "{case}: {pool}"
        );
        assert_eq!(pool["last_resolution"]["ok"], false, "{case}: {pool}");
    }
}

/// Basic authentication, with the auth JSON given directly (`LEASEGATE_REGISTRY_AUTH`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_authentication() {
    let fake = FakeRegistry::start(FakeAuth::Basic).await;
    let dir = tempfile::tempdir().unwrap();
    let auth_json = std::fs::read_to_string(fake.auth_file(dir.path(), PASSWORD)).unwrap();
    let app = spawn_app_with(|args| {
        args.insecure_registries = vec![fake.host()];
        args.registry_auth = Some(auth_json.clone());
    })
    .await;
    put_registry_pool(&app, "basic", &fake.image_ref(), 900).await;
    let pool = resolve_ok(&app, "basic").await;
    assert!(has(&pool, "expected_image_ids", CONFIG_DIGEST), "{pool}");
    assert_eq!(fake.token_requests(), 0);

    let anonymous = spawn_app_with(|args| args.insecure_registries = vec![fake.host()]).await;
    put_registry_pool(&anonymous, "basic", &fake.image_ref(), 900).await;
    let body = problem(resolve(&anonymous, "basic").await, StatusCode::BAD_GATEWAY).await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("basic credentials"),
        "{body}"
    );
}

/// A registry that is not listed as insecure is reached over TLS, and a plain-HTTP registry
/// then fails the resolution instead of being spoken to in the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registries_are_reached_over_tls_unless_listed() {
    let fake = FakeRegistry::start(FakeAuth::Basic).await;
    let app = spawn_app().await;
    put_registry_pool(&app, "tls", &fake.image_ref(), 900).await;
    let body = problem(resolve(&app, "tls").await, StatusCode::BAD_GATEWAY).await;
    assert!(
        body["detail"].as_str().unwrap().contains("cannot reach"),
        "{body}"
    );
    assert_eq!(fake.manifest_requests(), 0);
}

// ---------------------------------------------------------------------------------------------
// The API around it
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_answers_for_manual_unknown_and_malformed_pools() {
    let app = spawn_app().await;
    app.pool("manual", &[IMAGE_A]).await;
    let body = problem(resolve(&app, "manual").await, StatusCode::CONFLICT).await;
    assert_eq!(body["code"], "pool_not_registry");
    let body = problem(resolve(&app, "nosuch").await, StatusCode::NOT_FOUND).await;
    assert_eq!(body["code"], "not_found");
    let body = problem(resolve(&app, "Bad Name").await, StatusCode::BAD_REQUEST).await;
    assert_eq!(body["code"], "bad_request");
    let r = app
        .client
        .post(app.url("/api/v1/admin/pools/manual/resolve"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(r, StatusCode::UNAUTHORIZED).await["code"],
        "unauthorized"
    );

    // A registry pool's reference must parse.
    let r = app
        .admin_put(
            "/api/v1/admin/pools/bad-ref",
            json!({"image_ref": "ci/Runner:stable", "image_source": "registry"}),
        )
        .await;
    let body = problem(r, StatusCode::BAD_REQUEST).await;
    assert!(
        body["detail"].as_str().unwrap().starts_with("image_ref:"),
        "{body}"
    );

    // Manual pools have no resolver; the fields are there for every pool.
    let pool = get_pool(&app, "manual").await;
    assert_eq!(pool["resolver_status"], Value::Null);
    assert_eq!(pool["resolution_failures"], 0);
    assert_eq!(pool["roll_stalled"], false);
    let drift: Value = app
        .admin_get("/api/v1/admin/drift")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        drift["pools"],
        json!([{"pool": "manual", "roll_stalled": false, "drifted": 0, "live": 0}])
    );
}

/// Two PostgreSQL replicas with a due pool: exactly one of them resolves it (the due check and
/// the claim are one statement), so a fleet of replicas does not stampede the registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_do_not_stampede_the_registry() {
    let fake = FakeRegistry::start(FakeAuth::Basic).await;
    let dir = tempfile::tempdir().unwrap();
    let auth_file = fake.auth_file(dir.path(), PASSWORD);
    let host = fake.host();
    let adjust = |args: &mut leasegate::config::ServeArgs| {
        args.insecure_registries = vec![host.clone()];
        args.registry_auth_file = Some(auth_file.clone());
        args.registry_resolver = true;
    };
    let Some(first) = spawn_app_on_with(Engine::Postgres, adjust).await else {
        return;
    };
    let mut replicas = vec![];
    for _ in 0..2 {
        replicas.push(spawn_replica_with(&first, adjust).await);
    }
    put_registry_pool(&first, "shared", &fake.image_ref(), 900).await;
    wait_for_pool(&first, "shared", "resolution", |p| {
        p["resolver_status"] == "ok"
    })
    .await;
    // Give every replica a few ticks to (not) resolve it again.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    // One resolution: a 401, then the manifest with basic credentials.
    assert_eq!(fake.manifest_requests(), 2);
    drop(replicas);
}

/// The store's side of "no stampede", on both engines: the due check and the claim are one
/// statement, a claim holds until it expires or the outcome is recorded, and recording
/// schedules the next attempt.
mod claims {
    use super::*;
    use leasegate::domain::image_set::ResolutionOutcome;
    use leasegate::domain::pool_name::PoolName;
    use leasegate::domain::time::Millis;

    // Nothing listens on port 9 and the background resolver is off in these apps: the
    // reference is never contacted.
    const REF: &str = "127.0.0.1:9/ci/runner:stable";

    each_engine!(the_due_check_and_the_claim_are_one_statement);

    async fn the_due_check_and_the_claim_are_one_statement(engine: common::Engine) {
        let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
            return;
        };
        let store = app.state.store().clone();
        put_registry_pool(&app, "claimed", REF, 900).await;
        app.pool("manual", &[IMAGE_A]).await;
        let name = PoolName::parse("claimed").unwrap();
        let now = Millis::now();

        let first = store
            .claim_resolution(&name, now, now.plus_secs(60))
            .await
            .unwrap();
        assert_eq!(first.map(|p| p.name), Some(name.clone()));
        assert!(
            store
                .claim_resolution(&name, now, now.plus_secs(60))
                .await
                .unwrap()
                .is_none()
        );
        let manual = PoolName::parse("manual").unwrap();
        assert!(
            store
                .claim_resolution(&manual, now, now.plus_secs(60))
                .await
                .unwrap()
                .is_none()
        );
        let unknown = PoolName::parse("nosuch").unwrap();
        assert!(
            store
                .claim_resolution(&unknown, now, now.plus_secs(60))
                .await
                .unwrap()
                .is_none()
        );

        // Eight replicas' worth of claims at once on a due pool: exactly one wins.
        put_registry_pool(&app, "raced", REF, 900).await;
        let raced = PoolName::parse("raced").unwrap();
        let at = Millis::now();
        let mut claims = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let (store, raced) = (store.clone(), raced.clone());
            claims.spawn(async move {
                store
                    .claim_resolution(&raced, at, at.plus_secs(60))
                    .await
                    .unwrap()
                    .is_some()
            });
        }
        let won = claims.join_all().await.into_iter().filter(|w| *w).count();
        assert_eq!(won, 1);

        // A claim left by a replica that died expires.
        let later = now.plus_secs(61);
        assert!(
            store
                .claim_resolution(&name, later, later.plus_secs(60))
                .await
                .unwrap()
                .is_some()
        );

        // Recording releases the claim and schedules the next attempt.
        let failed = ResolutionOutcome::Failed {
            error: "registry unreachable".into(),
        };
        let pool = store
            .record_resolution(&name, REF, &failed, later)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pool.resolution_failures, 1);
        assert_eq!(pool.next_resolve_at, Some(later.plus_secs(300)));
        assert!(pool.expected_image_ids.is_empty());
        let stored = store.get_pool(&name).await.unwrap().unwrap();
        assert_eq!(stored, pool);
        assert!(
            store
                .claim_resolution(&name, later.plus_secs(1), later.plus_secs(60))
                .await
                .unwrap()
                .is_none()
        );
        let due = later.plus_secs(300);
        assert!(
            store
                .claim_resolution(&name, due, due.plus_secs(60))
                .await
                .unwrap()
                .is_some()
        );
        // An outcome for a reference the pool no longer has is dropped (and the claim freed).
        assert!(
            store
                .record_resolution(&name, "127.0.0.1:9/ci/other:stable", &failed, due)
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            store
                .get_pool(&name)
                .await
                .unwrap()
                .unwrap()
                .resolution_failures,
            1
        );
    }
}

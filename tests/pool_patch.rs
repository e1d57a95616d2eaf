//! `PATCH /api/v1/admin/pools/{name}`: a JSON merge patch of the pool's `PUT` body. It keeps
//! what it does not name, `null` returns a field to its default, the patched body is read
//! exactly as a `PUT` body (the same answers), it is audited, and concurrent patches of
//! different fields lose none of them.

use crate::common;

use common::oci::*;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const POOL: &str = "/api/v1/admin/pools/linux";

/// The fields a patch may leave alone: everything of the view but its counters and times.
fn kept(view: &Value) -> Value {
    let mut v = view.clone();
    for volatile in [
        "updated_at",
        "runners_by_status",
        "queued_jobs",
        "oldest_queued_at",
        "roll_stalled",
    ] {
        v.as_object_mut().unwrap().remove(volatile);
    }
    v
}

async fn get(app: &TestApp, path: &str) -> Value {
    let r = app.admin_get(path).await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

async fn patched(app: &TestApp, patch: Value) -> Value {
    let r = app.admin_patch(POOL, patch.clone()).await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "PATCH {patch}: {body}");
    body
}

each_engine!(
    a_patch_keeps_what_it_does_not_name,
    null_returns_a_field_to_its_default_and_a_new_set_rolls_as_a_put_does,
    the_patched_body_gets_the_answers_a_put_gets,
    a_patch_is_audited,
    concurrent_patches_of_different_fields_lose_none,
);

async fn a_patch_keeps_what_it_does_not_name(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let full = json!({
        "image_ref": "registry.example/ci/runner:1",
        "expected_image_ids": [IMAGE_A],
        "image_policy": "report",
        "gate_mode": "enforce",
        "drift_grace_s": 60,
        "resolve_interval_s": 600,
    });
    assert_eq!(
        app.admin_put(POOL, full).await.status(),
        StatusCode::CREATED
    );
    let before = get(&app, POOL).await;

    // FORGES.md's step: the gate mode alone.
    let after = patched(&app, json!({"gate_mode": "observe"})).await;
    assert_eq!(after["gate_mode"], "observe");
    let mut expected = kept(&before);
    expected["gate_mode"] = json!("observe");
    assert_eq!(kept(&after), expected);
    assert_eq!(kept(&get(&app, POOL).await), expected, "as stored");

    // Plain JSON is a merge patch too.
    let r = app
        .client
        .patch(app.url(POOL))
        .bearer_auth(ADMIN)
        .json(&json!({"gate_mode": "enforce"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(kept(&get(&app, POOL).await), kept(&before));
}

async fn null_returns_a_field_to_its_default_and_a_new_set_rolls_as_a_put_does(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let r = app
        .admin_put(
            POOL,
            json!({"image_ref": "registry.example/ci/runner:1", "expected_image_ids": [IMAGE_A],
                   "drift_grace_s": 60, "image_policy": "report"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let after = patched(
        &app,
        json!({"drift_grace_s": null, "image_ref": null, "image_policy": null}),
    )
    .await;
    assert_eq!(after["drift_grace_s"], 900);
    assert_eq!(after["image_ref"], Value::Null);
    assert_eq!(after["image_policy"], "enforce");
    assert_eq!(after["expected_image_ids"], json!([IMAGE_A]));

    // A new set: the one it replaces stays accepted for the grace, as after a PUT.
    let after = patched(
        &app,
        json!({"expected_image_ids": [IMAGE_B], "drift_grace_s": 120}),
    )
    .await;
    assert_eq!(after["expected_image_ids"], json!([IMAGE_B]));
    assert_eq!(after["previous_image_ids"], json!([IMAGE_A]));
    assert!(after["previous_valid_until"].is_string(), "{after}");
    // The same set again changes neither the sets nor the grace.
    let again = patched(&app, json!({"expected_image_ids": [IMAGE_B]})).await;
    assert_eq!(again["previous_valid_until"], after["previous_valid_until"]);
}

async fn the_patched_body_gets_the_answers_a_put_gets(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    assert_eq!(
        app.admin_put(POOL, json!({"expected_image_ids": [IMAGE_A]}))
            .await
            .status(),
        StatusCode::CREATED
    );
    let base = json!({"expected_image_ids": [IMAGE_A]});
    let cases = [
        (
            json!({"drift_grace_s": -1}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"drift_grace_s": 1.5}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"resolve_interval_s": 5}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"gate_mode": "loud"}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"expected_image_ids": ["sha256:nothex"]}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"image_source": "registry"}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"image_ref": "bad\u{7}ref"}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        // serde would read a struct from an array: a nested object is an object or nothing.
        (
            json!({"disk_warning": [null, null]}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"ejection": [3]}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"disk_warning": {"min_free_bytes": 9_223_372_036_854_775_808_u64}}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"github": ["orgs/acme", 1, ["linux"]]}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"github": "orgs/acme"}),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            json!({"expected_image_ids": []}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "pool_image_unresolved",
        ),
        (
            json!({"expected_image_ids": null}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "pool_image_unresolved",
        ),
    ];
    for (patch, status, code) in cases {
        let mut body = base.clone();
        merge(&mut body, &patch);
        if let Some(o) = body.as_object_mut() {
            o.retain(|_, v| !v.is_null());
        }
        let put = expect_problem(
            app.admin_put("/api/v1/admin/pools/other", body.clone())
                .await,
            &format!("PUT {body}"),
            status,
            code,
        )
        .await;
        let patch_answer = expect_problem(
            app.admin_patch(POOL, patch.clone()).await,
            &format!("PATCH {patch}"),
            status,
            code,
        )
        .await;
        // The same words, less where in the body (the patched body is not the one sent).
        let put_detail = put["detail"].as_str().unwrap();
        let put_detail = put_detail.split(" at line ").next().unwrap();
        assert_eq!(patch_answer["detail"], put_detail, "PATCH {patch}");
    }
    // Nothing of it was written.
    assert_eq!(
        get(&app, POOL).await["expected_image_ids"],
        json!([IMAGE_A])
    );

    // Not an object (a JSON Patch, say), as a PUT of one.
    for body in [
        "[]",
        "[{\"op\":\"replace\",\"path\":\"/gate_mode\",\"value\":\"observe\"}]",
        "\"x\"",
        "",
    ] {
        let r = app
            .client
            .patch(app.url(POOL))
            .bearer_auth(ADMIN)
            .header("content-type", "application/merge-patch+json")
            .body(body)
            .send()
            .await
            .unwrap();
        expect_problem(r, body, StatusCode::BAD_REQUEST, "bad_request").await;
    }
    expect_problem(
        app.admin_patch(
            "/api/v1/admin/pools/missing",
            json!({"gate_mode": "observe"}),
        )
        .await,
        "a missing pool",
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    // A PATCH never creates.
    let r = app.admin_get("/api/v1/admin/pools/missing").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    expect_problem(
        app.admin_patch("/api/v1/admin/pools/Bad%20Name", json!({}))
            .await,
        "a bad name",
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let r = app
        .client
        .patch(app.url(POOL))
        .bearer_auth(FORGE)
        .json(&json!({"gate_mode": "observe"}))
        .send()
        .await
        .unwrap();
    expect_problem(r, "the forge token", StatusCode::FORBIDDEN, "forbidden").await;
}

async fn a_patch_is_audited(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    assert_eq!(
        app.admin_put(POOL, json!({"expected_image_ids": [IMAGE_A]}))
            .await
            .status(),
        StatusCode::CREATED
    );
    patched(&app, json!({"gate_mode": "observe", "drift_grace_s": 30})).await;
    // A refused patch records nothing.
    let r = app.admin_patch(POOL, json!({"drift_grace_s": -1})).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let trail = get(&app, "/api/v1/admin/audit?target=linux").await;
    let entries = trail["entries"].as_array().unwrap();
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["pool_patch", "pool_put"]);
    let detail = entries[0]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("patched drift_grace_s, gate_mode; "),
        "{detail}"
    );
    assert!(detail.contains("gate_mode observe"), "{detail}");
    assert_eq!(entries[0]["actor"], "bootstrap");
    assert_eq!(entries[0]["target_kind"], "pool");
}

async fn concurrent_patches_of_different_fields_lose_none(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    for round in 0..10 {
        let r = app
            .admin_put(POOL, json!({"expected_image_ids": [IMAGE_A]}))
            .await;
        assert!(r.status().is_success());
        let patches = [
            json!({"gate_mode": "observe"}),
            json!({"drift_grace_s": 120 + round}),
            json!({"image_policy": "report"}),
            json!({"resolve_interval_s": 600 + round}),
            json!({"image_ref": format!("registry.example/ci/runner:{round}")}),
            json!({"expected_image_ids": [IMAGE_A, IMAGE_B]}),
        ];
        let tasks: Vec<_> = patches
            .into_iter()
            .map(|patch| {
                let (client, url) = (app.client.clone(), app.url(POOL));
                tokio::spawn(async move {
                    client
                        .patch(url)
                        .bearer_auth(ADMIN)
                        .json(&patch)
                        .send()
                        .await
                        .unwrap()
                        .status()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), StatusCode::OK);
        }
        let pool = get(&app, POOL).await;
        assert_eq!(pool["gate_mode"], "observe", "round {round}: {pool}");
        assert_eq!(pool["drift_grace_s"], 120 + round, "round {round}: {pool}");
        assert_eq!(pool["image_policy"], "report", "round {round}: {pool}");
        assert_eq!(
            pool["resolve_interval_s"],
            600 + round,
            "round {round}: {pool}"
        );
        assert_eq!(
            pool["image_ref"],
            format!("registry.example/ci/runner:{round}"),
            "round {round}: {pool}"
        );
        assert_eq!(
            pool["expected_image_ids"],
            json!([IMAGE_A, IMAGE_B]),
            "round {round}: {pool}"
        );
    }
}

/// A registry pool's set is the registry's: a patch keeps it, and what it resolved to, as it
/// was (a `PUT` naming the set would make it the operator's until the next resolution).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_of_a_registry_pool_keeps_its_resolved_set() {
    let fake = FakeRegistry::start(FakeAuth::Basic).await;
    let dir = tempfile::tempdir().unwrap();
    let auth_json = std::fs::read_to_string(fake.auth_file(dir.path(), PASSWORD)).unwrap();
    let app = spawn_app_with(|args| {
        args.insecure_registries = vec![fake.host()];
        args.registry_auth = Some(auth_json.clone());
    })
    .await;
    let r = app
        .admin_put(
            POOL,
            json!({"image_ref": fake.image_ref(), "image_source": "registry"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = app.admin_post(&format!("{POOL}/resolve"), json!({})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let resolved = get(&app, POOL).await;
    assert!(resolved["resolved_digest"].is_string(), "{resolved}");
    let ids = resolved["expected_image_ids"].as_array().unwrap();
    assert!(ids.iter().any(|id| id == CONFIG_DIGEST), "{resolved}");

    let after = patched(&app, json!({"gate_mode": "observe"})).await;
    let mut expected = kept(&resolved);
    expected["gate_mode"] = json!("observe");
    assert_eq!(kept(&after), expected);
    assert_eq!(after["resolved_digest"], resolved["resolved_digest"]);
}

//! `GET /openapi.json`: the document is OpenAPI 3.x, it lists exactly the router's routes
//! (and each of them is routed), every `$ref` resolves, and real answers of a running service
//! validate against the schemas the document gives for them.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// Every route of the router (`src/http/mod.rs` and the party routers it merges), as
/// (method, path template). Add a route there, add it here: the test then fails until the
/// document describes it.
const ROUTES: &[(&str, &str)] = &[
    // ops
    ("get", "/livez"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    // runners
    ("post", "/api/v1/runners"),
    ("post", "/api/v1/runners/heartbeat"),
    // lease
    ("post", "/api/v1/lease"),
    ("post", "/api/v1/leases/{id}/start"),
    ("post", "/api/v1/leases/{id}/extend"),
    ("post", "/api/v1/leases/{id}/complete"),
    ("post", "/api/v1/leases/{id}/abandon"),
    // github
    ("post", "/api/v1/github/runners"),
    // forge
    ("post", "/api/v1/jobs"),
    ("get", "/api/v1/jobs/{id}"),
    ("post", "/api/v1/jobs/{id}/cancel"),
    ("post", "/api/v1/gate/check"),
    // admin
    ("get", "/api/v1/admin/pools"),
    ("get", "/api/v1/admin/pools/{name}"),
    ("put", "/api/v1/admin/pools/{name}"),
    ("patch", "/api/v1/admin/pools/{name}"),
    ("delete", "/api/v1/admin/pools/{name}"),
    ("post", "/api/v1/admin/pools/{name}/registration-tokens"),
    ("post", "/api/v1/admin/pools/{name}/resolve"),
    ("get", "/api/v1/admin/runners"),
    ("get", "/api/v1/admin/runners/{id}"),
    ("post", "/api/v1/admin/runners/{id}/cordon"),
    ("post", "/api/v1/admin/runners/{id}/uncordon"),
    ("post", "/api/v1/admin/runners/{id}/reinstate"),
    ("post", "/api/v1/admin/runners/{id}/revoke"),
    ("put", "/api/v1/admin/runners/{id}/forge-runners"),
    ("get", "/api/v1/admin/drift"),
    // operators
    ("post", "/api/v1/admin/tokens"),
    ("get", "/api/v1/admin/tokens"),
    ("delete", "/api/v1/admin/tokens/{name}"),
    ("get", "/api/v1/admin/audit"),
    // registry_events
    ("post", "/api/v1/admin/registry-events"),
    // page
    ("get", "/admin"),
    ("get", "/admin/fleet"),
    ("get", "/admin/login"),
    ("post", "/admin/login"),
    ("post", "/admin/logout"),
    ("get", "/admin/runners/{id}"),
    ("post", "/admin/runners/{id}/{action}"),
    ("get", "/admin/jobs/{id}"),
    ("get", "/admin/assets/app.css"),
    ("get", "/admin/assets/app.js"),
];

/// The (method, path) of every `.route("path", get(..).post(..))` in the router's sources, so
/// that `ROUTES` cannot drift from them either.
fn routes_in_sources() -> BTreeSet<(String, String)> {
    // Every source file under `src/http/`, however deep: a router may be in any of them.
    let mut files = Vec::new();
    let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut routes = BTreeSet::new();
    for file in files {
        let source = std::fs::read_to_string(&file).unwrap();
        for (at, _) in source.match_indices(".route(") {
            let rest = source[at + ".route(".len()..].trim_start();
            let path = rest
                .strip_prefix('"')
                .and_then(|r| r.split('"').next())
                .unwrap_or_else(|| panic!("{}: a .route( without a literal path", file.display()));
            // The method routers: up to the `)` that closes `.route(`.
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map(|(i, _)| i)
                .unwrap();
            let call = &rest[..end];
            for method in ["get", "post", "put", "delete", "patch"] {
                let called = call.match_indices(&format!("{method}(")).any(|(i, _)| {
                    i == 0
                        || !call.as_bytes()[i - 1].is_ascii_alphanumeric()
                            && call.as_bytes()[i - 1] != b'_'
                });
                if called {
                    routes.insert((method.to_string(), path.to_string()));
                }
            }
        }
    }
    routes
}

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options"];

async fn document(app: &TestApp) -> Value {
    let r = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers().get("content-type").unwrap(),
        "application/json",
        "the document is JSON"
    );
    r.json().await.expect("the document parses as JSON")
}

/// The operations the document describes, as (method, path).
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(*m).is_some() {
                ops.insert((m.to_string(), path.clone()));
            }
        }
    }
    ops
}

#[tokio::test]
async fn the_document_is_openapi_3_and_lists_exactly_the_routes() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let version = doc["openapi"].as_str().expect("openapi version");
    assert!(version.starts_with("3."), "OpenAPI 3.x, got {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());

    let listed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(listed.len(), ROUTES.len(), "ROUTES has a duplicate");
    let routed = routes_in_sources();
    let unlisted: Vec<_> = routed.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&routed).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "ROUTES differs from the .route(..) calls in src/http: not listed {unlisted:?}, no such route {stale:?}"
    );
    let documented = documented(&doc);
    let missing: Vec<_> = listed.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "routes missing from /openapi.json: {missing:?}"
    );
    let extra: Vec<_> = documented.difference(&listed).collect();
    assert!(extra.is_empty(), "documented but not in ROUTES: {extra:?}");

    // Each operation has a tag, an answer, and (under /api/) its problems described.
    for (method, path) in &documented {
        let op = &doc["paths"][path][method];
        assert!(
            op["tags"].as_array().is_some_and(|t| !t.is_empty()),
            "{method} {path}: no tag"
        );
        let responses = op["responses"].as_object().expect("responses");
        assert!(
            responses
                .keys()
                .any(|s| s.starts_with('2') || s.starts_with('3')),
            "{method} {path}: no success answer"
        );
        if path.starts_with("/api/") {
            for status in ["400", "500", "503"] {
                let schema = &responses
                    .get(status)
                    .unwrap_or_else(|| panic!("{method} {path}: no {status}"))["content"]["application/problem+json"]
                    ["schema"];
                assert_eq!(
                    schema["$ref"], "#/components/schemas/Problem",
                    "{method} {path} {status}"
                );
            }
        }
        let authenticated = path.starts_with("/api/v1/admin/")
            || path.starts_with("/api/v1/jobs")
            || path.starts_with("/api/v1/gate/")
            || path.starts_with("/api/v1/leases/");
        if authenticated {
            assert!(
                op["security"].as_array().is_some_and(|s| !s.is_empty()),
                "{method} {path}: no security requirement"
            );
            assert!(responses.contains_key("401"), "{method} {path}: no 401");
        }
    }
    // Optional bodies are not required, and still describe the object.
    for path in [
        "/api/v1/leases/{id}/extend",
        "/api/v1/leases/{id}/abandon",
        "/api/v1/admin/pools/{name}/registration-tokens",
    ] {
        let body = &doc["paths"][path]["post"]["requestBody"];
        assert_ne!(body["required"], true, "{path}: the body is optional");
        let schema = &body["content"]["application/json"]["schema"];
        assert!(schema["$ref"].is_string(), "{path}: {schema}");
    }
    assert_eq!(
        doc["paths"]["/api/v1/leases/{id}/complete"]["post"]["requestBody"]["required"],
        true
    );
    for scheme in ["admin_token", "forge_token", "lease_token"] {
        assert_eq!(
            doc["components"]["securitySchemes"][scheme]["scheme"], "bearer",
            "{scheme}"
        );
    }
    assert_every_ref_resolves(&doc, &doc);
}

fn assert_every_ref_resolves(doc: &Value, v: &Value) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get("$ref") {
                let pointer = r.strip_prefix('#').expect("a local $ref");
                assert!(doc.pointer(pointer).is_some(), "dangling $ref {r}");
            }
            o.values().for_each(|c| assert_every_ref_resolves(doc, c));
        }
        Value::Array(a) => a.iter().for_each(|c| assert_every_ref_resolves(doc, c)),
        _ => {}
    }
}

/// Every documented route is routed: called without credentials or body, with placeholder
/// ids, none answers the fallback's `404 no such route` or `405`.
#[tokio::test]
async fn every_documented_route_is_routed() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (method, path) in documented(&doc) {
        let url = app.url(
            &path
                .replace("{id}", "placeholder-id")
                .replace("{name}", "placeholder")
                .replace("{action}", "cordon"),
        );
        let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let r = client.request(m, url).send().await.unwrap();
        let status = r.status();
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path} is not routed for that method"
        );
        if status == StatusCode::NOT_FOUND {
            let body: Value = r.json().await.unwrap_or(Value::Null);
            assert_ne!(
                body["detail"], "no such route",
                "{method} {path} is documented but not routed"
            );
        }
    }
    // And the fallback does answer that way, so the check above means something.
    let r = client
        .get(app.url("/api/v1/no-such-thing"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(r, StatusCode::NOT_FOUND).await["detail"],
        "no such route"
    );
}

/// Validates `body`, answered with `status` and `content_type` to `method path`, against the
/// schema the document gives for it (its `$ref`s resolved in the document's components).
fn check(doc: &Value, method: &str, path: &str, status: u16, content_type: &str, body: &Value) {
    let op = &doc["paths"][path][method];
    assert!(op.is_object(), "{method} {path} is not documented");
    let response = &op["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {path}: {status} is not documented"
    );
    let schema = &response["content"][content_type]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} {status}: no {content_type} schema"
    );
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": doc["components"],
        "allOf": [schema],
    });
    let validator = jsonschema::validator_for(&root)
        .unwrap_or_else(|e| panic!("{method} {path} {status}: the schema does not compile: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status}: the answer does not match the document: {errors:?}\n{body:#}"
    );
}

async fn json_of(r: reqwest::Response, status: StatusCode) -> (String, Value) {
    assert_eq!(r.status(), status);
    let ct = r
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    (ct, r.json().await.unwrap())
}

#[tokio::test]
async fn real_answers_match_the_documented_schemas() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let j = "application/json";
    let pj = "application/problem+json";

    let (_, pool) = json_of(
        app.admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A]}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    check(&doc, "put", "/api/v1/admin/pools/{name}", 201, j, &pool);
    let patch = json!({"drift_grace_s": 60, "image_ref": null});
    let (_, patched) = json_of(
        app.admin_patch("/api/v1/admin/pools/linux", patch.clone())
            .await,
        StatusCode::OK,
    )
    .await;
    check(
        &doc,
        "patch",
        "/api/v1/admin/pools/{name}",
        200,
        j,
        &patched,
    );
    // The patch itself is what the document says a patch is, in either media type.
    let body = &doc["paths"]["/api/v1/admin/pools/{name}"]["patch"]["requestBody"];
    for media in ["application/merge-patch+json", "application/json"] {
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": doc["components"],
            "allOf": [body["content"][media]["schema"]],
        });
        let validator = jsonschema::validator_for(&root).unwrap();
        assert!(validator.is_valid(&patch), "{media}: {patch}");
        assert!(
            !validator.is_valid(&json!({"gate_mode": "loud"})),
            "{media}"
        );
    }

    let (_, token) = json_of(
        app.admin_post("/api/v1/admin/pools/linux/registration-tokens", json!({}))
            .await,
        StatusCode::CREATED,
    )
    .await;
    check(
        &doc,
        "post",
        "/api/v1/admin/pools/{name}/registration-tokens",
        201,
        j,
        &token,
    );

    let runner = app.register("linux", "r1").await;
    let (_, hb) = json_of(app.heartbeat(&runner.healthy()).await, StatusCode::OK).await;
    check(&doc, "post", "/api/v1/runners/heartbeat", 200, j, &hb);

    let (_, enqueued) = json_of(
        app.forge_post(
            "/api/v1/jobs",
            json!({"pool": "linux", "payload": {"x": 1}}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    check(&doc, "post", "/api/v1/jobs", 201, j, &enqueued);

    let granted = app.grant(&runner).await;
    check(&doc, "post", "/api/v1/lease", 200, j, &granted.body);

    let (_, started) = json_of(app.call(&granted, "start", None).await, StatusCode::OK).await;
    check(&doc, "post", "/api/v1/leases/{id}/start", 200, j, &started);
    let (_, completed) = json_of(
        app.call(
            &granted,
            "complete",
            Some(json!({"outcome": "failed", "exit_code": 2, "message": "boom"})),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    check(
        &doc,
        "post",
        "/api/v1/leases/{id}/complete",
        200,
        j,
        &completed,
    );

    let (_, job) = json_of(
        app.forge_get(&format!("/api/v1/jobs/{}", granted.job_id))
            .await,
        StatusCode::OK,
    )
    .await;
    check(&doc, "get", "/api/v1/jobs/{id}", 200, j, &job);

    let (_, gate) = json_of(
        app.forge_post(
            "/api/v1/gate/check",
            json!({"attestation": runner.healthy()}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    check(&doc, "post", "/api/v1/gate/check", 200, j, &gate);

    // A refusal: 409 probe_failed, as problem+json.
    let r = app.lease(&runner.failing("crun not found")).await;
    let (ct, refused) = json_of(r, StatusCode::CONFLICT).await;
    assert_eq!(ct, pj);
    assert_eq!(refused["code"], "probe_failed");
    check(&doc, "post", "/api/v1/lease", 409, pj, &refused);

    // The runner now has attestations, a refusal, a lease and status changes.
    let (_, detail) = json_of(
        app.admin_get(&format!("/api/v1/admin/runners/{}", runner.id))
            .await,
        StatusCode::OK,
    )
    .await;
    assert!(!detail["leases"].as_array().unwrap().is_empty());
    check(&doc, "get", "/api/v1/admin/runners/{id}", 200, j, &detail);

    let (_, cordoned) = json_of(
        app.admin_post(
            &format!("/api/v1/admin/runners/{}/cordon", runner.id),
            json!({}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    check(
        &doc,
        "post",
        "/api/v1/admin/runners/{id}/cordon",
        200,
        j,
        &cordoned,
    );

    let (_, runners) = json_of(app.admin_get("/api/v1/admin/runners").await, StatusCode::OK).await;
    check(&doc, "get", "/api/v1/admin/runners", 200, j, &runners);

    let (_, pool) = json_of(
        app.admin_get("/api/v1/admin/pools/linux").await,
        StatusCode::OK,
    )
    .await;
    check(&doc, "get", "/api/v1/admin/pools/{name}", 200, j, &pool);

    let (_, pools) = json_of(app.admin_get("/api/v1/admin/pools").await, StatusCode::OK).await;
    check(&doc, "get", "/api/v1/admin/pools", 200, j, &pools);

    let (_, drift) = json_of(app.admin_get("/api/v1/admin/drift").await, StatusCode::OK).await;
    check(&doc, "get", "/api/v1/admin/drift", 200, j, &drift);

    // More problems: 404 on a forge read, 401 without a token, 400 on a bad body.
    let (ct, missing) = json_of(
        app.forge_get("/api/v1/jobs/nope").await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(ct, pj);
    check(&doc, "get", "/api/v1/jobs/{id}", 404, pj, &missing);
    let (_, unauthorized) = json_of(
        app.client
            .get(app.url("/api/v1/admin/pools"))
            .send()
            .await
            .unwrap(),
        StatusCode::UNAUTHORIZED,
    )
    .await;
    check(&doc, "get", "/api/v1/admin/pools", 401, pj, &unauthorized);
    let (_, bad) = json_of(
        app.post("/api/v1/lease", json!({"attestation": 1})).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    check(&doc, "post", "/api/v1/lease", 400, pj, &bad);

    // A wrong answer fails the check: the schemas are not vacuous.
    let wrong = std::panic::catch_unwind(|| {
        check(
            &doc,
            "post",
            "/api/v1/lease",
            200,
            j,
            &json!({"lease_id": 1, "job": {}}),
        )
    });
    assert!(wrong.is_err(), "a malformed grant validated");
    // Every key of a view is sent, `null` where there is no value: a missing one fails too.
    let mut without = detail.clone();
    without.as_object_mut().unwrap().remove("current_lease");
    let wrong = std::panic::catch_unwind(|| {
        check(&doc, "get", "/api/v1/admin/runners/{id}", 200, j, &without)
    });
    assert!(wrong.is_err(), "a runner without current_lease validated");
}

/// GitHub's side of the document: a pool with its `github` object, a minted registration, the
/// problem of an outstanding one (with its extension member), the runner's registrations.
#[tokio::test]
async fn github_answers_match_the_documented_schemas() {
    let github = common::github::FakeGithub::start(common::github::Auth::Token("pat".into())).await;
    let url = github.url.clone();
    let app = spawn_app_with(move |a| {
        a.github_api_url = url;
        a.github_token = Some("pat".into());
    })
    .await;
    let doc = document(&app).await;
    let (j, pj) = ("application/json", "application/problem+json");
    let (_, pool) = json_of(
        app.admin_put(
            "/api/v1/admin/pools/gh",
            json!({"expected_image_ids": [IMAGE_A], "github": {"scope": "orgs/acme", "labels": ["linux"]}}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    check(&doc, "put", "/api/v1/admin/pools/{name}", 201, j, &pool);
    let runner = app.register("gh", "r1").await;
    let ask = || {
        app.post(
            "/api/v1/github/runners",
            json!({"attestation": runner.healthy()}),
        )
    };
    let (_, minted) = json_of(ask().await, StatusCode::CREATED).await;
    check(&doc, "post", "/api/v1/github/runners", 201, j, &minted);
    let (_, outstanding) = json_of(ask().await, StatusCode::CONFLICT).await;
    assert_eq!(outstanding["github_runner_id"], minted["github_runner_id"]);
    check(
        &doc,
        "post",
        "/api/v1/github/runners",
        409,
        pj,
        &outstanding,
    );
    let (_, detail) = json_of(
        app.admin_get(&format!("/api/v1/admin/runners/{}", runner.id))
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(detail["github_registrations"][0]["state"], "minted");
    check(&doc, "get", "/api/v1/admin/runners/{id}", 200, j, &detail);
    github.assert_clean();

    let off = spawn_app().await;
    let (_, not_found) = json_of(
        off.post("/api/v1/github/runners", json!({"attestation": "a.b.c"}))
            .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    check(&doc, "post", "/api/v1/github/runners", 404, pj, &not_found);
}

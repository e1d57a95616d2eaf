//! Named operators, their roles and the audit trail, on both engines: a viewer reads and
//! cannot change anything (every write route of the OpenAPI document is tried), an operator
//! changes runners and pools but manages no tokens, every change is in the audit trail with
//! its author and client (filtered, paged, on the runner's detail and page), a revoked token
//! is refused at once on every replica, previous admin and forge tokens are accepted until
//! removed, a revoked runner's name can be registered again, and a pool with nothing live can
//! be deleted.

use crate::common;

use common::*;
use reqwest::StatusCode;
use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::{Value, json};

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Creates a named token with the bootstrap admin token; the token.
async fn named_token(app: &TestApp, name: &str, role: &str) -> String {
    let r = app
        .admin_post("/api/v1/admin/tokens", json!({"name": name, "role": role}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED, "{name}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["name"], name);
    assert_eq!(body["role"], role);
    assert_eq!(body["created_by"], "bootstrap");
    let token = body["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("lgo_"), "{token}");
    token
}

async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = app.client.request(method, app.url(path)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap()
}

async fn audit(app: &TestApp, query: &str) -> Value {
    let r = app.admin_get(&format!("/api/v1/admin/audit{query}")).await;
    assert_eq!(r.status(), StatusCode::OK, "{query}");
    r.json().await.unwrap()
}

/// `(actor, action, target)` of every entry, oldest first.
fn trail(page: &Value) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_string(),
                e["action"].as_str().unwrap().to_string(),
                e["target"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.reverse();
    out
}

fn entry(actor: &str, action: &str, target: &str) -> (String, String, String) {
    (actor.into(), action.into(), target.into())
}

/// Logs in on the page with `token`; the cookie pair.
async fn page_login(app: &TestApp, token: &str) -> String {
    let r = no_redirects()
        .post(app.url("/admin/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = r.headers()[SET_COOKIE].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

async fn page(app: &TestApp, path: &str, cookie: &str) -> (StatusCode, String) {
    let r = no_redirects()
        .get(app.url(path))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    (r.status(), r.text().await.unwrap())
}

/// Every call of the API under the admin token names in the OpenAPI document the role it needs
/// (`read`, `write` or `admin`, its security requirement's scope), with the 403 that role's
/// refusal answers; and a viewer's and an operator's token are refused exactly where that
/// role says.
async fn the_role_each_call_documents_is_the_role_it_needs(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let viewer = named_token(&app, "dash", "viewer").await;
    let operator = named_token(&app, "olga", "operator").await;
    let doc = openapi(&app).await;
    let mut calls = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Some(security) = op["security"].as_array() else {
                continue;
            };
            let Some(scopes) = security.iter().find_map(|s| s.get("admin_token")) else {
                continue;
            };
            if !path.starts_with("/api/") {
                continue;
            }
            let role = match scopes.as_array().unwrap().as_slice() {
                [role] => role.as_str().unwrap().to_string(),
                other => panic!("{method} {path}: admin_token scopes {other:?}, not one role"),
            };
            let refusal = op["responses"]["403"]["description"].as_str().unwrap();
            let words = match role.as_str() {
                "read" => "the forge token.",
                "write" => "the forge token, or a viewer's token.",
                "admin" => "the forge token, or a token whose role is not `admin`.",
                other => panic!("{method} {path}: no such role {other}"),
            };
            assert!(refusal.ends_with(words), "{method} {path}: {refusal}");
            calls.push((method.to_uppercase(), path.clone(), role));
        }
    }
    assert!(calls.len() >= 20, "only {} calls name a role", calls.len());
    // Reads first, then writes, then what only an admin may do: a deleted pool or a revoked
    // runner is then gone only for the calls after it, which answer 404, never 403.
    calls.sort_by_key(|(method, _, role)| (role != "read", method == "DELETE"));
    for (method, path, role) in calls {
        let path = concrete(&path, &runner.id);
        let m: reqwest::Method = method.parse().unwrap();
        for (who, token, refused) in [
            ("viewer", &viewer, role != "read"),
            ("operator", &operator, role == "admin"),
        ] {
            if method == "DELETE" && !refused {
                continue;
            }
            let r = send(&app, m.clone(), &path, token, Some(json!({}))).await;
            assert_eq!(
                r.status() == StatusCode::FORBIDDEN,
                refused,
                "{who} {method} {path} ({role}): {}",
                r.status()
            );
        }
    }
}

async fn openapi(app: &TestApp) -> Value {
    let r = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    r.json().await.unwrap()
}

/// A documented path with its parameters filled: the pool `linux`, the token `dash`, the
/// runner `runner_id`.
fn concrete(path: &str, runner_id: &str) -> String {
    let name = if path.contains("/tokens/") {
        "dash"
    } else {
        "linux"
    };
    path.replace("{name}", name).replace("{id}", runner_id)
}

fn csrf_of(html: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let start = html.find(marker).expect("a form with a CSRF token") + marker.len();
    html[start..start + html[start..].find('"').unwrap()].to_string()
}

each_engine!(
    a_viewer_reads_everything_and_changes_nothing,
    the_role_each_call_documents_is_the_role_it_needs,
    every_change_is_in_the_audit_trail_with_its_author,
    tokens_are_named_once_and_refused_at_once_when_revoked,
    a_revoked_runners_name_can_be_registered_again,
    a_pool_with_nothing_live_can_be_deleted,
    previous_tokens_are_accepted_until_removed,
);

async fn a_viewer_reads_everything_and_changes_nothing(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let viewer = named_token(&app, "dash", "viewer").await;
    let before = audit(&app, "").await;

    // Every write route the OpenAPI document lists under the admin API is refused.
    let doc = openapi(&app).await;
    let mut tried = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/api/v1/admin") {
            continue;
        }
        for method in item.as_object().unwrap().keys() {
            let path = concrete(path, &runner.id);
            let m: reqwest::Method = method.to_uppercase().parse().unwrap();
            let r = send(&app, m.clone(), &path, &viewer, Some(json!({}))).await;
            if m == reqwest::Method::GET {
                let admin_only = path == "/api/v1/admin/tokens";
                let want = if admin_only {
                    StatusCode::FORBIDDEN
                } else {
                    StatusCode::OK
                };
                assert_eq!(r.status(), want, "{m} {path}");
            } else {
                let p = expect_problem(
                    r,
                    &format!("{m} {path}"),
                    StatusCode::FORBIDDEN,
                    "forbidden",
                )
                .await;
                assert!(
                    p["detail"].as_str().unwrap().contains("dash is a viewer"),
                    "{p}"
                );
                tried += 1;
            }
        }
    }
    assert!(tried >= 11, "only {tried} write routes tried");
    // Nothing changed, and nothing was recorded.
    assert_eq!(app.runner(&runner.id).await["cordoned"], false);
    assert_eq!(audit(&app, "").await["entries"], before["entries"]);

    // On the page a viewer sees the fleet without the forms, and a POST is refused.
    let cookie = page_login(&app, &viewer).await;
    let (status, html) = page(&app, "/admin", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        html.contains("Logged in as <strong>dash (viewer)</strong>"),
        "{html}"
    );
    assert!(
        !html.contains("/cordon\""),
        "a viewer is shown no cordon form"
    );
    let csrf = csrf_of(&html);
    let r = no_redirects()
        .post(app.url(&format!("/admin/runners/{}/cordon", runner.id)))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    expect_problem(r, "viewer page cordon", StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(app.runner(&runner.id).await["cordoned"], false);
}

async fn every_change_is_in_the_audit_trail_with_its_author(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let alice = named_token(&app, "alice", "operator").await;
    let cordon = format!("/api/v1/admin/runners/{}/cordon", runner.id);
    let uncordon = format!("/api/v1/admin/runners/{}/uncordon", runner.id);
    for path in [&cordon, &uncordon] {
        let r = send(&app, reqwest::Method::POST, path, &alice, None).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    let r = send(
        &app,
        reqwest::Method::PUT,
        "/api/v1/admin/pools/macos",
        &alice,
        Some(json!({"expected_image_ids": [IMAGE_B]})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = send(
        &app,
        reqwest::Method::POST,
        "/api/v1/admin/pools/macos/registration-tokens",
        &alice,
        Some(json!({"ttl_s": 60})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = send(&app, reqwest::Method::PUT,
        &format!("/api/v1/admin/runners/{}/forge-runners", runner.id), &alice,
        Some(json!({"forge_runners": [{"kind": "forgejo", "uuid": "8c1b1d0e-3c4f-4a6e-9a51-2f0f6d1e7a10"}]}))).await;
    assert_eq!(r.status(), StatusCode::OK);
    // An operator manages no tokens.
    let r = send(
        &app,
        reqwest::Method::POST,
        "/api/v1/admin/tokens",
        &alice,
        Some(json!({"name": "mallory", "role": "admin"})),
    )
    .await;
    expect_problem(
        r,
        "operator creates a token",
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    let r = send(
        &app,
        reqwest::Method::POST,
        &format!("/api/v1/admin/runners/{}/revoke", runner.id),
        &alice,
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = send(
        &app,
        reqwest::Method::DELETE,
        "/api/v1/admin/pools/macos",
        &alice,
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // The page: login and logout are recorded too.
    let cookie = page_login(&app, &alice).await;
    let (_, html) = page(&app, "/admin", &cookie).await;
    assert!(
        html.contains("Logged in as <strong>alice (operator)</strong>"),
        "{html}"
    );
    let r = no_redirects()
        .post(app.url("/admin/logout"))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf_of(&html).as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = app
        .client
        .delete(app.url("/api/v1/admin/tokens/alice"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);

    let all = audit(&app, "").await;
    let id = runner.id.as_str();
    assert_eq!(
        trail(&all),
        vec![
            entry("bootstrap", "pool_put", "linux"),
            entry("bootstrap", "registration_token_create", "linux"),
            entry("bootstrap", "operator_token_create", "alice"),
            entry("alice", "runner_cordon", id),
            entry("alice", "runner_uncordon", id),
            entry("alice", "pool_put", "macos"),
            entry("alice", "registration_token_create", "macos"),
            entry("alice", "runner_forge_runners", id),
            entry("alice", "runner_revoke", id),
            entry("alice", "pool_delete", "macos"),
            entry("alice", "page_login", "alice"),
            entry("alice", "page_logout", "alice"),
            entry("bootstrap", "operator_token_revoke", "alice"),
        ],
        "{all}"
    );
    for e in all["entries"].as_array().unwrap() {
        assert_eq!(e["client"], "127.0.0.1", "{e}");
        assert!(e["at"].as_str().unwrap().ends_with('Z'), "{e}");
    }
    let created = &all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "operator_token_create")
        .unwrap()["detail"];
    assert_eq!(created, "role operator");
    assert!(
        !all.to_string().contains("lgo_"),
        "no token reaches the trail"
    );

    // Filters: by target, by actor, by time; paging with the cursor.
    let on_runner = audit(&app, &format!("?target={id}")).await;
    assert_eq!(trail(&on_runner).len(), 4, "{on_runner}");
    assert_eq!(trail(&audit(&app, "?actor=bootstrap").await).len(), 4);
    assert_eq!(
        trail(&audit(&app, "?since=2999-01-01T00:00:00Z").await).len(),
        0
    );
    assert_eq!(
        trail(&audit(&app, "?until=2000-01-01T00:00:00Z").await).len(),
        0
    );
    let mut seen = Vec::new();
    let mut query = "?limit=5".to_string();
    loop {
        let page = audit(&app, &query).await;
        assert!(page["entries"].as_array().unwrap().len() <= 5);
        seen.extend(
            page["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["seq"].as_i64().unwrap()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => query = format!("?limit=5&cursor={c}"),
            None => break,
        }
    }
    let everything: Vec<i64> = all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(
        seen, everything,
        "the pages are the trail, newest first, once each"
    );
    for bad in [
        "?since=yesterday",
        "?limit=0",
        "?limit=501",
        "?cursor=abc",
        "?target=a%00b",
    ] {
        let r = app.admin_get(&format!("/api/v1/admin/audit{bad}")).await;
        expect_problem(r, bad, StatusCode::BAD_REQUEST, "bad_request").await;
    }

    // The runner's detail and page carry its entries.
    let detail = app.runner(id).await;
    let actions: Vec<&str> = detail["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "runner_revoke",
            "runner_forge_runners",
            "runner_uncordon",
            "runner_cordon"
        ],
        "{detail}"
    );
    let admin_cookie = page_login(&app, ADMIN).await;
    let (_, html) = page(&app, &format!("/admin/runners/{id}"), &admin_cookie).await;
    assert!(html.contains("Operators' changes"), "{html}");
    assert!(
        html.contains("<code>runner_revoke</code>") && html.contains("<td>alice</td>"),
        "{html}"
    );
}

async fn tokens_are_named_once_and_refused_at_once_when_revoked(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let bob = named_token(&app, "bob", "admin").await;
    // A named admin manages tokens too.
    let r = send(
        &app,
        reqwest::Method::POST,
        "/api/v1/admin/tokens",
        &bob,
        Some(json!({"name": "carol", "role": "viewer"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let carol: Value = r.json().await.unwrap();
    assert_eq!(carol["created_by"], "bob");
    let r = app
        .admin_post(
            "/api/v1/admin/tokens",
            json!({"name": "bob", "role": "viewer"}),
        )
        .await;
    expect_problem(r, "name taken", StatusCode::CONFLICT, "token_name_taken").await;
    for (body, case) in [
        (json!({"name": "bootstrap", "role": "viewer"}), "bootstrap"),
        (json!({"name": "Bob Smith", "role": "viewer"}), "bad name"),
        (json!({"name": "dave", "role": "root"}), "bad role"),
        (json!({"name": "dave"}), "no role"),
        (
            json!({"name": "dave", "role": "viewer", "extra": 1}),
            "unknown field",
        ),
    ] {
        let r = app.admin_post("/api/v1/admin/tokens", body).await;
        expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
    }
    let listed: Value = app
        .admin_get("/api/v1/admin/tokens")
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = listed["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bob", "carol"]);
    assert!(
        !listed.to_string().contains("lgo_"),
        "tokens are never listed: {listed}"
    );

    // A session opened with the token ends with it, as the token does, at once.
    let cookie = page_login(&app, &bob).await;
    assert_eq!(page(&app, "/admin", &cookie).await.0, StatusCode::OK);
    let r = app
        .client
        .delete(app.url("/api/v1/admin/tokens/bob"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = send(
        &app,
        reqwest::Method::GET,
        "/api/v1/admin/pools",
        &bob,
        None,
    )
    .await;
    expect_problem(r, "revoked token", StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(page(&app, "/admin", &cookie).await.0, StatusCode::SEE_OTHER);
    let r = app
        .client
        .delete(app.url("/api/v1/admin/tokens/bob"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    expect_problem(r, "revoked twice", StatusCode::NOT_FOUND, "not_found").await;
    // The name is free again, with a new token.
    let again = named_token(&app, "bob", "viewer").await;
    assert_ne!(again, bob);
}

async fn a_revoked_runners_name_can_be_registered_again(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let old = app.register("linux", "build-1").await;
    assert_eq!(
        app.lease(&old.healthy()).await.status(),
        StatusCode::NO_CONTENT
    );
    // While it is live the name is taken.
    let token = app.registration_token("linux").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let body =
        json!({"registration_token": token, "name": "build-1", "public_key": key.public_jwk()});
    let r = app.post("/api/v1/runners", body.clone()).await;
    expect_problem(r, "live name", StatusCode::CONFLICT, "runner_exists").await;
    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/revoke", old.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let new = app.register("linux", "build-1").await;
    assert_ne!(new.id, old.id);
    // The old runner's history stays under its id.
    let detail = app.runner(&old.id).await;
    assert_eq!(detail["status"], "revoked", "{detail}");
    assert_eq!(detail["name"], "build-1");
    assert!(
        !detail["attestations"].as_array().unwrap().is_empty(),
        "{detail}"
    );
    let listed: Value = app
        .admin_get("/api/v1/admin/runners?pool=linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["runners"].as_array().unwrap().len(), 2, "{listed}");
    // A second live runner of that name is still refused.
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": app.registration_token("linux").await,
        "name": "build-1", "public_key": key.public_jwk()}),
        )
        .await;
    expect_problem(r, "live name again", StatusCode::CONFLICT, "runner_exists").await;
}

async fn a_pool_with_nothing_live_can_be_deleted(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let r = app
        .client
        .delete(app.url("/api/v1/admin/pools/linux"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let p = expect_problem(r, "live runner", StatusCode::CONFLICT, "pool_in_use").await;
    assert!(
        p["detail"].as_str().unwrap().contains("1 live runners"),
        "{p}"
    );
    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/revoke", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let job = app.enqueue("linux").await;
    let r = app
        .client
        .delete(app.url("/api/v1/admin/pools/linux"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    expect_problem(r, "queued job", StatusCode::CONFLICT, "pool_in_use").await;
    // Nothing changed by a refused delete.
    assert_eq!(app.job(&job).await["state"], "queued");
    let r = app
        .forge_post(&format!("/api/v1/jobs/{job}/cancel"), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = app
        .client
        .delete(app.url("/api/v1/admin/pools/linux"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = app.admin_get("/api/v1/admin/pools/linux").await;
    expect_problem(r, "deleted pool", StatusCode::NOT_FOUND, "not_found").await;
    let r = app
        .admin_get(&format!("/api/v1/admin/runners/{}", runner.id))
        .await;
    expect_problem(
        r,
        "its runners go with it",
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let r = app
        .client
        .delete(app.url("/api/v1/admin/pools/linux"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    expect_problem(r, "deleted twice", StatusCode::NOT_FOUND, "not_found").await;
    // The name can be used again from scratch.
    app.pool("linux", &[IMAGE_B]).await;
    app.register("linux", "r1").await;
}

async fn previous_tokens_are_accepted_until_removed(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |a: &mut leasegate::config::ServeArgs| {
        a.admin_token = Some(NEW_ADMIN.into());
        a.admin_token_previous = Some(ADMIN.into());
        a.forge_token = Some(NEW_FORGE.into());
        a.forge_token_previous = Some(FORGE.into());
    })
    .await
    else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    for token in [ADMIN, NEW_ADMIN] {
        let r = send(
            &app,
            reqwest::Method::GET,
            "/api/v1/admin/pools",
            token,
            None,
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    for token in [FORGE, NEW_FORGE] {
        let r = send(
            &app,
            reqwest::Method::POST,
            "/api/v1/jobs",
            token,
            Some(json!({"pool": "linux", "payload": {}})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        // Neither side's token opens the other's endpoints.
        let r = send(
            &app,
            reqwest::Method::GET,
            "/api/v1/admin/pools",
            token,
            None,
        )
        .await;
        expect_problem(r, "forge on admin", StatusCode::FORBIDDEN, "forbidden").await;
    }
    let old_session = page_login(&app, ADMIN).await;
    let new_session = page_login(&app, NEW_ADMIN).await;
    assert_eq!(page(&app, "/admin", &old_session).await.0, StatusCode::OK);
    // The rotation's last step: the previous values removed.
    let next = app
        .restart_with(|a| {
            a.admin_token = Some(NEW_ADMIN.into());
            a.forge_token = Some(NEW_FORGE.into());
        })
        .await;
    let r = send(
        &next,
        reqwest::Method::GET,
        "/api/v1/admin/pools",
        ADMIN,
        None,
    )
    .await;
    expect_problem(r, "removed admin", StatusCode::UNAUTHORIZED, "unauthorized").await;
    let r = send(
        &next,
        reqwest::Method::POST,
        "/api/v1/jobs",
        FORGE,
        Some(json!({"pool": "linux", "payload": {}})),
    )
    .await;
    expect_problem(r, "removed forge", StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(
        page(&next, "/admin", &old_session).await.0,
        StatusCode::SEE_OTHER
    );
    assert_eq!(page(&next, "/admin", &new_session).await.0, StatusCode::OK);
}

const NEW_ADMIN: &str = "rotated-admin-token-0123456789abcdef0123";
const NEW_FORGE: &str = "rotated-forge-token-0123456789abcdef0123";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_at_once_by_every_replica() {
    let Some(a) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    let b = spawn_replica(&a).await;
    let token = named_token(&a, "erin", "operator").await;
    let r = send(
        &b,
        reqwest::Method::GET,
        "/api/v1/admin/pools",
        &token,
        None,
    )
    .await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "a token made on one replica works on the other"
    );
    let r = a
        .client
        .delete(a.url("/api/v1/admin/tokens/erin"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = send(
        &b,
        reqwest::Method::GET,
        "/api/v1/admin/pools",
        &token,
        None,
    )
    .await;
    expect_problem(
        r,
        "revoked on the other replica",
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
}

#[test]
fn a_previous_token_must_be_strong_and_not_the_current_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = test_args(dir.path());
    args.admin_token_previous = Some("short".into());
    let e = leasegate::server::load_secrets(&args)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("LEASEGATE_ADMIN_TOKEN_PREVIOUS") && e.contains("at least"),
        "{e}"
    );
    args.admin_token_previous = Some(ADMIN.into());
    let e = leasegate::server::load_secrets(&args)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("is the current token"), "{e}");
    args.admin_token_previous = None;
    args.forge_token_previous = Some(ADMIN.into());
    let e = leasegate::server::load_secrets(&args)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("must differ"), "{e}");
    let file = dir.path().join("previous.token");
    std::fs::write(&file, format!("{NEW_FORGE}\n")).unwrap();
    args.forge_token_previous = None;
    args.forge_token_previous_file = Some(file);
    let secrets = leasegate::server::load_secrets(&args).unwrap();
    assert!(secrets.is_forge(NEW_FORGE) && secrets.is_forge(FORGE) && !secrets.is_admin(NEW_FORGE));
}

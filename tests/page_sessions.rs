//! The page's sessions are the service's: logging out ends one at once on every replica, a
//! rotated admin token ends every session opened with the old one, the cookie is `Secure`
//! behind a TLS proxy (and only when a trusted proxy says so), every answer carries the
//! security headers, and runner names that could pass for another are refused or marked.

use crate::common;

use common::*;
use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::json;

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Logs in with `token` through the form; the `Set-Cookie` value.
async fn login_with(app: &TestApp, token: &str, headers: &[(&str, &str)]) -> String {
    let mut req = no_redirects()
        .post(app.url("/admin/login"))
        .form(&[("token", token)]);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    r.headers()[SET_COOKIE].to_str().unwrap().to_string()
}

fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_string()
}

/// The page's status for `cookie`: 200 when the session holds, 303 to login when not.
async fn fleet_status(app: &TestApp, cookie: &str) -> StatusCode {
    no_redirects()
        .get(app.url("/admin"))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap()
        .status()
}

fn csrf_of(html: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let start = html.find(marker).expect("a form with a CSRF token") + marker.len();
    html[start..start + html[start..].find('"').unwrap()].to_string()
}

each_engine!(
    logging_out_ends_the_session_on_the_server,
    a_rotated_admin_token_ends_the_old_sessions,
);

async fn logging_out_ends_the_session_on_the_server(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let cookie = cookie_pair(&login_with(&app, ADMIN, &[]).await);
    assert_eq!(fleet_status(&app, &cookie).await, StatusCode::OK);
    let html = no_redirects()
        .get(app.url("/admin"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let r = no_redirects()
        .post(app.url("/admin/logout"))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf_of(&html))])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(
        r.headers()[SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    // A client that kept the old cookie gets nothing with it: not the page, not its refresh,
    // not an action.
    assert_eq!(fleet_status(&app, &cookie).await, StatusCode::SEE_OTHER);
    let r = no_redirects()
        .get(app.url("/admin/fleet"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = no_redirects()
        .post(app.url("/admin/runners/x/cordon"))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf_of(&html))])
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()[LOCATION], "/admin/login");
}

async fn a_rotated_admin_token_ends_the_old_sessions(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let cookie = cookie_pair(&login_with(&app, ADMIN, &[]).await);
    assert_eq!(fleet_status(&app, &cookie).await, StatusCode::OK);
    // The same database served again with another admin token, as after a rotation.
    let rotated = "rotated-admin-token-0123456789abcdef0123";
    let next = app
        .restart_with(|a| a.admin_token = Some(rotated.into()))
        .await;
    assert_eq!(fleet_status(&next, &cookie).await, StatusCode::SEE_OTHER);
    let fresh = cookie_pair(&login_with(&next, rotated, &[]).await);
    assert_eq!(fleet_status(&next, &fresh).await, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cookie_is_secure_when_a_trusted_proxy_says_the_page_came_over_tls() {
    let app = spawn_app_with(|a| a.trusted_proxies = vec!["127.0.0.1".into()]).await;
    let tls = login_with(&app, ADMIN, &[("x-forwarded-proto", "https")]).await;
    assert!(tls.contains("; Secure"), "{tls}");
    let plain = login_with(&app, ADMIN, &[]).await;
    assert!(!plain.contains("Secure"), "{plain}");
    // Anyone else saying https is not believed.
    let untrusted = spawn_app().await;
    let c = login_with(&untrusted, ADMIN, &[("x-forwarded-proto", "https")]).await;
    assert!(!c.contains("Secure"), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_the_security_headers() {
    let app = spawn_app().await;
    let c = no_redirects();
    let cases = [
        ("an API 401", c.get(app.url("/api/v1/admin/pools"))),
        (
            "an API 404",
            c.get(app.url("/api/v1/admin/runners/nobody"))
                .bearer_auth(ADMIN),
        ),
        ("an unknown route", c.get(app.url("/nowhere"))),
        (
            "a page 404",
            c.get(app.url("/admin/runners/nobody")).bearer_auth(ADMIN),
        ),
        ("a page 401", c.get(app.url("/admin/fleet"))),
        ("a redirect", c.get(app.url("/admin"))),
        ("JSON", c.get(app.url("/openapi.json"))),
        ("text", c.get(app.url("/livez"))),
    ];
    for (case, req) in cases {
        let r = req.send().await.unwrap();
        let h = r.headers();
        assert_eq!(
            h.get("x-content-type-options").map(|v| v.to_str().unwrap()),
            Some("nosniff"),
            "{case}"
        );
        let csp = h
            .get("content-security-policy")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        assert!(csp.contains("frame-ancestors 'none'"), "{case}: {csp}");
        assert!(h.contains_key("referrer-policy"), "{case}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_could_pass_for_another_are_refused_or_marked() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    for (case, name, labels) in [
        ("a right-to-left override", "build-\u{202e}10", json!({})),
        ("a zero-width space", "build\u{200b}-01", json!({})),
        (
            "an isolate in a label",
            "build-02",
            json!({"os": "linux\u{2067}"}),
        ),
        (
            "a BOM in a label key",
            "build-03",
            json!({"\u{feff}os": "linux"}),
        ),
    ] {
        let token = app.registration_token("linux").await;
        let r = app.post("/api/v1/runners", json!({"registration_token": token, "name": name, "labels": labels, "public_key": key.public_jwk()})).await;
        let body = expect_problem(r, case, StatusCode::BAD_REQUEST, "bad_request").await;
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("format characters"),
            "{case}: {body}"
        );
    }
    // A look-alike is a name like any other, but the confirmation dialog spells it out.
    let lookalike = app.register("linux", "bu\u{0456}ld-01").await;
    let html = no_redirects()
        .get(app.url("/admin"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains(&format!("Cordon bu\u{0456}ld-01 (pool linux, id {}); the name has characters beyond ASCII: U+0456?", lookalike.id)), "{html}");
}

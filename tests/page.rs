//! The runner-health page over a real listener: login and session, CSRF, escaping of
//! everything a runner sends, and the fleet, runner and job views.

use crate::common;

use common::*;
use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use serde_json::json;

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Logs in through the form and returns the session cookie (`name=value`).
async fn login(app: &TestApp) -> String {
    let r = no_redirects()
        .post(app.url("/admin/login"))
        .form(&[("token", ADMIN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], "/admin");
    let cookie = r.headers()[SET_COOKIE].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    cookie.split(';').next().unwrap().to_string()
}

async fn page(app: &TestApp, path: &str, cookie: &str) -> String {
    let r = no_redirects()
        .get(app.url(path))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{path}");
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(r.headers().contains_key("content-security-policy"));
    r.text().await.unwrap()
}

/// The CSRF token the page embeds in its forms.
fn csrf_of(html: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let start = html.find(marker).expect("a form with a CSRF token") + marker.len();
    html[start..start + html[start..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn without_a_session_the_page_redirects_to_login() {
    let app = spawn_app().await;
    for path in ["/admin", "/admin/runners/x", "/admin/jobs/x"] {
        let r = no_redirects().get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{path}");
        assert_eq!(r.headers()[LOCATION], "/admin/login");
    }
    let forged = no_redirects()
        .get(app.url("/admin"))
        .header(COOKIE, "leasegate_session=99999999999999.00")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::SEE_OTHER);
    let r = no_redirects()
        .get(app.url("/admin/fleet"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = no_redirects()
        .post(app.url("/admin/login"))
        .form(&[("token", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("That is not a valid token")
    );
    // The forge token is not an operator credential either.
    let r = no_redirects()
        .get(app.url("/admin"))
        .bearer_auth(FORGE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn the_admin_bearer_token_and_the_session_both_open_the_page() {
    let app = spawn_app().await;
    let r = no_redirects()
        .get(app.url("/admin"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let cookie = login(&app).await;
    let html = page(&app, "/admin", &cookie).await;
    assert!(html.contains("Runners"));
    let css = reqwest::get(app.url("/admin/assets/app.css"))
        .await
        .unwrap();
    assert_eq!(css.status(), StatusCode::OK);
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
}

#[tokio::test]
async fn everything_a_runner_sends_is_escaped() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let token = app.registration_token("linux").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let evil_name = "<script>alert('name')</script>";
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": token, "name": evil_name, "public_key": key.public_jwk(),
                   "labels": {"<b>k</b>": "<img src=x onerror=alert(1)>"}}),
        )
        .await;
    let id = r.json::<serde_json::Value>().await.unwrap()["runner_id"]
        .as_str()
        .unwrap()
        .to_string();
    let runner = TestRunner {
        id: id.clone(),
        pool: "linux".into(),
        key,
    };
    app.heartbeat(&runner.failing("<script>alert('probe')</script> \"quoted\" & more"))
        .await;
    let cookie = login(&app).await;
    for path in ["/admin".to_string(), format!("/admin/runners/{id}")] {
        let html = page(&app, &path, &cookie).await;
        assert!(
            !html.contains("<script>alert"),
            "{path} renders a runner's script"
        );
        assert!(
            !html.contains("<img src=x"),
            "{path} renders a runner's label as HTML"
        );
        // askama escapes with numeric references: &#60; for <, &#39; for '.
        assert!(
            html.contains("&#60;script&#62;alert(&#39;probe&#39;)&#60;/script&#62;"),
            "{path}"
        );
        assert!(
            html.contains("&#60;script&#62;alert(&#39;name&#39;)&#60;/script&#62;"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn cross_site_posts_are_refused_and_own_forms_work() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    app.heartbeat(&runner.failing("default OCI runtime \"crun\" not found: invalid argument"))
        .await;
    let cookie = login(&app).await;
    let html = page(&app, "/admin", &cookie).await;
    assert!(html.contains(
        "cannot run a container with podman: default OCI runtime &#34;crun&#34; not found: invalid argument"
    ));
    let csrf = csrf_of(&html);
    let action = app.url(&format!("/admin/runners/{}/cordon", runner.id));

    // A cross-site form carries the cookie (a browser would not, being SameSite=Strict) but
    // cannot know the CSRF token.
    let r = no_redirects()
        .post(&action)
        .header(COOKIE, &cookie)
        .form(&[("back", "/admin")])
        .send()
        .await
        .unwrap();
    assert_eq!(code_of(r, StatusCode::FORBIDDEN).await, "forbidden");
    let r = no_redirects()
        .post(&action)
        .header(COOKIE, &cookie)
        .header(ORIGIN, "https://evil.example")
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(app.runner(&runner.id).await["cordoned"], false);

    let r = no_redirects()
        .post(&action)
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str()), ("back", "https://evil.example")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        r.headers()[LOCATION],
        "/admin",
        "only page paths are followed back to"
    );
    assert_eq!(app.runner(&runner.id).await["status"], "cordoned");
    let html = page(&app, &format!("/admin/runners/{}", runner.id), &cookie).await;
    assert!(html.contains("Uncordon"));
    assert!(html.contains("Revoke"));
}

#[tokio::test]
async fn the_job_page_tells_the_story() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let job = app.enqueue("linux").await;
    let lease = app.grant(&runner).await;
    app.call(&lease, "abandon", Some(json!({"reason": "disk_full"})))
        .await;
    let cookie = login(&app).await;
    let html = page(&app, &format!("/admin/jobs/{job}"), &cookie).await;
    assert!(html.contains("enqueued by the forge"));
    assert!(html.contains("returned to the queue without using an attempt"));
    assert!(html.contains("abandoned: disk_full"));
    assert!(html.contains("0 of 3"));
    let fleet = page(&app, "/admin", &cookie).await;
    assert!(fleet.contains("1 queued"));
    // The story names the runner, with its id on hover.
    assert!(
        html.contains(&format!("title=\"{}\">r1</a>", runner.id)),
        "{html}"
    );
}

#[tokio::test]
async fn the_fleet_lists_what_needs_attention_filters_pages_and_answers_304_when_unchanged() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    app.pool("macos", &[IMAGE_B]).await;
    let mut healthy = Vec::new();
    for i in 0..4 {
        let r = app.register("linux", &format!("ok-{i}")).await;
        let host = format!("build-{i}.ci.example");
        app.heartbeat(&r.attest(json!({"host": host, "agent": {"version": "9.9.1"}})))
            .await;
        healthy.push(r);
    }
    let broken = app.register("linux", "broken").await;
    app.heartbeat(&broken.failing("crun not found")).await;
    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/cordon", broken.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    for i in 0..3 {
        let r = app.register("macos", &format!("mac-{i}")).await;
        app.heartbeat(&r.failing("no podman machine")).await;
    }
    app.enqueue("macos").await;
    let cookie = login(&app).await;

    // Two minutes of samples (as the service's sampler takes them), drawn per pool.
    let now = leasegate::domain::time::Millis::now();
    for at in [now.minus_secs(60), now] {
        let taken = leasegate::timeline::take_samples(&app.state, at)
            .await
            .unwrap();
        assert_eq!(taken.len(), 2, "a sample per pool");
    }
    let html = page(&app, "/admin", &cookie).await;
    assert_eq!(
        html.matches("<svg class=\"timeline\"").count(),
        4,
        "an hour and a day per pool"
    );
    assert!(
        html.contains("class=\"t-bad\"") && html.contains("<title>"),
        "{html}"
    );
    // The pool whose jobs nobody may take says so.
    assert!(
        html.contains("1 jobs waiting and no runner of this pool may take one"),
        "{html}"
    );
    // Healthy runners are a count; the rest are rows, with both facts of a cordoned broken one.
    assert!(html.contains("4 healthy runners</a> not listed"), "{html}");
    assert!(!html.contains(">ok-0</a>"), "healthy runners are collapsed");
    assert!(
        html.contains(">broken</a>")
            && html.contains("cordoned</span> · <span class=\"status bad\">probe failed"),
        "{html}"
    );
    // Asked for, the healthy ones are listed with their host and agent.
    let listed = page(&app, "/admin?status=healthy", &cookie).await;
    assert!(
        listed.contains(">ok-3</a>")
            && listed.contains("build-3.ci.example")
            && listed.contains("agent 9.9.1"),
        "{listed}"
    );
    // The search covers the host; the pool filter holds; filters stay in the refresh URL.
    let found = page(&app, "/admin?status=healthy&q=BUILD-2", &cookie).await;
    assert!(
        found.contains(">ok-2</a>") && !found.contains(">ok-1</a>"),
        "{found}"
    );
    let macs = page(&app, "/admin?pool=macos&limit=2", &cookie).await;
    assert!(
        macs.contains("data-refresh=\"/admin/fleet?pool=macos&#38;limit=2\""),
        "{macs}"
    );
    assert_eq!(macs.matches("class=\"runner\"").count(), 2, "a page of two");
    assert!(
        macs.contains("href=\"/admin?pool=macos&#38;limit=2&#38;cursor=2\""),
        "{macs}"
    );
    let rest = page(&app, "/admin?pool=macos&limit=2&cursor=2", &cookie).await;
    assert_eq!(rest.matches("class=\"runner\"").count(), 1);

    // The refresh: an ETag, and 304 with no body while nothing changed.
    let fragment = |etag: Option<String>| {
        let mut req = no_redirects()
            .get(app.url("/admin/fleet"))
            .header(COOKIE, &cookie);
        if let Some(e) = etag {
            req = req.header("if-none-match", e);
        }
        req.send()
    };
    let first = fragment(None).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let etag = first.headers()["etag"].to_str().unwrap().to_string();
    let again = fragment(Some(etag.clone())).await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert!(again.text().await.unwrap().is_empty());
    // A change (a runner uncordoned) is a new view.
    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/uncordon", broken.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let changed = fragment(Some(etag)).await.unwrap();
    assert_eq!(changed.status(), StatusCode::OK);

    // A refresh that names the pieces it shows gets only those that changed: here the
    // uncordoned runner's row, its pool's card (its counts) and the as-of line.
    let everything = first.text().await.unwrap();
    let hash = regex_lite_hashes(&everything);
    assert!(hash.len() >= 6, "{everything}");
    let partial = no_redirects()
        .get(app.url("/admin/fleet"))
        .header(COOKIE, &cookie)
        .header("x-fleet-have", hash.join(" "))
        .send()
        .await
        .unwrap();
    assert_eq!(partial.status(), StatusCode::OK);
    let partial = partial.text().await.unwrap();
    let sent: Vec<&str> = partial
        .lines()
        .filter(|l| l.starts_with("<template") && !l.contains(" data-kept>"))
        .map(|l| {
            l.split("data-piece=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(
        sent,
        ["asof", "pool:linux", &format!("row:{}", broken.id)],
        "{partial}"
    );
    // What it keeps is sent empty: the macOS runners' rows are not in it.
    assert!(
        everything.contains(">mac-0</a>") && !partial.contains(">mac-0</a>"),
        "{partial}"
    );
}

/// The `data-hash` values of a refresh's pieces.
fn regex_lite_hashes(fragment: &str) -> Vec<String> {
    fragment
        .lines()
        .filter(|l| l.starts_with("<template"))
        .filter_map(|l| l.split(" data-hash=\"").nth(1))
        .map(|rest| rest[..16].to_string())
        .collect()
}

#[tokio::test]
async fn an_ejected_runner_is_reinstated_from_its_page() {
    use leasegate::domain::ejection::{FailureReason, JobEnd};
    use leasegate::domain::ids::RunnerId;
    use leasegate::domain::time::Millis;
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let mut runners = Vec::new();
    for name in ["r1", "r2", "r3"] {
        let runner = app.register("linux", name).await;
        assert_eq!(
            app.heartbeat(&runner.healthy()).await.status(),
            StatusCode::OK
        );
        runners.push(runner);
    }
    let store = app.state.store().clone();
    let rules = app.state.settings().status_rules();
    let id = RunnerId(runners[0].id.clone());
    let failed = JobEnd::Infrastructure(FailureReason::RunnerSystemFailure);
    for job in 1..=3 {
        store
            .forge_job_ended(&format!("gitlab:{job}"), &id, failed, Millis::now(), rules)
            .await
            .unwrap();
    }
    assert_eq!(app.runner(&runners[0].id).await["status"], "ejected");
    let cookie = login(&app).await;
    let path = format!("/admin/runners/{}", runners[0].id);
    let html = page(&app, &path, &cookie).await;
    assert!(html.contains("Reinstate"), "{html}");
    // The page says why, how many, and until when.
    assert!(
        html.contains("3 infrastructure failures in a row (runner_system_failure ×3) until"),
        "{html}"
    );
    let healthy = page(&app, &format!("/admin/runners/{}", runners[1].id), &cookie).await;
    assert!(
        !healthy.contains("Reinstate"),
        "only an ejected runner offers it"
    );
    let r = no_redirects()
        .post(app.url(&format!("/admin/runners/{}/reinstate", runners[0].id)))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf_of(&html).as_str()), ("back", path.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let shown = app.runner(&runners[0].id).await;
    assert_eq!(shown["status"], "healthy", "{shown}");
    let audit: Vec<&str> = shown["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(audit.contains(&"runner_reinstate"), "{audit:?}");
}

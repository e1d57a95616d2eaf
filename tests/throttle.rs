//! Guessing credentials is throttled: each client's failed checks are counted, and past the
//! limit it is answered 429 with `Retry-After` whatever it presents, while every other client,
//! and its correct credentials, goes on as before. `X-Forwarded-For` names the client only
//! when a trusted proxy sends it.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use std::net::IpAddr;

/// A client whose requests come from the loopback address `from`.
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(from.parse::<IpAddr>().unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn limit(n: u32) -> impl FnOnce(&mut leasegate::config::ServeArgs) {
    move |args| {
        args.auth_failure_limit = n;
        args.auth_failure_window_s = 60;
    }
}

async fn admin_get(app: &TestApp, client: &reqwest::Client, token: &str) -> reqwest::Response {
    client
        .get(app.url("/api/v1/admin/pools"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

each_engine!(
    wrong_tokens_past_the_limit_are_throttled_and_other_clients_are_not,
    registration_lease_and_forge_tokens_are_throttled_too,
    page_logins_are_throttled,
    forwarded_for_names_the_client_only_from_a_trusted_proxy,
);

async fn wrong_tokens_past_the_limit_are_throttled_and_other_clients_are_not(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, limit(20)).await else {
        return;
    };
    let guesser = client_from("127.0.0.11");
    for i in 0..20 {
        let r = admin_get(&app, &guesser, &format!("guess-{i}")).await;
        expect_problem(
            r,
            "a wrong admin token",
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        )
        .await;
    }
    let r = admin_get(&app, &guesser, "guess-21").await;
    let retry: i64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&retry), "Retry-After {retry}");
    expect_problem(r, "guess 21", StatusCode::TOO_MANY_REQUESTS, "throttled").await;
    // The throttled client is refused before its credential is looked at, even a right one:
    // otherwise the throttle would still tell a guesser when it guessed right.
    let r = admin_get(&app, &guesser, ADMIN).await;
    expect_problem(
        r,
        "the right token from the guesser",
        StatusCode::TOO_MANY_REQUESTS,
        "throttled",
    )
    .await;
    // Every other client is untouched, with the right token or a wrong one.
    let other = client_from("127.0.0.12");
    assert_eq!(
        admin_get(&app, &other, ADMIN).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        admin_get(&app, &other, "wrong").await.status(),
        StatusCode::UNAUTHORIZED
    );
    let forge = other
        .get(app.url("/api/v1/jobs/x"))
        .bearer_auth(FORGE)
        .send()
        .await
        .unwrap();
    assert_eq!(forge.status(), StatusCode::NOT_FOUND);
    // The failures and the 429s are counted.
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("leasegate_auth_failures_total{credential=\"admin\"} 21"),
        "{metrics}"
    );
    assert!(metrics.contains("leasegate_auth_throttled_total{credential=\"admin\"} 2"));
}

async fn registration_lease_and_forge_tokens_are_throttled_too(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, limit(3)).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    app.enqueue("linux").await;
    let lease = app.grant(&runner).await;

    let key = leasegate::agent::keys::RunnerKey::generate();
    let register = |c: reqwest::Client, token: String| {
        let body =
            json!({"registration_token": token, "name": "r2", "public_key": key.public_jwk()});
        let url = app.url("/api/v1/runners");
        async move { c.post(url).json(&body).send().await.unwrap() }
    };
    let c = client_from("127.0.0.21");
    for _ in 0..3 {
        let r = register(c.clone(), "lgr_guess".into()).await;
        expect_problem(
            r,
            "a wrong registration token",
            StatusCode::UNAUTHORIZED,
            "registration_token_invalid",
        )
        .await;
    }
    let r = register(c.clone(), "lgr_guess".into()).await;
    expect_problem(
        r,
        "registration, throttled",
        StatusCode::TOO_MANY_REQUESTS,
        "throttled",
    )
    .await;

    let c = client_from("127.0.0.22");
    let start = |token: &'static str| {
        c.post(app.url(&format!("/api/v1/leases/{}/start", lease.lease_id)))
            .bearer_auth(token)
            .send()
    };
    for _ in 0..3 {
        expect_problem(
            start("lgl_guess").await.unwrap(),
            "a wrong lease token",
            StatusCode::UNAUTHORIZED,
            "lease_token_invalid",
        )
        .await;
    }
    expect_problem(
        start("lgl_guess").await.unwrap(),
        "lease, throttled",
        StatusCode::TOO_MANY_REQUESTS,
        "throttled",
    )
    .await;
    // The lease's own runner, elsewhere, starts it.
    assert_eq!(
        app.call(&lease, "start", None).await.status(),
        StatusCode::OK
    );

    let c = client_from("127.0.0.23");
    for _ in 0..3 {
        let r = c
            .post(app.url("/api/v1/jobs"))
            .bearer_auth("guess")
            .json(&json!({"pool": "linux"}))
            .send()
            .await
            .unwrap();
        expect_problem(
            r,
            "a wrong forge token",
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        )
        .await;
    }
    let r = c
        .post(app.url("/api/v1/jobs"))
        .bearer_auth("guess")
        .json(&json!({"pool": "linux"}))
        .send()
        .await
        .unwrap();
    expect_problem(
        r,
        "forge, throttled",
        StatusCode::TOO_MANY_REQUESTS,
        "throttled",
    )
    .await;
}

async fn page_logins_are_throttled(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, limit(3)).await else {
        return;
    };
    let c = client_from("127.0.0.31");
    let login = |token: &str| {
        c.post(app.url("/admin/login"))
            .form(&[("token", token)])
            .send()
    };
    for _ in 0..3 {
        assert_eq!(
            login("guess").await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    let r = login(ADMIN).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key("retry-after"));
    assert!(r.text().await.unwrap().contains("Too many failed logins"));
    // Someone else logs in.
    let r = client_from("127.0.0.32")
        .post(app.url("/admin/login"))
        .form(&[("token", ADMIN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

async fn forwarded_for_names_the_client_only_from_a_trusted_proxy(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |args: &mut leasegate::config::ServeArgs| {
        args.auth_failure_limit = 2;
        args.trusted_proxies = vec!["127.0.0.41".into()];
    })
    .await
    else {
        return;
    };
    let guess = |c: &reqwest::Client, forwarded: &'static str| {
        c.get(app.url("/api/v1/admin/pools"))
            .bearer_auth("guess")
            .header("x-forwarded-for", forwarded)
            .send()
    };
    // Through the trusted proxy, each forwarded client has its own allowance.
    let proxy = client_from("127.0.0.41");
    for _ in 0..2 {
        assert_eq!(
            guess(&proxy, "203.0.113.5").await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        guess(&proxy, "203.0.113.5").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        guess(&proxy, "203.0.113.6").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    // Anyone else's X-Forwarded-For is their own writing: changing it dodges nothing.
    let direct = client_from("127.0.0.42");
    assert_eq!(
        guess(&direct, "198.51.100.1").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        guess(&direct, "198.51.100.2").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        guess(&direct, "198.51.100.3").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

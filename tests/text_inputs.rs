//! Text at the edge: a NUL (or another control character) in anything the service stores or
//! looks up is a 400 on both engines, before any query; and no string a client can send, in
//! any field, is answered with a 5xx (a sampled property over every string input).

use crate::common;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner as Sampler;
use reqwest::StatusCode;
use serde_json::json;

/// `s` as one path segment.
fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(b) {
            out.push(*b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A compact JWS whose header names `kid` (the signature is garbage: the kid is read first).
fn jws_with_kid(kid: &str) -> String {
    let header = json!({"alg": "EdDSA", "typ": "leasegate-attestation+jwt", "kid": kid});
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode("{}"),
        URL_SAFE_NO_PAD.encode([0u8; 64])
    )
}

struct Fixture {
    runner: TestRunner,
    job: String,
    lease: Granted,
}

async fn fixture(app: &TestApp) -> Fixture {
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    app.enqueue("linux").await;
    let lease = app.grant(&runner).await;
    let job = lease.job_id.clone();
    Fixture { runner, job, lease }
}

/// One request a client may make, with `text` in one of its string inputs.
async fn send(app: &TestApp, f: &Fixture, field: usize, text: &str) -> (String, reqwest::Response) {
    let seg = segment(text);
    let c = &app.client;
    let (case, req) = match field {
        0 => ("kid (heartbeat)", c.post(app.url("/api/v1/runners/heartbeat")).json(&json!({"attestation": jws_with_kid(text)}))),
        1 => ("kid (lease)", c.post(app.url("/api/v1/lease")).json(&json!({"attestation": jws_with_kid(text)}))),
        2 => ("kid (gate check)", c.post(app.url("/api/v1/gate/check")).bearer_auth(FORGE).json(&json!({"attestation": jws_with_kid(text)}))),
        3 => ("jti", c.post(app.url("/api/v1/runners/heartbeat")).json(&json!({"attestation": f.runner.attest(json!({"jti": format!("0123456789abcdef{text}")}))}))),
        4 => ("probe.error", c.post(app.url("/api/v1/lease")).json(&json!({"attestation": f.runner.attest(json!({"probe": {"ok": false, "error": format!("x{text}")}}))}))),
        5 => ("probe.runtime", c.post(app.url("/api/v1/runners/heartbeat")).json(&json!({"attestation": f.runner.attest(json!({"probe": {"runtime": format!("p{text}"), "runtime_version": text}}))}))),
        6 => ("image", c.post(app.url("/api/v1/runners/heartbeat")).json(&json!({"attestation": f.runner.attest(json!({"image": {"id": text, "digest": text, "ref": text}}))}))),
        7 => ("agent", c.post(app.url("/api/v1/runners/heartbeat")).json(&json!({"attestation": f.runner.attest(json!({"agent": {"name": text, "version": text, "hostname": text}}))}))),
        8 => ("runner id", c.get(app.url(&format!("/api/v1/admin/runners/{seg}"))).bearer_auth(ADMIN)),
        9 => ("runner id (cordon)", c.post(app.url(&format!("/api/v1/admin/runners/{seg}/cordon"))).bearer_auth(ADMIN)),
        10 => ("runner id (revoke)", c.post(app.url(&format!("/api/v1/admin/runners/{seg}/revoke"))).bearer_auth(ADMIN)),
        11 => ("job id", c.get(app.url(&format!("/api/v1/jobs/{seg}"))).bearer_auth(FORGE)),
        12 => ("job id (cancel)", c.post(app.url(&format!("/api/v1/jobs/{seg}/cancel"))).bearer_auth(FORGE)),
        13 => ("lease id", c.post(app.url(&format!("/api/v1/leases/{seg}/extend"))).bearer_auth(&f.lease.token)),
        14 => ("idempotency_key", c.post(app.url("/api/v1/jobs")).bearer_auth(FORGE).json(&json!({"pool": "linux", "idempotency_key": text}))),
        15 => ("pool in a job", c.post(app.url("/api/v1/jobs")).bearer_auth(FORGE).json(&json!({"pool": text}))),
        16 => ("pool name", c.put(app.url(&format!("/api/v1/admin/pools/{seg}"))).bearer_auth(ADMIN).json(&json!({"expected_image_ids": [IMAGE_A]}))),
        17 => ("image_ref", c.put(app.url("/api/v1/admin/pools/other")).bearer_auth(ADMIN).json(&json!({"image_ref": text, "expected_image_ids": [IMAGE_A]}))),
        18 => ("pool filter", c.get(app.url(&format!("/api/v1/admin/runners?pool={seg}"))).bearer_auth(ADMIN)),
        19 => ("runner name", c.post(app.url("/api/v1/runners")).json(&json!({"registration_token": "lgr_x", "name": text, "public_key": f.runner.key.public_jwk()}))),
        20 => ("label", c.post(app.url("/api/v1/runners")).json(&json!({"registration_token": "lgr_x", "name": "n", "labels": {text: text}, "public_key": f.runner.key.public_jwk()}))),
        21 => ("registration_token", c.post(app.url("/api/v1/runners")).json(&json!({"registration_token": text, "name": "n", "public_key": f.runner.key.public_jwk()}))),
        22 => ("public key", c.post(app.url("/api/v1/runners")).json(&json!({"registration_token": "lgr_x", "name": "n", "public_key": {"kty": text, "crv": text, "x": text}}))),
        23 => ("complete message", c.post(app.url(&format!("/api/v1/leases/{}/complete", f.lease.lease_id))).bearer_auth(&f.lease.token).json(&json!({"outcome": "failed", "message": text}))),
        24 => ("abandon reason", c.post(app.url("/api/v1/leases/unknown/abandon")).bearer_auth(&f.lease.token).json(&json!({"reason": text, "message": text}))),
        25 => ("page runner id", c.get(app.url(&format!("/admin/runners/{seg}"))).bearer_auth(ADMIN)),
        26 => ("page job id", c.get(app.url(&format!("/admin/jobs/{seg}"))).bearer_auth(ADMIN)),
        27 => ("page login", c.post(app.url("/admin/login")).form(&[("token", text)])),
        28 => ("job story", c.get(app.url(&format!("/api/v1/jobs/{}", f.job))).bearer_auth(FORGE)),
        _ => unreachable!(),
    };
    (case.to_string(), req.send().await.unwrap())
}

const FIELDS: usize = 29;

each_engine!(
    a_nul_anywhere_that_is_stored_or_looked_up_is_a_bad_request,
    no_string_in_any_field_is_answered_with_a_server_error,
);

async fn a_nul_anywhere_that_is_stored_or_looked_up_is_a_bad_request(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let f = fixture(&app).await;
    // Every field that names or identifies something; the rest are cleaned, not refused.
    for field in [
        0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 25, 26,
    ] {
        for nul in ["\u{0}", "a\u{0}b", "\u{1}", "\u{7f}"] {
            let (case, r) = send(&app, &f, field, nul).await;
            expect_problem(
                r,
                &format!("{case} with {nul:?}"),
                StatusCode::BAD_REQUEST,
                "bad_request",
            )
            .await;
        }
    }
    // Nothing was written behind them: the lease and job are as they were.
    let job = app.job(&f.job).await;
    assert_eq!(job["state"], "leased");
}

async fn no_string_in_any_field_is_answered_with_a_server_error(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let f = fixture(&app).await;
    let mut sampler = Sampler::deterministic();
    // Any text; text with controls, format and odd characters; long text.
    let texts = prop_oneof![
        any::<String>(),
        "[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}\\u{200b}-\\u{200f}\\u{202a}-\\u{202e}\\u{feff}a-z%/.]{0,40}",
        "[a-z\\x00]{100,3000}",
        Just(String::new()),
    ];
    for field in 0..FIELDS {
        for _ in 0..48 {
            let text = texts.new_tree(&mut sampler).unwrap().current();
            let (case, r) = send(&app, &f, field, &text).await;
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            assert!(
                status.as_u16() < 500,
                "{case} with {text:?}: {status} {body}"
            );
        }
    }
    // The service still works for the runner.
    assert_eq!(
        app.heartbeat(&f.runner.healthy()).await.status(),
        StatusCode::OK
    );
}

#[test]
fn segments_are_percent_encoded() {
    assert_eq!(segment("a\u{0}/b"), "a%00%2Fb");
}

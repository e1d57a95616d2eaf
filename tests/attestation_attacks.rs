//! An attack corpus for the attestation verifier, over the real listener: every way a JWS can
//! be forged, confused, stretched, truncated or replayed, each with the exact status and `code`
//! that PROTOCOL.md ("The attestation", rules 1–6) gives it, and proof that a rejected
//! attestation writes nothing.

use crate::common;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use leasegate::agent::keys::RunnerKey;
use reqwest::StatusCode;
use serde_json::{Value, json};

const TYP: &str = "leasegate-attestation+jwt";
const UNAUTHORIZED: StatusCode = StatusCode::UNAUTHORIZED;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn b64_json(v: &Value) -> String {
    b64(v.to_string().as_bytes())
}

/// The header an honest runner sends.
fn honest_header(kid: &str) -> Value {
    json!({"alg": "EdDSA", "typ": TYP, "kid": kid})
}

/// The runner's healthy claims with `patch` merged in (`null` removes a key).
fn claims_with(runner: &TestRunner, patch: Value) -> Value {
    let mut claims = runner.claims();
    merge(&mut claims, &patch);
    claims
}

/// A compact JWS with exactly `header` and `claims`, EdDSA-signed by `key` whatever the header says.
fn sign_raw(key: &RunnerKey, header: &Value, claims: &Value) -> String {
    sign_bytes(
        key,
        header.to_string().as_bytes(),
        claims.to_string().as_bytes(),
    )
}

/// A compact JWS over exactly these header and payload bytes, EdDSA-signed by `key`.
fn sign_bytes(key: &RunnerKey, header: &[u8], payload: &[u8]) -> String {
    let input = format!("{}.{}", b64(header), b64(payload));
    let signing = SigningKey::from_pkcs8_pem(&key.to_pkcs8_pem()).unwrap();
    let encoding = EncodingKey::from_ed_der(signing.to_pkcs8_der().unwrap().as_bytes());
    let signature =
        jsonwebtoken::crypto::sign(input.as_bytes(), &encoding, Algorithm::EdDSA).unwrap();
    format!("{input}.{signature}")
}

/// An HMAC-signed token (`alg` HS256/384/512) for `runner`, keyed with `secret`.
fn hmac_token(runner: &TestRunner, alg: Algorithm, secret: &[u8]) -> String {
    let mut header = Header::new(alg);
    header.typ = Some(TYP.into());
    header.kid = Some(runner.id.clone());
    jsonwebtoken::encode(&header, &runner.claims(), &EncodingKey::from_secret(secret)).unwrap()
}

/// Posts `token` as a heartbeat and asserts the problem; returns its body.
async fn heartbeat_rejected(
    app: &TestApp,
    case: &str,
    token: &str,
    status: StatusCode,
    code: &str,
) -> Value {
    expect_problem(app.heartbeat(token).await, case, status, code).await
}

/// `gate/check` for `token`, as the forge posts it.
async fn gate_check(app: &TestApp, token: &str) -> Value {
    let r = app
        .forge_post("/api/v1/gate/check", json!({"attestation": token}))
        .await;
    assert_eq!(r.status(), StatusCode::OK, "gate/check answers 200");
    r.json().await.unwrap()
}

/// A token rejected under rules 1–6 is rejected alike by the heartbeat, the lease and
/// `gate/check` (as a `refuse` there). Such a rejection writes nothing, so one token serves all.
async fn rejected_everywhere(
    app: &TestApp,
    case: &str,
    token: &str,
    status: StatusCode,
    code: &str,
) -> Value {
    let body = heartbeat_rejected(app, case, token, status, code).await;
    let lease = expect_problem(app.lease(token).await, case, status, code).await;
    assert_eq!(lease["detail"], body["detail"], "{case}: lease detail");
    let check = gate_check(app, token).await;
    assert_eq!(check["decision"], "refuse", "{case}: gate/check {check}");
    assert_eq!(check["code"], code, "{case}: gate/check {check}");
    body
}

/// Asserts that a heartbeat with `token` is accepted.
async fn accepted(app: &TestApp, case: &str, token: &str) -> Value {
    let r = app.heartbeat(token).await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{case}: {body}");
    body
}

/// Asserts that nothing at all was recorded for the runner.
async fn assert_nothing_recorded(app: &TestApp, runner: &TestRunner) {
    let detail = app.runner(&runner.id).await;
    assert!(
        detail["last_attestation_at"].is_null(),
        "an attestation was recorded: {detail}"
    );
    assert_eq!(detail["status"], "unknown", "{detail}");
    assert_eq!(detail["attestations"], json!([]), "{detail}");
    assert_eq!(detail["refusals"], json!([]), "{detail}");
    assert_eq!(detail["status_changes"], json!([]), "{detail}");
}

async fn with_runner(app: TestApp) -> (TestApp, TestRunner) {
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "victim").await;
    (app, runner)
}

each_engine!(
    alg_none_in_any_casing_is_invalid,
    hmac_keyed_with_the_public_key_is_invalid,
    other_alg_names_over_an_eddsa_signature_are_invalid,
    a_valid_token_from_an_unregistered_key_is_invalid,
    unknown_kid_is_indistinguishable_from_a_bad_signature,
    kid_and_typ_are_required_and_exact,
    audience_must_name_this_gatekeeper,
    iss_and_sub_must_both_be_the_kid,
    numeric_dates_must_be_numbers,
    required_claims_must_be_present_with_their_type,
    jti_is_16_to_128_characters,
    time_rules_answer_expired_and_lifetime_answers_invalid,
    probe_claims_are_checked_before_anything_is_recorded,
    a_jti_is_accepted_once_across_heartbeat_lease_and_gate_check,
    a_tampered_token_no_longer_verifies,
    malformed_compact_serialisations_are_invalid,
    rejected_attestations_write_nothing_and_spend_no_jti,
    short_image_ids_and_tags_are_bad_requests_and_record_nothing,
    a_runner_sending_more_than_its_row_holds_has_every_jti_refused_again,
    revoked_runner_is_refused_after_the_replay_check,
    duplicate_members_are_invalid,
    a_header_that_is_not_a_json_object_is_invalid,
    claims_that_are_not_a_json_object_are_invalid,
    claims_with_trailing_bytes_are_invalid,
    critical_header_extensions_are_invalid,
    weak_and_non_canonical_keys_are_refused_at_registration,
);

async fn alg_none_in_any_casing_is_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    for alg in ["none", "None", "NONE", "nOnE"] {
        let header = json!({"alg": alg, "typ": TYP, "kid": runner.id});
        let unsigned = format!("{}.{}.", b64_json(&header), b64_json(&runner.claims()));
        rejected_everywhere(
            &app,
            &format!("alg {alg:?}, empty signature"),
            &unsigned,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
        // The same header with a genuine signature of the runner is no better.
        let signed = sign_raw(&runner.key, &header, &runner.claims());
        rejected_everywhere(
            &app,
            &format!("alg {alg:?}, signed"),
            &signed,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
    }
    assert_nothing_recorded(&app, &runner).await;
}

async fn hmac_keyed_with_the_public_key_is_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let x = runner.key.public_x();
    let raw = URL_SAFE_NO_PAD.decode(&x).unwrap();
    assert_eq!(raw.len(), 32);
    let jwk = runner.key.public_jwk().to_string();
    let cases: [(&str, &[u8]); 3] = [
        ("raw public key bytes", &raw),
        ("base64url x", x.as_bytes()),
        ("the JWK text", jwk.as_bytes()),
    ];
    for (what, secret) in cases {
        for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            let token = hmac_token(&runner, alg, secret);
            rejected_everywhere(
                &app,
                &format!("{alg:?} keyed with {what}"),
                &token,
                UNAUTHORIZED,
                "attestation_invalid",
            )
            .await;
        }
    }
    assert_nothing_recorded(&app, &runner).await;
}

async fn other_alg_names_over_an_eddsa_signature_are_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    for alg in [
        "RS256", "RS512", "PS256", "ES256", "ES384", "ES512", "ES256K", "Ed25519", "Ed448",
        "eddsa", "EDDSA", "EdDSA ", " EdDSA",
    ] {
        let header = json!({"alg": alg, "typ": TYP, "kid": runner.id});
        let token = sign_raw(&runner.key, &header, &runner.claims());
        rejected_everywhere(
            &app,
            &format!("alg {alg:?}"),
            &token,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
    }
    // `alg` that is not a string, or absent.
    for header in [
        json!({"alg": ["EdDSA"], "typ": TYP, "kid": runner.id}),
        json!({"alg": null, "typ": TYP, "kid": runner.id}),
        json!({"typ": TYP, "kid": runner.id}),
    ] {
        let token = sign_raw(&runner.key, &header, &runner.claims());
        rejected_everywhere(
            &app,
            &format!("header {header}"),
            &token,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
    }
    assert_nothing_recorded(&app, &runner).await;
}

async fn a_valid_token_from_an_unregistered_key_is_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let attacker = RunnerKey::generate();
    let forged = attacker.sign_attestation(&runner.id, &runner.claims());
    rejected_everywhere(
        &app,
        "victim's kid, attacker's key",
        &forged,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    // Offering the attacker's key in the header ("alg/key from the token") changes nothing.
    for extra in [
        json!({"jwk": attacker.public_jwk()}),
        json!({"jku": "https://attacker.example/jwks.json"}),
        json!({"x5u": "https://attacker.example/cert.pem"}),
    ] {
        let mut header = honest_header(&runner.id);
        merge(&mut header, &extra);
        let token = sign_raw(&attacker, &header, &runner.claims());
        rejected_everywhere(
            &app,
            &format!("attacker key offered as {extra}"),
            &token,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
    }
    assert_nothing_recorded(&app, &runner).await;
}

async fn unknown_kid_is_indistinguishable_from_a_bad_signature(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let attacker = RunnerKey::generate();

    let bad_signature = attacker.sign_attestation(&runner.id, &runner.claims());
    let known = heartbeat_rejected(
        &app,
        "registered kid, bad signature",
        &bad_signature,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;

    let ghost = uuid::Uuid::now_v7().to_string();
    let upper = runner.id.to_uppercase();
    let upper_claims = claims_with(&runner, json!({"iss": upper, "sub": upper}));
    let mut ghost_claims = runner.claims();
    merge(&mut ghost_claims, &json!({"iss": ghost, "sub": ghost}));
    for (case, token) in [
        (
            "unknown kid signed by an unknown key",
            attacker.sign_attestation(&ghost, &ghost_claims),
        ),
        (
            "unknown kid signed by a registered runner's key",
            runner.key.sign_attestation(&ghost, &ghost_claims),
        ),
        (
            "unknown kid, claims naming the victim",
            attacker.sign_attestation(&ghost, &runner.claims()),
        ),
        (
            "the runner's id in upper case, signed by the runner",
            runner
                .key
                .sign_attestation(&runner.id.to_uppercase(), &upper_claims),
        ),
    ] {
        let unknown =
            heartbeat_rejected(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
        assert_eq!(
            unknown, known,
            "{case}: an unknown kid must answer exactly as a bad signature"
        );
        let lease = expect_problem(
            app.lease(&token).await,
            case,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
        assert_eq!(lease, known, "{case}: lease");
        let check = gate_check(&app, &token).await;
        let known_check = gate_check(&app, &bad_signature).await;
        assert_eq!(check, known_check, "{case}: gate/check");
    }

    // A signature mangled in place answers the same too.
    let good = runner.healthy();
    let (signing_input, signature) = good.rsplit_once('.').unwrap();
    let mut sig = URL_SAFE_NO_PAD.decode(signature).unwrap();
    sig[0] ^= 0x01;
    let flipped = format!("{signing_input}.{}", b64(&sig));
    let body = heartbeat_rejected(
        &app,
        "flipped signature bit",
        &flipped,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_eq!(body, known);
    assert_nothing_recorded(&app, &runner).await;
}

async fn kid_and_typ_are_required_and_exact(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let claims = runner.claims();
    for (case, header) in [
        ("missing kid", json!({"alg": "EdDSA", "typ": TYP})),
        ("empty kid", json!({"alg": "EdDSA", "typ": TYP, "kid": ""})),
        (
            "kid not a string",
            json!({"alg": "EdDSA", "typ": TYP, "kid": 1}),
        ),
        ("missing typ", json!({"alg": "EdDSA", "kid": runner.id})),
        (
            "typ JWT",
            json!({"alg": "EdDSA", "typ": "JWT", "kid": runner.id}),
        ),
        (
            "typ at+jwt",
            json!({"alg": "EdDSA", "typ": "at+jwt", "kid": runner.id}),
        ),
        (
            "typ in other case",
            json!({"alg": "EdDSA", "typ": "LEASEGATE-ATTESTATION+JWT", "kid": runner.id}),
        ),
        (
            "typ without +jwt",
            json!({"alg": "EdDSA", "typ": "leasegate-attestation", "kid": runner.id}),
        ),
    ] {
        let token = sign_raw(&runner.key, &header, &claims);
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
    }
    // The honest header, hand-built, is accepted: the corpus above differs only where it says.
    let honest = sign_raw(&runner.key, &honest_header(&runner.id), &runner.claims());
    accepted(&app, "hand-built honest token", &honest).await;
}

async fn audience_must_name_this_gatekeeper(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    for aud in [
        json!("other"),
        json!("leasegate "),
        json!("LEASEGATE"),
        json!(""),
        json!(["other"]),
        json!(["other", "another"]),
        json!([]),
        json!(5),
        json!({"aud": "leasegate"}),
    ] {
        let token = runner.attest(json!({"aud": aud}));
        rejected_everywhere(
            &app,
            &format!("aud {aud}"),
            &token,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
    }
    assert_nothing_recorded(&app, &runner).await;
    let body = accepted(
        &app,
        "aud array containing ours",
        &runner.attest(json!({"aud": ["other", "leasegate"]})),
    )
    .await;
    assert_eq!(body["status"], "healthy");
    accepted(
        &app,
        "aud array of ours alone",
        &runner.attest(json!({"aud": ["leasegate"]})),
    )
    .await;
}

async fn iss_and_sub_must_both_be_the_kid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "attacker").await;
    let victim = app.register("linux", "victim").await;
    for (case, patch) in [
        (
            "sub of another registered runner",
            json!({"sub": victim.id}),
        ),
        (
            "iss of another registered runner",
            json!({"iss": victim.id}),
        ),
        (
            "iss and sub of another registered runner",
            json!({"iss": victim.id, "sub": victim.id}),
        ),
        ("iss mismatch", json!({"iss": "https://leasegate.example"})),
        ("sub mismatch", json!({"sub": "someone-else"})),
        ("iss not a string", json!({"iss": 1})),
    ] {
        let token = runner.attest(patch);
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
    }
    // The victim's kid and claims, signed with the attacker's (registered) key.
    let confused = runner.key.sign_attestation(&victim.id, &victim.claims());
    rejected_everywhere(
        &app,
        "victim's kid and claims, another runner's key",
        &confused,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_nothing_recorded(&app, &runner).await;
    assert_nothing_recorded(&app, &victim).await;
}

async fn numeric_dates_must_be_numbers(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let now = now_s();
    for (case, patch) in [
        ("exp as a string", json!({"exp": (now + 60).to_string()})),
        ("iat as a string", json!({"iat": now.to_string()})),
        ("nbf as a string", json!({"nbf": now.to_string()})),
        (
            "iat as an RFC 3339 string",
            json!({"iat": "2026-01-01T00:00:00Z"}),
        ),
        ("exp as a boolean", json!({"exp": true})),
        ("exp negative", json!({"exp": -1})),
        ("exp absurdly large", json!({"exp": 1e300})),
        (
            "probe.checked_at as a string",
            json!({"probe": {"checked_at": now.to_string()}}),
        ),
    ] {
        let token = runner.attest(patch);
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
    }
    assert_nothing_recorded(&app, &runner).await;
    // Fractional NumericDates are numbers, and fine.
    let fractional = runner.attest(json!({"iat": now as f64 + 0.25, "exp": now as f64 + 60.5}));
    accepted(&app, "fractional NumericDates", &fractional).await;
}

async fn required_claims_must_be_present_with_their_type(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    for claim in ["jti", "exp", "aud", "iat", "probe", "iss", "sub"] {
        let token = runner.attest(json!({ claim: null }));
        rejected_everywhere(
            &app,
            &format!("missing {claim}"),
            &token,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
    }
    for field in ["ok", "runtime", "checked_at"] {
        let token = runner.attest(json!({"probe": { field: null }}));
        rejected_everywhere(
            &app,
            &format!("missing probe.{field}"),
            &token,
            UNAUTHORIZED,
            "attestation_invalid",
        )
        .await;
    }
    for (case, patch) in [
        ("probe.ok as a string", json!({"probe": {"ok": "true"}})),
        ("probe not an object", json!({"probe": true})),
        ("jti not a string", json!({"jti": 1234567890123456789_i64})),
    ] {
        let token = runner.attest(patch);
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
    }
    // Claims that are not a JSON object at all.
    let token = sign_raw(&runner.key, &honest_header(&runner.id), &json!("claims"));
    rejected_everywhere(
        &app,
        "claims a string",
        &token,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_nothing_recorded(&app, &runner).await;
}

async fn jti_is_16_to_128_characters(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    for (case, jti) in [
        ("jti of 15", "j".repeat(15)),
        ("jti of 129", "j".repeat(129)),
        ("empty jti", String::new()),
    ] {
        let token = runner.attest(json!({ "jti": jti }));
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
    }
    assert_nothing_recorded(&app, &runner).await;
    accepted(
        &app,
        "jti of 16",
        &runner.attest(json!({"jti": "k".repeat(16)})),
    )
    .await;
    accepted(
        &app,
        "jti of 128",
        &runner.attest(json!({"jti": "m".repeat(128)})),
    )
    .await;
}

async fn time_rules_answer_expired_and_lifetime_answers_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let now = now_s();
    for (case, patch) in [
        (
            "exp passed beyond the leeway",
            json!({"iat": now - 50, "exp": now - 35}),
        ),
        ("iat 80 s old", json!({"iat": now - 80, "exp": now + 60})),
        ("nbf 45 s in the future", json!({"nbf": now + 45})),
    ] {
        let token = runner.attest(patch);
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_expired").await;
    }
    // Past the leeway ahead, or past the maximum age and the leeway behind: the runner's clock
    // is the likeliest cause, and the answer says so, with the offset.
    for (case, patch, words) in [
        (
            "iat 45 s in the future",
            json!({"iat": now + 45, "exp": now + 100}),
            "s ahead of the server",
        ),
        (
            "iat 100 s old",
            json!({"iat": now - 100, "exp": now - 40}),
            "s behind the server",
        ),
    ] {
        let token = runner.attest(patch);
        let p = expect_problem(
            app.heartbeat(&token).await,
            case,
            UNAUTHORIZED,
            "clock_skew",
        )
        .await;
        assert!(p["detail"].as_str().unwrap().contains(words), "{case}: {p}");
        expect_problem(app.lease(&token).await, case, UNAUTHORIZED, "clock_skew").await;
    }
    for (case, patch) in [
        ("lifetime of 301 s", json!({"iat": now, "exp": now + 301})),
        (
            "lifetime of a day",
            json!({"iat": now - 10, "exp": now + 86_400}),
        ),
    ] {
        let token = runner.attest(patch);
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
    }
    // Rules apply in order: a bad signature or a bad claim outranks expiry.
    let attacker = RunnerKey::generate();
    let stale_forgery = attacker.sign_attestation(
        &runner.id,
        &claims_with(&runner, json!({"iat": now - 200, "exp": now - 150})),
    );
    heartbeat_rejected(
        &app,
        "expired and forged",
        &stale_forgery,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    let stale_wrong_aud =
        runner.attest(json!({"aud": "other", "iat": now - 200, "exp": now - 150}));
    heartbeat_rejected(
        &app,
        "expired, wrong aud",
        &stale_wrong_aud,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_nothing_recorded(&app, &runner).await;

    // Inside the leeways, all is well.
    for (case, patch) in [
        ("iat 20 s ahead", json!({"iat": now + 20, "exp": now + 80})),
        ("exp 20 s ago", json!({"iat": now - 50, "exp": now - 20})),
        ("nbf 20 s ahead", json!({"nbf": now + 20})),
        (
            "lifetime of exactly 300 s",
            json!({"iat": now, "exp": now + 300}),
        ),
        ("iat 50 s old", json!({"iat": now - 50, "exp": now + 10})),
    ] {
        accepted(&app, case, &runner.attest(patch)).await;
    }
}

async fn probe_claims_are_checked_before_anything_is_recorded(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let now = now_s();
    for (case, patch) in [(
        "probe.ok false without probe.error",
        json!({"probe": {"ok": false}}),
    )] {
        let token = runner.attest(patch);
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
    }
    let ahead = runner.attest(json!({"probe": {"checked_at": now + 60}}));
    for r in [app.heartbeat(&ahead).await, app.lease(&ahead).await] {
        let p = expect_problem(r, "probe.checked_at 60 s ahead", UNAUTHORIZED, "clock_skew").await;
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("s ahead of the server's"),
            "{p}"
        );
    }
    assert_nothing_recorded(&app, &runner).await;
    accepted(
        &app,
        "probe.checked_at 20 s ahead, inside the leeway",
        &runner.attest(json!({"probe": {"checked_at": now + 20}})),
    )
    .await;
}

async fn a_jti_is_accepted_once_across_heartbeat_lease_and_gate_check(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let token = runner.healthy();
    accepted(&app, "first use", &token).await;
    heartbeat_rejected(
        &app,
        "heartbeat replay",
        &token,
        UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;
    expect_problem(
        app.lease(&token).await,
        "heartbeat, then lease",
        UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;
    let check = gate_check(&app, &token).await;
    assert_eq!(check["decision"], "refuse");
    assert_eq!(check["code"], "attestation_replayed");

    // A fresh signature over other claims does not make an old jti new.
    let jti = runner.claims()["jti"].as_str().unwrap().to_string();
    accepted(&app, "fresh jti", &runner.attest(json!({"jti": jti}))).await;
    let resigned = runner.attest(json!({"jti": jti, "probe": {"runtime": "docker"}}));
    heartbeat_rejected(
        &app,
        "same jti, new claims",
        &resigned,
        UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;

    // Lease first, then heartbeat.
    let leased = runner.healthy();
    assert_eq!(app.lease(&leased).await.status(), StatusCode::NO_CONTENT);
    heartbeat_rejected(
        &app,
        "lease, then heartbeat",
        &leased,
        UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;

    // gate/check uses the jti up too.
    let checked = runner.healthy();
    assert_eq!(gate_check(&app, &checked).await["decision"], "allow");
    expect_problem(
        app.lease(&checked).await,
        "gate/check, then lease",
        UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;

    // A refused lease (rules 7–13) records the attestation, so its jti is spent as well.
    let failing = runner.failing("crun not found");
    expect_problem(
        app.lease(&failing).await,
        "refused lease",
        StatusCode::CONFLICT,
        "probe_failed",
    )
    .await;
    heartbeat_rejected(
        &app,
        "after a refusal",
        &failing,
        UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;
}

async fn a_tampered_token_no_longer_verifies(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let good = runner.healthy();
    let parts: Vec<&str> = good.split('.').collect();
    assert_eq!(parts.len(), 3);

    let mut claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["image"]["id"] = json!(IMAGE_B);
    let tampered_payload = format!("{}.{}.{}", parts[0], b64_json(&claims), parts[2]);
    rejected_everywhere(
        &app,
        "payload changed",
        &tampered_payload,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;

    let mut header: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
    header["cty"] = json!("JWT");
    let tampered_header = format!("{}.{}.{}", b64_json(&header), parts[1], parts[2]);
    rejected_everywhere(
        &app,
        "header changed",
        &tampered_header,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;

    let other = runner.healthy();
    let other_signature = other.rsplit('.').next().unwrap();
    let swapped = format!("{}.{}.{}", parts[0], parts[1], other_signature);
    rejected_everywhere(
        &app,
        "signature of another token",
        &swapped,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;

    let truncated = format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        &parts[2][..parts[2].len() - 4]
    );
    rejected_everywhere(
        &app,
        "signature truncated",
        &truncated,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_nothing_recorded(&app, &runner).await;
    // The untouched original still passes: nothing above spent its jti.
    accepted(&app, "original", &good).await;
}

async fn malformed_compact_serialisations_are_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let good = runner.healthy();
    let parts: Vec<&str> = good.split('.').collect();
    for (case, token) in [
        ("2 segments", format!("{}.{}", parts[0], parts[1])),
        ("4 segments", format!("{good}.{}", parts[2])),
        (
            "5 segments (JWE-shaped)",
            format!("{good}.{}.{}", parts[1], parts[2]),
        ),
        ("1 segment", parts[1].to_string()),
        ("empty string", String::new()),
        ("only dots", "..".to_string()),
        ("garbage base64", "!!!.???.***".to_string()),
        ("garbage header", format!("%%%%.{}.{}", parts[1], parts[2])),
        ("garbage payload", format!("{}.%%%%.{}", parts[0], parts[2])),
        (
            "garbage signature",
            format!("{}.{}.%%%%", parts[0], parts[1]),
        ),
        (
            "header is not JSON",
            format!("{}.{}.{}", b64(b"not json"), parts[1], parts[2]),
        ),
        ("leading whitespace", format!(" {good}")),
        ("a bearer prefix", format!("Bearer {good}")),
    ] {
        rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
    }
    assert_nothing_recorded(&app, &runner).await;
}

async fn rejected_attestations_write_nothing_and_spend_no_jti(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let job = app.enqueue("linux").await;
    let before = app.job(&job).await;
    let now = now_s();
    let jti = "0123456789abcdef-reused-jti";
    let attacker = RunnerKey::generate();
    let header_none = json!({"alg": "none", "typ": TYP, "kid": runner.id});
    let batch = [
        (
            "alg none",
            format!(
                "{}.{}.",
                b64_json(&header_none),
                b64_json(&claims_with(&runner, json!({"jti": jti})))
            ),
            UNAUTHORIZED,
            "attestation_invalid",
        ),
        (
            "foreign key",
            attacker.sign_attestation(&runner.id, &claims_with(&runner, json!({"jti": jti}))),
            UNAUTHORIZED,
            "attestation_invalid",
        ),
        (
            "wrong aud",
            runner.attest(json!({"jti": jti, "aud": "other"})),
            UNAUTHORIZED,
            "attestation_invalid",
        ),
        (
            "expired",
            runner.attest(json!({"jti": jti, "iat": now - 50, "exp": now - 35})),
            UNAUTHORIZED,
            "attestation_expired",
        ),
        (
            "failed probe without error",
            runner.attest(json!({"jti": jti, "probe": {"ok": false}})),
            UNAUTHORIZED,
            "attestation_invalid",
        ),
        (
            "short image id",
            runner.attest(json!({"jti": jti, "image": {"id": "abc123"}})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
    ];
    for (case, token, status, code) in &batch {
        heartbeat_rejected(&app, case, token, *status, code).await;
        expect_problem(app.lease(token).await, case, *status, code).await;
    }
    assert_nothing_recorded(&app, &runner).await;
    assert_eq!(
        app.job(&job).await,
        before,
        "a rejected lease touched the job"
    );

    // None of them was accepted, so their jti is still unused (rule 5: "never accepted before").
    let lease = app.lease(&runner.attest(json!({"jti": jti}))).await;
    assert_eq!(lease.status(), StatusCode::OK);
}

async fn short_image_ids_and_tags_are_bad_requests_and_record_nothing(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    for (case, image) in [
        ("short id", json!({"id": "abc123"})),
        ("12-character id", json!({"id": "aaaaaaaaaaaa"})),
        ("bare hex", json!({"id": "a".repeat(64)})),
        ("tag", json!({"id": "registry.example/ci/runner:stable"})),
        (
            "uppercase hex",
            json!({"id": format!("sha256:{}", "A".repeat(64))}),
        ),
        (
            "short digest",
            json!({"id": IMAGE_A, "digest": "sha256:abc"}),
        ),
        (
            "tag as digest",
            json!({"id": IMAGE_A, "digest": "ci/runner:stable"}),
        ),
    ] {
        let token = runner.attest(json!({ "image": image }));
        let body =
            heartbeat_rejected(&app, case, &token, StatusCode::BAD_REQUEST, "bad_request").await;
        assert!(
            body["detail"].as_str().unwrap().contains("image"),
            "{case}: the detail names the field: {body}"
        );
        expect_problem(
            app.lease(&token).await,
            case,
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    assert_nothing_recorded(&app, &runner).await;
}

async fn a_runner_sending_more_than_its_row_holds_has_every_jti_refused_again(
    engine: common::Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    // The row keeps a runner's 12 most recent jtis; a client hammering the endpoints within
    // one window spills older ones into a table, and every one of them stays spent.
    let (app, runner) = with_runner(app).await;
    let tokens: Vec<(String, String)> = (0..30)
        .map(|i| {
            let jti = format!("burst-{i}-{}", uuid::Uuid::now_v7());
            (jti.clone(), runner.attest(json!({ "jti": jti })))
        })
        .collect();
    for (i, (_, token)) in tokens.iter().enumerate() {
        if i % 2 == 0 {
            accepted(&app, "burst heartbeat", token).await;
        } else {
            assert_eq!(app.lease(token).await.status(), StatusCode::NO_CONTENT);
        }
    }
    for (jti, token) in &tokens {
        heartbeat_rejected(&app, jti, token, UNAUTHORIZED, "attestation_replayed").await;
        let check = gate_check(&app, token).await;
        assert_eq!(check["code"], "attestation_replayed", "{jti}");
        // Re-signed with other claims (and an invalid digest, answered after rule 5 without
        // a write): still the same spent jti.
        let resigned = runner.attest(json!({"jti": jti, "image": {"id": "abc123"}}));
        heartbeat_rejected(&app, jti, &resigned, UNAUTHORIZED, "attestation_replayed").await;
    }
    // They stay spent after a restart (SQLite reads the spill table back) and through a purge
    // while their windows last.
    let app = app.restart_with(|_| {}).await;
    app.sweep_ahead(0).await;
    for (jti, token) in &tokens {
        heartbeat_rejected(&app, jti, token, UNAUTHORIZED, "attestation_replayed").await;
    }
    // Once every window has ended, the purge forgets the 18 that spilled (30 accepted, 12 in
    // the row).
    let later = leasegate::domain::time::Millis::now().plus_secs(86_400);
    let swept = leasegate::sweeper::sweep_once(app.state.store(), app.state.metrics(), later)
        .await
        .unwrap();
    assert_eq!(swept.jtis_purged, 18);
}

async fn revoked_runner_is_refused_after_the_replay_check(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let used = runner.healthy();
    accepted(&app, "before revocation", &used).await;
    let r = app
        .admin_post(
            &format!("/api/v1/admin/runners/{}/revoke", runner.id),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let recorded_before = app.runner(&runner.id).await["attestations"].clone();

    // Rule 5 before rule 6: an already-used jti is a replay, revoked or not.
    heartbeat_rejected(
        &app,
        "revoked, used jti",
        &used,
        UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;
    expect_problem(
        app.lease(&used).await,
        "revoked, used jti",
        UNAUTHORIZED,
        "attestation_replayed",
    )
    .await;

    // A fresh attestation: 403 runner_revoked everywhere.
    let fresh = runner.healthy();
    rejected_everywhere(
        &app,
        "revoked, fresh jti",
        &fresh,
        StatusCode::FORBIDDEN,
        "runner_revoked",
    )
    .await;
    // Rule 6 comes before the digest check.
    let short = runner.attest(json!({"image": {"id": "abc123"}}));
    heartbeat_rejected(
        &app,
        "revoked, short image id",
        &short,
        StatusCode::FORBIDDEN,
        "runner_revoked",
    )
    .await;
    // Rules 1–4 still come first.
    let now = now_s();
    let expired = runner.attest(json!({"iat": now - 50, "exp": now - 35}));
    heartbeat_rejected(
        &app,
        "revoked, expired",
        &expired,
        UNAUTHORIZED,
        "attestation_expired",
    )
    .await;
    let forged = RunnerKey::generate().sign_attestation(&runner.id, &runner.claims());
    heartbeat_rejected(
        &app,
        "revoked, forged",
        &forged,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;

    let detail = app.runner(&runner.id).await;
    assert_eq!(detail["status"], "revoked");
    assert_eq!(
        detail["attestations"], recorded_before,
        "a revoked runner's attestation was recorded"
    );
    assert_eq!(detail["refusals"], json!([]));
}

async fn duplicate_members_are_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let victim = app.register("linux", "other").await;
    let id = &runner.id;
    let claims = runner.claims().to_string();
    // `alg` twice: whichever a parser keeps, the header is ambiguous.
    let header = format!(r#"{{"alg":"none","typ":"{TYP}","kid":"{id}","alg":"EdDSA"}}"#);
    let token = sign_bytes(&runner.key, header.as_bytes(), claims.as_bytes());
    rejected_everywhere(
        &app,
        "alg twice",
        &token,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    // `sub` twice, once naming another runner.
    let doubled = format!(r#"{{"sub":"{}",{}"#, victim.id, &claims[1..]);
    let token = sign_bytes(
        &runner.key,
        honest_header(id).to_string().as_bytes(),
        doubled.as_bytes(),
    );
    rejected_everywhere(
        &app,
        "sub twice",
        &token,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_nothing_recorded(&app, &runner).await;
}

async fn a_header_that_is_not_a_json_object_is_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let header = json!(["EdDSA", TYP, runner.id]);
    let token = sign_raw(&runner.key, &header, &runner.claims());
    rejected_everywhere(
        &app,
        "header a JSON array",
        &token,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_nothing_recorded(&app, &runner).await;
}

async fn claims_that_are_not_a_json_object_are_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let now = now_s();
    let jti = uuid::Uuid::now_v7().to_string();
    let claims = json!([
        runner.id, runner.id, "leasegate", now, now + 60, null, jti,
        [true, "podman", "4.3.1", now, null, null],
        {"id": IMAGE_A},
    ]);
    let token = sign_raw(&runner.key, &honest_header(&runner.id), &claims);
    rejected_everywhere(
        &app,
        "claims a JSON array",
        &token,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_nothing_recorded(&app, &runner).await;
}

async fn claims_with_trailing_bytes_are_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    let header = honest_header(&runner.id).to_string();
    let payload = format!("{} trailing", runner.claims());
    let token = sign_bytes(&runner.key, header.as_bytes(), payload.as_bytes());
    rejected_everywhere(
        &app,
        "claims followed by garbage",
        &token,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    let payload = format!("{}{}", runner.claims(), runner.claims());
    let token = sign_bytes(&runner.key, header.as_bytes(), payload.as_bytes());
    rejected_everywhere(
        &app,
        "two claims objects",
        &token,
        UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_nothing_recorded(&app, &runner).await;
}

async fn critical_header_extensions_are_invalid(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let (app, runner) = with_runner(app).await;
    for (case, extra) in [
        (
            "crit naming an extension",
            json!({"crit": ["foo"], "foo": 1}),
        ),
        ("crit, empty", json!({"crit": []})),
        (
            "an unencoded payload (RFC 7797)",
            json!({"crit": ["b64"], "b64": false}),
        ),
        ("b64 without crit", json!({"b64": false})),
    ] {
        let mut header = honest_header(&runner.id);
        merge(&mut header, &extra);
        let token = sign_raw(&runner.key, &header, &runner.claims());
        let body =
            rejected_everywhere(&app, case, &token, UNAUTHORIZED, "attestation_invalid").await;
        assert!(
            body["detail"].as_str().unwrap().contains("crit"),
            "{case}: {body}"
        );
    }
    assert_nothing_recorded(&app, &runner).await;
}

async fn weak_and_non_canonical_keys_are_refused_at_registration(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    // The eight small-order points (the identity among them) and the all-zero encoding.
    let small_order = [
        "0100000000000000000000000000000000000000000000000000000000000000",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000080",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
    ];
    // A point whose y is written as y + p: a second encoding of a real, strong key.
    let non_canonical = (0u8..19)
        .map(|y| {
            let mut bytes = [0xffu8; 32];
            bytes[0] = 0xed + y;
            bytes[31] = 0x7f;
            bytes
        })
        .find(|b| ed25519_dalek::VerifyingKey::from_bytes(b).is_ok_and(|k| !k.is_weak()))
        .expect("some y below 19 is on the curve");
    let mut cases: Vec<(String, [u8; 32], &str)> = small_order
        .iter()
        .map(|h| {
            (
                format!("small-order {h}"),
                hex::decode(h).unwrap().try_into().unwrap(),
                "weak",
            )
        })
        .collect();
    cases.push(("non-canonical y".into(), non_canonical, "canonical"));
    for (case, bytes, says) in cases {
        let token = app.registration_token("linux").await;
        let r = app
            .post(
                "/api/v1/runners",
                json!({"registration_token": token, "name": "weak",
                "public_key": {"kty": "OKP", "crv": "Ed25519", "x": b64(&bytes)}}),
            )
            .await;
        let body = expect_problem(r, &case, StatusCode::BAD_REQUEST, "bad_request").await;
        assert!(
            body["detail"].as_str().unwrap().contains(says),
            "{case}: {body}"
        );
    }
    let r = app.admin_get("/api/v1/admin/runners").await;
    assert_eq!(r.json::<Value>().await.unwrap()["runners"], json!([]));
}

//! The runner's endpoints: registration with a single-use token, and the signed heartbeat.

use super::auth::{Credential, throttled};
use super::forge_bindings::{ForgeRunnerSpec, identities};
use super::json::JsonBody;
use super::problem::Problem;
use super::views::{ExpectedImage, Heartbeat, Registered};
use crate::app::AppState;
use crate::client::Client;
use crate::domain::ids::RunnerId;
use crate::domain::text::plain_name;
use crate::domain::time::Millis;
use crate::domain::verdict::{refs_to_pull, state_current};
use crate::gate::Purpose;
use crate::problem::ApiError;
use crate::secrets::hash_token;
use crate::store::NewRunner;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use std::collections::BTreeMap;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/runners", post(register))
        .route("/api/v1/runners/heartbeat", post(heartbeat))
}

/// An Ed25519 public key as a JWK.
#[derive(Deserialize, utoipa::ToSchema)]
struct Jwk {
    #[schema(pattern = "^OKP$")]
    kty: String,
    #[schema(pattern = "^Ed25519$")]
    crv: String,
    /// The key's 32 bytes, base64url without padding (padding `=` is ignored): a valid
    /// point, not of small order, in its one canonical encoding.
    #[schema(pattern = "^[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]=*$")]
    x: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct RegisterBody {
    registration_token: String,
    name: String,
    public_key: Jwk,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// The forge runners on this machine, for the forge gate.
    #[serde(default)]
    forge_runners: Vec<ForgeRunnerSpec>,
}

/// The `x` of an Ed25519 public JWK, checked to be a valid curve point.
fn ed25519_x(jwk: &Jwk) -> Result<String, ApiError> {
    if jwk.kty != "OKP" || jwk.crv != "Ed25519" {
        return Err(ApiError::bad_request(
            "public_key: must be a JWK with kty OKP and crv Ed25519",
        ));
    }
    let bytes = URL_SAFE_NO_PAD
        .decode(jwk.x.trim_end_matches('='))
        .map_err(|_| ApiError::bad_request("public_key.x: not base64url"))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| ApiError::bad_request("public_key.x: an Ed25519 public key is 32 bytes"))?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes)
        .map_err(|_| ApiError::bad_request("public_key.x: not a valid Ed25519 public key"))?;
    // A small-order key verifies forged signatures under the plain Ed25519 check; and a
    // point has one encoding, so that one key cannot be registered under two.
    if key.is_weak() {
        return Err(ApiError::bad_request(
            "public_key.x: a small-order (weak) Ed25519 key; generate a real key pair",
        ));
    }
    if key.to_edwards().compress().to_bytes() != bytes {
        return Err(ApiError::bad_request(
            "public_key.x: not the canonical encoding of an Ed25519 public key",
        ));
    }
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if name.trim().is_empty() || name.chars().count() > 128 {
        return Err(ApiError::bad_request("name: 1-128 printable characters"));
    }
    plain_name("name", name)?;
    Ok(())
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if labels.len() > 64 {
        return Err(ApiError::bad_request("labels: at most 64 labels"));
    }
    for (k, v) in labels {
        let printable = plain_name("labels", k).and_then(|_| plain_name("labels", v));
        // Counted in characters, as JSON Schema's `maxLength` counts them.
        let (klen, vlen) = (k.chars().count(), v.chars().count());
        if k.is_empty() || klen > 128 || vlen > 1024 || printable.is_err() {
            // The key is shown only once it is known to be plain.
            let key = if printable.is_ok() { k.as_str() } else { "…" };
            return Err(ApiError::bad_request(format!(
                "labels.{key}: keys 1-128 characters, values at most 1024, no control or \
                 invisible format characters"
            )));
        }
    }
    Ok(())
}

#[utoipa::path(post, path = "/api/v1/runners", tag = "runners",
    request_body = RegisterBody,
    responses(
        (status = 201, description = "Registered.", body = Registered),
        (status = 400, description = "`bad_request`: a bad name, labels or public key (checked before the token).", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`registration_token_invalid`: unknown, used or expired.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`runner_exists`: the name is taken in the pool; `forge_runner_taken`: a forge runner is bound to another runner. Nothing is spent.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn register(
    State(state): State<AppState>,
    client: Client,
    JsonBody(body): JsonBody<RegisterBody>,
) -> Result<(StatusCode, Json<Registered>), ApiError> {
    check_name(&body.name)?;
    check_labels(&body.labels)?;
    let public_key_x = ed25519_x(&body.public_key)?;
    let forge_runners = identities(&body.forge_runners)?;
    let new = NewRunner {
        forge_runners,
        id: RunnerId::generate(),
        name: body.name,
        labels: body.labels,
        public_key_x,
    };
    let token_hash = hash_token(&body.registration_token);
    let runner = throttled(&state, client, Credential::Registration, async {
        Ok(state
            .store()
            .register_runner(&token_hash, new, Millis::now())
            .await?)
    })
    .await?;
    tracing::info!(runner_id = %runner.id, pool = %runner.pool, name = %runner.name, "runner registered");
    let s = state.settings();
    Ok((
        StatusCode::CREATED,
        Json(Registered {
            runner_id: runner.id,
            pool: runner.pool,
            audience: s.rules.audience.clone(),
            heartbeat_interval_s: s.heartbeat_interval_s,
            attestation_max_age_s: s.rules.max_age_s,
            probe_max_age_s: s.probe_max_age_s,
        }),
    ))
}

/// A signed attestation (a JWT, see PROTOCOL.md).
#[derive(Deserialize, utoipa::ToSchema)]
pub struct AttestationBody {
    pub attestation: String,
}

#[utoipa::path(post, path = "/api/v1/runners/heartbeat", tag = "runners",
    request_body = AttestationBody,
    responses(
        (status = 200, description = "Recorded, with the runner's status as a lease would judge it.", body = Heartbeat),
        (status = 400, description = "`bad_request`: a malformed body or a bad digest.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Rules 1-5: `attestation_invalid`, `attestation_expired`, `attestation_replayed`.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`runner_revoked`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn heartbeat(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<AttestationBody>,
) -> Result<Json<Heartbeat>, ApiError> {
    let turn = state.gate().turn().await;
    let now = Millis::now();
    let admitted = state
        .gate()
        .admit(turn, &body.attestation, Purpose::Heartbeat, now)
        .await?;
    let attested = admitted.state();
    let current = state_current(&attested, &admitted.pool);
    let pull = refs_to_pull(&attested, &admitted.pool);
    let expected_images = admitted
        .pool
        .images
        .iter()
        .filter(|i| pull.contains(&i.image_ref))
        .map(|i| ExpectedImage {
            image_ref: i.image_ref.clone(),
            expected_image_ids: i.expected_image_ids.clone(),
        })
        .collect();
    let refusal = admitted.verdict.as_ref().err();
    Ok(Json(Heartbeat {
        runner_id: admitted.runner.id.clone(),
        status: admitted.status().as_str().to_string(),
        code: refusal.map(|r| r.code().to_string()),
        detail: refusal.map(|r| r.detail()),
        expected_image_ids: admitted.pool.expected_image_ids.clone(),
        image_current: current,
        next_heartbeat_s: state.settings().heartbeat_interval_s,
        action: if current == Some(false) {
            "recycle"
        } else {
            "none"
        }
        .to_string(),
        pull,
        expected_images,
    }))
}

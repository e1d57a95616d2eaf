//! Credential extractors, one per party: `AdminAuth`, `ForgeAuth`, and `LeaseBearer`.
//!
//! A valid credential of another party is 403 `forbidden` (it is known who is asking, and
//! they may not); anything else is 401 `unauthorized`.

use super::problem::ApiError;
use crate::app::AppState;
use crate::secrets::secret_matches;
use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// An operator: the admin bearer token.
pub struct AdminAuth;

/// The forge: the forge bearer token.
pub struct ForgeAuth;

/// The bearer token presented on a lease call (checked against the lease by the store).
pub struct LeaseBearer(pub String);

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let secrets = state.secrets();
        match bearer(parts) {
            Some(t) if secret_matches(t, &secrets.admin) => Ok(AdminAuth),
            Some(t) if secret_matches(t, &secrets.forge) => Err(ApiError::forbidden(
                "the forge token cannot call admin endpoints",
            )),
            _ => Err(ApiError::unauthorized("an admin bearer token is required")),
        }
    }
}

impl FromRequestParts<AppState> for ForgeAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let secrets = state.secrets();
        match bearer(parts) {
            Some(t) if secret_matches(t, &secrets.forge) => Ok(ForgeAuth),
            Some(t) if secret_matches(t, &secrets.admin) => Err(ApiError::forbidden(
                "the admin token cannot call forge endpoints",
            )),
            _ => Err(ApiError::unauthorized("a forge bearer token is required")),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for LeaseBearer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        bearer(parts)
            .map(|t| LeaseBearer(t.to_string()))
            .ok_or_else(|| {
                ApiError::new(
                    axum::http::StatusCode::UNAUTHORIZED,
                    "lease_token_invalid",
                    "the lease token is required as a bearer token",
                )
            })
    }
}

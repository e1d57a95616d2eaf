//! Credential extractors, one per party: the operators' `AsViewer`, `AsOperator` and
//! `AsAdmin` (an operator's token whose role allows what the route needs), `ForgeAuth`,
//! `MetricsAuth` and `LeaseBearer`, and `throttled`, which every credential check runs under.
//!
//! An operator's token is the configured admin token (the admin `bootstrap`, current or
//! previous value) or a named token from the store, looked up by its hash on every request so
//! that a revocation holds at once on every replica. A valid credential that may not do what
//! it asks (a viewer's write, the forge token on an admin route) is 403 `forbidden`; anything
//! else is 401 `unauthorized`, and counts against the client in the throttle (`crate::throttle`):
//! a client past its allowance is answered 429 before its credential is looked at.
//!
//! Each is an extractor of the request's parts, which axum runs before the one extractor that
//! reads the body (`JsonBody`), so a request with a bad credential never has its body parsed.

use crate::app::AppState;
use crate::client::Client;
use crate::domain::audit::{Action, Entry};
use crate::domain::operator::{Operator, Role};
use crate::domain::time::Millis;
use crate::problem::ApiError;
use crate::secrets::{hash_token, secret_matches};
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use std::marker::PhantomData;

/// The credentials the throttle counts failures of, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    Admin,
    Forge,
    Metrics,
    PageLogin,
    Registration,
    Lease,
}

impl Credential {
    pub fn as_str(self) -> &'static str {
        match self {
            Credential::Admin => "admin",
            Credential::Forge => "forge",
            Credential::Metrics => "metrics",
            Credential::PageLogin => "page_login",
            Credential::Registration => "registration",
            Credential::Lease => "lease",
        }
    }
}

/// `Some(seconds to wait)` when `client` may not present a credential now (counted).
pub fn throttle_wait(state: &AppState, client: Client, credential: Credential) -> Option<i64> {
    let wait_s = state.throttle().blocked(client.ip, Millis::now())?;
    state.metrics().auth_throttled(credential.as_str());
    Some(wait_s)
}

/// Counts a failed credential check of `client`, and says so once when it is throttled.
pub fn credential_failed(state: &AppState, client: Client, credential: Credential) {
    state.metrics().auth_failed(credential.as_str());
    if state.throttle().failed(client.ip, Millis::now()) {
        tracing::warn!(
            client = %client.ip,
            credential = credential.as_str(),
            "failed credential checks from this client are throttled"
        );
    }
}

/// Runs `check`, a credential check for `client`, under the throttle: refused with 429 at once
/// when the client has no failures left, and a 401 from it counted as a failure.
pub async fn throttled<T, F>(
    state: &AppState,
    client: Client,
    credential: Credential,
    check: F,
) -> Result<T, ApiError>
where
    F: Future<Output = Result<T, ApiError>>,
{
    if let Some(wait_s) = throttle_wait(state, client, credential) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "throttled",
            "too many failed credentials from this address; retry later",
        )
        .retry_after(wait_s));
    }
    let result = check.await;
    if let Err(e) = &result
        && e.status == StatusCode::UNAUTHORIZED
    {
        credential_failed(state, client, credential);
    }
    result
}

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The forge: the forge bearer token.
pub struct ForgeAuth;

/// The bearer token presented on a lease call (checked against the lease by the store).
pub struct LeaseBearer(pub String);

/// `/metrics`, when `LEASEGATE_METRICS_TOKEN` is set: that bearer token.
pub struct MetricsAuth;

async fn client(parts: &mut Parts, state: &AppState) -> Client {
    match Client::from_request_parts(parts, state).await {
        Ok(c) => c,
        Err(never) => match never {},
    }
}

/// The operator a bearer token is: the configured admin token's `bootstrap`, or the named
/// token's operator; `None` for anything else.
pub async fn operator_of(state: &AppState, token: &str) -> Result<Option<Operator>, ApiError> {
    if state.secrets().is_admin(token) {
        return Ok(Some(Operator::bootstrap()));
    }
    Ok(state.store().operator_by_token(&hash_token(token)).await?)
}

/// Who asks, and from where: what an audit entry is made of.
#[derive(Clone, Debug)]
pub struct Caller {
    pub operator: Operator,
    pub client: Client,
}

impl Caller {
    /// The audit entry of `action` on `target` by this caller at `now`.
    pub fn audit(&self, action: Action, target: impl Into<String>, now: Millis) -> Entry {
        Entry {
            at: now,
            actor: self.operator.name.to_string(),
            action,
            target: target.into(),
            detail: None,
            client: self.client.ip.to_string(),
        }
    }
}

/// The role a route needs, as a type: `Authorized<Writes>` is an operator's extractor.
pub trait Needs: Send + Sync {
    const ROLE: Role;
}

/// Reading the admin API: any operator's token.
pub struct Reads;
/// Changing runners, pools, registration tokens, resolutions.
pub struct Writes;
/// Managing operators' tokens.
pub struct Manages;

impl Needs for Reads {
    const ROLE: Role = Role::Viewer;
}
impl Needs for Writes {
    const ROLE: Role = Role::Operator;
}
impl Needs for Manages {
    const ROLE: Role = Role::Admin;
}

/// An operator whose role allows what `N` needs.
pub struct Authorized<N> {
    pub caller: Caller,
    needs: PhantomData<N>,
}

pub type AsViewer = Authorized<Reads>;
pub type AsOperator = Authorized<Writes>;
pub type AsAdmin = Authorized<Manages>;

impl<N> std::ops::Deref for Authorized<N> {
    type Target = Caller;

    fn deref(&self) -> &Caller {
        &self.caller
    }
}

impl<N: Needs> FromRequestParts<AppState> for Authorized<N> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let client = client(parts, state).await;
        let secrets = state.secrets();
        let operator = throttled(state, client, Credential::Admin, async {
            let Some(token) = bearer(parts) else {
                return Err(ApiError::unauthorized(
                    "an operator's bearer token is required",
                ));
            };
            if secrets.is_forge(token) {
                return Err(ApiError::forbidden(
                    "the forge token cannot call admin endpoints",
                ));
            }
            operator_of(state, token)
                .await?
                .ok_or_else(|| ApiError::unauthorized("an operator's bearer token is required"))
        })
        .await?;
        if !operator.may(N::ROLE) {
            return Err(ApiError::forbidden(format!(
                "{} is a {}; this needs the {} role",
                operator.name,
                operator.role,
                N::ROLE
            )));
        }
        Ok(Authorized {
            caller: Caller { operator, client },
            needs: PhantomData,
        })
    }
}

impl FromRequestParts<AppState> for ForgeAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let client = client(parts, state).await;
        let secrets = state.secrets();
        throttled(state, client, Credential::Forge, async {
            match bearer(parts) {
                Some(t) if secrets.is_forge(t) => Ok(ForgeAuth),
                Some(t) if secrets.is_admin(t) => Err(ApiError::forbidden(
                    "the admin token cannot call forge endpoints",
                )),
                _ => Err(ApiError::unauthorized("a forge bearer token is required")),
            }
        })
        .await
    }
}

impl FromRequestParts<AppState> for MetricsAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(token) = state.settings().metrics_token.as_deref() else {
            return Ok(MetricsAuth);
        };
        let client = client(parts, state).await;
        throttled(state, client, Credential::Metrics, async {
            match bearer(parts) {
                Some(t) if secret_matches(t, token) => Ok(MetricsAuth),
                _ => Err(ApiError::unauthorized(
                    "the metrics bearer token is required",
                )),
            }
        })
        .await
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

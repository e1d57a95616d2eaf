//! The one error type of what the service answers over HTTP: RFC 9457 problem details with a
//! stable `code`.
//!
//! Every error leaves the service as `application/problem+json` with `type`, `title`,
//! `status`, `detail` and `code`. Server faults are logged here and never leak internals.
//! The API (`http`) and the forge gate (`forge_gate`) both answer with it, so it lives beside
//! neither.

use crate::gate::AdmitError;
use crate::store::{CancelError, EnqueueError, LeaseCallFailure, RegisterError, StoreError};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub const PROBLEM_JSON: &str = "application/problem+json";

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
    pub retry_after_s: Option<i64>,
    /// Members of the problem beyond the standard ones (RFC 9457 "extension members") that a
    /// client acts on, such as the `github_runner_id` a runner already holds.
    pub extensions: Vec<(&'static str, serde_json::Value)>,
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    code: &'a str,
    #[serde(flatten)]
    extensions: serde_json::Map<String, serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            detail: detail.into(),
            retry_after_s: None,
            extensions: Vec::new(),
        }
    }

    pub fn retry_after(mut self, secs: i64) -> Self {
        self.retry_after_s = Some(secs.max(1));
        self
    }

    /// The problem with the extension member `name`.
    pub fn with(mut self, name: &'static str, value: impl Into<serde_json::Value>) -> Self {
        self.extensions.push((name, value.into()));
        self
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such {what}"),
        )
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    /// A request body that arrived too slowly (`listener::body`). The connection is
    /// closed after the answer: the rest of the body may still be on its way.
    pub fn request_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "the request body arrived too slowly",
        )
    }

    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, detail)
    }

    pub fn unprocessable(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, detail)
    }

    /// The problem a framework-level status stands for (unknown route, wrong method, …).
    pub fn from_status(status: StatusCode, detail: impl Into<String>) -> Self {
        let code = match status {
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            StatusCode::REQUEST_TIMEOUT => "request_timeout",
            StatusCode::TOO_MANY_REQUESTS => "throttled",
            s if s.is_server_error() => "internal",
            _ => "bad_request",
        };
        Self::new(status, code, detail)
    }

    fn title(&self) -> &'static str {
        self.status.canonical_reason().unwrap_or("Error")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Problem {
            kind: format!("urn:leasegate:problem:{}", self.code),
            title: self.title(),
            status: self.status.as_u16(),
            detail: &self.detail,
            code: self.code,
            extensions: self
                .extensions
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::REQUEST_TIMEOUT {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) => {
                tracing::warn!(error = %m, "database unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the database is unavailable; retry later",
                )
                .retry_after(5)
            }
            StoreError::Conflict(m) => {
                tracing::warn!(error = %m, "a write conflicted with others until its retries ran out");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the database is busy with conflicting writes; retry",
                )
                .retry_after(1)
            }
            StoreError::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

impl From<crate::domain::text::BadText> for ApiError {
    fn from(e: crate::domain::text::BadText) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

/// How soon a runner whose clock is off should try again (`Retry-After` of `clock_skew`).
pub const CLOCK_SKEW_RETRY_S: i64 = 30;

impl From<AdmitError> for ApiError {
    fn from(e: AdmitError) -> Self {
        let code = e.code();
        match e {
            AdmitError::Invalid(d) | AdmitError::Expired(d) => {
                ApiError::new(StatusCode::UNAUTHORIZED, code, d)
            }
            AdmitError::Replayed => ApiError::new(StatusCode::UNAUTHORIZED, code, e.to_string()),
            // Transient for the runner: it retries once its clock is set right.
            AdmitError::ClockSkew(d) => {
                ApiError::new(StatusCode::UNAUTHORIZED, code, d).retry_after(CLOCK_SKEW_RETRY_S)
            }
            AdmitError::Revoked => ApiError::new(StatusCode::FORBIDDEN, code, e.to_string()),
            AdmitError::BadRequest(d) => ApiError::bad_request(d),
            AdmitError::Store(s) => s.into(),
        }
    }
}

impl From<RegisterError> for ApiError {
    fn from(e: RegisterError) -> Self {
        match e {
            RegisterError::TokenInvalid => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "registration_token_invalid",
                e.to_string(),
            ),
            RegisterError::NameTaken => ApiError::conflict("runner_exists", e.to_string()),
            RegisterError::ForgeRunnerTaken(_) => {
                ApiError::conflict("forge_runner_taken", e.to_string())
            }
            RegisterError::Store(s) => s.into(),
        }
    }
}

impl From<crate::store::BindError> for ApiError {
    fn from(e: crate::store::BindError) -> Self {
        use crate::store::BindError;
        match e {
            BindError::Taken(_) => ApiError::conflict("forge_runner_taken", e.to_string()),
            BindError::Revoked => ApiError::conflict("runner_revoked", e.to_string()),
            BindError::Store(s) => s.into(),
        }
    }
}

impl From<LeaseCallFailure> for ApiError {
    fn from(e: LeaseCallFailure) -> Self {
        use crate::domain::lease::LeaseCallError as E;
        match e {
            LeaseCallFailure::TokenInvalid => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "lease_token_invalid",
                e.to_string(),
            ),
            LeaseCallFailure::Rejected(r) => {
                let status = match r {
                    E::Expired => StatusCode::GONE,
                    E::RunnerRevoked => StatusCode::FORBIDDEN,
                    E::Finished | E::Started | E::NotStarted | E::JobCancelled => {
                        StatusCode::CONFLICT
                    }
                };
                ApiError::new(status, r.code(), r.to_string())
            }
            LeaseCallFailure::Store(s) => s.into(),
        }
    }
}

impl From<EnqueueError> for ApiError {
    fn from(e: EnqueueError) -> Self {
        match e {
            EnqueueError::UnknownPool => {
                ApiError::unprocessable("unknown_pool", "no pool of that name")
            }
            EnqueueError::Store(s) => s.into(),
        }
    }
}

impl From<CancelError> for ApiError {
    fn from(e: CancelError) -> Self {
        match e {
            CancelError::Finished(_) => ApiError::conflict("job_finished", e.to_string()),
            CancelError::Store(s) => s.into(),
        }
    }
}

impl From<crate::store::TokenError> for ApiError {
    fn from(e: crate::store::TokenError) -> Self {
        use crate::store::TokenError;
        match e {
            TokenError::NameTaken => ApiError::conflict("token_name_taken", e.to_string()),
            TokenError::Store(s) => s.into(),
        }
    }
}

impl From<crate::store::PoolDeleteError> for ApiError {
    fn from(e: crate::store::PoolDeleteError) -> Self {
        use crate::store::PoolDeleteError;
        match e {
            PoolDeleteError::NotFound => ApiError::not_found("pool"),
            PoolDeleteError::InUse { .. } => ApiError::conflict("pool_in_use", e.to_string()),
            PoolDeleteError::Store(s) => s.into(),
        }
    }
}

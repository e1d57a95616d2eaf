//! The API's problems: `Problem`, the schema of every error in the OpenAPI document, and the
//! layer that makes what axum answers by itself (unknown route, wrong method, a body too
//! large, a path that does not parse) a problem like every other error. The error itself,
//! `ApiError`, is `crate::problem`'s: the forge gate answers with it too.

use crate::problem::{ApiError, PROBLEM_JSON};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// An RFC 9457 problem, the body of every error (`application/problem+json`).
// It describes what `ApiError` renders and is never constructed.
#[allow(dead_code)]
#[derive(Serialize, ToSchema)]
pub struct Problem {
    /// `urn:leasegate:problem:<code>`.
    #[serde(rename = "type")]
    #[schema(example = "urn:leasegate:problem:probe_failed")]
    pub kind: String,
    /// The HTTP reason phrase.
    #[schema(example = "Conflict")]
    pub title: String,
    /// The HTTP status.
    #[schema(example = 409)]
    pub status: u16,
    /// For people; for a probe failure it quotes the container runtime.
    pub detail: String,
    /// Stable snake_case code that clients branch on.
    #[schema(example = "probe_failed")]
    pub code: String,
}

/// Whether `response` is a framework's error (unknown route, wrong method, body too large, a
/// path or query that does not parse) that `problem_for_framework_errors` makes a problem.
pub fn is_framework_error(response: &Response) -> bool {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    let is_html = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
    let is_error = status.is_client_error() || status.is_server_error();
    // The health page answers its own errors in HTML; leave those alone.
    is_error && !is_problem && !is_html && !response.headers().contains_key(header::LOCATION)
}

/// Turns framework answers into problems, so that every error a client sees has the same
/// shape.
pub async fn problem_for_framework_errors(response: Response) -> Response {
    if !is_framework_error(&response) {
        return response;
    }
    let status = response.status();
    let detail = match axum::body::to_bytes(response.into_body(), 4096).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    ApiError::from_status(status, detail).into_response()
}

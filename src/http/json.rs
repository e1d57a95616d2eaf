//! A JSON body extractor whose every failure is a problem naming the field.
//!
//! Unlike `axum::Json` it does not insist on a `Content-Type` (runner scripts often omit it),
//! and its errors say where in the body the problem is, e.g. `wait_s: invalid type: string`.
//! `OptionalJson` treats an empty body as the type's default, for calls whose body is optional.

use super::problem::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

pub struct JsonBody<T>(pub T);

pub struct OptionalJson<T>(pub T);

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if super::listener::body::is_body_timeout(&rejection) {
            return ApiError::request_timeout();
        }
        ApiError::from_status(rejection.status(), rejection.body_text())
    })
}

/// The whole body as `T`: a malformed document, or anything after it, is a bad request that
/// names where the problem is.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::bad_request(format!("body: {inner}"))
        } else {
            ApiError::bad_request(format!("{path}: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("body: {e}")))?;
    Ok(value)
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read_body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request("body: a JSON object is required"));
        }
        Ok(JsonBody(parse(&bytes)?))
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read_body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        Ok(OptionalJson(parse(&bytes)?))
    }
}

//! A JSON body extractor whose every failure is a problem naming the field.
//!
//! Unlike `axum::Json` it does not insist on a `Content-Type` (runner scripts often omit it),
//! and its errors say where in the body the problem is, e.g. `wait_s: invalid type: string`.
//! `OptionalJson` treats an empty body as the type's default, for calls whose body is optional.
//! Every body of the API is an object: serde would read a struct from an array too, so
//! anything else is refused before it is read. `whole_number` reads the integers of a body as
//! JSON Schema defines them, so that `22.0` is the `22` the OpenAPI document allows.

use crate::problem::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

pub struct JsonBody<T>(pub T);

pub struct OptionalJson<T>(pub T);

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if crate::listener::body::is_body_timeout(&rejection) {
            return ApiError::request_timeout();
        }
        ApiError::from_status(rejection.status(), rejection.body_text())
    })
}

/// The whole body as `T`: a malformed document, anything after it, or a document that is not
/// an object, is a bad request that names where the problem is.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("body: a JSON object is required"));
    }
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

/// `value` as `T`, with `parse`'s answers (less the line and column, which would point into a
/// document the client never sent: a merge patch's result).
pub fn parse_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::bad_request("body: a JSON object is required"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::bad_request(format!("body: {inner}"))
        } else {
            ApiError::bad_request(format!("{path}: {inner}"))
        }
    })
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

/// An optional integer field, read as JSON Schema reads an integer: a number with no
/// fractional part (`3` or `3.0`). A fraction, or a number outside `i64`, is refused.
pub fn whole_number<'de, D>(deserializer: D) -> Result<Option<i64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::Deserialize;
    let Some(n) = Option::<serde_json::Number>::deserialize(deserializer)? else {
        return Ok(None);
    };
    whole(&n)
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("expected a whole number, found {n}")))
}

/// `n` as an `i64` when it is a whole number in range.
pub fn whole(n: &serde_json::Number) -> Option<i64> {
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    let f = n.as_f64()?;
    // `i64::MAX as f64` rounds up to 2^63, which is out of range: hence `<`.
    (f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64).then_some(f as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_are_integers_with_or_without_a_point() {
        let n = |s: &str| serde_json::from_str::<serde_json::Number>(s).unwrap();
        assert_eq!(whole(&n("22")), Some(22));
        assert_eq!(whole(&n("22.0")), Some(22));
        assert_eq!(whole(&n("-3.0")), Some(-3));
        assert_eq!(whole(&n("22.5")), None);
        assert_eq!(whole(&n("1e300")), None);
        assert_eq!(whole(&n("18446744073709551615")), None);
    }

    #[test]
    fn a_body_is_an_object() {
        #[derive(serde::Deserialize, Debug)]
        struct B {
            #[allow(dead_code)]
            a: Option<String>,
        }
        assert!(parse::<B>(b" {\"a\": \"x\"}").is_ok());
        assert!(parse::<B>(b"[\"x\"]").is_err());
        assert!(parse::<B>(b"null").is_err());
    }
}

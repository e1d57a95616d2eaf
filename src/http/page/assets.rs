//! The page's stylesheet and script, embedded in the binary, so that the page needs nothing
//! beside the service.

use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut().insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    r
}

#[utoipa::path(get, path = "/admin/assets/app.css", tag = "page",
    responses(
        (status = 200, description = "The page's stylesheet.", body = String, content_type = "text/css"),
    ))]
pub(super) async fn css() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../../../assets/app.css"),
    )
}

#[utoipa::path(get, path = "/admin/assets/app.js", tag = "page",
    responses(
        (status = 200, description = "The page's script.", body = String, content_type = "text/javascript"),
    ))]
pub(super) async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../../../assets/app.js"),
    )
}

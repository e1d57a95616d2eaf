//! The HTTP surface: one router per party, assembled here with the layers every request
//! passes through (body limit, problem-shaped errors, request tracing).

pub mod admin;
pub mod auth;
pub mod client;
pub mod constraints;
pub mod forge;
pub mod forge_bindings;
pub mod github;
pub mod json;
mod latency;
pub mod lease;
pub mod merge_patch;
pub mod operators;
pub mod ops;
pub mod page;
pub mod problem;
pub mod registry_events;
pub mod runners;
pub mod schema;
pub mod views;

use crate::app::AppState;
use crate::problem::ApiError;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::{MatchedPath, Request};
use axum::response::{IntoResponse, Response};
use futures_util::future::{BoxFuture, Either, Ready, ready};
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::trace::TraceLayer;

pub fn router(state: AppState) -> Router {
    // `/metrics` is here unless it has a listener of its own.
    let metrics_here = state.settings().metrics_listen.is_none();
    // The forge's routes stay outside the API's layers: forwarded as they came, answered as
    // the forge answered.
    let forge = state.gate_state().map(crate::forge_gate::router);
    let api = with_layers(
        state,
        Router::new()
            .merge(ops::router(metrics_here))
            .merge(schema::router())
            .merge(runners::router())
            .merge(lease::router())
            .merge(github::router())
            .merge(forge::router())
            .merge(admin::router())
            .merge(operators::router())
            .merge(page::router())
            .merge(registry_events::router()),
    );
    match forge {
        Some(forge) => api.merge(forge),
        None => api,
    }
}

/// The router of `LEASEGATE_METRICS_LISTEN`: `/metrics` alone.
pub fn metrics_router(state: AppState) -> Router {
    with_layers(state, ops::metrics_only())
}

/// The layers every request passes through: the request's span, latency metrics, answers
/// finished (problem-shaped framework errors, security headers) and the body limit.
///
/// They are one stack, applied with one `Router::layer` call: each call wraps every route in a
/// boxed service of its own, and a request holds one boxed future per call for as long as it
/// is served, which for a waiting long poll is up to 30 s (docs/BENCHMARKS.md, long polls).
fn with_layers(state: AppState, routes: Router<AppState>) -> Router {
    let max_body = state.settings().max_body_bytes;
    let layers = ServiceBuilder::new()
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .layer(latency::LatencyLayer::new(state.clone()))
        // Outside the body limit, so that its early 413 becomes a problem too.
        .layer(axum::middleware::map_response(finish_answer))
        .map_response(IntoResponse::into_response)
        .layer(RequestBodyLimitLayer::new(max_body))
        .layer(DefaultBodyLimit::disable());
    routes
        .fallback(|| async { ApiError::not_found("route") })
        .layer(layers)
        .with_state(state)
}

/// Every answer on its way out: a framework's error made a problem, then the security headers.
///
/// Ready at once but for a framework's error, whose body must be read first; only that one is
/// boxed, so that a request being served (a waiting long poll) does not carry room for the
/// reading in its own future.
fn finish_answer(response: Response) -> Either<Ready<Response>, BoxFuture<'static, Response>> {
    if !problem::is_framework_error(&response) {
        return Either::Left(ready(security_headers(response)));
    }
    Either::Right(Box::pin(async move {
        security_headers(problem::problem_for_framework_errors(response).await)
    }))
}

/// The headers every answer carries, error or not, unless it set its own (the page sets a
/// policy that lets its own script and style load): nothing the service sends is sniffed into
/// another type, framed, or allowed to load anything.
fn security_headers(mut response: Response) -> Response {
    use axum::http::HeaderValue;
    let h = response.headers_mut();
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        (
            "content-security-policy",
            "default-src 'none'; frame-ancestors 'none'",
        ),
        ("referrer-policy", "no-referrer"),
    ] {
        if !h.contains_key(name) {
            h.insert(name, HeaderValue::from_static(value));
        }
    }
    response
}

/// The span every request runs in. Handlers fill in the runner, pool, job and lease they
/// learn, so that each log line of a request says whose it was.
fn request_span(req: &Request) -> tracing::Span {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    tracing::info_span!(
        "request",
        method = %req.method(),
        route,
        runner_id = tracing::field::Empty,
        pool = tracing::field::Empty,
        job_id = tracing::field::Empty,
        lease_id = tracing::field::Empty,
    )
}

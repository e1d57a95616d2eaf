//! The HTTP surface: one router per party, assembled here with the layers every request
//! passes through (body limit, problem-shaped errors, request tracing).

pub mod admin;
pub mod auth;
pub mod forge;
pub mod json;
pub mod lease;
pub mod ops;
pub mod problem;
pub mod registry_events;
pub mod runners;
pub mod views;

use crate::app::AppState;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use problem::ApiError;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::trace::TraceLayer;

pub fn router(state: AppState) -> Router {
    let max_body = state.settings().max_body_bytes;
    Router::new()
        .merge(ops::router())
        .merge(runners::router())
        .merge(lease::router())
        .merge(forge::router())
        .merge(admin::router())
        .merge(registry_events::router())
        .fallback(|| async { ApiError::not_found("route") })
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(max_body))
        // Outside the body limit, so that its early 413 becomes a problem too.
        .layer(axum::middleware::map_response(
            problem::problem_for_framework_errors,
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

//! Unauthenticated operational endpoints: liveness and readiness.

use super::problem::ApiError;
use crate::app::AppState;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
}

async fn livez() -> &'static str {
    "ok\n"
}

/// 200 once the database answers; 503 while it does not, or once shutdown began.
async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    if state.shutdown().is_cancelled() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "shutting down",
        ));
    }
    let ping = tokio::time::timeout(std::time::Duration::from_secs(2), state.store().ping()).await;
    match ping {
        Ok(Ok(())) => Ok("ready\n"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness check failed");
            Err(unavailable("the database does not answer"))
        }
        Err(_) => Err(unavailable("the database did not answer in time")),
    }
}

fn unavailable(detail: &str) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail).retry_after(5)
}

//! Unauthenticated operational endpoints: liveness, readiness and metrics (the OpenAPI
//! document is `schema`'s).

use super::problem::Problem;
use crate::app::AppState;
use crate::domain::status::RunnerStatus;
use crate::domain::time::Millis;
use crate::metrics::{Metrics, PoolStatusLabels};
use crate::problem::ApiError;
use axum::Router;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::collections::BTreeMap;

/// Liveness, readiness and, when `with_metrics`, `/metrics`.
pub fn router(with_metrics: bool) -> Router<AppState> {
    let router = Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz));
    if with_metrics {
        router.merge(metrics_only())
    } else {
        router
    }
}

/// `/metrics` alone, for a listener of its own.
pub fn metrics_only() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

#[utoipa::path(get, path = "/livez", tag = "operations",
    responses((status = 200, description = "The process is up: `ok`.", body = String, content_type = "text/plain")))]
async fn livez() -> &'static str {
    "ok\n"
}

/// 200 once the database answers; 503 while it does not, or once shutdown began.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "The database answers: `ready`.", body = String, content_type = "text/plain"),
        (status = 503, description = "`unavailable`: the database does not answer in 2 s (`Retry-After: 5`), or shutdown began.", body = Problem, content_type = "application/problem+json"),
    ))]
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

/// The Prometheus exposition. State gauges (queue depth, runners by status) are read from the
/// store now, so every replica reports the same fleet.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "The OpenMetrics exposition.", body = String,
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        (status = 503, description = "`unavailable`: the database does not answer (`Retry-After: 5`).", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "`internal`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn metrics(
    _: super::auth::MetricsAuth,
    State(state): State<AppState>,
) -> Result<Response, ApiError> {
    let now = Millis::now();
    let store = state.store();
    let m = state.metrics();
    let pools = store.list_pools().await?;
    // Only statuses are counted: the narrow read the fleet's views judge from.
    let runners = store.runner_summaries(None, false).await?;
    let depths = store.queue_depths().await?;
    m.queue_depth.clear();
    m.oldest_queued_age.clear();
    m.runners.clear();
    m.runners_disk_warned.clear();
    m.ejected_runners.clear();
    for pool in &pools {
        let label = Metrics::pool(pool.name.as_str());
        let depth = depths.get(&pool.name).copied().unwrap_or_default();
        m.queue_depth.get_or_create(&label).set(depth.queued);
        let age = depth
            .oldest_queued_at
            .map_or(0.0, |t| (now.0 - t.0).max(0) as f64 / 1000.0);
        m.oldest_queued_age.get_or_create(&label).set(age);
        let mut counts: BTreeMap<&'static str, i64> =
            RunnerStatus::ALL.iter().map(|s| (s.as_str(), 0)).collect();
        let mut disk_warned = 0;
        // Ejected whatever else the status says (a runner out whose probe fails too).
        let ejected = runners
            .iter()
            .filter(|r| r.pool == pool.name && !r.is_revoked() && r.gate.ejection.is_some())
            .count();
        m.ejected_runners
            .get_or_create(&label)
            .set(i64::try_from(ejected).unwrap_or(i64::MAX));
        for r in runners.iter().filter(|r| r.pool == pool.name) {
            let observed = r.observe(pool, now, state.settings().status_rules());
            *counts.entry(observed.status.as_str()).or_default() += 1;
            disk_warned += i64::from(observed.disk_warning.is_some());
        }
        m.runners_disk_warned.get_or_create(&label).set(disk_warned);
        for (status, n) in counts {
            let labels = PoolStatusLabels {
                pool: pool.name.to_string(),
                status: status.to_string(),
            };
            m.runners.get_or_create(&labels).set(n);
        }
    }
    let mut response = m.render().into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(response)
}

//! Resolving a registry pool now: `POST /api/v1/admin/pools/{name}/resolve` makes one attempt
//! at once, instead of waiting for the resolver's next round, and records it in the audit
//! trail whether it succeeded or failed.

use super::pools::{pool_name, pool_view};
use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::time::Millis;
use crate::http::auth::AsOperator;
use crate::http::problem::Problem;
use crate::http::views::PoolView;
use crate::problem::ApiError;
use crate::registry::resolver::{self, ResolvePoolError};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

/// `POST /api/v1/admin/pools/{name}/resolve`: one attempt now; 200 with the pool when it is
/// over, 502 `pool_resolution_failed` (the set unchanged) when it failed.
#[utoipa::path(post, path = "/api/v1/admin/pools/{name}/resolve", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    responses(
        (status = 200, description = "Resolved; the pool.", body = PoolView),
        (status = 400, description = "`bad_request`: not a valid pool name.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`pool_not_registry` (a `manual` pool) or `pool_changed` (its `image_ref` changed meanwhile).", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "`pool_resolution_failed`: the pool keeps its image set.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn resolve(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<PoolView>, ApiError> {
    let name = pool_name(&name)?;
    let resolved = resolver::resolve_pool(state.store(), state.registry(), &name).await;
    // An attempt that reached the registry changed the pool's record, failed or not.
    let outcome = match &resolved {
        Ok(pool) => Some(format!(
            "resolved to {}",
            pool.resolved_image_id
                .as_ref()
                .map_or_else(|| "-".to_string(), |d| d.to_string())
        )),
        Err(ResolvePoolError::Failed { error, .. }) => Some(format!("failed: {error}")),
        Err(_) => None,
    };
    if let Some(detail) = outcome {
        let entry = caller
            .audit(Action::PoolResolve, name.as_str(), Millis::now())
            .detail(detail);
        state.store().record_audit(&entry).await?;
    }
    let pool = resolved.map_err(resolve_error)?;
    Ok(Json(pool_view(&state, &pool, Millis::now()).await?))
}

fn resolve_error(e: ResolvePoolError) -> ApiError {
    match e {
        ResolvePoolError::NotFound => ApiError::not_found("pool"),
        ResolvePoolError::NotRegistry(_) => ApiError::conflict("pool_not_registry", e.to_string()),
        ResolvePoolError::Failed { error, .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "pool_resolution_failed",
            format!("the pool keeps its image set: {error}"),
        ),
        ResolvePoolError::Changed(_) => ApiError::conflict("pool_changed", e.to_string()),
        ResolvePoolError::Store(s) => s.into(),
    }
}

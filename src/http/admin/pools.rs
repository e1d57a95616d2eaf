//! Pools: list, read, create or replace (`PUT`), merge-patch (`PATCH`) and delete; each shown
//! with its runners counted by status, its roll health and its queue depth. The body a `PUT`
//! reads is `pool_body`'s. Also the pool-name path segment and the pools-by-name map the other
//! admin resources read.

use super::pool_body::{PoolBody, PoolPatch, put_body, spec_detail, spec_of};
use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::pool::Pool;
use crate::domain::pool_name::PoolName;
use crate::domain::roll::roll_health;
use crate::domain::runner::RunnerSummary;
use crate::domain::time::Millis;
use crate::http::auth::{AsOperator, AsViewer};
use crate::http::json::JsonBody;
use crate::http::problem::Problem;
use crate::http::views::{self, PoolList, PoolStanding, PoolView};
use crate::problem::ApiError;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::Value;
use std::collections::BTreeMap;

pub(super) fn pool_name(name: &str) -> Result<PoolName, ApiError> {
    PoolName::parse(name).map_err(|e| ApiError::bad_request(e.to_string()))
}
/// Pools by name, for rendering runners against their pool.
pub(super) async fn pools_by_name(state: &AppState) -> Result<BTreeMap<PoolName, Pool>, ApiError> {
    Ok(state
        .store()
        .list_pools()
        .await?
        .into_iter()
        .map(|p| (p.name.clone(), p))
        .collect())
}
/// The pool as the API shows it, with its runners counted by status and its queue depth.
pub(super) async fn pool_view(
    state: &AppState,
    pool: &Pool,
    now: Millis,
) -> Result<PoolView, ApiError> {
    let runners = state
        .store()
        .runner_summaries(Some(&pool.name), false)
        .await?;
    let depth = state
        .store()
        .queue_depths()
        .await?
        .remove(&pool.name)
        .unwrap_or_default();
    Ok(views::pool(
        pool,
        &standing(state, &runners, pool, now),
        depth,
    ))
}

/// The pool's runners by status, its roll health and its resolver status at `now`.
fn standing(state: &AppState, runners: &[RunnerSummary], pool: &Pool, now: Millis) -> PoolStanding {
    let settings = state.settings();
    let mut counts = BTreeMap::new();
    let mut disk_warned = 0;
    for r in runners.iter().filter(|r| r.pool == pool.name) {
        let observed = r.observe(pool, now, settings.status_rules());
        *counts.entry(observed.status.as_str()).or_insert(0) += 1;
        disk_warned += i64::from(observed.disk_warning.is_some());
    }
    PoolStanding {
        runners_by_status: counts,
        disk_warned,
        roll: roll_health(
            pool,
            runners,
            now,
            settings.status_rules(),
            settings.roll_stalled_share,
        ),
        resolver_status: pool.resolver_status(settings.resolver_failure_threshold),
    }
}

#[utoipa::path(put, path = "/api/v1/admin/pools/{name}", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    request_body = PoolBody,
    responses(
        (status = 201, description = "Created.", body = PoolView),
        (status = 200, description = "Replaced.", body = PoolView),
        (status = 400, description = "`bad_request`: a bad name, digest, reference or number, or a bad `github` object.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`pool_image_unresolved`: a `manual` pool with `enforce` and no image ids.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn put_pool(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<PoolBody>,
) -> Result<(StatusCode, Json<PoolView>), ApiError> {
    let name = pool_name(&name)?;
    let spec = spec_of(body)?;
    let now = Millis::now();
    let audit = caller
        .audit(Action::PoolPut, name.as_str(), now)
        .detail(spec_detail(&spec));
    let (pool, created) = state.store().put_pool(&name, spec, now, &audit).await?;
    tracing::info!(pool = %pool.name, created, "pool written");
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(pool_view(&state, &pool, now).await?)))
}

/// How often a `PATCH` reads, merges and writes again when the pool changed under it. Of
/// writers racing on one pool one wins each round, so this many concurrent patches all land.
const PATCH_ATTEMPTS: usize = 32;

#[utoipa::path(patch, path = "/api/v1/admin/pools/{name}", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    request_body(description = "A JSON merge patch (RFC 7396) of the pool's `PUT` body: a member sets that field, `null` returns it to its default, a field not named keeps the pool's value.",
        content((PoolPatch = "application/merge-patch+json"), (PoolPatch = "application/json"))),
    responses(
        (status = 200, description = "Changed; the pool.", body = PoolView),
        (status = 400, description = "`bad_request`: a bad name, or the patched body is one a `PUT` refuses (a bad digest, reference or number; not an object).", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`pool_image_unresolved`: the patched pool would be a `manual` pool with `enforce` and no image ids.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`unavailable`: the pool kept changing under the patch, or the database did not answer.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn patch_pool(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(patch): JsonBody<serde_json::Map<String, Value>>,
) -> Result<Json<PoolView>, ApiError> {
    let name = pool_name(&name)?;
    let named = patch.keys().cloned().collect::<Vec<_>>().join(", ");
    let patch = Value::Object(patch);
    for _ in 0..PATCH_ATTEMPTS {
        let base = state
            .store()
            .get_pool(&name)
            .await?
            .ok_or_else(|| ApiError::not_found("pool"))?;
        let mut body = put_body(&base);
        crate::http::merge_patch::apply(&mut body, &patch);
        // Read exactly as a PUT body is, for the same answers.
        let spec = spec_of(crate::http::json::parse_value::<PoolBody>(body)?)?;
        let now = Millis::now();
        let audit = caller
            .audit(Action::PoolPatch, name.as_str(), now)
            .detail(format!(
                "patched {}; {}",
                if named.is_empty() { "nothing" } else { &named },
                spec_detail(&spec)
            ));
        if let Some(pool) = state
            .store()
            .replace_pool(&name, spec, &base, now, &audit)
            .await?
        {
            tracing::info!(pool = %pool.name, "pool patched");
            return Ok(Json(pool_view(&state, &pool, now).await?));
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("the pool changed under the patch {PATCH_ATTEMPTS} times; try again"),
    )
    .retry_after(1))
}

#[utoipa::path(delete, path = "/api/v1/admin/pools/{name}", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    responses(
        (status = 204, description = "Deleted, with its revoked runners, their history, its finished jobs and its registration tokens."),
        (status = 400, description = "`bad_request`: not a valid pool name.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`pool_in_use`: the pool has live (unrevoked) runners or unfinished jobs; nothing changed.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn delete_pool(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = pool_name(&name)?;
    let audit = caller.audit(Action::PoolDelete, name.as_str(), Millis::now());
    state.store().delete_pool(&name, &audit).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/admin/pools/{name}", tag = "admin",
    security(("admin_token" = ["read"])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    responses(
        (status = 200, description = "The pool.", body = PoolView),
        (status = 400, description = "`bad_request`: not a valid pool name.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn get_pool(
    _: AsViewer,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<PoolView>, ApiError> {
    let name = pool_name(&name)?;
    let pool = state
        .store()
        .get_pool(&name)
        .await?
        .ok_or_else(|| ApiError::not_found("pool"))?;
    Ok(Json(pool_view(&state, &pool, Millis::now()).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/pools", tag = "admin",
    security(("admin_token" = ["read"])),
    responses(
        (status = 200, description = "Every pool.", body = PoolList),
    ))]
pub(super) async fn list_pools(
    _: AsViewer,
    State(state): State<AppState>,
) -> Result<Json<PoolList>, ApiError> {
    let now = Millis::now();
    let pools = state.store().list_pools().await?;
    let runners = state.store().runner_summaries(None, false).await?;
    let mut depths = state.store().queue_depths().await?;
    let views: Vec<PoolView> = pools
        .iter()
        .map(|pool| {
            let standing = standing(&state, &runners, pool, now);
            views::pool(
                pool,
                &standing,
                depths.remove(&pool.name).unwrap_or_default(),
            )
        })
        .collect();
    Ok(Json(PoolList { pools: views }))
}

//! Runners: the filtered, paged list, one runner's detail (its history and audit trail), and
//! what an operator does to one: cordon, uncordon, reinstate, revoke. Each write answers with
//! the runner's detail, as `forge_runners` does.

use super::pools::{pool_name, pools_by_name};
use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::fleet::{self, Filter};
use crate::domain::ids::RunnerId;
use crate::domain::time::Millis;
use crate::http::auth::{AsOperator, AsViewer};
use crate::http::problem::Problem;
use crate::http::views::{self, RunnerDetail, RunnerList, RunnerView};
use crate::problem::ApiError;
use crate::store::AuditFilter;
use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct RunnerFilter {
    /// Only the runners of this pool.
    #[serde(default)]
    #[param(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pool: Option<String>,
    /// Only the runners of this status (as `status` in the runner view); empty: any.
    #[serde(default)]
    #[param(
        pattern = "^(healthy|probe_failed|probe_stale|pool_image_unresolved|image_unreported|drifted|cordoned|quarantined|ejected|revoked|stale|unknown)?$"
    )]
    status: Option<String>,
    /// A case-insensitive search over name, id, labels (`key=value`) and host.
    #[serde(default)]
    #[param(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    q: Option<String>,
    /// Runners per page: 1 to 1000, default 500.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// The `next_cursor` of the page before.
    #[serde(default)]
    #[param(pattern = "^[0-9]{1,9}$")]
    cursor: Option<String>,
}

/// Runners per page of `GET /api/v1/admin/runners`, by default and at most.
pub const RUNNER_PAGE_DEFAULT: i64 = 500;
pub const RUNNER_PAGE_MAX: i64 = 1000;
#[utoipa::path(get, path = "/api/v1/admin/runners", tag = "admin",
    security(("admin_token" = ["read"])),
    params(RunnerFilter),
    responses(
        (status = 200, description = "The runners, by pool then name, a page at a time.", body = RunnerList),
        (status = 400, description = "`bad_request`: not a valid pool name, status, limit or cursor.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn list_runners(
    _: AsViewer,
    State(state): State<AppState>,
    Query(filter): Query<RunnerFilter>,
) -> Result<Json<RunnerList>, ApiError> {
    let pool = filter.pool.as_deref().map(pool_name).transpose()?;
    let limit = filter.limit.unwrap_or(RUNNER_PAGE_DEFAULT);
    if !(1..=RUNNER_PAGE_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: must be from 1 to {RUNNER_PAGE_MAX}"
        )));
    }
    let offset: usize = match filter.cursor.as_deref() {
        None => 0,
        Some(c) if (1..=9).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit()) => {
            c.parse().expect("nine digits fit")
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "cursor: not a cursor this service gave",
            ));
        }
    };
    let status = filter.status.unwrap_or_default();
    if !status.is_empty()
        && !crate::domain::status::RunnerStatus::ALL
            .iter()
            .any(|s| s.as_str() == status)
    {
        return Err(ApiError::bad_request(format!(
            "status: `{status}` is not a runner status"
        )));
    }
    let q = filter.q.unwrap_or_default().to_lowercase();
    crate::domain::text::without_controls("q", &q)?;
    if q.chars().count() > 200 {
        return Err(ApiError::bad_request("q: at most 200 characters"));
    }
    let store = state.store();
    let summaries = store.runner_summaries(pool.as_ref(), !q.is_empty()).await?;
    let pools = pools_by_name(&state).await?;
    let now = Millis::now();
    let rules = state.settings().status_rules();
    let wanted = crate::domain::status::RunnerStatus::ALL
        .into_iter()
        .find(|s| s.as_str() == status);
    let filter = Filter {
        pool: "",
        status: wanted,
        q: &q,
    };
    // Judged, filtered and paged from the summaries; only the page's runners are read whole.
    let judged = fleet::judge(&summaries, &pools, rules, now);
    let matching: Vec<&fleet::Judged> = judged.iter().filter(|j| filter.matches(j)).collect();
    let shown = fleet::page(matching.into_iter(), offset, limit as usize);
    let whole = store.runners_by_id(&fleet::ids(&shown.items)).await?;
    let page: Vec<RunnerView> = fleet::in_shown_order(&shown.items, whole)
        .iter()
        .map(|(runner, pool)| views::runner(runner, pool, state.settings(), now))
        .collect();
    let next_cursor = shown.next_offset.map(|n| n.to_string());
    Ok(Json(RunnerList {
        runners: page,
        next_cursor,
    }))
}

pub(super) async fn runner_detail(
    state: &AppState,
    id: &RunnerId,
) -> Result<RunnerDetail, ApiError> {
    let runner = state
        .store()
        .get_runner(id)
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    let pool = state
        .store()
        .get_pool(&runner.pool)
        .await?
        .ok_or_else(|| ApiError::not_found("pool"))?;
    let history = state.store().runner_history(id).await?;
    let audit = state
        .store()
        .audit_trail(&AuditFilter {
            target: Some(id.to_string()),
            limit: views::RUNNER_AUDIT_SHOWN,
            ..AuditFilter::default()
        })
        .await?;
    let view = views::runner(&runner, &pool, state.settings(), Millis::now());
    let audit = audit.iter().map(views::audit_entry).collect();
    Ok(views::runner_detail(view, &history, audit))
}

#[utoipa::path(get, path = "/api/v1/admin/runners/{id}", tag = "admin",
    security(("admin_token" = ["read"])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "The runner and its history.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn get_runner(
    _: AsViewer,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    Ok(Json(
        runner_detail(&state, &RunnerId::parse("id", &id)?).await?,
    ))
}

async fn set_cordon(
    caller: &AsOperator,
    state: &AppState,
    id: String,
    cordoned: bool,
) -> Result<Json<RunnerDetail>, ApiError> {
    let id = RunnerId::parse("id", &id)?;
    let action = if cordoned {
        Action::RunnerCordon
    } else {
        Action::RunnerUncordon
    };
    state
        .store()
        .set_cordoned(
            &id,
            cordoned,
            &caller.audit(action, id.as_str(), Millis::now()),
        )
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    tracing::info!(runner_id = %id, cordoned, "runner cordon changed");
    Ok(Json(runner_detail(state, &id).await?))
}

#[utoipa::path(post, path = "/api/v1/admin/runners/{id}/cordon", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Cordoned; the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn cordon(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    set_cordon(&caller, &state, id, true).await
}

#[utoipa::path(post, path = "/api/v1/admin/runners/{id}/uncordon", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Uncordoned; the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn uncordon(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    set_cordon(&caller, &state, id, false).await
}

#[utoipa::path(post, path = "/api/v1/admin/runners/{id}/reinstate", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Out of ejection at once (and no longer marked `would_eject`), its failures in a row forgotten; the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn reinstate(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    let id = RunnerId::parse("id", &id)?;
    let audit = caller.audit(Action::RunnerReinstate, id.as_str(), Millis::now());
    state
        .store()
        .reinstate_runner(&id, &audit)
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    tracing::info!(runner_id = %id, "runner reinstated");
    Ok(Json(runner_detail(&state, &id).await?))
}

#[utoipa::path(post, path = "/api/v1/admin/runners/{id}/revoke", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Revoked (its live leases end); the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn revoke(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    let id = RunnerId::parse("id", &id)?;
    let now = Millis::now();
    state
        .revoke_runner(
            &id,
            now,
            &caller.audit(Action::RunnerRevoke, id.as_str(), now),
        )
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    Ok(Json(runner_detail(&state, &id).await?))
}

#[cfg(test)]
mod tests {
    use crate::domain::status::RunnerStatus;
    use std::collections::BTreeSet;

    #[test]
    fn the_documented_status_filter_names_every_status_and_no_other() {
        let doc = crate::http::schema::document();
        let start = doc.find("^(healthy|").expect("the status pattern") + 2;
        let end = start + doc[start..].find(")?$").unwrap();
        let documented: BTreeSet<&str> = doc[start..end].split('|').collect();
        let statuses: BTreeSet<&str> = RunnerStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(documented, statuses);
    }
}

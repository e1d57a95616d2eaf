//! A runner's forge runners: `PUT /api/v1/admin/runners/{id}/forge-runners` replaces the
//! forge-side runners bound to the runner's machine (what the forge gate answers for).

use super::runners::runner_detail;
use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::ids::RunnerId;
use crate::domain::time::Millis;
use crate::http::auth::AsOperator;
use crate::http::json::JsonBody;
use crate::http::problem::Problem;
use crate::http::views::RunnerDetail;
use crate::problem::ApiError;
use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ForgeRunnersBody {
    /// Every forge runner on the runner's machine; replaces what it had.
    forge_runners: Vec<crate::http::forge_bindings::ForgeRunnerSpec>,
}

#[utoipa::path(put, path = "/api/v1/admin/runners/{id}/forge-runners", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    request_body = ForgeRunnersBody,
    responses(
        (status = 200, description = "Replaced; the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`forge_runner_taken`: one of them is bound to another runner (nothing changed); `runner_revoked`.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn put_forge_runners(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ForgeRunnersBody>,
) -> Result<Json<RunnerDetail>, ApiError> {
    let id = RunnerId::parse("id", &id)?;
    let identities = crate::http::forge_bindings::identities(&body.forge_runners)?;
    let now = Millis::now();
    let bound: Vec<String> = identities.iter().map(|i| i.label()).collect();
    let audit = caller
        .audit(Action::RunnerForgeRunners, id.as_str(), now)
        .detail(format!("forge_runners [{}]", bound.join(", ")));
    state
        .store()
        .set_forge_runners(&id, &identities, now, &audit)
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    tracing::info!(runner_id = %id, forge_runners = identities.len(), "forge runners bound");
    Ok(Json(runner_detail(&state, &id).await?))
}

//! The drift report a fleet roller polls: drifted and skipped runners, and each pool's roll
//! health.

use super::pools::pools_by_name;
use crate::app::AppState;
use crate::domain::roll::roll_health;
use crate::domain::runner::{DriftEntry, drift_entry};
use crate::domain::time::Millis;
use crate::http::auth::AsViewer;
use crate::http::views::{DriftReport, DriftedRunner, RollHealthView, SkippedRunner};
use crate::problem::ApiError;
use axum::Json;
use axum::extract::State;

#[utoipa::path(get, path = "/api/v1/admin/drift", tag = "admin",
    security(("admin_token" = ["read"])),
    responses(
        (status = 200, description = "Drifted and skipped runners, and each pool's roll health.", body = DriftReport),
    ))]
pub(super) async fn drift(
    _: AsViewer,
    State(state): State<AppState>,
) -> Result<Json<DriftReport>, ApiError> {
    let now = Millis::now();
    let pools = pools_by_name(&state).await?;
    let runners = state.store().runner_summaries(None, false).await?;
    let (mut drifted, mut skipped) = (Vec::new(), Vec::new());
    for runner in &runners {
        let Some(pool) = pools.get(&runner.pool) else {
            continue;
        };
        match drift_entry(runner, pool, now, state.settings().status_rules()) {
            DriftEntry::Drifted {
                runner_id,
                pool,
                running_image_id,
                expected_image_ids,
                images,
            } => drifted.push(DriftedRunner {
                runner_id,
                pool,
                running_image_id,
                expected_image_ids,
                images,
            }),
            DriftEntry::Skipped { runner_id, reason } => skipped.push(SkippedRunner {
                runner_id,
                reason: reason.to_string(),
            }),
            DriftEntry::Current => {}
        }
    }
    let settings = state.settings();
    let rolls: Vec<RollHealthView> = pools
        .values()
        .map(|pool| {
            let h = roll_health(
                pool,
                &runners,
                now,
                settings.status_rules(),
                settings.roll_stalled_share,
            );
            RollHealthView::new(&pool.name, &h)
        })
        .collect();
    Ok(Json(DriftReport {
        drifted,
        skipped,
        pools: rolls,
    }))
}

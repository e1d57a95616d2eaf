//! One runner's page: its row as the fleet shows it, its labels, images, refusals, status
//! changes, attestations, leases, forge registrations and the operators' changes to it, with
//! the actions (`runner_actions`) an operator may take.

use super::views::{self, DigestView, RunnerRow};
use super::{PageViewer, render, who};
use crate::app::AppState;
use crate::domain::ids::RunnerId;
use crate::domain::operator::Role;
use crate::domain::time::Millis;
use crate::http::problem::Problem;
use crate::problem::ApiError;
use crate::store::AuditFilter;
use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

struct AttestationLine {
    at: String,
    status: String,
    ok: bool,
    runtime: String,
    error: String,
    image: Option<DigestView>,
}

#[derive(Template)]
#[template(path = "runner.html")]
struct RunnerPage {
    /// Its last attestation the gate refused under rules 3–4: when, code, why.
    rejected: Option<(String, String, String)>,
    logged_in: bool,
    who: String,
    can_write: bool,
    audit: Vec<AuditLine>,
    csrf: String,
    row: RunnerRow,
    labels: Vec<(String, String)>,
    actions: Vec<(&'static str, &'static str)>,
    refusals: Vec<RefusalLine>,
    changes: Vec<(String, String, String, String)>,
    attestations: Vec<AttestationLine>,
    leases: Vec<(String, String, i64, &'static str)>,
    github: Vec<views::GithubLine>,
    buildkite: Vec<views::BuildkiteLine>,
}

/// An operator's change to the runner, as its page shows it.
struct AuditLine {
    at: String,
    actor: String,
    action: &'static str,
    detail: String,
    client: String,
}

/// A run of refusals, as the runner page shows it.
struct RefusalLine {
    at: String,
    first_at: String,
    count: i64,
    code: String,
    detail: String,
}

#[utoipa::path(get, path = "/admin/runners/{id}", tag = "page",
    security((), ("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "One runner.", body = String, content_type = "text/html"),
        (status = 303, description = "No session: to `/admin/login`."),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn runner_page(
    State(state): State<AppState>,
    PageViewer(viewer): PageViewer,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = Millis::now();
    let id = RunnerId::parse("id", &id)?;
    let store = state.store();
    let runner = store
        .get_runner(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    let pool = store
        .get_pool(&runner.pool)
        .await?
        .ok_or_else(|| ApiError::not_found("pool"))?;
    let history = store.runner_history(&id).await?;
    // The runs that went on in the last hour, counted whole (as the fleet page counts them).
    let refusals_last_hour = history
        .refusals
        .iter()
        .filter(|r| r.at >= now.minus_secs(3600))
        .map(|r| r.count)
        .sum();
    let observed = runner.observe(&pool, now, state.settings().status_rules());
    let mut row = views::runner_row(&runner, &observed, refusals_last_hour, now);
    row.images = views::image_rows(&runner, &pool);
    // Since when it has been in its status: its latest change into it, first on the page.
    row.failing_since = history
        .status_changes
        .first()
        .filter(|c| c.to == row.status && row.rank != crate::domain::status::RunnerStatus::Healthy)
        .map(|c| format!("{} ({})", c.at.rfc3339(), views::age(c.at, now)));
    let rejected = runner
        .last_rejection
        .as_ref()
        .map(|r| (r.at.rfc3339(), r.code.clone(), r.detail.clone()));
    let mut actions = if row.cordoned {
        vec![("uncordon", "Uncordon")]
    } else {
        vec![("cordon", "Cordon")]
    };
    // An ejection (or one the rule called for and held back) an operator may end at once.
    if runner.ejection.ejected.is_some() || runner.ejection.would_eject.is_some() {
        actions.push(("reinstate", "Reinstate"));
    }
    let audit = store
        .audit_trail(&AuditFilter {
            target: Some(id.to_string()),
            limit: crate::http::views::RUNNER_AUDIT_SHOWN,
            ..AuditFilter::default()
        })
        .await?;
    let page = RunnerPage {
        rejected,
        logged_in: viewer.is_session(),
        who: who(&viewer),
        can_write: viewer.operator().may(Role::Operator),
        audit: audit
            .iter()
            .map(|r| AuditLine {
                at: r.entry.at.rfc3339(),
                actor: r.entry.actor.clone(),
                action: r.entry.action.as_str(),
                detail: r.entry.detail.clone().unwrap_or_default(),
                client: r.entry.client.clone(),
            })
            .collect(),
        csrf: viewer.csrf().into(),
        labels: runner.labels.clone().into_iter().collect(),
        actions: actions.into_iter().chain([("revoke", "Revoke")]).collect(),
        refusals: history
            .refusals
            .iter()
            .map(|r| RefusalLine {
                at: r.at.rfc3339(),
                first_at: r.first_at.rfc3339(),
                count: r.count,
                code: r.code.clone(),
                detail: r.detail.clone(),
            })
            .collect(),
        changes: history
            .status_changes
            .iter()
            .map(|c| {
                (
                    c.at.rfc3339(),
                    c.from.clone().unwrap_or_default(),
                    c.to.clone(),
                    c.detail.clone().unwrap_or_default(),
                )
            })
            .collect(),
        attestations: history
            .attestations
            .iter()
            .map(|a| AttestationLine {
                at: a.received_at.rfc3339(),
                status: a.status.clone(),
                ok: a.probe_ok,
                runtime: match &a.runtime_version {
                    Some(v) => format!("{} {v}", a.runtime),
                    None => a.runtime.clone(),
                },
                error: a.error.clone().unwrap_or_default(),
                image: a.image.id.as_ref().map(DigestView::from),
            })
            .collect(),
        leases: history
            .leases
            .iter()
            .map(|l| {
                (
                    l.granted_at.rfc3339(),
                    l.job_id.to_string(),
                    l.attempt,
                    l.state.as_str(),
                )
            })
            .collect(),
        github: history
            .github_registrations
            .iter()
            .map(views::github_line)
            .collect(),
        buildkite: views::buildkite_lines(&history.buildkite_agents, &history.buildkite_pauses),
        row,
    };
    render(StatusCode::OK, &page)
}

//! One job's page: its state and attempts, and its story, event by event, naming the runners
//! that took part.

use super::{PageViewer, render, who};
use crate::app::AppState;
use crate::domain::ids::JobId;
use crate::http::problem::Problem;
use crate::problem::ApiError;
use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use std::collections::BTreeMap;

struct EventLine {
    at: String,
    what: String,
    /// The runner's id and name.
    runner: Option<(String, String)>,
    why: Option<String>,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    logged_in: bool,
    who: String,
    csrf: String,
    id: String,
    pool: String,
    state: &'static str,
    attempts: i64,
    max_attempts: i64,
    returns: i64,
    last_error: Option<String>,
    events: Vec<EventLine>,
}

/// One event of the story in words an on-call engineer reads at 3 a.m.
fn describe(kind: &str) -> &'static str {
    match kind {
        "enqueued" => "enqueued by the forge",
        "leased" => "leased",
        "started" => "started (an attempt is used)",
        "returned" => "returned to the queue without using an attempt",
        "requeued" => "requeued after an attempt",
        "completed" => "completed",
        "failed" => "failed",
        "cancelled" => "cancelled by the forge",
        _ => "event",
    }
}

#[utoipa::path(get, path = "/admin/jobs/{id}", tag = "page",
    security((), ("admin_token" = [])),
    params(("id" = String, Path, description = "The job id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "One job's story.", body = String, content_type = "text/html"),
        (status = 303, description = "No session: to `/admin/login`."),
        (status = 404, description = "`not_found`: no such job.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn job_page(
    State(state): State<AppState>,
    PageViewer(viewer): PageViewer,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (job, events) = state
        .store()
        .get_job(&JobId::parse("id", &id)?)
        .await?
        .ok_or_else(|| ApiError::not_found("job"))?;
    // Job pages name runners: the few that took part in the story, each looked up once.
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for runner in events.iter().filter_map(|e| e.runner_id.as_ref()) {
        if !names.contains_key(runner.as_str())
            && let Some(r) = state.store().get_runner(runner).await?
        {
            names.insert(runner.to_string(), r.name);
        }
    }
    let page = JobPage {
        logged_in: viewer.is_session(),
        who: who(&viewer),
        csrf: viewer.csrf().into(),
        id: job.id.to_string(),
        pool: job.pool.to_string(),
        state: job.state.as_str(),
        attempts: job.attempts,
        max_attempts: job.max_attempts,
        returns: job.returns,
        last_error: job.last_error.clone(),
        events: events
            .iter()
            .map(|e| EventLine {
                at: e.at.rfc3339(),
                what: describe(&e.kind).to_string(),
                runner: e.runner_id.as_ref().map(|r| {
                    let id = r.to_string();
                    let name = names.get(&id).cloned().unwrap_or_else(|| id.clone());
                    (id, name)
                }),
                why: match (&e.reason, &e.detail) {
                    (Some(r), Some(d)) => Some(format!("{r}: {d}")),
                    (Some(r), None) => Some(r.clone()),
                    (None, Some(d)) => Some(d.clone()),
                    (None, None) => None,
                },
            })
            .collect(),
    };
    render(StatusCode::OK, &page)
}

//! GitLab's runner API (`/api/v4/…`).
//!
//! A runner asks for work with `POST /api/v4/jobs/request`, its authentication token in the
//! JSON body (`token`, also sent as `RUNNER-TOKEN`), read as GitLab reads it
//! (`gitlab_params.rs`). GitLab answers `201` with a job, or `204` with `X-GitLab-Last-Update`
//! when there is none, which is what a paused runner gets too. The gate never answers `403`:
//! gitlab-runner counts it against the runner's health and stops asking for an hour.
//!
//! With its Job Router (`FF_USE_JOB_ROUTER`) gitlab-runner first asks
//! `GET /api/v4/runners/router/discovery` and then takes its jobs from the router, past the
//! gate. The gate answers discovery itself as a GitLab without a router does (`501`,
//! "not available"), so gitlab-runner falls back to `jobs/request`.
//!
//! A refused runner's request is held, as GitLab holds it when it long-polls, so a refused
//! runner does not ask in a tight loop: up to `LEASEGATE_FORGE_HOLD_S` (30 s), then `204`
//! echoing the request's `last_update`. It is looked at again every second meanwhile, and
//! forwarded at once when the runner may have work. The runner is known by the SHA-256 of its
//! token and the `system_id` its machine sends; the token itself is only ever forwarded to
//! GitLab.

use super::canonical::is_call;
use super::gitlab_params;
use super::job_ends;
use super::job_watch::{self, ReportKind};
use super::pipeline::{self, Fetch, Forge};
use super::upstream::{ClientBodyError, Forwarder, is_length_limit};
use super::{GateState, REFUSAL_HEADER, Upstream, canonical_path, peer_of, set_path};
use crate::domain::forge::{ForgeIdentity, ForgeKind};
use crate::domain::ids::RunnerId;
use crate::problem::ApiError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// The paths the gate serves for a GitLab.
pub const PREFIX: &str = "/api/v4";

/// The call the gate judges.
pub const JOBS_REQUEST: &str = "/api/v4/jobs/request";

/// The Job Router's discovery, which the gate answers "not available".
pub const ROUTER_DISCOVERY: &str = "/api/v4/runners/router/discovery";

/// GitLab's own answer when its Job Router is not available.
const NO_ROUTER: &str =
    r#"{"message":"Job Router is not available. Please contact your administrator."}"#;

/// The largest job request read (gitlab-runner sends a few KB of `info`).
const MAX_REQUEST_BYTES: usize = 256 * 1024;

/// GitLab on the fetch pipeline: a refused job request is held, as GitLab holds it, then
/// answered `204` echoing its `last_update`.
pub struct Gitlab;

impl Forge for Gitlab {
    /// The request's `last_update`, echoed in the "no job".
    type NoWork = Option<String>;
    const KIND: ForgeKind = ForgeKind::Gitlab;
    const HOLDS: bool = true;

    fn route(gate: &GateState) -> (&Forwarder, &Upstream) {
        let upstream = gate
            .settings()
            .gitlab
            .as_ref()
            .expect("routed only with a gitlab upstream");
        (&gate.gate().forwarder, upstream)
    }

    fn no_work(last_update: Option<String>, code: &'static str) -> Response {
        no_job(last_update.as_deref(), code)
    }

    /// A `201` hands out a job: whose it is is kept, for its end (`job_watch`).
    async fn handed_out(gate: &GateState, runner: &RunnerId, answer: Response) -> Response {
        job_watch::job_taken(gate, runner, answer).await
    }
}

pub async fn handle(State(gate): State<GateState>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let path = match canonical_path(&parts, &[PREFIX]) {
        Ok(path) => path,
        Err(refused) => return refused,
    };
    let peer = peer_of(&gate, &parts);
    if is_call(&path, ROUTER_DISCOVERY, true) {
        return no_router();
    }
    // Any method: see forgejo.rs.
    if is_call(&path, JOBS_REQUEST, true) {
        set_path(&mut parts, JOBS_REQUEST);
        let bytes = match axum::body::to_bytes(body, MAX_REQUEST_BYTES).await {
            Ok(b) => b,
            Err(e) if is_length_limit(&e) => {
                return ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("a job request is at most {MAX_REQUEST_BYTES} bytes"),
                )
                .into_response();
            }
            Err(e) => return ClientBodyError::from(e).problem().into_response(),
        };
        let asked = match gitlab_params::read(&parts.headers, parts.uri.query(), &bytes) {
            Ok(asked) => asked,
            Err(why) => {
                return ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "unreadable_fetch",
                    format!("the job request does not name one runner: {why}"),
                )
                .into_response();
            }
        };
        let identity = asked
            .token
            .as_deref()
            .map(|t| ForgeIdentity::gitlab_token(t).on_machine(asked.system_id.clone()));
        let fetch = Fetch::<Gitlab> {
            request: Request::from_parts(parts, Body::from(bytes)),
            peer,
            identity,
            token: None,
            no_work: asked.last_update,
        };
        return pipeline::fetch(&gate, fetch).await;
    }
    set_path(&mut parts, &path);
    let is_put = parts.method == Method::PUT;
    let request = Request::from_parts(parts, body);
    // A job's update, whose final one says how the job ended (`job_watch`).
    if let Some(job) = job_ends::gitlab_update_job(&path).filter(|_| is_put) {
        let kind = ReportKind::GitlabJobUpdate(job);
        return job_watch::forward_report::<Gitlab>(&gate, kind, request, peer).await;
    }
    pipeline::forward::<Gitlab>(&gate, request, peer).await
}

/// GitLab's answer to discovery without a Job Router.
fn no_router() -> Response {
    let mut r = (StatusCode::NOT_IMPLEMENTED, NO_ROUTER).into_response();
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// GitLab's "no job": `204`, `X-GitLab-Last-Update` echoing the runner's own.
fn no_job(last_update: Option<&str>, code: &'static str) -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    if let Some(v) = last_update.and_then(|v| HeaderValue::from_str(v).ok()) {
        r.headers_mut().insert("x-gitlab-last-update", v);
    }
    r.headers_mut()
        .insert(REFUSAL_HEADER, HeaderValue::from_static(code));
    r
}

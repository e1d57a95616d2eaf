//! The runner-health page: server-rendered HTML (askama templates, escaped), embedded assets,
//! login with an operator's token into a session cookie, and cordon / uncordon / revoke forms
//! (for operators and admins; a viewer sees the page without them).
//!
//! Everything a runner sent (names, labels, probe errors) reaches the page only through
//! templates that escape it. The page's own POSTs need the session's CSRF token.

pub mod fleet;
pub mod pieces;
pub mod session;
pub mod status;
pub mod timeline;
pub mod views;

use super::auth::{Caller, Credential, credential_failed, throttle_wait};
use super::problem::Problem;
use crate::app::AppState;
use crate::client::Client;
use crate::domain::audit::Action;
use crate::domain::fleet as fleet_rules;
use crate::domain::ids::{JobId, RunnerId};
use crate::domain::operator::Role;
use crate::domain::pool::Pool;
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::problem::ApiError;
use crate::store::AuditFilter;
use askama::Template;
use axum::Router;
use axum::extract::{Form, FromRequestParts, Path, Query, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LOCATION, RETRY_AFTER, SET_COOKIE,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use pieces::{FleetBody, FleetParts, Piece};
use serde::Deserialize;
use session::Viewer;
use std::collections::BTreeMap;
use views::{DigestView, PoolCard, RunnerRow};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin", get(fleet))
        .route("/admin/fleet", get(fleet_fragment))
        .route("/admin/login", get(login_form).post(login))
        .route("/admin/logout", post(logout))
        .route("/admin/runners/{id}", get(runner_page))
        .route("/admin/runners/{id}/{action}", post(runner_action))
        .route("/admin/jobs/{id}", get(job_page))
        .route("/admin/assets/app.css", get(css))
        .route("/admin/assets/app.js", get(js))
}

/// The request header a refresh names the pieces it shows by (their hashes).
const FLEET_HAVE: &str = "x-fleet-have";

/// A page response with the headers every page carries: no caching, no framing, scripts and
/// styles from this origin only.
fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    r
}

fn render(status: StatusCode, t: &impl Template) -> Result<Response, ApiError> {
    Ok(html(status, rendered(t)?))
}

fn rendered(t: &impl Template) -> Result<String, ApiError> {
    t.render().map_err(template_failed)
}

fn template_failed(e: askama::Error) -> ApiError {
    tracing::error!(error = %e, "template failed");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error",
    )
}

fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut().insert(
        LOCATION,
        HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/admin")),
    );
    r
}

/// A logged-in viewer; anyone else is sent to the login page.
pub struct PageViewer(pub Viewer);

impl FromRequestParts<AppState> for PageViewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        match session::viewer(state, &parts.headers, Millis::now()).await {
            Ok(Some(viewer)) => Ok(PageViewer(viewer)),
            Ok(None) => Err(see_other("/admin/login")),
            Err(e) => Err(ApiError::from(e).into_response()),
        }
    }
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    logged_in: bool,
    who: String,
    csrf: String,
    error: Option<String>,
}

#[derive(Deserialize, Default)]
struct LoginQuery {
    #[serde(default)]
    token: Option<String>,
}

/// The login form. `?token=` logs in at once: `leasegate demo` prints such a link.
#[utoipa::path(get, path = "/admin/login", tag = "page",
    params(("token" = Option<String>, Query, description = "The admin token: log in at once.")),
    responses(
        (status = 200, description = "The login form.", body = String, content_type = "text/html"),
        (status = 303, description = "Logged in (with `?token=`): to `/admin`, with the session cookie."),
        (status = 401, description = "A wrong `?token=`: the form again.", body = String, content_type = "text/html"),
    ))]
async fn login_form(
    State(state): State<AppState>,
    client: Client,
    Query(q): Query<LoginQuery>,
) -> Result<Response, ApiError> {
    if let Some(token) = q.token {
        return login_with(&state, client, &token).await;
    }
    render(
        StatusCode::OK,
        &LoginPage {
            logged_in: false,
            who: String::new(),
            csrf: String::new(),
            error: None,
        },
    )
}

#[derive(Deserialize, utoipa::ToSchema)]
struct LoginForm {
    /// The admin token, or an operator's named token.
    token: String,
}

#[utoipa::path(post, path = "/admin/login", tag = "page",
    request_body(content = LoginForm, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 303, description = "The admin token: the session cookie, to `/admin`."),
        (status = 401, description = "Anything else: the form again.", body = String, content_type = "text/html"),
        (status = 403, description = "`forbidden`: a cross-site login.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn login(
    State(state): State<AppState>,
    client: Client,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, ApiError> {
    if session::same_origin(&headers) == Some(false) {
        return Err(ApiError::forbidden("cross-site login refused"));
    }
    login_with(&state, client, &form.token).await
}

/// The login form again, with what went wrong.
fn login_refused(status: StatusCode, error: String) -> Result<Response, ApiError> {
    let page = LoginPage {
        logged_in: false,
        who: String::new(),
        csrf: String::new(),
        error: Some(error),
    };
    render(status, &page)
}

async fn login_with(state: &AppState, client: Client, token: &str) -> Result<Response, ApiError> {
    if let Some(wait_s) = throttle_wait(state, client, Credential::PageLogin) {
        let mut r = login_refused(
            StatusCode::TOO_MANY_REQUESTS,
            format!("Too many failed logins from this address: try again in {wait_s} s."),
        )?;
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(wait_s.max(1)));
        return Ok(r);
    }
    let token = token.trim();
    let Some(operator) = crate::http::auth::operator_of(state, token).await? else {
        tracing::info!(client = %client.ip, "page login refused");
        credential_failed(state, client, Credential::PageLogin);
        return login_refused(
            StatusCode::UNAUTHORIZED,
            "That is not a valid token: use the admin token or a named operator token.".into(),
        );
    };
    let caller = Caller { operator, client };
    let value = session::open(state, &caller, token, Millis::now()).await?;
    let mut r = see_other("/admin");
    let cookie = session::set_cookie(&value, session::SESSION_S, client.https);
    r.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("cookie is ASCII"),
    );
    Ok(r)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct CsrfForm {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    back: Option<String>,
}

#[utoipa::path(post, path = "/admin/logout", tag = "page",
    request_body(content = Option<CsrfForm>, content_type = "application/x-www-form-urlencoded", description = "Optional without a session (the answer is the redirect)."),
    responses(
        (status = 303, description = "The cookie cleared, to `/admin/login`."),
    ))]
async fn logout(
    State(state): State<AppState>,
    PageViewer(viewer): PageViewer,
    client: Client,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, ApiError> {
    if !session::post_allowed(&viewer, &headers, form.csrf.as_deref()) {
        return Err(ApiError::forbidden("cross-site request refused"));
    }
    // Ended on the server: the old cookie opens nothing from now on, anywhere.
    let caller = Caller {
        operator: viewer.operator().clone(),
        client,
    };
    session::close(&state, &headers, &caller).await?;
    let mut r = see_other("/admin/login");
    r.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_str(&session::set_cookie("", 0, client.https)).expect("ASCII"),
    );
    Ok(r)
}

#[derive(Template)]
#[template(path = "fleet.html")]
struct FleetPage {
    logged_in: bool,
    who: String,
    csrf: String,
    /// The refresh's query (the filters and the page).
    query: String,
    body: FleetBody,
}

#[derive(Template)]
#[template(path = "fleet_fragment.html")]
struct FleetFragment<'a> {
    pieces: Vec<(&'static str, &'a Piece, bool)>,
}

/// Every status a runner may have, for the filter.
fn statuses() -> Vec<&'static str> {
    crate::domain::status::RunnerStatus::ALL
        .iter()
        .map(|s| s.as_str())
        .collect()
}

/// The fleet view for `viewer`, in pieces, and the refresh's query.
async fn fleet_view(
    state: &AppState,
    viewer: &Viewer,
    query: &fleet::FleetQuery,
) -> Result<(FleetBody, String), ApiError> {
    let now = Millis::now();
    let rules = state.settings().status_rules();
    let store = state.store();
    let pools: BTreeMap<PoolName, Pool> = store
        .list_pools()
        .await?
        .into_iter()
        .map(|p| (p.name.clone(), p))
        .collect();
    // Every runner judged from its summary; only the page's runners are read whole.
    let summaries = store.runner_summaries(None, query.searches()).await?;
    let judged = fleet_rules::judge(&summaries, &pools, rules, now);
    let tallies = fleet_rules::tally(&judged);
    let (shown, mut selection) = fleet::select(&judged, query);
    let whole = store.runners_by_id(&fleet_rules::ids(&shown)).await?;
    let refusals = store.refusal_counts_since(now.minus_secs(3600)).await?;
    selection.rows = fleet_rules::in_shown_order(&shown, whole)
        .iter()
        .map(|(runner, pool)| {
            let observed = runner.observe(pool, now, rules);
            let refused = refusals.get(&runner.id).copied().unwrap_or(0);
            let mut row = views::runner_row(runner, &observed, refused, now);
            row.images = views::image_rows(runner, pool);
            row
        })
        .collect();
    let mut depths = store.queue_depths().await?;
    // Every pool's day of samples in one read, not one per pool.
    let mut samples: BTreeMap<PoolName, Vec<_>> = BTreeMap::new();
    let since = now.minus_secs(crate::domain::timeline::SAMPLES_KEPT_S);
    for sample in store.pool_samples(since).await? {
        samples.entry(sample.pool.clone()).or_default().push(sample);
    }
    let cards: Vec<PoolCard> = pools
        .values()
        .map(|p| {
            let depth = depths.remove(&p.name).unwrap_or_default();
            let mut card = views::pool_card(p, tallies.get(&p.name), depth, now);
            let own = samples.get(&p.name).map_or(&[][..], Vec::as_slice);
            card.timelines = timeline::timelines(own, now);
            card
        })
        .collect();
    let body = FleetBody::render(&FleetParts {
        as_of: &now.rfc3339(),
        pools: &cards,
        sel: &selection,
        statuses: &statuses(),
        can_write: viewer.operator().may(Role::Operator),
        csrf: viewer.csrf(),
    })
    .map_err(template_failed)?;
    Ok((body, selection.query))
}

#[utoipa::path(get, path = "/admin", tag = "page",
    security((), ("admin_token" = [])),
    params(
        ("pool" = Option<String>, Query, description = "Only this pool's runners."),
        ("status" = Option<String>, Query, description = "Only runners of this status (`healthy` lists the healthy ones, otherwise a count)."),
        ("q" = Option<String>, Query, description = "A search over name, labels (`key=value`) and host."),
        ("limit" = Option<usize>, Query, description = "Runners per page, 1 to 500, default 50."),
        ("cursor" = Option<String>, Query, description = "The next page's cursor, from the page's own link."),
    ),
    responses(
        (status = 200, description = "The fleet page.", body = String, content_type = "text/html"),
        (status = 303, description = "No session: to `/admin/login`."),
    ))]
async fn fleet(
    State(state): State<AppState>,
    PageViewer(viewer): PageViewer,
    Query(query): Query<fleet::FleetQuery>,
) -> Result<Response, ApiError> {
    let (body, query) = fleet_view(&state, &viewer, &query).await?;
    render(
        StatusCode::OK,
        &FleetPage {
            logged_in: viewer.is_session(),
            who: who(&viewer),
            csrf: viewer.csrf().into(),
            query,
            body,
        },
    )
}

#[utoipa::path(get, path = "/admin/fleet", tag = "page",
    security((), ("admin_token" = [])),
    params(
        ("pool" = Option<String>, Query, description = "As for `/admin`."),
        ("status" = Option<String>, Query, description = "As for `/admin`."),
        ("q" = Option<String>, Query, description = "As for `/admin`."),
        ("limit" = Option<usize>, Query, description = "As for `/admin`."),
        ("cursor" = Option<String>, Query, description = "As for `/admin`."),
        ("X-Fleet-Have" = Option<String>, Header, description = "The hashes (`data-hash`, 16 hex digits, space-separated) of the pieces the page shows: those are sent empty, to be kept."),
    ),
    responses(
        (status = 200, description = "The fleet's pieces in order, each a `<template>` naming its slot, key and hash; one named in `X-Fleet-Have` is empty (`data-kept`). With the view's `ETag`.", body = String, content_type = "text/html"),
        (status = 304, description = "`If-None-Match` named this view's `ETag`: nothing changed."),
        (status = 401, description = "`unauthorized`: no valid session (no redirect).", body = Problem, content_type = "application/problem+json"),
    ))]
async fn fleet_fragment(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<fleet::FleetQuery>,
) -> Result<Response, ApiError> {
    // The refresh script follows no redirect to a login page: an expired session is a 401.
    let viewer = session::viewer(&state, &headers, Millis::now())
        .await?
        .ok_or_else(|| ApiError::unauthorized("log in again"))?;
    let (body, _) = fleet_view(&state, &viewer, &query).await?;
    let have = pieces::have(headers.get(FLEET_HAVE).and_then(|v| v.to_str().ok()));
    let etag = body.etag.clone();
    let unchanged = headers
        .get(IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag);
    let mut response = if unchanged {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        r.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    } else {
        let fragment = FleetFragment {
            pieces: body.refresh(&have),
        };
        html(StatusCode::OK, rendered(&fragment)?)
    };
    response
        .headers_mut()
        .insert(ETAG, HeaderValue::from_str(&etag).expect("hex is ASCII"));
    Ok(response)
}

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

/// Who is logged in, as the page's header says it.
fn who(viewer: &Viewer) -> String {
    let o = viewer.operator();
    format!("{} ({})", o.name, o.role)
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
async fn runner_page(
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

#[utoipa::path(post, path = "/admin/runners/{id}/{action}", tag = "page",
    request_body(content = CsrfForm, content_type = "application/x-www-form-urlencoded", description = "Without a session the answer is the redirect, whatever the body."),
    security((), ("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"), ("action" = String, Path, description = "`cordon`, `uncordon`, `reinstate` or `revoke`.")),
    responses(
        (status = 303, description = "Done: back to the form's `back` (default `/admin`), or no session: to `/admin/login`."),
        (status = 403, description = "`forbidden`: a missing or wrong CSRF token, another site's `Origin`, or a viewer.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such runner or action.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn runner_action(
    State(state): State<AppState>,
    PageViewer(viewer): PageViewer,
    client: Client,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, ApiError> {
    if !session::post_allowed(&viewer, &headers, form.csrf.as_deref()) {
        return Err(ApiError::forbidden(
            "cross-site request refused: reload the page and try again",
        ));
    }
    let operator = viewer.operator();
    if !operator.may(Role::Operator) {
        return Err(ApiError::forbidden(format!(
            "{} is a {}: changing runners needs the operator role",
            operator.name, operator.role
        )));
    }
    let caller = Caller {
        operator: operator.clone(),
        client,
    };
    let id = RunnerId::parse("id", &id)?;
    let now = Millis::now();
    let store = state.store();
    let audit = |action| caller.audit(action, id.as_str(), now);
    let done = match action.as_str() {
        "cordon" => {
            store
                .set_cordoned(&id, true, &audit(Action::RunnerCordon))
                .await?
        }
        "uncordon" => {
            store
                .set_cordoned(&id, false, &audit(Action::RunnerUncordon))
                .await?
        }
        "reinstate" => {
            store
                .reinstate_runner(&id, &audit(Action::RunnerReinstate))
                .await?
        }
        "revoke" => {
            state
                .revoke_runner(&id, now, &audit(Action::RunnerRevoke))
                .await?
        }
        _ => return Err(ApiError::not_found("action")),
    };
    done.ok_or_else(|| ApiError::not_found("runner"))?;
    tracing::info!(runner_id = %id, action = %action, "runner changed from the page");
    // Only paths on this page are followed back to.
    let back = form
        .back
        .filter(|b| b.starts_with("/admin") && !b.starts_with("//"))
        .unwrap_or_else(|| "/admin".into());
    Ok(see_other(&back))
}

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
async fn job_page(
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

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut().insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    r
}

#[utoipa::path(get, path = "/admin/assets/app.css", tag = "page",
    responses(
        (status = 200, description = "The page's stylesheet.", body = String, content_type = "text/css"),
    ))]
async fn css() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../../../assets/app.css"),
    )
}

#[utoipa::path(get, path = "/admin/assets/app.js", tag = "page",
    responses(
        (status = 200, description = "The page's script.", body = String, content_type = "text/javascript"),
    ))]
async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../../../assets/app.js"),
    )
}

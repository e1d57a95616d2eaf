//! The runner-health page: server-rendered HTML (askama templates, escaped), embedded assets,
//! login with an operator's token into a session cookie, and cordon / uncordon / revoke forms
//! (for operators and admins; a viewer sees the page without them).
//!
//! Everything a runner sent (names, labels, probe errors) reaches the page only through
//! templates that escape it. The page's own POSTs need the session's CSRF token.
//!
//! One module per page: `login` (and logout), `fleet_page` (and its refresh), `runner_page`,
//! `runner_actions` (its forms), `job_page`, `assets`. What they are made of: `fleet` selects
//! the runners, `pieces` cuts the fleet view for refreshes, `views` makes rows and cards,
//! `timeline` the pools' bars, `status` the colours, `session` the cookie. Here the router and
//! what every page shares: the page headers, rendering, the redirect, the logged-in viewer.

pub(super) mod assets;
pub mod fleet;
pub(super) mod fleet_page;
pub(super) mod job_page;
pub(super) mod login;
pub mod pieces;
pub(super) mod runner_actions;
pub(super) mod runner_page;
pub mod session;
pub mod status;
pub mod timeline;
pub mod views;

use crate::app::AppState;
use crate::domain::time::Millis;
use crate::problem::ApiError;
use askama::Template;
use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use session::Viewer;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin", get(fleet_page::fleet))
        .route("/admin/fleet", get(fleet_page::fleet_fragment))
        .route("/admin/login", get(login::login_form).post(login::login))
        .route("/admin/logout", post(login::logout))
        .route("/admin/runners/{id}", get(runner_page::runner_page))
        .route(
            "/admin/runners/{id}/{action}",
            post(runner_actions::runner_action),
        )
        .route("/admin/jobs/{id}", get(job_page::job_page))
        .route("/admin/assets/app.css", get(assets::css))
        .route("/admin/assets/app.js", get(assets::js))
}

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

/// Who is logged in, as the page's header says it.
fn who(viewer: &Viewer) -> String {
    let o = viewer.operator();
    format!("{} ({})", o.name, o.role)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct CsrfForm {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    back: Option<String>,
}

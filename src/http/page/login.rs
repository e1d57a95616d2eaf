//! Logging in and out: the login form (and `?token=`, which logs in at once), the form's POST,
//! which opens a session cookie for an operator's token under the credential throttle, and
//! logout, which ends the session on the server.

use super::session;
use super::{CsrfForm, PageViewer, render, see_other};
use crate::app::AppState;
use crate::client::Client;
use crate::domain::time::Millis;
use crate::http::auth::{Caller, Credential, credential_failed, throttle_wait};
use crate::http::problem::Problem;
use crate::problem::ApiError;
use askama::Template;
use axum::extract::{Form, Query, State};
use axum::http::header::{RETRY_AFTER, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde::Deserialize;

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    logged_in: bool,
    who: String,
    csrf: String,
    error: Option<String>,
}

#[derive(Deserialize, Default)]
pub(super) struct LoginQuery {
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
pub(super) async fn login_form(
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
pub(super) struct LoginForm {
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
pub(super) async fn login(
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

#[utoipa::path(post, path = "/admin/logout", tag = "page",
    request_body(content = Option<CsrfForm>, content_type = "application/x-www-form-urlencoded", description = "Optional without a session (the answer is the redirect)."),
    responses(
        (status = 303, description = "The cookie cleared, to `/admin/login`."),
    ))]
pub(super) async fn logout(
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

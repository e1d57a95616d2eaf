//! The health page's credentials: a session cookie set by logging in with an operator's
//! token (the admin token or a named one), and a CSRF token for the page's own forms.
//!
//! A session is kept by the service (`Store::page_session`), not in the cookie: the cookie
//! holds a random token, the store its hash, so logging out ends the session at once on every
//! replica, and an old cookie is worth nothing after. A session is bound to the credential it
//! was opened with: rotating the admin token (once the previous value is removed) or revoking
//! a named token ends every session opened with it, and the operator's role is read again
//! with the credential on every request.
//! The cookie is `HttpOnly` (scripts cannot read it), `SameSite=Strict` (no browser sends it
//! on a cross-site request) and `Secure` when the page was reached over TLS (a trusted proxy
//! says so: `X-Forwarded-Proto: https`). The page's POSTs also carry a CSRF token derived
//! from the session's token, and an `Origin` that is not this site is refused outright.

use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::operator::Operator;
use crate::domain::time::Millis;
use crate::http::auth::Caller;
use crate::secrets::{generate_token, hash_token, secret_matches};
use crate::store::{PageSession, StoreResult};
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};

pub const COOKIE_NAME: &str = "leasegate_session";
/// How long a login lasts.
pub const SESSION_S: i64 = 12 * 3600;

/// The CSRF token of the session whose cookie holds `token`: unguessable without the cookie,
/// which another site's page cannot read.
fn csrf_of(token: &str) -> String {
    hash_token(&format!("csrf\0{token}"))
}

/// Opens a session for `caller`, who presented `credential`; the cookie's value. The login
/// is recorded in the audit trail.
pub async fn open(
    state: &AppState,
    caller: &Caller,
    credential: &str,
    now: Millis,
) -> StoreResult<String> {
    let token = generate_token("lgs_");
    let name = caller.operator.name.to_string();
    state
        .store()
        .create_page_session(
            &PageSession {
                token_hash: hash_token(&token),
                actor: name.clone(),
                credential_hash: hash_token(credential),
                created_at: now,
                expires_at: now.plus_secs(SESSION_S),
            },
            &caller.audit(Action::PageLogin, name, now),
        )
        .await?;
    Ok(token)
}

/// Ends the session whose cookie `headers` carry, if any, recording the logout.
pub async fn close(state: &AppState, headers: &HeaderMap, caller: &Caller) -> StoreResult<()> {
    match cookie_value(headers) {
        Some(token) => {
            let name = caller.operator.name.to_string();
            let audit = caller.audit(Action::PageLogout, name, Millis::now());
            state
                .store()
                .end_page_session(&hash_token(token), &audit)
                .await
        }
        None => Ok(()),
    }
}

/// The `Set-Cookie` header value for a session (or for logging out, with an empty value).
pub fn set_cookie(value: &str, max_age_s: i64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE_NAME}={value}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{secure}"
    )
}

fn cookie_value(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE_NAME)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// Who is looking at the page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Viewer {
    /// Logged in with the cookie; the CSRF token its forms must carry.
    Session { operator: Operator, csrf: String },
    /// An operator's bearer token (scripts, curl): no ambient credential, so no CSRF token
    /// needed.
    Bearer { operator: Operator },
}

impl Viewer {
    pub fn csrf(&self) -> &str {
        match self {
            Viewer::Session { csrf, .. } => csrf,
            Viewer::Bearer { .. } => "",
        }
    }

    pub fn operator(&self) -> &Operator {
        match self {
            Viewer::Session { operator, .. } | Viewer::Bearer { operator } => operator,
        }
    }

    pub fn is_session(&self) -> bool {
        matches!(self, Viewer::Session { .. })
    }
}

/// The operator whose token hashes to `hash`, current: the configured admin token's
/// `bootstrap` (current or previous value), or a named token not revoked.
async fn operator_by_hash(state: &AppState, hash: &str) -> StoreResult<Option<Operator>> {
    if state.secrets().admin_hash_valid(hash) {
        return Ok(Some(Operator::bootstrap()));
    }
    state.store().operator_by_token(hash).await
}

/// The viewer behind `headers`, if any credential is valid at `now`.
pub async fn viewer(
    state: &AppState,
    headers: &HeaderMap,
    now: Millis,
) -> StoreResult<Option<Viewer>> {
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    if let Some(token) = bearer
        && let Some(operator) = operator_by_hash(state, &hash_token(token)).await?
    {
        return Ok(Some(Viewer::Bearer { operator }));
    }
    let Some(token) = cookie_value(headers) else {
        return Ok(None);
    };
    let Some(session) = state.store().page_session(&hash_token(token), now).await? else {
        return Ok(None);
    };
    // Opened with a credential that is no longer accepted (rotated out, revoked): ended with it.
    let Some(operator) = operator_by_hash(state, &session.credential_hash).await? else {
        return Ok(None);
    };
    // A name revoked and created again with another token is another credential, so this
    // holds; it is checked all the same, so that a session is only ever its opener's.
    if operator.name.as_str() != session.actor {
        return Ok(None);
    }
    Ok(Some(Viewer::Session {
        operator,
        csrf: csrf_of(token),
    }))
}

/// Whether a POST from this viewer may change anything: the bearer token may; a session needs
/// its CSRF token and no foreign `Origin`.
pub fn post_allowed(viewer: &Viewer, headers: &HeaderMap, csrf_field: Option<&str>) -> bool {
    if same_origin(headers) == Some(false) {
        return false;
    }
    match viewer {
        Viewer::Bearer { .. } => true,
        Viewer::Session { csrf, .. } => csrf_field.is_some_and(|f| secret_matches(f, csrf)),
    }
}

/// `Some(true)` when `Origin` names this host, `Some(false)` when it names another, `None`
/// when the browser sent none (or `null`).
pub fn same_origin(headers: &HeaderMap) -> Option<bool> {
    let origin = headers.get(ORIGIN)?.to_str().ok()?;
    // Browsers send `null` for privacy-sensitive contexts: it says nothing either way.
    if origin == "null" {
        return None;
    }
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
    Some(!host.is_empty() && origin_host == host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_cookie_is_secure_only_over_tls() {
        assert!(set_cookie("v", 60, true).ends_with("; Secure"));
        assert!(!set_cookie("v", 60, false).contains("Secure"));
        assert!(set_cookie("v", 60, false).contains("HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn session_posts_need_the_csrf_token_and_no_foreign_origin() {
        let mut headers = HeaderMap::new();
        let v = Viewer::Session {
            operator: Operator::bootstrap(),
            csrf: csrf_of("lgs_token"),
        };
        assert!(!post_allowed(&v, &headers, None));
        assert!(!post_allowed(&v, &headers, Some("wrong")));
        assert!(post_allowed(&v, &headers, Some(v.csrf())));
        headers.insert(HOST, HeaderValue::from_static("gate.example:8080"));
        headers.insert(ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert!(!post_allowed(&v, &headers, Some(v.csrf())));
        headers.insert(ORIGIN, HeaderValue::from_static("http://gate.example:8080"));
        assert!(post_allowed(&v, &headers, Some(v.csrf())));
    }
}

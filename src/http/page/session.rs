//! The health page's credentials: a signed session cookie set by logging in with the admin
//! token, and a CSRF token for the page's own forms.
//!
//! The cookie is stateless: its expiry, MAC'd with a key derived from the admin token, so any
//! replica can check it and rotating the admin token ends every session. It is `HttpOnly`
//! (scripts cannot read it) and `SameSite=Strict` (no browser sends it on a cross-site
//! request). The page's POSTs also carry a CSRF token derived from the same session, and an
//! `Origin` that is not this site is refused outright.

use crate::domain::time::Millis;
use crate::secrets::secret_matches;
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const COOKIE_NAME: &str = "leasegate_session";
/// How long a login lasts.
pub const SESSION_S: i64 = 12 * 3600;

fn mac(admin_token: &str, purpose: &str, message: &str) -> String {
    let mut m =
        Hmac::<Sha256>::new_from_slice(admin_token.as_bytes()).expect("HMAC takes any key length");
    m.update(purpose.as_bytes());
    m.update(b"\0");
    m.update(message.as_bytes());
    hex::encode(m.finalize().into_bytes())
}

/// A new session's cookie value, valid until `now + SESSION_S`.
pub fn new_session(admin_token: &str, now: Millis) -> String {
    let expires = now.plus_secs(SESSION_S).0.to_string();
    format!("{expires}.{}", mac(admin_token, "session", &expires))
}

/// The `Set-Cookie` header value for a session (or for logging out, with an empty value).
pub fn set_cookie(value: &str, max_age_s: i64) -> String {
    format!("{COOKIE_NAME}={value}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={max_age_s}")
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
}

/// Who is looking at the page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Viewer {
    /// Logged in with the cookie; the CSRF token its forms must carry.
    Session { csrf: String },
    /// The admin bearer token (scripts, curl): no ambient credential, so no CSRF token needed.
    Bearer,
}

impl Viewer {
    pub fn csrf(&self) -> &str {
        match self {
            Viewer::Session { csrf } => csrf,
            Viewer::Bearer => "",
        }
    }
}

/// The viewer behind `headers`, if any credential is valid at `now`.
pub fn viewer(headers: &HeaderMap, admin_token: &str, now: Millis) -> Option<Viewer> {
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    if bearer.is_some_and(|t| secret_matches(t, admin_token)) {
        return Some(Viewer::Bearer);
    }
    let value = cookie_value(headers)?;
    let (expires, tag) = value.split_once('.')?;
    let expires_at: i64 = expires.parse().ok()?;
    if now.0 >= expires_at || !secret_matches(tag, &mac(admin_token, "session", expires)) {
        return None;
    }
    Some(Viewer::Session {
        csrf: mac(admin_token, "csrf", value),
    })
}

/// Whether a POST from this viewer may change anything: the bearer token may; a session needs
/// its CSRF token and no foreign `Origin`.
pub fn post_allowed(viewer: &Viewer, headers: &HeaderMap, csrf_field: Option<&str>) -> bool {
    if same_origin(headers) == Some(false) {
        return false;
    }
    match viewer {
        Viewer::Bearer => true,
        Viewer::Session { csrf } => csrf_field.is_some_and(|f| secret_matches(f, csrf)),
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

    fn with_cookie(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE_NAME}={value}")).unwrap(),
        );
        h
    }

    #[test]
    fn a_session_is_valid_until_it_expires_and_only_for_its_token() {
        let now = Millis(1_800_000_000_000);
        let value = new_session("admin", now);
        let v = viewer(&with_cookie(&value), "admin", now).unwrap();
        assert!(matches!(v, Viewer::Session { .. }));
        assert!(viewer(&with_cookie(&value), "rotated", now).is_none());
        assert!(viewer(&with_cookie(&value), "admin", now.plus_secs(SESSION_S)).is_none());
        let forged = format!("{}.{}", now.plus_secs(999_999).0, "00");
        assert!(viewer(&with_cookie(&forged), "admin", now).is_none());
    }

    #[test]
    fn session_posts_need_the_csrf_token_and_no_foreign_origin() {
        let now = Millis(1_800_000_000_000);
        let mut headers = with_cookie(&new_session("admin", now));
        let v = viewer(&headers, "admin", now).unwrap();
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

//! What can go wrong talking to GitHub, sorted by what the caller does about it: wait and try
//! again (`Unavailable`: unreachable, a 5xx, a rate limit), or tell an operator (`Refused`: a
//! credential or permission GitHub does not accept, a scope it does not know).
//!
//! GitHub's rate limits come as `403` or `429` with `x-ratelimit-remaining: 0` (wait until
//! `x-ratelimit-reset`, epoch seconds) or with `retry-after` (secondary limits); a `429`
//! without either means a minute. A `403` without them is a permission refused.

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

/// How long to wait after a rate limit that says nothing more (GitHub's guidance: a minute).
pub const RATE_LIMIT_DEFAULT_S: i64 = 60;
/// How long to wait after GitHub could not be reached or answered 5xx without `retry-after`.
pub const UNAVAILABLE_DEFAULT_S: i64 = 30;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GithubError {
    /// Try again after `retry_after_s`.
    #[error("{detail}")]
    Unavailable { retry_after_s: i64, detail: String },
    /// GitHub refused the call: its status and its message.
    #[error("GitHub answered {status}: {message}")]
    Refused { status: u16, message: String },
    /// An answer that is not what GitHub's description says.
    #[error("GitHub's answer is not what its API describes: {0}")]
    Unexpected(String),
}

impl GithubError {
    pub fn status(&self) -> Option<u16> {
        match self {
            GithubError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The rate-limit wait a `403`/`429` carries, in seconds from `now_s`: `None` for a `403`
/// that is not a rate limit.
fn rate_limited(status: StatusCode, headers: &HeaderMap, now_s: i64) -> Option<i64> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i64>().ok())
    };
    if let Some(secs) = header("retry-after") {
        return Some(secs.max(1));
    }
    if header("x-ratelimit-remaining") == Some(0) {
        let reset = header("x-ratelimit-reset").map_or(RATE_LIMIT_DEFAULT_S, |r| r - now_s);
        return Some(reset.max(1));
    }
    (status == StatusCode::TOO_MANY_REQUESTS).then_some(RATE_LIMIT_DEFAULT_S)
}

/// GitHub's `message` from an error body (`basic-error`), or the body's start.
fn message_of(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let text = match parsed.as_ref().and_then(|v| v.get("message")?.as_str()) {
        Some(m) => m.to_string(),
        None => String::from_utf8_lossy(body).into_owned(),
    };
    crate::domain::text::sanitize(text.trim(), 300)
}

/// The error an answer that is not a success stands for.
pub fn classify(status: StatusCode, headers: &HeaderMap, body: &[u8], now_s: i64) -> GithubError {
    let message = message_of(body);
    if matches!(
        status,
        StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    ) && let Some(retry_after_s) = rate_limited(status, headers, now_s)
    {
        return GithubError::Unavailable {
            retry_after_s,
            detail: format!(
                "GitHub is rate-limiting leasegate ({}: {message}); retry in {retry_after_s} s",
                status.as_u16()
            ),
        };
    }
    if status.is_server_error() {
        let retry_after_s = rate_limited(status, headers, now_s)
            .filter(|_| headers.contains_key("retry-after"))
            .unwrap_or(UNAVAILABLE_DEFAULT_S);
        return GithubError::Unavailable {
            retry_after_s,
            detail: format!("GitHub answered {}: {message}", status.as_u16()),
        };
    }
    GithubError::Refused {
        status: status.as_u16(),
        message,
    }
}

/// GitHub could not be reached at all.
pub fn unreachable(e: &reqwest::Error) -> GithubError {
    let why = if e.is_timeout() {
        "it did not answer in time".to_string()
    } else if e.is_connect() {
        format!("cannot connect: {}", source_chain(e))
    } else {
        source_chain(e)
    };
    GithubError::Unavailable {
        retry_after_s: UNAVAILABLE_DEFAULT_S,
        detail: format!("cannot reach GitHub: {why}"),
    }
}

/// The error and its causes, as one line (the URL left out: it is in the settings).
fn source_chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    if let Some(url) = e.url() {
        out = out.replace(&format!(" for url ({url})"), "");
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const NOW: i64 = 1_800_000_000;
    const BODY: &[u8] = br#"{"message": "Resource not accessible by integration", "documentation_url": "https://docs.github.com"}"#;

    #[test]
    fn a_rate_limit_waits_as_github_says_and_a_bare_403_is_a_refusal() {
        let primary = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &(NOW + 42).to_string()),
        ]);
        for status in [StatusCode::FORBIDDEN, StatusCode::TOO_MANY_REQUESTS] {
            let e = classify(status, &primary, BODY, NOW);
            assert!(
                matches!(
                    e,
                    GithubError::Unavailable {
                        retry_after_s: 42,
                        ..
                    }
                ),
                "{e:?}"
            );
        }
        let secondary = headers(&[("retry-after", "7")]);
        assert!(matches!(
            classify(StatusCode::FORBIDDEN, &secondary, BODY, NOW),
            GithubError::Unavailable {
                retry_after_s: 7,
                ..
            }
        ));
        assert!(matches!(
            classify(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), BODY, NOW),
            GithubError::Unavailable {
                retry_after_s: RATE_LIMIT_DEFAULT_S,
                ..
            }
        ));
        assert_eq!(
            classify(StatusCode::FORBIDDEN, &HeaderMap::new(), BODY, NOW),
            GithubError::Refused {
                status: 403,
                message: "Resource not accessible by integration".into()
            }
        );
        // A limit whose reset is already past is waited out for a second, not a negative time.
        let past = headers(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "1")]);
        assert!(matches!(
            classify(StatusCode::FORBIDDEN, &past, BODY, NOW),
            GithubError::Unavailable {
                retry_after_s: 1,
                ..
            }
        ));
    }

    #[test]
    fn server_errors_are_retried_after_githubs_retry_after_or_a_default() {
        assert!(matches!(
            classify(StatusCode::BAD_GATEWAY, &HeaderMap::new(), b"<html>", NOW),
            GithubError::Unavailable {
                retry_after_s: UNAVAILABLE_DEFAULT_S,
                ..
            }
        ));
        assert!(matches!(
            classify(
                StatusCode::SERVICE_UNAVAILABLE,
                &headers(&[("retry-after", "12")]),
                b"",
                NOW
            ),
            GithubError::Unavailable {
                retry_after_s: 12,
                ..
            }
        ));
    }
}

//! GitLab's runner API (`/api/v4/…`).
//!
//! A runner asks for work with `POST /api/v4/jobs/request`, its authentication token in the
//! JSON body (`token`, also sent as `RUNNER-TOKEN`). GitLab answers `201` with a job, or `204`
//! with `X-GitLab-Last-Update` when there is none, which is what a paused runner gets too. The
//! gate never answers `403`: gitlab-runner counts it against the runner's health and stops
//! asking for an hour.
//!
//! A refused runner's request is held, as GitLab holds it when it long-polls, so a refused
//! runner does not ask in a tight loop: up to `LEASEGATE_FORGE_HOLD_S` (30 s), then `204`
//! echoing the request's `last_update`. It is looked at again every second meanwhile, and
//! forwarded at once when the runner may have work. The runner is known by the SHA-256 of its
//! token; the token itself is only ever forwarded to GitLab.

use super::decide::{self, Verdict};
use super::{ForgeGate, REFUSAL_HEADER, WOULD_REFUSE_HEADER, count, peer_of};
use crate::app::AppState;
use crate::domain::forge::{ForgeIdentity, ForgeKind};
use crate::domain::time::Millis;
use crate::http::problem::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::time::Duration;

/// The one call the gate answers itself.
pub const JOBS_REQUEST: &str = "/api/v4/jobs/request";

/// The largest job request read (gitlab-runner sends a few KB of `info`).
const MAX_REQUEST_BYTES: usize = 256 * 1024;

/// How often a held request is judged again.
const RECHECK: Duration = Duration::from_secs(1);

/// What the gate reads of a job request; the rest goes to GitLab as it came.
#[derive(Deserialize, Default)]
struct JobRequest {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    last_update: Option<String>,
}

pub async fn handle(State(state): State<AppState>, request: Request) -> Response {
    let gate = state.forge_gate().expect("routed only with a forge gate");
    let upstream = gate
        .settings
        .gitlab
        .clone()
        .expect("routed only with a gitlab upstream");
    let (parts, body) = request.into_parts();
    let peer = peer_of(&state, &parts);
    if parts.method == Method::POST && parts.uri.path() == JOBS_REQUEST {
        let bytes = match axum::body::to_bytes(body, MAX_REQUEST_BYTES).await {
            Ok(b) => b,
            Err(e) if crate::http::listener::body::is_body_timeout(&e) => {
                return ApiError::request_timeout().into_response();
            }
            Err(_) => {
                return ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("a job request is at most {MAX_REQUEST_BYTES} bytes"),
                )
                .into_response();
            }
        };
        return jobs_request(&state, gate, parts, bytes, peer, &upstream).await;
    }
    gate.forwarder
        .forward(&upstream, Request::from_parts(parts, body), peer)
        .await
}

async fn jobs_request(
    state: &AppState,
    gate: &ForgeGate,
    parts: axum::http::request::Parts,
    bytes: Bytes,
    peer: super::upstream::Peer,
    upstream: &super::Upstream,
) -> Response {
    let asked: JobRequest = serde_json::from_slice(&bytes).unwrap_or_default();
    let token = asked.token.clone().or_else(|| {
        parts
            .headers
            .get("runner-token")
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    });
    let identity = token.as_deref().map(ForgeIdentity::gitlab_token);
    let deadline = tokio::time::Instant::now() + gate.settings.hold;
    let mut recorded = false;
    let refusal = loop {
        let now = Millis::now();
        let code = match decide::judge(state, &gate.settings, identity.as_ref(), now).await {
            Ok(judged) => {
                if !recorded {
                    recorded = true;
                    if let Err(e) = decide::record(
                        state,
                        &gate.recent,
                        ForgeKind::Gitlab,
                        identity.as_ref(),
                        &judged,
                        now,
                    )
                    .await
                    {
                        tracing::warn!(error = %e, "cannot record a forge refusal");
                    }
                }
                match &judged.verdict {
                    Verdict::Forward | Verdict::Observe(_) => {
                        count(
                            state,
                            ForgeKind::Gitlab,
                            &judged.verdict,
                            judged.subject.is_some(),
                        );
                        let request = Request::from_parts(parts, Body::from(bytes));
                        let mut answer = gate.forwarder.forward(upstream, request, peer).await;
                        if let Verdict::Observe(r) = &judged.verdict {
                            answer
                                .headers_mut()
                                .insert(WOULD_REFUSE_HEADER, HeaderValue::from_static(r.code()));
                        }
                        return answer;
                    }
                    Verdict::Refuse(r) => r.code(),
                }
            }
            Err(e) => {
                // Fail closed, and held like any refusal.
                tracing::warn!(error = %e, "the forge gate cannot judge a fetch: answering no job");
                "unavailable"
            }
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break code;
        }
        tokio::select! {
            _ = tokio::time::sleep(left.min(RECHECK)) => {}
            _ = state.shutdown().cancelled() => break code,
        }
    };
    state.metrics().forge_fetch("gitlab", "refused", refusal);
    no_job(asked.last_update.as_deref(), refusal)
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

//! Forgejo's and Gitea's runner API (`/api/actions/…`, and the artifact services
//! `/api/actions_pipeline/…` and `/twirp/…` the runner hands its jobs).
//!
//! Runners speak the Connect protocol: a unary call is a `POST` whose body is the message,
//! `application/proto` (what the runners send) or `application/json`. `FetchTask` is the only
//! call in which the forge hands out a job, and a `FetchTaskResponse` without a task means "no
//! work": the runner keeps its `tasks_version` and asks again after its interval (2 s by
//! default). So for a refused runner the gate answers `200` with an empty `FetchTaskResponse`
//! in the request's codec (zero bytes in protobuf, `{}` in JSON) and never asks the forge.
//! The runner is known by its `x-runner-uuid`; a spoofed uuid gains nothing, since the forge
//! still checks the `x-runner-token` of every call the gate forwards. Where the binding holds
//! the runner's token's SHA-256, a fetch naming the uuid with another token is forwarded
//! untouched, and learns nothing of the runner (`decide`).

use super::canonical::is_call;
use super::decide::{self, Verdict};
use super::{
    ForgeGate, REFUSAL_HEADER, WOULD_REFUSE_HEADER, canonical_path, count, peer_of, set_path,
};
use crate::app::AppState;
use crate::domain::forge::{ForgeIdentity, ForgeKind};
use crate::domain::time::Millis;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The paths the gate serves for a Forgejo or a Gitea.
pub const PREFIXES: [&str; 3] = ["/api/actions", "/api/actions_pipeline", "/twirp"];

/// The one call the gate answers itself.
pub const FETCH_TASK: &str = "/api/actions/runner.v1.RunnerService/FetchTask";

/// A Connect unary codec, from the request's `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Codec {
    Proto,
    Json,
}

impl Codec {
    fn of(content_type: Option<&str>) -> Option<Self> {
        let base = content_type?.split(';').next()?.trim();
        match base {
            "application/proto" => Some(Codec::Proto),
            "application/json" => Some(Codec::Json),
            _ => None,
        }
    }

    /// An empty `FetchTaskResponse`: no task. proto3 writes no field of default value, so it
    /// is zero bytes; ProtoJSON omits them too, so it is `{}`.
    fn empty_response(self) -> (&'static str, &'static str) {
        match self {
            Codec::Proto => ("application/proto", ""),
            Codec::Json => ("application/json", "{}"),
        }
    }
}

pub async fn handle(State(state): State<AppState>, request: Request) -> Response {
    let gate = state.forge_gate().expect("routed only with a forge gate");
    let upstream = gate
        .settings
        .forgejo
        .clone()
        .expect("routed only with a forgejo upstream");
    let (mut parts, body) = request.into_parts();
    let path = match canonical_path(&parts, &PREFIXES) {
        Ok(path) => path,
        Err(refused) => return refused,
    };
    let peer = peer_of(&state, &parts);
    // Any method: what a forge would do with another one is the forge's business, not a way
    // around the gate.
    if is_call(&path, FETCH_TASK, false) {
        set_path(&mut parts, FETCH_TASK);
        let request = Request::from_parts(parts, body);
        return fetch_task(&state, gate, request, peer, &upstream).await;
    }
    set_path(&mut parts, &path);
    gate.forwarder
        .forward(&upstream, Request::from_parts(parts, body), peer)
        .await
}

async fn fetch_task(
    state: &AppState,
    gate: &ForgeGate,
    request: Request,
    peer: super::upstream::Peer,
    upstream: &super::Upstream,
) -> Response {
    let now = Millis::now();
    let identity = request
        .headers()
        .get("x-runner-uuid")
        .and_then(|v| v.to_str().ok())
        .and_then(|u| ForgeIdentity::forgejo(u).ok());
    let codec = Codec::of(
        request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let token = request
        .headers()
        .get("x-runner-token")
        .and_then(|v| v.to_str().ok());
    let judged = match decide::judge(state, &gate.settings, identity.as_ref(), token, now).await {
        Ok(j) => j,
        Err(e) => {
            // Fail closed: without the store the gate cannot tell, so no runner gets work.
            tracing::warn!(error = %e, "the forge gate cannot judge a fetch: answering no work");
            state
                .metrics()
                .forge_fetch("forgejo", "refused", "unavailable");
            return no_work(codec, "unavailable", request).await;
        }
    };
    if let Err(e) = decide::record(
        state,
        &gate.recent,
        ForgeKind::Forgejo,
        identity.as_ref(),
        &judged,
        now,
    )
    .await
    {
        tracing::warn!(error = %e, "cannot record a forge refusal");
    }
    count(
        state,
        ForgeKind::Forgejo,
        &judged.verdict,
        judged.subject.is_some(),
    );
    match judged.verdict {
        Verdict::Forward | Verdict::Untouched => {
            gate.forwarder.forward(upstream, request, peer).await
        }
        Verdict::Observe(refusal) => {
            let mut answer = gate.forwarder.forward(upstream, request, peer).await;
            answer.headers_mut().insert(
                WOULD_REFUSE_HEADER,
                HeaderValue::from_static(refusal.code()),
            );
            answer
        }
        Verdict::Refuse(refusal) => no_work(codec, refusal.code(), request).await,
    }
}

/// "No work", in the request's codec, without the forge.
async fn no_work(codec: Option<Codec>, code: &'static str, request: Request) -> Response {
    // The request is a few bytes; reading it keeps the connection for the runner's next call.
    let _ = axum::body::to_bytes(request.into_body(), 64 * 1024).await;
    let Some(codec) = codec else {
        // Not a Connect unary call (gRPC, say): refused all the same, in Connect's error shape.
        let body = format!(
            r#"{{"code":"unavailable","message":"leasegate refused this runner's fetch ({code}); the forge gate answers FetchTask over the Connect protocol (application/proto or application/json)"}}"#
        );
        let mut r = (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r.headers_mut()
            .insert(REFUSAL_HEADER, HeaderValue::from_static(code));
        return r;
    };
    let (content_type, body) = codec.empty_response();
    let mut r = Response::new(Body::from(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut()
        .insert(REFUSAL_HEADER, HeaderValue::from_static(code));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codec_follows_the_content_type() {
        assert_eq!(Codec::of(Some("application/proto")), Some(Codec::Proto));
        assert_eq!(
            Codec::of(Some("application/json; charset=utf-8")),
            Some(Codec::Json)
        );
        assert_eq!(Codec::of(Some("application/grpc")), None);
        assert_eq!(Codec::of(None), None);
        assert_eq!(Codec::Proto.empty_response().1, "");
        assert_eq!(Codec::Json.empty_response().1, "{}");
    }
}

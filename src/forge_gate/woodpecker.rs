//! Woodpecker's agent protocol: gRPC (HTTP/2), service `proto.Woodpecker`, served to the agents
//! on a listener of its own (`h2_listener.rs`) and forwarded to the server
//! (`LEASEGATE_WOODPECKER_UPSTREAM`, h2c or HTTP/2 over TLS).
//!
//! The server hands out a workflow only inside `Next`, which waits at the server for as long
//! as there is none; an agent the server pauses (`no_schedule`) gets an empty `NextResponse`,
//! and an agent given one asks again at once. So for a refused agent the gate answers `Next`
//! itself with an empty `NextResponse`: a real zero-length message with status OK (`200`,
//! `application/grpc`, trailers `grpc-status: 0` and `x-leasegate-refusal`), never a gRPC
//! error, after which Woodpecker's agent backs off and may stop, nor a trailers-only answer,
//! which its gRPC library reads as `INTERNAL`. The gate holds it first, up to
//! `LEASEGATE_FORGE_HOLD_S` and judged again every second, since the agent has no pause of its
//! own. A `Next` forwarded while its runner was admitted is watched while it waits at the
//! server: once its runner is refused, it is cancelled (the stream reset, which removes the
//! agent's waiting worker) and answered empty.
//!
//! Every other call (`Init`, `Wait`, `Update`, `Log`, `Done`, `Extend`, `Auth`, …) is
//! forwarded as it came, headers, trailers and statuses included, so a workflow already
//! running finishes.
//!
//! The agent is known by the `agent_id` claim of the JWT in its `token` metadata, read and not
//! verified (leasegate does not hold the server's secret): a forged claim only gets its own
//! call held or judged by another agent's runner, and the server refuses its token.

use super::canonical::is_call;
use super::pipeline::{self, Fetch, Forge};
use super::upstream::Forwarder;
use super::{GateState, REFUSAL_HEADER, Upstream, canonical_path, peer_of, set_path};
use crate::domain::forge::{ForgeIdentity, ForgeKind};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use base64::Engine;
use http_body_util::{BodyExt, Full};

/// The call in which the server hands out a workflow.
pub const NEXT: &str = "/proto.Woodpecker/Next";

/// An empty `NextResponse` as a gRPC message: not compressed (flag 0), zero bytes long (a
/// proto3 message with no field set is empty).
const EMPTY_MESSAGE: [u8; 5] = [0, 0, 0, 0, 0];

/// Woodpecker on the fetch pipeline: a refused `Next` is held, then answered empty; a
/// forwarded one is watched while it waits at the server.
pub struct Woodpecker;

impl Forge for Woodpecker {
    type NoWork = ();
    const KIND: ForgeKind = ForgeKind::Woodpecker;
    const HOLDS: bool = true;
    const WATCHES: bool = true;

    fn route(gate: &GateState) -> (&Forwarder, &Upstream) {
        let upstream = gate
            .settings()
            .woodpecker
            .as_ref()
            .expect("routed only with a woodpecker upstream");
        (&gate.gate().forwarder, upstream)
    }

    fn no_work((): (), code: &'static str) -> Response {
        empty_next(code)
    }
}

/// The routes of the agents' listener: every path is a call to the server.
pub fn router(gate: GateState) -> Router {
    Router::new().fallback(handle).with_state(gate)
}

async fn handle(State(gate): State<GateState>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let path = match canonical_path(&parts, &[]) {
        Ok(path) => path,
        Err(refused) => return refused,
    };
    let peer = peer_of(&gate, &parts);
    if is_call(&path, NEXT, false) {
        set_path(&mut parts, NEXT);
        let identity = parts
            .headers
            .get("token")
            .and_then(|v| v.to_str().ok())
            .and_then(agent_id_of)
            .map(ForgeIdentity::woodpecker);
        let fetch = Fetch::<Woodpecker> {
            request: Request::from_parts(parts, body),
            peer,
            identity,
            token: None,
            no_work: (),
        };
        return pipeline::fetch(&gate, fetch).await;
    }
    set_path(&mut parts, &path);
    pipeline::forward::<Woodpecker>(&gate, Request::from_parts(parts, body), peer).await
}

/// The `agent_id` claim of a Woodpecker access token (a JWT), its signature unchecked.
pub fn agent_id_of(token: &str) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Claims {
        agent_id: i64,
    }
    let payload = token.trim().split('.').nth(1)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice::<Claims>(&json)
        .ok()
        .map(|c| c.agent_id)
}

/// An empty `NextResponse` with status OK, the refusal's `code` in its trailers.
fn empty_next(code: &'static str) -> Response {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers.insert(REFUSAL_HEADER, HeaderValue::from_static(code));
    let body = Full::new(Bytes::from_static(&EMPTY_MESSAGE))
        .with_trailers(async move { Some(Ok(trailers)) });
    let mut r = Response::new(Body::new(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!(
            "{}.{}.c2ln",
            b64(r#"{"alg":"HS256","typ":"JWT"}"#),
            b64(payload)
        )
    }

    #[test]
    fn the_agent_is_the_tokens_agent_id_claim() {
        assert_eq!(
            agent_id_of(&jwt(r#"{"iss":"woodpecker","sub":"42","agent_id":42}"#)),
            Some(42)
        );
        assert_eq!(agent_id_of(&jwt(r#"{"agent_id":-1}"#)), Some(-1));
        assert_eq!(agent_id_of(&jwt(r#"{"agent_id":"42"}"#)), None);
        assert_eq!(agent_id_of(&jwt(r#"{"sub":"42"}"#)), None);
        assert_eq!(agent_id_of("not-a-jwt"), None);
        assert_eq!(agent_id_of("a.!!!.c"), None);
    }

    #[tokio::test]
    async fn no_work_is_one_empty_message_then_status_ok() {
        let answer = empty_next("probe_failed");
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.headers()[CONTENT_TYPE], "application/grpc");
        let collected = answer.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers[REFUSAL_HEADER], "probe_failed");
        assert_eq!(collected.to_bytes().as_ref(), &EMPTY_MESSAGE);
    }
}

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
use super::job_watch::{self, ReportKind};
use super::pipeline::{self, Fetch, Forge};
use super::upstream::Forwarder;
use super::{GateState, REFUSAL_HEADER, Upstream, canonical_path, peer_of, set_path};
use crate::domain::forge::{ForgeIdentity, ForgeKind};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The paths the gate serves for a Forgejo or a Gitea.
pub const PREFIXES: [&str; 3] = ["/api/actions", "/api/actions_pipeline", "/twirp"];

/// The one call the gate answers itself.
pub const FETCH_TASK: &str = "/api/actions/runner.v1.RunnerService/FetchTask";

/// The call with which a runner reports its task's state, and at its end the result, which
/// the gate reads for ejection (`job_watch`).
pub const UPDATE_TASK: &str = "/api/actions/runner.v1.RunnerService/UpdateTask";

/// A Connect unary codec, from the request's `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
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

/// Forgejo and Gitea on the fetch pipeline: "no work" is answered at once, since the runner
/// waits its own interval before it asks again.
pub struct Forgejo;

impl Forge for Forgejo {
    type NoWork = Option<Codec>;
    const KIND: ForgeKind = ForgeKind::Forgejo;
    const HOLDS: bool = false;

    fn route(gate: &GateState) -> (&Forwarder, &Upstream) {
        let upstream = gate
            .settings()
            .forgejo
            .as_ref()
            .expect("routed only with a forgejo upstream");
        (&gate.gate().forwarder, upstream)
    }

    fn no_work(codec: Option<Codec>, code: &'static str) -> Response {
        no_work(codec, code)
    }
}

pub async fn handle(State(gate): State<GateState>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let path = match canonical_path(&parts, &PREFIXES) {
        Ok(path) => path,
        Err(refused) => return refused,
    };
    let peer = peer_of(&gate, &parts);
    // Any method: what a forge would do with another one is the forge's business, not a way
    // around the gate.
    if is_call(&path, FETCH_TASK, false) {
        set_path(&mut parts, FETCH_TASK);
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let identity = header("x-runner-uuid").and_then(|u| ForgeIdentity::forgejo(u).ok());
        let token = header("x-runner-token").map(str::to_string);
        let codec = Codec::of(header(CONTENT_TYPE.as_str()));
        let fetch = Fetch::<Forgejo> {
            request: Request::from_parts(parts, body),
            peer,
            identity,
            token,
            no_work: codec,
        };
        return pipeline::fetch(&gate, fetch).await;
    }
    set_path(&mut parts, &path);
    let request = Request::from_parts(parts, body);
    if is_call(&path, UPDATE_TASK, false) {
        let kind = ReportKind::ForgejoUpdateTask;
        return job_watch::forward_report::<Forgejo>(&gate, kind, request, peer).await;
    }
    pipeline::forward::<Forgejo>(&gate, request, peer).await
}

/// "No work", in the request's codec, without the forge.
fn no_work(codec: Option<Codec>, code: &'static str) -> Response {
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

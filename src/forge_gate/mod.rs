//! The forge gate: leasegate in front of a Forgejo/Gitea, a GitLab or a Woodpecker server,
//! gating unmodified runners on unmodified forges.
//!
//! Every request under the forge's runner API is forwarded to the forge (`upstream.rs`) except
//! the one call with which a runner asks for work: Forgejo's `FetchTask` (`forgejo.rs`),
//! GitLab's `POST /api/v4/jobs/request` (`gitlab.rs`) and Woodpecker's `Next` (`woodpecker.rs`,
//! on an HTTP/2 listener of its own, `h2_listener.rs`). That call is judged (`decide.rs`: the
//! lease's rules over the bound runner's latest attestation) and, for a runner the gate
//! refuses, answered "no work" by leasegate itself: the forge never sees it, so it claims no
//! job and counts nothing. Every other call (updates, logs, traces, artifacts) is forwarded
//! even for a refused runner, so a job already running can finish. Every forge's fetch goes
//! through one pipeline (`pipeline.rs`); a forge says only who calls and what its "no work"
//! looks like. The routes read the gate's own state (`state.rs`), not the service's.
//!
//! Why answer the fetch rather than pause the runner through the forge's API: the fetch is the
//! one moment the forge hands out work, so answering it is the only way to be sure a refused
//! runner gets nothing, and it needs no credential on the forge, no change to it, and nothing
//! on the runner but the URL it is given.
//!
//! What is judged and forwarded is the path in its canonical form (`canonical.rs`), so that
//! the forge routes exactly what the gate judged; a path without one is refused 400
//! `ambiguous_path`. A GitLab job request's token is read as GitLab reads it
//! (`gitlab_params.rs`).
//!
//! The routes live outside the API's layers: no 64 KiB body limit (`LEASEGATE_FORGE_MAX_BODY_BYTES`
//! instead), no security headers or problem rewriting of the forge's answers.

mod canonical;
mod connections;
mod decide;
mod forgejo;
mod gitlab;
mod gitlab_params;
mod h2_listener;
mod job_ends;
mod job_watch;
mod pipeline;
mod state;
mod upload;
mod upstream;
mod woodpecker;

pub use connections::ForwardCaps;
pub use decide::Verdict;
pub use gitlab_params::JobRequestParams;
pub use state::GateState;
pub use upstream::Upstream;

use crate::client::{Client, client_of};
use crate::problem::ApiError;
use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use axum::http::uri::PathAndQuery;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use upstream::{Forwarder, Peer};

/// The header a refused fetch's "no work" carries: the refusal's code.
pub const REFUSAL_HEADER: &str = "x-leasegate-refusal";
/// The header a forwarded fetch of an observing pool carries: what would have been refused.
pub const WOULD_REFUSE_HEADER: &str = "x-leasegate-would-refuse";

/// The forge gate's settings (`LEASEGATE_FORGEJO_UPSTREAM`, `LEASEGATE_GITLAB_UPSTREAM`, …).
#[derive(Clone, Debug)]
pub struct ForgeSettings {
    pub forgejo: Option<Upstream>,
    pub gitlab: Option<Upstream>,
    /// A Woodpecker server's gRPC address.
    pub woodpecker: Option<Upstream>,
    /// The listener Woodpecker's agents connect to (set exactly when `woodpecker` is).
    pub woodpecker_listen: Option<SocketAddr>,
    pub ca_file: Option<PathBuf>,
    pub max_body_bytes: u64,
    /// Forward the fetches of forge runners bound to no leasegate runner.
    pub pass_unbound: bool,
    /// How long a refused GitLab runner's request, or Woodpecker agent's `Next`, is held.
    pub hold: Duration,
    /// How long a forge may take to begin an answer.
    pub timeout: Duration,
    /// How many sockets and requests the forwarder may hold (`connections.rs`).
    pub connections: ForwardCaps,
}

/// The forge gate of a running service.
pub struct ForgeGate {
    settings: ForgeSettings,
    forwarder: Forwarder,
    recent: decide::Recent,
    /// Where Woodpecker's agents' listener was bound, once it is.
    woodpecker_addr: std::sync::OnceLock<SocketAddr>,
}

impl ForgeGate {
    pub fn new(settings: ForgeSettings) -> anyhow::Result<Self> {
        let forwarder = Forwarder::new(
            settings.ca_file.as_deref(),
            settings.max_body_bytes,
            settings.timeout,
            settings.connections,
        )?;
        Ok(ForgeGate {
            settings,
            forwarder,
            recent: decide::Recent::default(),
            woodpecker_addr: std::sync::OnceLock::new(),
        })
    }

    pub fn settings(&self) -> &ForgeSettings {
        &self.settings
    }

    /// The address Woodpecker's agents' listener is bound to, once it is.
    pub fn woodpecker_addr(&self) -> Option<SocketAddr> {
        self.woodpecker_addr.get().copied()
    }
}

/// Serves Woodpecker's agents on `listener` (`LEASEGATE_WOODPECKER_LISTEN`) until shutdown,
/// allowing them what `settings` allows the API's clients.
pub async fn serve_woodpecker(
    gate: GateState,
    settings: crate::listener::ListenerSettings,
    listener: tokio::net::TcpListener,
) {
    if let Ok(addr) = listener.local_addr() {
        let _ = gate.gate().woodpecker_addr.set(addr);
        tracing::info!(%addr, "Woodpecker agents listening (HTTP/2)");
    }
    let shutdown = gate.shutdown().clone();
    h2_listener::serve(listener, woodpecker::router(gate), settings, shutdown).await;
}

/// The forge routes, for the forges that are set.
pub fn router(gate: GateState) -> Router {
    let mut router = Router::new();
    if gate.settings().forgejo.is_some() {
        for prefix in forgejo::PREFIXES {
            router = router.route(&format!("{prefix}/{{*rest}}"), any(forgejo::handle));
        }
    }
    if gate.settings().gitlab.is_some() {
        router = router.route(
            &format!("{}/{{*rest}}", gitlab::PREFIX),
            any(gitlab::handle),
        );
    }
    router.with_state(gate)
}

/// The canonical path of a request routed by one of `prefixes`, or the 400 that refuses it.
#[allow(clippy::result_large_err)]
fn canonical_path(parts: &Parts, prefixes: &[&str]) -> Result<String, Response> {
    let raw = parts.uri.path();
    let prefix = prefixes
        .iter()
        .find(|p| raw.strip_prefix(**p).is_some_and(|r| r.starts_with('/')))
        .copied()
        // No prefix (Woodpecker's calls, at the root): any canonical path.
        .unwrap_or("");
    canonical::canonical(raw, prefix).map_err(|why| {
        tracing::debug!(
            path = raw,
            why = why.detail(),
            "a forge path without one canonical form"
        );
        ApiError::new(StatusCode::BAD_REQUEST, "ambiguous_path", why.detail()).into_response()
    })
}

/// `parts` with its path replaced by `path` (canonical, so valid), its query kept as it came.
fn set_path(parts: &mut Parts, path: &str) {
    let path_and_query = match parts.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut uri = parts.uri.clone().into_parts();
    uri.path_and_query = Some(
        PathAndQuery::try_from(path_and_query).expect("a canonical path and a query as it came"),
    );
    parts.uri = Uri::from_parts(uri).expect("the same URI with another path");
}

/// Who sent a request, as the client (for logs) and as the peer (for the forge's headers).
fn peer_of(gate: &GateState, parts: &Parts) -> Peer {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    let trusted = gate.trusted_proxies();
    let client: Client = client_of(peer, &parts.headers, trusted);
    Peer::of(client, peer, trusted.iter().any(|n| n.contains(&peer)))
}

//! Forwarding a request to a forge and its answer back, unchanged.
//!
//! Method, path, query, end-to-end headers and body go as they came; `Host` names the forge
//! and `X-Forwarded-For`/`-Proto` say who asked. Bodies stream both ways and are never
//! decoded (a gzipped answer stays gzipped), so artifacts of hundreds of MB pass through
//! without being held: hyper keeps one frame between the two connections, and reading further
//! ahead gained nothing, since a forwarded byte's cost is the kernel copying it in and out of
//! a second pair of sockets (docs/BENCHMARKS.md, "The forge gate's transfers"). The forge has
//! `timeout` to begin its answer (GitLab holds a runner's job request for up to ~50 s),
//! counted while it is the forge's turn (`upload.rs`: not while the client is still sending
//! its body), and may pause no longer than that within it; an unreachable forge is 502
//! `forge_unreachable`, a silent one 504 `forge_timeout`. How many requests and sockets the
//! forwarder may hold, and per address, is `connections.rs`'s.
//!
//! Each side is blamed for its own failures. The client's body is marked (`ClientBodyError`)
//! on its way to the forge, so that a body the client stalled (the listener's pace) is 408
//! `request_timeout` and one it broke off or mangled is 400 `malformed_body`, logged as the
//! client's at info, and only what the forge did is 502 and the WARN "cannot reach the forge"
//! that operators alert on. Forwarding headers a client wrote itself (`Forwarded`,
//! `X-Real-IP`, `X-Forwarded-Host`, `X-Original-URL`, …) are dropped unless the peer is a
//! trusted proxy: a forge behind leasegate would otherwise believe them.

use super::connections::{ForgeConnections, ForwardCaps, Holding, is_no_socket, turned_away};
use super::upload::{Turn, Watched};
use crate::client::Client;
use crate::listener::body::{BodyPace, PacedBody, is_body_timeout};
use crate::problem::ApiError;
use axum::body::Body;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::path::Path;
use std::time::Duration;

/// A forge's base URL: scheme, authority and an optional path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    scheme: String,
    authority: String,
    /// Without a trailing `/` (empty for the root).
    prefix: String,
    /// A gRPC server (Woodpecker's): spoken to over HTTP/2 only (`http` prior knowledge,
    /// `https` by ALPN), `te: trailers` kept, and given all the time it takes to answer,
    /// since its calls wait for work or for a workflow's end.
    grpc: bool,
}

impl Upstream {
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("`{url}` is not a URL ({e})"))?;
        let scheme = uri
            .scheme_str()
            .filter(|s| *s == "http" || *s == "https")
            .ok_or_else(|| format!("`{url}` must start with https:// or http://"))?;
        let authority = uri
            .authority()
            .ok_or_else(|| format!("`{url}` names no host"))?;
        if uri.query().is_some() {
            return Err(format!("`{url}` may not carry a query"));
        }
        Ok(Upstream {
            scheme: scheme.to_string(),
            authority: authority.as_str().to_string(),
            prefix: uri.path().trim_end_matches('/').to_string(),
            grpc: false,
        })
    }

    /// A gRPC server at `url`, which names no path: gRPC's calls are at the server's root.
    pub fn parse_grpc(url: &str) -> Result<Self, String> {
        let mut upstream = Self::parse(url)?;
        if !upstream.prefix.is_empty() {
            return Err(format!(
                "`{url}` may not name a path: a gRPC server's calls are at its root"
            ));
        }
        upstream.grpc = true;
        Ok(upstream)
    }

    /// The forge's URL for `path_and_query` of a request to leasegate.
    fn uri(&self, path_and_query: &str) -> Result<Uri, axum::http::Error> {
        Uri::builder()
            .scheme(self.scheme.as_str())
            .authority(self.authority.as_str())
            .path_and_query(format!("{}{path_and_query}", self.prefix))
            .build()
    }

    pub fn host(&self) -> &str {
        &self.authority
    }
}

/// Headers that belong to one connection, not to the request: never forwarded (RFC 9110 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    // hyper frames the body itself (chunked or by length), as it came.
    headers.remove(header::TRANSFER_ENCODING);
}

/// The HTTP client to the forges, pooled.
#[derive(Clone)]
pub struct Forwarder {
    client: HttpClient<HttpsConnector<super::connections::CountedConnector>, Body>,
    /// HTTP/2 only, for gRPC servers.
    client_h2: HttpClient<HttpsConnector<super::connections::CountedConnector>, Body>,
    connections: ForgeConnections,
    max_body_bytes: u64,
    timeout: Duration,
}

impl Forwarder {
    /// A client trusting the system's roots and, when given, the CAs of `ca_file`.
    pub fn new(
        ca_file: Option<&Path>,
        max_body_bytes: u64,
        timeout: Duration,
        caps: ForwardCaps,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(path) = ca_file {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject;
            let mut added = 0;
            for cert in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("LEASEGATE_FORGE_CA_FILE: reading {}", path.display()))?
            {
                let cert = cert.with_context(|| {
                    format!(
                        "LEASEGATE_FORGE_CA_FILE: {} holds a bad certificate",
                        path.display()
                    )
                })?;
                roots.add(cert).with_context(|| {
                    format!(
                        "LEASEGATE_FORGE_CA_FILE: {} holds a certificate rustls refuses",
                        path.display()
                    )
                })?;
                added += 1;
            }
            anyhow::ensure!(
                added > 0,
                "LEASEGATE_FORGE_CA_FILE: {} holds no PEM certificate",
                path.display()
            );
        }
        let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .context("TLS for the forge")?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout.min(Duration::from_secs(10))));
        let connections = ForgeConnections::new(caps);
        let counted = connections.connector(http);
        // Two connectors on one socket budget: a forge that offers HTTP/2 over TLS is still
        // spoken HTTP/1.1 to, as before; a gRPC server only HTTP/2.
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(counted.clone());
        let client = HttpClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(caps.idle_per_forge)
            .build(connector);
        let connector_h2 = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http2()
            .wrap_connector(counted);
        let client_h2 = HttpClient::builder(TokioExecutor::new())
            .http2_only(true)
            .timer(hyper_util::rt::TokioTimer::new())
            .pool_timer(hyper_util::rt::TokioTimer::new())
            // A call waiting for work leaves the connection quiet: pings tell a dead server.
            .http2_keep_alive_interval(Duration::from_secs(30))
            .http2_keep_alive_timeout(Duration::from_secs(20))
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector_h2);
        Ok(Forwarder {
            client,
            client_h2,
            connections,
            max_body_bytes,
            timeout,
        })
    }

    /// `request`, which came from `peer`, sent to `upstream`, and the forge's answer as it came;
    /// a problem when the forge cannot be had.
    pub async fn forward(
        &self,
        upstream: &Upstream,
        request: Request<Body>,
        peer: Peer,
    ) -> Response<Body> {
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let uri = match upstream.uri(&path) {
            Ok(uri) => uri,
            Err(e) => return ApiError::bad_request(format!("path: {e}")).into_response_body(),
        };
        if let Some(len) = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > self.max_body_bytes
        {
            return too_large(self.max_body_bytes).into_response_body();
        }
        let place = match self.connections.admit(peer.ip, peer.trusted) {
            Ok(place) => place,
            Err(turned_away) => return turned_away,
        };
        // gRPC requires `te: trailers`, the one `te` HTTP/2 allows.
        let te_trailers = upstream.grpc
            && parts
                .headers
                .get(header::TE)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
        strip_hop_by_hop(&mut parts.headers);
        forwarded_for(&mut parts.headers, peer);
        if upstream.grpc {
            // HTTP/2 names the server in `:authority`, from the URI.
            parts.headers.remove(header::HOST);
            parts.version = axum::http::Version::HTTP_2;
            if te_trailers {
                parts
                    .headers
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
        } else {
            parts.headers.insert(
                header::HOST,
                HeaderValue::from_str(upstream.host()).expect("an authority is a header value"),
            );
        }
        parts.uri = uri;
        let body = body.map_err(ClientBodyError::from);
        let limited = Limited::new(body, self.max_body_bytes as usize);
        let turn = Turn::new();
        let body = Watched::new(limited.map_err(axum::Error::new), turn.clone());
        let outgoing = Request::from_parts(parts, Body::new(body));
        let sent = if upstream.grpc {
            // A gRPC server's calls wait for work, or for a workflow's end: as long as it takes.
            Some(self.client_h2.request(outgoing).await)
        } else {
            self.on_the_forges_time(&turn, self.client.request(outgoing))
                .await
        };
        let answer = match sent {
            None => {
                return ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "forge_timeout",
                    format!(
                        "the forge at {} did not take the request or begin its answer in {} s",
                        upstream.host(),
                        self.timeout.as_secs()
                    ),
                )
                .into_response_body();
            }
            Some(Err(e)) => return self.failed(upstream, &e, peer),
            Some(Ok(answer)) => answer,
        };
        let (mut parts, body) = answer.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if upstream.grpc {
            // Its answer ends with its trailers whenever the call ends; HTTP/2's pings tell a
            // server that died meanwhile.
            return Response::from_parts(parts, Body::new(Holding::new(body, place)));
        }
        // A forge that stops halfway through an answer does not hold the runner forever.
        let pace = BodyPace {
            timeout: self.timeout,
            min_rate: 1,
        };
        let body = Holding::new(PacedBody::new(body, pace), place);
        Response::from_parts(parts, Body::new(body))
    }

    /// `request`'s outcome, or `None` once the forge has had its turn (`upload::Turn`) for
    /// longer than the timeout.
    async fn on_the_forges_time<T>(
        &self,
        turn: &Turn,
        request: impl Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(request);
        loop {
            // On the client's turn, look again within a second: its turn may end any time.
            let check = turn
                .forge_deadline(self.timeout)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1));
            tokio::select! {
                outcome = &mut request => return Some(outcome),
                _ = tokio::time::sleep_until(check) => {
                    if turn
                        .forge_deadline(self.timeout)
                        .is_some_and(|d| d <= tokio::time::Instant::now())
                    {
                        return None;
                    }
                }
            }
        }
    }

    fn failed(
        &self,
        upstream: &Upstream,
        e: &hyper_util::client::legacy::Error,
        peer: Peer,
    ) -> Response<Body> {
        // The request body was over the limit: the client's fault, not the forge's.
        if std::error::Error::source(e).is_some_and(is_length_limit) {
            return too_large(self.max_body_bytes).into_response_body();
        }
        if let Some(client) = find::<ClientBodyError>(e) {
            tracing::info!(client = %peer.ip, forge = upstream.host(), error = %client, "a client's request body failed on its way to the forge");
            return client.problem().into_response_body();
        }
        if std::error::Error::source(e).is_some_and(is_no_socket) {
            return turned_away(format!(
                "every socket to the forges is in use ({})",
                self.connections.caps().sockets
            ));
        }
        let why = describe(e);
        tracing::warn!(forge = upstream.host(), error = %why, "cannot reach the forge");
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "forge_unreachable",
            format!("the forge at {} cannot be reached: {why}", upstream.host()),
        )
        .into_response_body()
    }
}

fn too_large(max: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the body is over LEASEGATE_FORGE_MAX_BODY_BYTES ({max} bytes)"),
    )
}

/// A failure of the client's request body, as opposed to the forge's.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct ClientBodyError {
    source: axum::Error,
    timed_out: bool,
}

impl From<axum::Error> for ClientBodyError {
    fn from(source: axum::Error) -> Self {
        let timed_out = is_body_timeout(&source);
        ClientBodyError { source, timed_out }
    }
}

impl ClientBodyError {
    /// The client's problem: 408 for a body that arrived too slowly, else 400.
    pub fn problem(&self) -> ApiError {
        if self.timed_out {
            ApiError::request_timeout()
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_body",
                format!(
                    "the request body broke off or was malformed: {}",
                    self.source
                ),
            )
        }
    }
}

/// The first error of type `E` in `e`'s chain of causes.
fn find<'a, E: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut current = Some(e);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

pub fn is_length_limit(mut e: &(dyn std::error::Error + 'static)) -> bool {
    loop {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        match e.source() {
            Some(next) => e = next,
            None => return false,
        }
    }
}

/// The innermost cause of a client error, in words: "connection refused", "dns error: …".
fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Who sent a request to leasegate, as a proxy tells the forge.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub ip: std::net::IpAddr,
    /// The peer is a trusted proxy: its `X-Forwarded-For` chain is kept.
    pub trusted: bool,
    /// The request came over TLS (as a trusted proxy said).
    pub https: bool,
}

impl Peer {
    pub fn of(client: Client, peer: std::net::IpAddr, trusted: bool) -> Self {
        Peer {
            ip: peer,
            trusted,
            https: client.https,
        }
    }
}

/// Headers with which a proxy tells the server who asked, how and for what: believed by
/// forges (and the proxies in front of them) from a proxy, written by a client to pass for
/// another address, host, scheme or path. Only a trusted proxy's are forwarded.
const PROXY_WRITTEN: [&str; 18] = [
    "forwarded",
    "x-real-ip",
    "true-client-ip",
    "client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "x-forwarded",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-url-scheme",
    "front-end-https",
    "x-original-url",
    "x-rewrite-url",
    "x-original-host",
];

/// `X-Forwarded-For` and `X-Forwarded-Proto` as the forge should see them: a trusted proxy's
/// chain with its address added, as every proxy does; anyone else's replaced by their address
/// (what a client writes there proves nothing), and the client's other forwarding headers
/// dropped.
fn forwarded_for(headers: &mut HeaderMap, peer: Peer) {
    if !peer.trusted {
        for name in PROXY_WRITTEN {
            headers.remove(name);
        }
    }
    let chain = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .filter(|_| peer.trusted)
        .map_or_else(|| peer.ip.to_string(), |v| format!("{v}, {}", peer.ip));
    if let Ok(v) = HeaderValue::from_str(&chain) {
        headers.insert("x-forwarded-for", v);
    }
    let proto = if peer.https { "https" } else { "http" };
    headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
}

trait IntoResponseBody {
    fn into_response_body(self) -> Response<Body>;
}

impl IntoResponseBody for ApiError {
    fn into_response_body(self) -> Response<Body> {
        axum::response::IntoResponse::into_response(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_keeps_its_path_prefix() {
        let u = Upstream::parse("https://forge.example/git/").unwrap();
        assert_eq!(
            u.uri("/api/v4/jobs/request?x=1").unwrap().to_string(),
            "https://forge.example/git/api/v4/jobs/request?x=1"
        );
        let root = Upstream::parse("http://127.0.0.1:3000").unwrap();
        assert_eq!(
            root.uri("/api/actions/x").unwrap().to_string(),
            "http://127.0.0.1:3000/api/actions/x"
        );
        assert!(Upstream::parse("ftp://x").is_err());
        assert!(Upstream::parse("forge.example").is_err());
        assert!(Upstream::parse("https://x/?a=b").is_err());
    }

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("x-runner-uuid", HeaderValue::from_static("u"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-runner-uuid"));
    }

    #[test]
    fn forwarded_headers_keep_a_trusted_chain_only() {
        let peer = |trusted| Peer {
            ip: "10.0.0.9".parse().unwrap(),
            trusted,
            https: trusted,
        };
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        forwarded_for(&mut h, peer(false));
        assert_eq!(h["x-forwarded-for"], "10.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "http");
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        forwarded_for(&mut h, peer(true));
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 10.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "https");
    }

    #[test]
    fn a_clients_forwarding_headers_stay_behind_a_proxys_go() {
        let written = || {
            let mut h = HeaderMap::new();
            for name in PROXY_WRITTEN {
                h.insert(name, HeaderValue::from_static("203.0.113.7"));
            }
            h.insert("x-runner-uuid", HeaderValue::from_static("u"));
            h
        };
        let peer = |trusted| Peer {
            ip: "10.0.0.9".parse().unwrap(),
            trusted,
            https: false,
        };
        let mut h = written();
        forwarded_for(&mut h, peer(false));
        assert!(PROXY_WRITTEN.iter().all(|n| !h.contains_key(*n)), "{h:?}");
        assert_eq!(h["x-runner-uuid"], "u");
        let mut h = written();
        forwarded_for(&mut h, peer(true));
        assert!(
            PROXY_WRITTEN.iter().all(|n| h[*n] == "203.0.113.7"),
            "{h:?}"
        );
    }
}

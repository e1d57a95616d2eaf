//! The forwarder's sockets to the forges: how many it may hold, and how a busy address is kept
//! from taking them all.
//!
//! A forwarded request holds two sockets, the client's and one to the forge, for as long as
//! the forge takes (GitLab holds a job request ~50 s; an artifact upload runs for minutes).
//! The listener's caps (`listener/limits.rs`) count only the first, so before these
//! caps four addresses of slow forwarded requests took a process with a file limit of 512 to
//! its limit: `accept` failed and every other client's `/readyz` timed out.
//!
//! The sockets to the forges are a budget of their own, carved out of the file limit beside
//! the listener's (`ServeArgs::listener_settings`, `forge_settings`): with a forge set, a third
//! of what the file limit leaves goes to the forges and two thirds to the listener, since
//! every forwarded request rides on a client's connection and a fleet's runners hold about one
//! forwarded request (a fetch, a log upload) beside one other connection (the agent's
//! heartbeat) each. Then listener and forwarder together stay under the file limit whatever
//! the clients do. Two counts keep the budget:
//!
//! - **Sockets, exactly**: the connector takes a place for every socket it opens and the
//!   socket gives it back when it closes, so sockets in use, idle in hyper's pool and still
//!   connecting are all counted, whatever the pool does (it may finish a connect no request
//!   waits for any more and keep it). `ForwardCaps::sockets` in all.
//! - **Requests, per address**: a forwarded request holds a place from before it is sent
//!   until its answer is written or dropped, at most `requests` in all and `requests_per_peer`
//!   from one address (an IPv6 /64; a trusted proxy, which carries many clients, only to the
//!   total), counted like the listener's connections. This is what keeps one address's slow
//!   requests from starving the others'. A request past either cap is answered `503
//!   too_many_connections` with `Retry-After: 5`, and the forge never sees it.
//!
//! `requests` leaves room under `sockets` for the idle sockets the pool keeps for each forge
//! (`idle_per_forge`, for the two forges a gate may have), so a request admitted finds a
//! socket. A connect that still finds none (the pool finishing connects nobody waits for)
//! waits briefly for one, then is answered as a request past the cap.
//!
//! Why not count the forge's socket in the listener's caps instead: a forwarded request would
//! then take two of its address's places, so an address would reach its cap with half the
//! connections, and four busy addresses (each allowed a quarter) would fill the listener and
//! lock every other client out, which is the failure this module is for.

use crate::listener::limits::{ConnectionCaps, ConnectionLimits, Permit, Refused};
use crate::problem::ApiError;
use axum::body::{Body, Bytes};
use axum::http::{Response, StatusCode, Uri};
use axum::response::IntoResponse;
use http_body::Frame;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use pin_project_lite::pin_project;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The fewest sockets the forwarder is given, whatever the file limit.
const MIN_SOCKETS: usize = 16;

/// How long a connect waits for a socket place before the request is turned away.
const SOCKET_WAIT: Duration = Duration::from_secs(2);

/// How often the forwarder warns that it turns requests away.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// How many sockets the forwarder may hold to the forges, and how they are shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardCaps {
    /// Sockets to the forges open at once: in use, idle in the pool, or connecting.
    pub sockets: usize,
    /// Idle sockets kept per forge for the next request.
    pub idle_per_forge: usize,
    /// Forwarded requests in flight at once.
    pub requests: usize,
    /// Forwarded requests in flight at once from one address.
    pub requests_per_peer: usize,
}

impl ForwardCaps {
    /// The caps of a budget of `sockets`: a sixteenth of it idle per forge (at most 32), the
    /// rest for requests, a quarter of those per address (as the listener's per-peer cap).
    pub fn of_sockets(sockets: usize) -> Self {
        let sockets = sockets.max(MIN_SOCKETS);
        let idle_per_forge = (sockets / 16).clamp(1, 32);
        let requests = sockets - 2 * idle_per_forge;
        ForwardCaps {
            sockets,
            idle_per_forge,
            requests,
            requests_per_peer: (requests / 4).max(1),
        }
    }
}

/// The forwarder's counts: requests in flight by address, and sockets open. Cheap to clone.
#[derive(Clone)]
pub struct ForgeConnections {
    caps: ForwardCaps,
    requests: ConnectionLimits,
    sockets: Arc<Semaphore>,
    /// When the forwarder last warned of a request turned away (seconds since the Unix epoch).
    warned_at: Arc<AtomicU64>,
}

impl ForgeConnections {
    pub fn new(caps: ForwardCaps) -> Self {
        let requests = ConnectionLimits::new(
            ConnectionCaps {
                max_total: caps.requests,
                max_per_peer: caps.requests_per_peer,
            },
            // Whether a peer is a trusted proxy is the caller's to say (`admit`).
            Vec::new(),
        );
        ForgeConnections {
            caps,
            requests,
            sockets: Arc::new(Semaphore::new(caps.sockets)),
            warned_at: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn caps(&self) -> ForwardCaps {
        self.caps
    }

    /// A place for a request from `peer` (a trusted proxy or not) to be forwarded, or the
    /// answer that turns it away.
    #[allow(clippy::result_large_err)]
    pub fn admit(&self, peer: IpAddr, trusted: bool) -> Result<Permit, Response<Body>> {
        self.requests.admit_as(peer, trusted).map_err(|refused| {
            let detail = match refused {
                Refused::Total => format!(
                    "the forge's connections are all in use ({} requests in flight); try again shortly",
                    self.caps.requests
                ),
                Refused::Peer => format!(
                    "this address has {} requests to the forge in flight, as many as one address may",
                    self.caps.requests_per_peer
                ),
            };
            self.warn_turned_away(peer, refused);
            turned_away(detail)
        })
    }

    /// The connector to the forges, every socket of which holds a place.
    pub fn connector(&self, inner: HttpConnector) -> CountedConnector {
        CountedConnector {
            inner,
            sockets: self.sockets.clone(),
        }
    }

    /// Warns at most once a minute: an address at its cap would otherwise write a line a
    /// request.
    fn warn_turned_away(&self, peer: IpAddr, refused: Refused) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.warned_at.load(Ordering::Relaxed);
        if now < last + WARN_EVERY.as_secs()
            || self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        match refused {
            Refused::Total => tracing::warn!(
                %peer,
                max = self.caps.requests,
                "forwarded requests to the forge at their cap: answering 503 too_many_connections \
                 (logged at most once a minute)"
            ),
            Refused::Peer => tracing::warn!(
                %peer,
                max_per_peer = self.caps.requests_per_peer,
                "an address has as many requests to the forge in flight as one may: answering \
                 503 too_many_connections (logged at most once a minute)"
            ),
        }
    }
}

/// `503 too_many_connections`, as the listener answers past its caps.
pub fn turned_away(detail: String) -> Response<Body> {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_connections",
        detail,
    )
    .retry_after(5)
    .into_response()
}

/// A connect that found no socket place in time.
#[derive(Debug, thiserror::Error)]
#[error("every socket the forwarder may hold to the forges is open")]
pub struct NoSocket;

/// Whether a client error is (caused by) `NoSocket`.
pub fn is_no_socket(mut e: &(dyn std::error::Error + 'static)) -> bool {
    loop {
        if e.is::<NoSocket>() {
            return true;
        }
        match e.source() {
            Some(next) => e = next,
            None => return false,
        }
    }
}

/// `HttpConnector`, each socket of which holds a place in the forwarder's socket budget.
#[derive(Clone)]
pub struct CountedConnector {
    inner: HttpConnector,
    sockets: Arc<Semaphore>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Uri> for CountedConnector {
    type Response = Counted<<HttpConnector as tower::Service<Uri>>::Response>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        // The clone that was made ready is the one called (tower's contract).
        let mut inner = self.inner.clone();
        std::mem::swap(&mut inner, &mut self.inner);
        let sockets = self.sockets.clone();
        Box::pin(async move {
            let place = tokio::time::timeout(SOCKET_WAIT, sockets.acquire_owned())
                .await
                .map_err(|_| NoSocket)?
                .expect("the socket budget is never closed");
            let stream = inner.call(uri).await?;
            Ok(Counted {
                inner: stream,
                _place: place,
            })
        })
    }
}

pin_project! {
    /// A socket to a forge, which gives its place back when it closes.
    pub struct Counted<T> {
        #[pin]
        inner: T,
        _place: OwnedSemaphorePermit,
    }
}

impl<T: Connection> Connection for Counted<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

impl<T: hyper::rt::Read> hyper::rt::Read for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write> hyper::rt::Write for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

pin_project! {
    /// A forwarded request's answer, which keeps the request's place until it is written or
    /// dropped.
    pub struct Holding<B> {
        #[pin]
        inner: B,
        _place: Permit,
    }
}

impl<B> Holding<B> {
    pub fn new(inner: B, place: Permit) -> Self {
        Holding {
            inner,
            _place: place,
        }
    }
}

impl<B> http_body::Body for Holding<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caps_leave_room_for_the_idle_sockets_of_two_forges() {
        for sockets in [0, 16, 17, 144, 1_000, 25_000] {
            let c = ForwardCaps::of_sockets(sockets);
            assert!(c.sockets >= MIN_SOCKETS);
            assert_eq!(c.requests + 2 * c.idle_per_forge, c.sockets, "{c:?}");
            assert!(c.requests_per_peer >= 1 && c.requests_per_peer * 4 <= c.requests.max(4));
            assert!((1..=32).contains(&c.idle_per_forge));
        }
        assert_eq!(
            ForwardCaps::of_sockets(144),
            ForwardCaps {
                sockets: 144,
                idle_per_forge: 9,
                requests: 126,
                requests_per_peer: 31,
            }
        );
    }

    #[test]
    fn one_address_cannot_take_every_request_place() {
        let c = ForgeConnections::new(ForwardCaps::of_sockets(144));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let held: Vec<Permit> = (0..31).map(|_| c.admit(a, false).unwrap()).collect();
        let Err(refused) = c.admit(a, false) else {
            panic!("a 32nd request from one address was admitted")
        };
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()["retry-after"], "5");
        assert!(c.admit("10.0.0.2".parse().unwrap(), false).is_ok());
        // A trusted proxy is held to the total only.
        let proxied: Vec<Permit> = (0..95).map(|_| c.admit(a, true).unwrap()).collect();
        assert!(c.admit(a, true).is_err());
        drop((held, proxied));
        assert!(c.admit(a, false).is_ok());
    }

    #[tokio::test]
    async fn every_socket_holds_a_place_until_it_closes() {
        use tower::ServiceExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let c = ForgeConnections::new(ForwardCaps::of_sockets(16));
        let connector = c.connector(HttpConnector::new());
        let mut open = Vec::new();
        for _ in 0..16 {
            open.push(connector.clone().oneshot(uri.clone()).await.unwrap());
        }
        assert_eq!(c.sockets.available_permits(), 0);
        let started = tokio::time::Instant::now();
        let err = connector.clone().oneshot(uri.clone()).await.err().unwrap();
        assert!(is_no_socket(err.as_ref()), "{err}");
        assert!(started.elapsed() >= SOCKET_WAIT);
        open.pop();
        assert_eq!(c.sockets.available_permits(), 1);
        open.push(connector.oneshot(uri).await.unwrap());
    }
}

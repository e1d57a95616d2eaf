//! Accepting connections and serving HTTP/1.1 on each, with limits on what a client may hold
//! and a graceful drain on shutdown.
//!
//! This is what `axum::serve` does, plus what an open port needs and that function does not
//! expose:
//!
//! - plain requests (HTTP/1.1, no body or a small one of known length: a runner's heartbeats
//!   and leases, a forge runner's fetches, the API) read and answered by `plain`, which holds no
//!   buffer while a request is served: a fleet's waiting long polls are ten thousand
//!   connections held open (`docs/BENCHMARKS.md`), and hyper keeps an 8 KiB read and an 8 KiB
//!   write buffer for each connection's life. From a connection's first request that is not
//!   plain (a forwarded artifact, a chunked body) hyper serves it;
//! - a request's head capped at 8 KiB (`MAX_HEAD_BYTES`), answered 431 by hyper past it, and
//!   hyper's read buffer at 256 KiB (`MAX_READ_BYTES`). The buffer starts at 8 KiB and grows
//!   only while reads fill it (a body arriving faster than it is read: a forwarded artifact),
//!   then shrinks again. Capped at 8 KiB, a 200 MB upload was 25,000 reads of 8 KiB and as
//!   many frames handed on;
//! - caps on open connections, in all and per peer (`limits`);
//! - timeouts for a head that trickles in, a connection that idles, an answer nobody reads
//!   (`activity`), and a body that trickles in (`body`). A request being served (a waiting
//!   long poll) is never idle.
//!
//! Each request carries its peer's address (`ConnectInfo`) for the throttle and the logs.

mod activity;
pub mod body;
pub mod limits;
mod plain;

use crate::metrics::Metrics;
use activity::{Activity, InFlight, PhaseTimeouts, Watched};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use body::{BodyPace, PacedBody};
use futures_util::FutureExt;
use http_body::Frame;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use limits::{ConnectionCaps, ConnectionLimits, Refused};
use pin_project_lite::pin_project;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service;

/// The largest request head (request line and headers) the service reads.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// The most a connection reads from its socket at once (and hands on as one frame of a body).
pub const MAX_READ_BYTES: usize = 256 * 1024;

/// What a listener allows its clients.
#[derive(Clone, Debug)]
pub struct ListenerSettings {
    pub caps: ConnectionCaps,
    /// Connections from these networks are proxies: only the overall cap counts them.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub body: BodyPace,
}

/// Serves `app` on `listener` until `shutdown` is cancelled, then stops accepting and waits for
/// the connections' requests in flight to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: ListenerSettings,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let connections = TaskTracker::new();
    let limits = ConnectionLimits::new(settings.caps.clone(), settings.trusted_proxies.clone());
    let timeouts = PhaseTimeouts {
        header: settings.header_timeout,
        idle: settings.idle_timeout,
    };
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let permit = match limits.admit(peer.ip()) {
            Ok(permit) => permit,
            Err(refused) => {
                turn_away(&stream, refused);
                metrics.connection_closed(refused.as_str());
                continue;
            }
        };
        // Answers are written in one piece; waiting for more to coalesce only adds latency.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let activity = Activity::new();
        let io = Watched::new(stream, activity.clone());
        let (app, pace, drain) = (app.clone(), settings.body, shutdown.clone());
        let metrics = metrics.clone();
        let open = metrics.open_connections.clone();
        open.inc();
        connections.spawn(async move {
            // The connection's future is made where it is polled: made before the task and
            // moved in, it would have its room in the task twice, for every waiting poll.
            tokio::select! {
                result = serve_connection(io, app, peer, pace, activity.clone(), drain) => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                }
                why = activity.stalled(timeouts) => {
                    tracing::debug!(%peer, reason = why.as_str(), "closing a stalled connection");
                    metrics.connection_closed(why.as_str());
                }
            }
            open.dec();
            drop(permit);
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Serves one connection: its plain requests here (`plain`), then, from the first request that
/// is not plain, hyper. When `drain` is cancelled, the request being served is answered and the
/// connection closes.
async fn serve_connection(
    mut io: Watched<TcpStream>,
    app: Router,
    peer: SocketAddr,
    pace: BodyPace,
    activity: Arc<Activity>,
    drain: CancellationToken,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let connection = plain::Connection {
        app: &app,
        peer,
        pace,
        activity: &activity,
        drain: &drain,
    };
    let read = match plain::serve(&mut io, &connection).await? {
        plain::Ended::Closed => return Ok(()),
        plain::Ended::HandedOver(read) => read,
    };
    let service = connection_service(app.clone(), peer, pace, activity.clone());
    let mut http = http1::Builder::new();
    http.max_header_size(MAX_HEAD_BYTES);
    http.max_buf_size(MAX_READ_BYTES);
    // Boxed, so that a connection of plain requests (each of a fleet's waiting polls) does not
    // make room for hyper's connection state in its own.
    io.put_back(read);
    let mut hyper = Box::pin(http.serve_connection(TokioIo::new(io), service));
    tokio::select! {
        result = hyper.as_mut() => return Ok(result?),
        _ = drain.cancelled() => {}
    }
    hyper.as_mut().graceful_shutdown();
    Ok(hyper.await?)
}

/// The service of one connection: each request's body paced, its peer known, and its time on
/// the connection counted from its head to the end of its answer.
fn connection_service(
    app: Router,
    peer: SocketAddr,
    pace: BodyPace,
    activity: Arc<Activity>,
) -> impl hyper::service::Service<
    hyper::Request<Incoming>,
    Response = hyper::Response<Body>,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<hyper::Response<Body>, std::convert::Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let in_flight = InFlight::begin(&activity);
        let mut req = req.map(|incoming| Body::new(PacedBody::new(incoming, pace)));
        req.extensions_mut().insert(ConnectInfo(peer));
        // A router is always ready, so it is called at once, and its future mapped rather than
        // awaited in an async block (which would hold it twice): hyper keeps this future's
        // room for the connection's whole life.
        app.clone().call(req).map(move |routed| {
            routed.map(|response| {
                response.map(|body| {
                    Body::new(Answer {
                        inner: body,
                        _in_flight: in_flight,
                    })
                })
            })
        })
    })
}

pin_project! {
    /// An answer's body, which keeps its request in flight until it is written or dropped.
    struct Answer {
        #[pin]
        inner: Body,
        _in_flight: InFlight,
    }
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What a client turned away reads (best effort: the service never waits on its socket).
const TURN_AWAY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
        content-type: application/problem+json\r\nretry-after: 5\r\nconnection: close\r\n\
        content-length: 163\r\n\r\n\
        {\"type\":\"urn:leasegate:problem:too_many_connections\",\"title\":\"Service Unavailable\",\
        \"status\":503,\"detail\":\"too many open connections\",\"code\":\"too_many_connections\"}";

fn turn_away(stream: &TcpStream, why: Refused) {
    let _ = stream.try_write(TURN_AWAY);
    tracing::debug!(reason = why.as_str(), "connection turned away");
}

/// After a failed accept: a connection that went away before it was taken is nothing; running
/// out of file descriptors is worth an error and a pause, so that connections can close
/// before the next try rather than the loop spinning.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed; trying again in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_turn_away_answer_says_its_length() {
        let answer = std::str::from_utf8(super::TURN_AWAY).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let declared: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(declared, body.len());
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }
}

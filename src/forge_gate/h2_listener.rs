//! The HTTP/2 cleartext listener Woodpecker's agents connect to (`LEASEGATE_WOODPECKER_LISTEN`).
//!
//! gRPC is HTTP/2 only, and the API's listener speaks HTTP/1.1, so the agents get a listener of
//! their own: HTTP/2 with prior knowledge (what a gRPC client does on an `http` target, and what
//! a TLS proxy's gRPC pass speaks to its backend). TLS is the proxy's, as for the API.
//!
//! Its connections are held to the API listener's caps (in all and per address), which a
//! connection's streams cannot get around: each has at most `MAX_STREAMS` calls open. A peer
//! that stops answering pings is dropped (`KEEP_ALIVE`), since an agent's `Next` and `Wait`
//! leave a connection without traffic for as long as there is no work. On shutdown it stops
//! accepting and lets the calls in flight finish, as the API's listener does.

use crate::listener::ListenerSettings;
use crate::listener::limits::ConnectionLimits;
use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The most calls one connection may have open at once (an agent has a `Next` and a `Wait`
/// per workflow it runs, and a few short calls).
const MAX_STREAMS: u32 = 128;

/// How often a quiet connection is pinged, and how long its peer has to answer.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `app` over HTTP/2 on `listener` until `shutdown`, then drains.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: ListenerSettings,
    shutdown: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let limits = ConnectionLimits::new(settings.caps.clone(), settings.trusted_proxies.clone());
    let mut http = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http.timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .keep_alive_interval(KEEP_ALIVE)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "the Woodpecker listener cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Ok(permit) = limits.admit(peer.ip()) else {
            tracing::debug!(%peer, "a Woodpecker agent's connection over the caps: closed");
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            app.clone().oneshot(req.map(axum::body::Body::new))
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "a Woodpecker agent's connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

//! Accepting connections and serving HTTP/1.1 on each, with a graceful drain on shutdown.
//!
//! This is what `axum::serve` does, with one setting it does not expose: hyper's read buffer is
//! capped at 8 KiB (`MAX_HEAD_BYTES`). Left alone, hyper grows it to 16 KiB on most connections
//! and keeps it for the connection's life, and a fleet's waiting long polls are ten thousand
//! connections held open (`docs/BENCHMARKS.md`). The cap bounds a request's head only: bodies
//! stream through the buffer whatever their size (`max_body_bytes` bounds those), and a head
//! over 8 KiB, far more than any client of this API sends, is answered 431 by hyper.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The largest request head (request line and headers) the service reads.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Serves `app` on `listener` until `shutdown` is cancelled, then stops accepting and waits for
/// the connections' requests in flight to finish.
pub async fn serve(listener: TcpListener, app: Router, shutdown: CancellationToken) {
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.max_buf_size(MAX_HEAD_BYTES);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        // Answers are written in one piece; waiting for more to coalesce only adds latency.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        // A `Router` clone shares its routes; it is not rebuilt per connection.
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
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

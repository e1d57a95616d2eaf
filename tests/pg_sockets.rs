//! The store's TCP connections to PostgreSQL have Nagle's algorithm off (`TCP_NODELAY`).
//!
//! With it on, a message written in more than one piece waits for the server's acknowledgement
//! of the first, which the server delays by 40 ms: over TLS any statement larger than one TLS
//! record (16 KiB), such as a round's update of 32 runners, stalled its round 40 ms (rounds of
//! 32 took 46.8 ms against 3.5 ms without TLS; docs/BENCHMARKS.md, "Rounds of at most 16 on
//! SQLite"). sqlx 0.9.0 no longer set the option; 0.9.1 does again. This test inspects every
//! socket of the test process connected to the server's port (only sqlx's connect there).

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

/// The port of the PostgreSQL server the tests use, or `None` when it is reached by a path
/// that is not TCP.
fn server_port(url: &str) -> Option<u16> {
    let url = reqwest::Url::parse(url).expect("LEASEGATE_TEST_DATABASE_URL is a URL");
    // A `host` parameter (or no host at all) names a socket directory.
    let socket = url.query_pairs().any(|(k, _)| k == "host") || url.host_str().is_none();
    (!socket).then(|| url.port().unwrap_or(5432))
}

/// Whether each TCP socket of this process connected to `port` has `TCP_NODELAY`. A socket
/// closed by another test while it is looked at is skipped.
fn sockets_to(port: u16) -> Vec<(SocketAddr, bool)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let Some(fd) = entry
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: another test may close the descriptor meanwhile; the two calls below only
        // read its address and one option, and fail (EBADF, ENOTSOCK) on what it became.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(Some(peer)) = rustix::net::getpeername(fd) else {
            continue;
        };
        let Ok(peer) = SocketAddr::try_from(peer) else {
            continue;
        };
        if peer.port() != port {
            continue;
        }
        if let Ok(nodelay) = rustix::net::sockopt::tcp_nodelay(fd) {
            found.push((peer, nodelay));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stores_connections_to_postgresql_send_at_once() {
    let Some(app) = spawn_app_on(Engine::Postgres).await else {
        return;
    };
    let url = common::pg::server_url().expect("the server's address");
    let Some(port) = server_port(&url) else {
        common::skip::skipped("TCP_NODELAY case (PostgreSQL is reached through a Unix socket)");
        return;
    };
    // The pool's connections are open and in use: a pool, a registration, a heartbeat's round.
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "nodelay").await;
    let r = app.heartbeat(&runner.healthy()).await;
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let sockets = sockets_to(port);
    assert!(
        !sockets.is_empty(),
        "the service holds pooled connections to PostgreSQL's port {port}"
    );
    let slow: Vec<_> = sockets.iter().filter(|(_, nodelay)| !nodelay).collect();
    assert!(
        slow.is_empty(),
        "{} of {} connections to PostgreSQL have Nagle's algorithm on: {slow:?}",
        slow.len(),
        sockets.len()
    );
}

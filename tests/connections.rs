//! Hostile connections: a head or a body that trickles in, a silent or idle connection, an
//! answer nobody reads, and one client holding every socket it can. Each is closed (or turned
//! away) within its limit while a normal request is served, and a waiting long poll, which
//! sends nothing for its whole wait, is never taken for idle.

mod common;

use common::*;
use reqwest::StatusCode;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn addr(app: &TestApp) -> SocketAddr {
    app.base.trim_start_matches("http://").parse().unwrap()
}

/// Reads until the service closes the connection (or `limit` passes); what it sent, and
/// whether it closed.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&seen).into(), true),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&seen).into(), false),
        }
    }
}

/// A normal request is answered while the hostile connections are open.
async fn still_serves(app: &TestApp) {
    let r = app.client.get(app.url("/livez")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

fn short_timeouts(args: &mut leasegate::config::ServeArgs) {
    args.header_timeout_s = 1;
    args.body_timeout_s = 1;
    args.idle_timeout_s = 2;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_trickles_in_is_cut_off_at_the_header_timeout() {
    let app = spawn_app_with(short_timeouts).await;
    let started = Instant::now();
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(addr(&app)).await.unwrap();
        s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    // A header line every 300 ms, as slowloris does, for longer than the timeout.
    let trickle = tokio::spawn(async move {
        for i in 0..10 {
            for s in &mut slow {
                let _ = s.write_all(format!("X-Slow-{i}: 1\r\n").as_bytes()).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        slow
    });
    still_serves(&app).await;
    let mut slow = trickle.await.unwrap();
    for s in &mut slow {
        let (_, closed) = read_until_closed(s, Duration::from_secs(3)).await;
        assert!(closed, "a trickling head was not cut off");
    }
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
    still_serves(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_at_the_header_timeout() {
    let app = spawn_app_with(short_timeouts).await;
    let mut silent = TcpStream::connect(addr(&app)).await.unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(closed, "a silent connection stayed open");
    assert!(started.elapsed() < Duration::from_secs(3));
    still_serves(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_may_idle_until_the_idle_timeout_and_no_longer() {
    let app = spawn_app_with(short_timeouts).await;
    let mut s = TcpStream::connect(addr(&app)).await.unwrap();
    // Longer than the header timeout between requests: idle is not a slow head.
    for _ in 0..2 {
        s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let idle_from = Instant::now();
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(closed, "an idle connection stayed open");
    let idled = idle_from.elapsed();
    assert!(idled < Duration::from_secs(3), "closed after {idled:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_in_is_refused_with_408() {
    let app = spawn_app_with(short_timeouts).await;
    let mut s = TcpStream::connect(addr(&app)).await.unwrap();
    s.write_all(
        b"POST /api/v1/runners/heartbeat HTTP/1.1\r\nHost: x\r\n\
          Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        // A byte every 500 ms: each pause is inside the body timeout, the average is not.
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if s.write_all(b" ").await.is_err() {
                break;
            }
        }
        s
    });
    let mut s = writer.await.unwrap();
    let (answer, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "answer: {answer}");
    assert!(answer.contains("request_timeout"), "answer: {answer}");
    assert!(closed);
    assert!(started.elapsed() < Duration::from_secs(5));
    still_serves(&app).await;
}

on_both_engines! {
async fn a_waiting_long_poll_is_never_idle(app, |args: &mut leasegate::config::ServeArgs| {
    args.header_timeout_s = 1;
    args.idle_timeout_s = 1;
}) {
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let started = Instant::now();
    let r = app.lease_wait(&runner.healthy(), 3).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(started.elapsed() >= Duration::from_secs(3));
}
}

/// Opens a connection to `to` from the local address `from` (another loopback address is
/// another peer).
async fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse().unwrap())?;
    socket.connect(to).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holding_every_socket_it_can_does_not_lock_the_others_out() {
    // The binary under a file limit of 512, as a small container would run it.
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 512 && exec \"$0\" serve")
        .arg(env!("CARGO_BIN_EXE_leasegate"))
        .env_remove("DATABASE_URL")
        .env("LEASEGATE_ADMIN_TOKEN", ADMIN)
        .env("LEASEGATE_FORGE_TOKEN", FORGE)
        .env("LEASEGATE_LISTEN", format!("127.0.0.1:{port}"))
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let to: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let base = format!("http://{to}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while reqwest::get(format!("{base}/readyz")).await.is_err() {
        assert!(Instant::now() < deadline, "serve did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // One peer (127.0.0.1) opens 620 connections and holds them.
    let mut held = Vec::new();
    let mut turned_away = 0;
    for _ in 0..620 {
        let mut s = connect_from("127.0.0.1", to).await.unwrap();
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(20), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 503"));
                turned_away += 1;
            }
            _ => held.push(s),
        }
    }
    assert!(turned_away > 0, "one peer was let hold 620 connections");
    assert!(held.len() < 512, "held {}", held.len());

    // Another peer is served, and so is the first peer's own next connection once it lets go.
    let other = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let r = other.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = reqwest::get(format!("{base}/readyz")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    child.kill().await.ok();
}

//! Hostile connections: a head or a body that trickles in, a silent or idle connection, an
//! answer nobody reads, and one client holding every socket it can. Each is closed (or turned
//! away) within its limit while a normal request is served, and a waiting long poll, which
//! sends nothing for its whole wait, is never taken for idle.

use crate::common;

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

each_engine!(a_waiting_long_poll_is_never_idle,);

async fn a_waiting_long_poll_is_never_idle(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |args: &mut leasegate::config::ServeArgs| {
        args.header_timeout_s = 1;
        args.idle_timeout_s = 1;
    })
    .await
    else {
        return;
    };
    app.pool("linux", &[IMAGE_A]).await;
    let runner = app.register("linux", "r1").await;
    let started = Instant::now();
    let r = app.lease_wait(&runner.healthy(), 3).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(started.elapsed() >= Duration::from_secs(3));
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
    let port = common::free_port();
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

/// `GET path` on a connection from `from`; the answer's status line and body, or `None` when
/// nothing came within `limit`.
async fn held_request(from: &str, to: SocketAddr, path: &str, limit: Duration) -> Option<String> {
    let mut s = connect_from(from, to).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 2048];
    let deadline = tokio::time::Instant::now() + limit;
    // The whole of a small answer: its head and the body its length says.
    loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if body.len() >= len {
                return Some(text);
            }
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => return (!seen.is_empty()).then(|| String::from_utf8_lossy(&seen).into_owned()),
        }
    }
}

/// A field of the JSON log line whose message is `message`.
fn logged(lines: &[serde_json::Value], message: &str, field: &str) -> usize {
    let line = lines
        .iter()
        .find(|l| l["message"] == message)
        .unwrap_or_else(|| panic!("no `{message}` line in {lines:?}"));
    line[field]
        .as_u64()
        .unwrap_or_else(|| panic!("`{message}` has no {field}: {line}")) as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_forwarded_requests_from_four_addresses_neither_exhaust_the_descriptors_nor_lock_a_fifth_out()
 {
    use std::collections::BTreeMap;
    use tokio::io::AsyncBufReadExt;
    let forge = forges::forgejo().await;
    // The binary under a file limit of 512 (soft and hard: it raises the soft one to the hard).
    let dir = tempfile::tempdir().unwrap();
    let port = binary::free_port();
    let mut cmd = binary::serve(dir.path(), port);
    cmd.env("LEASEGATE_ADMIN_TOKEN", ADMIN)
        .env("LEASEGATE_FORGE_TOKEN", FORGE)
        .env("LEASEGATE_FORGEJO_UPSTREAM", &forge.base)
        .env("LEASEGATE_LOG_FORMAT", "json");
    // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent.
    unsafe {
        cmd.pre_exec(|| rlimit::setrlimit(rlimit::Resource::NOFILE, 512, 512));
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    // Every log line, read as it comes (a full pipe would stall the service's logging).
    let log: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Default::default();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let reader = {
        let log = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str(&line) {
                    log.lock().unwrap().push(v);
                }
            }
        })
    };
    let to: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let base = format!("http://{to}");
    binary::wait_ready(&base).await;
    let started = log.lock().unwrap().clone();
    let per_peer = logged(&started, "listening", "max_connections_per_peer");
    let max_total = logged(&started, "listening", "max_connections");
    let forwarded_per_peer = logged(
        &started,
        "gating the forge's runners",
        "forge_requests_per_peer",
    );
    let forwarded_max = logged(&started, "gating the forge's runners", "forge_requests");

    // Each of four addresses holds nearly all a peer may of connections, each with a request
    // the forge answers in 10 s. Were each forwarded request's second socket uncounted, they
    // would take more than the 512 descriptors the process has.
    let n = per_peer - 4;
    assert!(
        4 * n * 2 > 512,
        "the scenario needs more sockets than the limit: {n} a peer"
    );
    assert!(
        4 * n < max_total,
        "and leaves the listener room for a fifth address"
    );
    assert!(4 * forwarded_per_peer <= forwarded_max);
    let attackers = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let mut held = Vec::new();
    for from in attackers {
        for _ in 0..n {
            held.push(tokio::spawn(async move {
                let answer = held_request(
                    from,
                    to,
                    "/api/actions_pipeline/slow/10",
                    Duration::from_secs(30),
                )
                .await;
                (from, answer)
            }));
        }
    }
    // Until the forge holds every request the caps let through.
    let deadline = Instant::now() + Duration::from_secs(8);
    while forge.calls().len() < 4 * forwarded_per_peer {
        assert!(
            Instant::now() < deadline,
            "the forge got {} requests",
            forge.calls().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A fifth address is served, and the process is below its file limit.
    let fifth = reqwest::Client::builder()
        .local_address("127.0.0.6".parse::<std::net::IpAddr>().unwrap())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let r = fifth.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let open_files = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(open_files < 512, "{open_files} files open");

    // Each address got its share of the forge and no more; the rest were turned away at once.
    let mut by_address: BTreeMap<String, usize> = BTreeMap::new();
    for call in forge.calls() {
        let from = call.headers["x-forwarded-for"]
            .to_str()
            .unwrap()
            .to_string();
        *by_address.entry(from).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = attackers
        .iter()
        .map(|a| (a.to_string(), forwarded_per_peer))
        .collect();
    assert_eq!(by_address, expected);
    let mut answered: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for task in held {
        let (from, answer) = task.await.unwrap();
        let answer = answer.unwrap_or_else(|| panic!("{from}: no answer"));
        let kind = if answer.starts_with("HTTP/1.1 200") && answer.ends_with("held and answered") {
            "forwarded"
        } else if answer.starts_with("HTTP/1.1 503")
            && answer.contains("\"code\":\"too_many_connections\"")
        {
            assert!(
                answer.to_ascii_lowercase().contains("retry-after: 5"),
                "{answer}"
            );
            "turned away"
        } else {
            panic!("{from}: {answer}")
        };
        *answered.entry((from, kind.to_string())).or_default() += 1;
    }
    for from in attackers {
        assert_eq!(
            answered[&(from, "forwarded".to_string())],
            forwarded_per_peer,
            "{from}"
        );
        assert_eq!(
            answered[&(from, "turned away".to_string())],
            n - forwarded_per_peer,
            "{from}"
        );
    }
    child.kill().await.ok();
    reader.abort();
}

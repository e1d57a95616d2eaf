//! The forge gate blames the right side: a client's upload that stalls is 408, one that breaks
//! off or is malformed 400, and neither is answered or logged as the forge's failure (502
//! `forge_unreachable`, "cannot reach the forge"), while a forge that is down still is. And the
//! forwarding headers a client writes itself reach the forge only through a trusted proxy. An
//! upload that takes longer than the forge's timeout, at a pace the client may keep, is not
//! the forge's timeout.
//!
//! The cases run on one thread, so that the log of the service they start is theirs to read.

use crate::common;

use common::forges;
use common::log::Captured;
use common::*;
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes `head` and `body` (in that order) to the app, then, unless `hold`, shuts the write
/// side; reads the answer until the app closes, and gives its status line and the rest.
async fn raw(app: &TestApp, head: &str, body: &[u8], hold: bool) -> (String, String) {
    let addr = app.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    if !hold {
        stream.shutdown().await.unwrap();
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (status, rest) = answer.split_once("\r\n").unwrap_or((&answer, ""));
    (status.to_string(), rest.to_string())
}

fn code_in(rest: &str) -> String {
    let body = rest.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: Value = serde_json::from_str(body).unwrap_or_default();
    v["code"].as_str().unwrap_or("").to_string()
}

#[tokio::test]
async fn a_clients_broken_upload_is_the_clients_and_a_dead_forge_the_forges() {
    let (log, _guard) = Captured::start();
    let gitlab = forges::gitlab(1).await;
    let base = gitlab.base.clone();
    let app = spawn_app_with(move |a| {
        a.gitlab_upstream = Some(base);
        a.body_timeout_s = 1;
        a.body_min_rate = 1;
    })
    .await;
    let host = app.base.trim_start_matches("http://").to_string();
    // An artifact upload that stops after 10 of its 1000 bytes.
    let (status, rest) = raw(
        &app,
        &format!("POST /api/v4/upload HTTP/1.1\r\nhost: {host}\r\ncontent-length: 1000\r\n\r\n"),
        &[b'x'; 10],
        true,
    )
    .await;
    assert!(status.contains(" 408 "), "{status}\n{rest}");
    assert_eq!(code_in(&rest), "request_timeout", "{rest}");
    // One whose chunked framing is garbage.
    let (status, rest) = raw(
        &app,
        &format!(
            "POST /api/v4/upload HTTP/1.1\r\nhost: {host}\r\ntransfer-encoding: chunked\r\n\r\n"
        ),
        b"5\r\nhello\r\nzz\r\n",
        true,
    )
    .await;
    assert!(status.contains(" 400 "), "{status}\n{rest}");
    assert_eq!(code_in(&rest), "malformed_body", "{rest}");
    // One that breaks off: the client closes before its 1000 bytes.
    let (status, rest) = raw(
        &app,
        &format!("POST /api/v4/upload HTTP/1.1\r\nhost: {host}\r\ncontent-length: 1000\r\n\r\n"),
        &[b'x'; 10],
        false,
    )
    .await;
    assert!(status.contains(" 400 "), "{status}\n{rest}");
    assert_eq!(code_in(&rest), "malformed_body", "{rest}");
    // A GitLab job request that stalls is the client's too.
    let (status, rest) = raw(
        &app,
        &format!("POST /api/v4/jobs/request HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"),
        b"{\"token\":",
        true,
    )
    .await;
    assert!(status.contains(" 408 "), "{status}\n{rest}");
    let text = log.text();
    assert!(!text.contains("cannot reach the forge"), "{text}");
    assert!(!text.contains("forge_unreachable"), "{text}");
    assert!(
        text.contains("a client's request body failed on its way to the forge"),
        "{text}"
    );

    // A forge that is down is the forge's.
    let (_held, refusing) = refusing_address();
    let dead =
        spawn_app_with(move |a| a.gitlab_upstream = Some(format!("http://{refusing}"))).await;
    let r = dead
        .client
        .post(dead.url("/api/v4/upload"))
        .body("0123456789")
        .send()
        .await
        .unwrap();
    expect_problem(
        r,
        "a forge that is down",
        reqwest::StatusCode::BAD_GATEWAY,
        "forge_unreachable",
    )
    .await;
    assert!(
        log.text().contains("cannot reach the forge"),
        "{}",
        log.text()
    );
}

#[tokio::test]
async fn a_clients_forwarding_headers_reach_the_forge_only_through_a_trusted_proxy() {
    const WRITTEN: [&str; 11] = [
        "forwarded",
        "x-real-ip",
        "true-client-ip",
        "client-ip",
        "x-forwarded-host",
        "x-forwarded-port",
        "x-forwarded-prefix",
        "x-original-url",
        "x-rewrite-url",
        "x-forwarded-ssl",
        "x-forwarded-scheme",
    ];
    for trusted in [false, true] {
        let forgejo = forges::forgejo().await;
        let base = forgejo.base.clone();
        let app = spawn_app_with(move |a| {
            a.forgejo_upstream = Some(base);
            if trusted {
                a.trusted_proxies = vec!["127.0.0.1".into()];
            }
        })
        .await;
        let mut request = app
            .client
            .post(app.url("/api/actions_pipeline/_apis/echo"))
            .header("x-forwarded-for", "198.51.100.1")
            .header("x-runner-uuid", "kept");
        for name in WRITTEN {
            request = request.header(name, "203.0.113.7");
        }
        let r = request.body("{}").send().await.unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::ACCEPTED);
        let echoed: Value = r.json().await.unwrap();
        let headers = &echoed["headers"];
        assert_eq!(headers["x-runner-uuid"], "kept");
        for name in WRITTEN {
            if trusted {
                assert_eq!(headers[name], "203.0.113.7", "{name} from a trusted proxy");
            } else {
                assert!(
                    headers.get(name).is_none(),
                    "{name} from a client: {headers}"
                );
            }
        }
        let chain = if trusted {
            "198.51.100.1, 127.0.0.1"
        } else {
            "127.0.0.1"
        };
        assert_eq!(headers["x-forwarded-for"], chain);
    }
}

#[tokio::test]
async fn a_slow_upload_is_not_counted_against_the_forge() {
    let forgejo = forges::forgejo().await;
    let base = forgejo.base.clone();
    let app = spawn_app_with(move |a| {
        a.forgejo_upstream = Some(base);
        a.forge_timeout_s = 1;
        a.body_timeout_s = 2;
        a.body_min_rate = 1;
    })
    .await;
    // Six chunks 600 ms apart: 3 s of upload, within the client's pace, past the forge's 1 s.
    let chunks = futures_util::stream::unfold(0u8, |i| async move {
        if i == 6 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        Some((Ok::<_, std::io::Error>(vec![b'a' + i; 5]), i + 1))
    });
    let started = std::time::Instant::now();
    let r = app
        .client
        .post(app.url("/api/actions_pipeline/upload"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_secs(3));
    let got: Value = r.json().await.unwrap();
    assert_eq!(got["bytes"], 30);
    // The forge's own silence is still its own.
    let r = app
        .client
        .get(app.url("/api/actions_pipeline/slow/3"))
        .send()
        .await
        .unwrap();
    expect_problem(
        r,
        "a forge that says nothing",
        reqwest::StatusCode::GATEWAY_TIMEOUT,
        "forge_timeout",
    )
    .await;
}

//! HTTP/1.1 on the wire, as a client that writes its own bytes sees it: plain requests (served
//! by `listener::plain`) and those handed to hyper (a chunked body, `Expect`, HTTP/1.0, a head
//! that does not parse) get the same answers, framed alike, and the connection goes on after
//! either until the client asks for it to close.

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(app: &TestApp) -> SocketAddr {
    app.base.trim_start_matches("http://").parse().unwrap()
}

/// One answer as read off the wire: its status, lower-cased headers, and body (de-chunked).
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A connection that reads answers one at a time, keeping what came after each.
struct Wire {
    stream: TcpStream,
    read: Vec<u8>,
}

impl Wire {
    async fn open(app: &TestApp) -> Wire {
        Wire {
            stream: TcpStream::connect(addr(app)).await.unwrap(),
            read: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Reads more; false once the service closed the connection.
    async fn fill(&mut self) -> bool {
        let mut buf = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut buf))
            .await
            .expect("the service answered within 10 s")
            .unwrap_or(0);
        self.read.extend_from_slice(&buf[..n]);
        n > 0
    }

    /// The next answer; `head_only` for an answer to HEAD (a length but no body).
    async fn answer(&mut self, head_only: bool) -> Answer {
        let head_end = loop {
            if let Some(i) = self.read.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(
                self.fill().await,
                "closed before a whole head: {:?}",
                self.text()
            );
        };
        let head = String::from_utf8(self.read[..head_end].to_vec()).unwrap();
        self.read.drain(..head_end);
        let mut lines = head.split("\r\n");
        let status: u16 = lines.next().unwrap()[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        let mut answer = Answer {
            status,
            headers,
            body: Vec::new(),
        };
        if head_only || status == 204 || status == 304 {
            return answer;
        }
        if let Some(length) = answer.header("content-length") {
            let length: usize = length.parse().unwrap();
            while self.read.len() < length {
                assert!(self.fill().await, "closed inside a body");
            }
            answer.body = self.read.drain(..length).collect();
        } else {
            assert_eq!(answer.header("transfer-encoding"), Some("chunked"));
            loop {
                let line_end = loop {
                    if let Some(i) = self.read.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    assert!(self.fill().await, "closed inside a chunk's size");
                };
                let size = usize::from_str_radix(
                    std::str::from_utf8(&self.read[..line_end]).unwrap().trim(),
                    16,
                )
                .unwrap();
                while self.read.len() < line_end + 2 + size + 2 {
                    assert!(self.fill().await, "closed inside a chunk");
                }
                answer
                    .body
                    .extend_from_slice(&self.read[line_end + 2..line_end + 2 + size]);
                self.read.drain(..line_end + 2 + size + 2);
                if size == 0 {
                    break;
                }
            }
        }
        answer
    }

    /// Whether the service closed the connection with nothing more to say.
    async fn closed(&mut self) -> bool {
        self.read.is_empty() && !self.fill().await
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.read).into()
    }
}

const LIVEZ: &[u8] = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n";

/// A heartbeat that is not JSON, with its body framed by a length or in chunks.
fn bad_heartbeat(chunked: bool) -> Vec<u8> {
    let body = b"{\"not\": json";
    let mut request = b"POST /api/v1/runners/heartbeat HTTP/1.1\r\nHost: x\r\n\
        Content-Type: application/json\r\n"
        .to_vec();
    if chunked {
        request.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        request.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
        request.extend_from_slice(body);
        request.extend_from_slice(b"\r\n0\r\n\r\n");
    } else {
        request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        request.extend_from_slice(body);
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_at_once_are_answered_in_order_on_one_connection() {
    let app = spawn_app().await;
    let mut wire = Wire::open(&app).await;
    let mut three = LIVEZ.to_vec();
    three.extend_from_slice(b"GET /no-such-route HTTP/1.1\r\nHost: x\r\n\r\n");
    three.extend_from_slice(LIVEZ);
    wire.send(&three).await;
    let first = wire.answer(false).await;
    assert_eq!((first.status, first.body.as_slice()), (200, &b"ok\n"[..]));
    let second = wire.answer(false).await;
    assert_eq!(second.status, 404);
    assert_eq!(
        second.header("content-type"),
        Some("application/problem+json")
    );
    let third = wire.answer(false).await;
    assert_eq!(third.status, 200);
    // Every answer says when it was made and how long it is, as hyper's do.
    for a in [&first, &second, &third] {
        assert!(
            a.header("date").is_some_and(|d| d.ends_with(" GMT")),
            "{a:?}"
        );
        assert!(a.header("content-length").is_some(), "{a:?}");
        assert!(a.header("connection").is_none(), "{a:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_a_few_bytes_at_a_time_is_read_whole() {
    let app = spawn_app().await;
    let mut wire = Wire::open(&app).await;
    for piece in LIVEZ.chunks(5) {
        wire.send(piece).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = wire.answer(false).await;
    assert_eq!((a.status, a.body.as_slice()), (200, &b"ok\n"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asks_to_close_is_answered_then_the_connection_closes() {
    let app = spawn_app().await;
    let mut wire = Wire::open(&app).await;
    wire.send(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n")
        .await;
    let a = wire.answer(false).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("connection"), Some("close"));
    assert!(wire.closed().await, "still open: {:?}", wire.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_head_has_its_length_and_no_body() {
    let app = spawn_app().await;
    let mut wire = Wire::open(&app).await;
    wire.send(b"HEAD /livez HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let a = wire.answer(true).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("content-length"), Some("3"));
    // Had a body been sent, the next answer would not begin where it is read.
    wire.send(LIVEZ).await;
    let next = wire.answer(false).await;
    assert_eq!((next.status, next.body.as_slice()), (200, &b"ok\n"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_gets_the_answer_its_length_framed_twin_gets_and_the_connection_goes_on() {
    let app = spawn_app().await;
    let mut answers = Vec::new();
    for chunked in [false, true] {
        let mut wire = Wire::open(&app).await;
        wire.send(&bad_heartbeat(chunked)).await;
        let a = wire.answer(false).await;
        let problem: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        answers.push((a.status, problem["code"].clone()));
        // After a request hyper was handed, the connection is served as before.
        wire.send(LIVEZ).await;
        assert_eq!(wire.answer(false).await.status, 200);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0].0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_expects_100_continue_is_told_to_go_on() {
    let app = spawn_app().await;
    let mut wire = Wire::open(&app).await;
    let body = b"{\"not\": json";
    wire.send(
        format!(
            "POST /api/v1/runners/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    let go_on = wire.answer(true).await;
    assert_eq!(go_on.status, 100);
    wire.send(body).await;
    assert_eq!(wire.answer(false).await.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_1_0_is_answered_and_closed() {
    let app = spawn_app().await;
    let mut wire = Wire::open(&app).await;
    wire.send(b"GET /livez HTTP/1.0\r\n\r\n").await;
    let a = wire.answer(false).await;
    assert_eq!((a.status, a.body.as_slice()), (200, &b"ok\n"[..]));
    assert!(wire.closed().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_does_not_parse_is_answered_400_and_a_huge_one_431() {
    let app = spawn_app().await;
    let mut wire = Wire::open(&app).await;
    wire.send(b"GET /livez HTTP/1.1\r\nHo st: x\r\n\r\n").await;
    assert_eq!(wire.answer(false).await.status, 400);
    let mut wire = Wire::open(&app).await;
    let mut huge = b"GET /livez HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..400 {
        huge.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "y".repeat(20)).as_bytes());
    }
    huge.extend_from_slice(b"\r\n");
    wire.send(&huge).await;
    assert_eq!(wire.answer(false).await.status, 431);
    // Few headers, one of them long: over the limit however it arrives.
    let mut wire = Wire::open(&app).await;
    let long = format!(
        "GET /livez HTTP/1.1\r\nHost: x\r\nX-Long: {}\r\n\r\n",
        "y".repeat(9000)
    );
    wire.send(long.as_bytes()).await;
    assert_eq!(wire.answer(false).await.status, 431);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_whose_client_went_away_is_not_given_the_next_job() {
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let gone = app.register("linux", "gone").await;
    let waiting = app.register("linux", "waiting").await;
    let mut wire = Wire::open(&app).await;
    let body = serde_json::json!({"attestation": gone.healthy(), "wait_s": 20}).to_string();
    wire.send(
        format!(
            "POST /api/v1/lease HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    // The poll is waiting when its client goes away.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(wire);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let job = app.enqueue("linux").await;
    let granted = app.grant(&waiting).await;
    assert_eq!(granted.job_id, job);
}

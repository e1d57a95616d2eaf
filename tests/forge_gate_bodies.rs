//! Large bodies through the forge gate, which streams them both ways (`forge_gate/upstream.rs`):
//! an upload and a download of several MiB, sent in pieces of uneven sizes, arrive byte for
//! byte; an upload the client breaks off breaks off the request the forge is reading, and a
//! download the client abandons stops the forge's answer.

use crate::common;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::routing::{get, post};
use common::*;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Uneven piece sizes, cycled: below, at and above the gate's 256 KiB reads.
const PIECES: [usize; 7] = [1, 4_093, 65_536, 262_145, 1_048_583, 17, 300_000];

/// What the forge saw of one request.
#[derive(Debug, PartialEq)]
enum Seen {
    /// An upload began.
    Started,
    /// An upload ended cleanly, with this many bytes and this SHA-256.
    Ended(u64, String),
    /// An upload broke off after this many bytes.
    BrokeOff(u64),
    /// A download's body was dropped before its end.
    Abandoned,
}

/// A forge that tells the test what it saw: an upload's end, or a download dropped.
async fn forge() -> (String, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let router = Router::new()
        .route("/api/actions_pipeline/upload", post(upload))
        .route("/api/actions_pipeline/blob/{bytes}", get(blob))
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (base, rx)
}

async fn upload(State(seen): State<mpsc::UnboundedSender<Seen>>, body: Body) -> String {
    seen.send(Seen::Started).unwrap();
    let mut body = body;
    let (mut n, mut hash) = (0u64, Sha256::new());
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            seen.send(Seen::BrokeOff(n)).unwrap();
            return String::new();
        };
        if let Ok(data) = frame.into_data() {
            n += data.len() as u64;
            hash.update(&data);
        }
    }
    let hex = hex::encode(hash.finalize());
    seen.send(Seen::Ended(n, hex.clone())).unwrap();
    format!("{n} {hex}")
}

/// The byte at `offset` of every blob: a byte lost, doubled or moved shows.
fn blob_byte(offset: usize) -> u8 {
    (offset % 251) as u8
}

/// Notes that a download's body was dropped before its end.
struct Unfinished(Option<mpsc::UnboundedSender<Seen>>);

impl Unfinished {
    fn finished(&mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(seen) = self.0.take() {
            let _ = seen.send(Seen::Abandoned);
        }
    }
}

/// `bytes` bytes of `blob_byte`, in frames of the uneven sizes of `PIECES`.
async fn blob(State(seen): State<mpsc::UnboundedSender<Seen>>, Path(bytes): Path<usize>) -> Body {
    let mut guard = Unfinished(Some(seen));
    let mut offset = 0;
    let frames = futures_util::stream::iter((0..).map_while(move |i| {
        if offset >= bytes {
            guard.finished();
            return None;
        }
        let end = bytes.min(offset + PIECES[i % PIECES.len()]);
        let data: Vec<u8> = (offset..end).map(blob_byte).collect();
        offset = end;
        Some(Ok::<_, std::io::Error>(Bytes::from(data)))
    }));
    Body::from_stream(frames)
}

/// `total` bytes in pieces of the sizes of `PIECES`, cycled.
fn uneven(total: usize) -> Vec<Vec<u8>> {
    let (mut pieces, mut offset) = (Vec::new(), 0);
    for size in PIECES.iter().cycle() {
        if offset >= total {
            break;
        }
        let end = total.min(offset + size);
        pieces.push((offset..end).map(|i| (i * 7 % 256) as u8).collect());
        offset = end;
    }
    pieces
}

async fn gated() -> (TestApp, mpsc::UnboundedReceiver<Seen>) {
    let (base, seen) = forge().await;
    let app = spawn_app_with(move |a| a.forgejo_upstream = Some(base)).await;
    (app, seen)
}

async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(10), seen.recv())
        .await
        .expect("the forge saw it within 10 s")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_and_a_download_in_uneven_pieces_pass_byte_for_byte() {
    let (app, mut seen) = gated().await;
    const TOTAL: usize = 24 << 20;
    let pieces = uneven(TOTAL);
    let mut hash = Sha256::new();
    for piece in &pieces {
        hash.update(piece);
    }
    let expected = format!("{TOTAL} {}", hex::encode(hash.finalize()));
    let stream = futures_util::stream::iter(pieces.into_iter().map(Ok::<_, std::io::Error>));
    let r = app
        .client
        .post(app.url("/api/actions_pipeline/upload"))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), expected);
    assert_eq!(next(&mut seen).await, Seen::Started);
    assert!(matches!(next(&mut seen).await, Seen::Ended(n, _) if n == TOTAL as u64));

    let mut r = app
        .client
        .get(app.url(&format!("/api/actions_pipeline/blob/{TOTAL}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let mut offset = 0;
    while let Some(piece) = r.chunk().await.unwrap() {
        if let Some(i) = (0..piece.len()).find(|i| piece[*i] != blob_byte(offset + i)) {
            panic!("byte {} of the download differs", offset + i);
        }
        offset += piece.len();
    }
    assert_eq!(offset, TOTAL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_the_client_breaks_off_breaks_off_at_the_forge() {
    let (app, mut seen) = gated().await;
    let addr = app.base.trim_start_matches("http://");
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let total = 8 << 20;
    let head = format!(
        "POST /api/actions_pipeline/upload HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {total}\r\n\r\n"
    );
    client.write_all(head.as_bytes()).await.unwrap();
    for piece in uneven(3 << 20) {
        client.write_all(&piece).await.unwrap();
    }
    assert_eq!(next(&mut seen).await, Seen::Started);
    drop(client);
    match next(&mut seen).await {
        Seen::BrokeOff(n) => assert!(n <= 3 << 20, "{n}"),
        other => panic!("the forge saw {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_the_client_abandons_stops_the_forges_answer() {
    let (app, mut seen) = gated().await;
    let mut r = app
        .client
        .get(app.url("/api/actions_pipeline/blob/1000000000"))
        .send()
        .await
        .unwrap();
    let mut read = 0;
    while read < 2 << 20 {
        read += r.chunk().await.unwrap().unwrap().len();
    }
    drop(r);
    assert_eq!(next(&mut seen).await, Seen::Abandoned);
}

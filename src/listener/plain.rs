//! Plain requests, served so that a request being answered holds no buffer of its connection.
//!
//! hyper keeps an 8 KiB read buffer and an 8 KiB write buffer for each HTTP/1 connection for
//! its whole life (fixed in hyper 1.x), and a fleet's waiting long polls are ten thousand
//! connections, each inside a request that waits up to 30 s. Nearly every request the service
//! gets is plain: HTTP/1.1, a head within `MAX_HEAD_BYTES`, no body or one of at most
//! `PLAIN_BODY_BYTES` with a `Content-Length`. Such a request is read here (its head parsed by
//! `httparse`, hyper's own parser) into a buffer of the size it needs, which is given up before
//! the router is called; the answer is written from a buffer made for it. Between requests the
//! connection holds its socket and nothing else; while one is served, 64 bytes besides, read
//! into to notice the client leaving, which cancels the request as hyper would.
//!
//! The first request that is not plain (a chunked or larger body, `Expect`, an upgrade,
//! HTTP/1.0, a head that is too large or does not parse) is hyper's: the connection is handed
//! over with every byte read of it (`Ended::HandedOver`, put back into its `Watched` socket),
//! and hyper serves it, answering its errors (400, 431). Once hyper's request is done, its body
//! read to the end and its answer flushed, the connection comes back here with whatever hyper
//! read beyond it (`listener::hyper_serves`); one whose body was left unread stays hyper's.

use super::MAX_HEAD_BYTES;
use super::activity::{Activity, InFlight};
use super::body::{BodyPace, BodyTimedOut, deadline};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, Request, Response, StatusCode, Uri, Version};
use bytes::{Buf, BytesMut};
use futures_util::FutureExt;
use http_body::Frame;
use http_body_util::BodyExt;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::Service;

/// The largest body read here; a larger one (an upload) is hyper's to stream.
pub const PLAIN_BODY_BYTES: u64 = 64 * 1024;

/// The most headers a plain request has (hyper's own limit is 100).
const MAX_HEADERS: usize = 100;

/// What a read asks the socket for at least: a lease request with its attestation fits.
const READ_BYTES: usize = 4 * 1024;

/// An answer's head and its small frames are gathered up to this size before a write.
const WRITE_BYTES: usize = 16 * 1024;

/// A connection, and what its requests need of it.
pub struct Connection<'a> {
    pub app: &'a Router,
    pub peer: SocketAddr,
    pub pace: BodyPace,
    pub activity: &'a Arc<Activity>,
    /// Cancelled when the service drains: no new request is read, the one being served is
    /// answered with `connection: close`.
    pub drain: &'a CancellationToken,
}

/// How serving plain requests ended.
#[derive(Debug)]
pub enum Ended {
    Closed,
    /// A request that is not plain began: the bytes read of it, and any after them, for hyper.
    HandedOver(Bytes),
}

/// Serves the connection's plain requests until it closes or one is not plain.
pub async fn serve<T>(io: &mut T, connection: &Connection<'_>) -> io::Result<Ended>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut read = BytesMut::new();
    loop {
        let head = match read_head(io, &mut read, connection.drain).await? {
            Some(Parsed::Plain(head)) => head,
            Some(Parsed::NotPlain) => return Ok(Ended::HandedOver(read.freeze())),
            Some(Parsed::Partial) | None => return Ok(Ended::Closed),
        };
        let in_flight = InFlight::begin(connection.activity);
        let Head {
            request,
            length,
            content_length,
            close,
        } = head;
        read.advance(length);
        // A body that did not come whole is handed on as the error a streamed one would end in
        // (the handler answers 408 or 400), and the connection closes after the answer.
        let (body, complete, still_reading) =
            match read_body(io, &mut read, content_length, connection.pace).await? {
                BodyRead::Complete(bytes) => (Body::from(bytes), true, true),
                BodyRead::TooSlow => (Body::new(Broken::new(BodyTimedOut)), false, true),
                BodyRead::Closed => {
                    let cut = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client closed its side before the body ended",
                    );
                    (Body::new(Broken::new(cut)), false, false)
                }
            };
        // The next request's bytes, if the client sent them already, in a buffer of their own:
        // the one read into may be most of `READ_BYTES` and is given up here.
        read = BytesMut::from(&read[..]);
        let head_only = request.method() == Method::HEAD;
        let mut request = request.map(|()| body);
        request
            .extensions_mut()
            .insert(ConnectInfo(connection.peer));
        // A client that goes away while its request is served (a runner stopped during its
        // long poll) cancels it, as hyper would: a job must not be leased to nobody.
        let response = tokio::select! {
            Ok(response) = connection.app.clone().call(request) => response,
            () = gone(io, &mut read), if still_reading => return Ok(Ended::Closed),
        };
        let close = close || !complete || connection.drain.is_cancelled();
        // Boxed, so that a request being served (a waiting poll) does not make room in the
        // connection's state for the writing of its answer.
        let close = Box::pin(write_answer(io, response, head_only, close)).await?;
        drop(in_flight);
        if close {
            return Ok(Ended::Closed);
        }
    }
}

/// Reads until a head is complete, or is known not to be plain. `None`: the client closed
/// the connection between requests, or the service drains.
async fn read_head<T>(
    io: &mut T,
    read: &mut BytesMut,
    drain: &CancellationToken,
) -> io::Result<Option<Parsed>>
where
    T: AsyncRead + Unpin,
{
    loop {
        if !read.is_empty() {
            match parse(read) {
                Parsed::Partial if read.len() >= MAX_HEAD_BYTES => {
                    return Ok(Some(Parsed::NotPlain));
                }
                Parsed::Partial => {}
                parsed => return Ok(Some(parsed)),
            }
        }
        if read.capacity() - read.len() < READ_BYTES / 4 {
            read.reserve(READ_BYTES);
        }
        let n = if read.is_empty() {
            tokio::select! {
                n = io.read_buf(read) => n?,
                _ = drain.cancelled() => return Ok(None),
            }
        } else {
            io.read_buf(read).await?
        };
        if n == 0 {
            // Closed between requests, or in the middle of a head (which hyper would not
            // answer either).
            return Ok(None);
        }
    }
}

enum BodyRead {
    Complete(Bytes),
    /// It came more slowly than bodies must (`BodyPace`).
    TooSlow,
    /// The client closed the connection before it was all sent.
    Closed,
}

/// Returns when the client closes the connection (or it fails). What it sends meanwhile (its
/// next request, pipelined) is kept in `read`, up to a head's worth; the read waits in 64
/// bytes of it.
async fn gone<T>(io: &mut T, read: &mut BytesMut)
where
    T: AsyncRead + Unpin,
{
    while read.len() < MAX_HEAD_BYTES {
        match io.read_buf(read).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    std::future::pending().await
}

/// Reads the body's `length` bytes, at the pace bodies must keep.
async fn read_body<T>(
    io: &mut T,
    read: &mut BytesMut,
    length: u64,
    pace: BodyPace,
) -> io::Result<BodyRead>
where
    T: AsyncRead + Unpin,
{
    let length = length as usize;
    let started = Instant::now();
    let mut last_bytes = started;
    while read.len() < length {
        read.reserve(length - read.len());
        let at = deadline(pace, started, last_bytes, read.len() as u64);
        match tokio::time::timeout_at(at, io.read_buf(read)).await {
            Err(_) => return Ok(BodyRead::TooSlow),
            Ok(Ok(0)) => return Ok(BodyRead::Closed),
            Ok(Ok(_)) => last_bytes = Instant::now(),
            Ok(Err(e)) => return Err(e),
        }
    }
    Ok(BodyRead::Complete(read.split_to(length).freeze()))
}

/// A plain request's head, ready for the router.
struct Head {
    request: Request<()>,
    /// The head's length in bytes.
    length: usize,
    content_length: u64,
    /// The client asked for the connection to close after this request.
    close: bool,
}

// Returned and matched at once, never kept: boxing the head would cost every request an
// allocation for nothing.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    Plain(Head),
    NotPlain,
    Partial,
}

fn parse(bytes: &[u8]) -> Parsed {
    // Uninitialised, as hyper keeps them: zeroing a hundred slots costs more than the parse.
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    match parsed.parse_with_uninit_headers(bytes, &mut headers) {
        Ok(httparse::Status::Partial) => Parsed::Partial,
        // A head over the limit that a single read completed is hyper's to refuse (431).
        Ok(httparse::Status::Complete(length)) if length > MAX_HEAD_BYTES => Parsed::NotPlain,
        Ok(httparse::Status::Complete(length)) => match plain_head(&parsed, length) {
            Some(head) => Parsed::Plain(head),
            None => Parsed::NotPlain,
        },
        Err(_) => Parsed::NotPlain,
    }
}

/// The head as a request, if it is plain.
fn plain_head(parsed: &httparse::Request<'_, '_>, length: usize) -> Option<Head> {
    if parsed.version != Some(1) {
        return None;
    }
    let method = Method::from_bytes(parsed.method?.as_bytes()).ok()?;
    let path = parsed.path?;
    if !path.starts_with('/') {
        return None;
    }
    let uri = Uri::from_maybe_shared(Bytes::copy_from_slice(path.as_bytes())).ok()?;
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    let mut content_length = None;
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(h.value).ok()?;
        if name == header::CONTENT_LENGTH {
            // Digits only: `u64::from_str` would take a sign, which hyper refuses.
            let digits = value.as_bytes();
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let length: u64 = value.to_str().ok()?.parse().ok()?;
            if content_length.replace(length).is_some() {
                return None;
            }
        } else if name == header::TRANSFER_ENCODING
            || name == header::EXPECT
            || name == header::UPGRADE
        {
            return None;
        }
        headers.append(name, value);
    }
    let content_length = content_length.unwrap_or(0);
    if content_length > PLAIN_BODY_BYTES || has_token(&headers, "upgrade") {
        return None;
    }
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    let close = has_token(&headers, "close");
    *request.headers_mut() = headers;
    Some(Head {
        request,
        length,
        content_length,
        close,
    })
}

/// A request body that did not arrive whole: it ends in the error at once.
struct Broken(Option<axum::BoxError>);

impl Broken {
    fn new(error: impl Into<axum::BoxError>) -> Self {
        Broken(Some(error.into()))
    }
}

impl http_body::Body for Broken {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        Poll::Ready(self.0.take().map(Err))
    }
}

/// How an answer's body is framed on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length,
    Chunked,
}

/// Writes `response`, framed as HTTP/1.1 needs; returns whether the connection closes after
/// it. What hyper adds to an answer is added here too: its length or chunked framing, `date`,
/// and `connection: close` when the connection closes.
async fn write_answer<T>(
    io: &mut T,
    response: Response<Body>,
    head_only: bool,
    close: bool,
) -> io::Result<bool>
where
    T: AsyncWrite + Unpin,
{
    let (mut parts, mut body) = response.into_parts();
    let close = close || has_token(&parts.headers, "close");
    let status = parts.status;
    parts.headers.remove(header::TRANSFER_ENCODING);
    let framing = if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        parts.headers.remove(header::CONTENT_LENGTH);
        Framing::None
    } else if parts.headers.contains_key(header::CONTENT_LENGTH) {
        Framing::Length
    } else if let Some(length) = http_body::Body::size_hint(&body).exact() {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        Framing::Length
    } else if head_only {
        Framing::None
    } else {
        parts.headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        Framing::Chunked
    };
    if !parts.headers.contains_key(header::DATE) {
        parts.headers.insert(header::DATE, date_now());
    }
    if close && !has_token(&parts.headers, "close") {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if head_only || framing == Framing::None {
        io.write_all(&out).await?;
        io.flush().await?;
        return Ok(close);
    }
    loop {
        // What is gathered goes out before waiting on a body that has nothing ready (a
        // forwarded answer the forge streams slowly).
        let frame = match body.frame().now_or_never() {
            Some(frame) => frame,
            None => {
                if !out.is_empty() {
                    io.write_all(&out).await?;
                    io.flush().await?;
                    out.clear();
                }
                body.frame().await
            }
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(io::Error::other)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing asks for them
        };
        if data.is_empty() {
            continue;
        }
        if framing == Framing::Chunked {
            out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        }
        if out.len() + data.len() <= WRITE_BYTES {
            out.extend_from_slice(&data);
        } else {
            // A large piece (a forwarded download) goes out as it is, not copied.
            io.write_all(&out).await?;
            out.clear();
            io.write_all(&data).await?;
        }
        if framing == Framing::Chunked {
            out.extend_from_slice(b"\r\n");
        }
        if out.len() >= WRITE_BYTES {
            io.write_all(&out).await?;
            out.clear();
        }
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    io.write_all(&out).await?;
    io.flush().await?;
    Ok(close)
}

/// The `date` of an answer made now: written once a second on each thread, as hyper does.
fn date_now() -> HeaderValue {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static DATE: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|date| match date {
        Some((at, value)) if *at == second => value.clone(),
        _ => {
            let value = HeaderValue::from_str(&httpdate::fmt_http_date(now))
                .expect("an HTTP date is a valid header value");
            *date = Some((second, value.clone()));
            value
        }
    })
}

/// Whether a `connection` header lists `token` (a request's or an answer's).
fn has_token(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(bytes: &[u8]) -> Parsed {
        parse(bytes)
    }

    #[test]
    fn plain_heads_are_told_from_those_hyper_is_to_read() {
        let plain = b"POST /api/v1/lease HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        let Parsed::Plain(h) = head(plain) else {
            panic!("a small body of known length is plain")
        };
        assert_eq!(
            (h.length, h.content_length, h.close),
            (plain.len() - 2, 2, false)
        );
        assert_eq!(h.request.uri().path(), "/api/v1/lease");
        assert!(matches!(
            head(b"GET /livez HTTP/1.1\r\nHost"),
            Parsed::Partial
        ));
        for not_plain in [
            &b"GET /livez HTTP/1.0\r\n\r\n"[..],
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            b"GET /x HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: 65537\r\n\r\n",
            b"GET http://elsewhere/x HTTP/1.1\r\n\r\n",
            b"GET /x HTTP/1.1\r\nBad Name: y\r\n\r\n",
        ] {
            assert!(
                matches!(head(not_plain), Parsed::NotPlain),
                "{}",
                String::from_utf8_lossy(not_plain)
            );
        }
        let long = format!(
            "GET / HTTP/1.1\r\nX-Long: {}\r\n\r\n",
            "y".repeat(MAX_HEAD_BYTES)
        );
        assert!(matches!(head(long.as_bytes()), Parsed::NotPlain));
        let Parsed::Plain(h) = head(b"GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n")
        else {
            panic!()
        };
        assert!(h.close);
    }

    async fn written(response: Response<Body>, head_only: bool) -> (String, bool) {
        let mut out = Vec::new();
        let close = write_answer(&mut out, response, head_only, false)
            .await
            .unwrap();
        (String::from_utf8(out).unwrap(), close)
    }

    #[tokio::test]
    async fn an_answer_of_unknown_length_goes_out_in_chunks() {
        let pieces = futures_util::stream::iter(
            ["ab", "", "cde"].map(|s| Ok::<_, std::io::Error>(Bytes::from_static(s.as_bytes()))),
        );
        let response = Response::new(Body::from_stream(pieces));
        let (wire, close) = written(response, false).await;
        assert!(!close);
        let (head, body) = wire.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("\r\ntransfer-encoding: chunked"), "{head}");
        assert!(!head.contains("content-length"), "{head}");
        assert_eq!(body, "2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n");
    }

    #[tokio::test]
    async fn an_answer_of_known_length_says_it_and_one_without_a_body_says_nothing() {
        let (wire, _) = written(Response::new(Body::from("hello")), false).await;
        assert!(wire.contains("\r\ncontent-length: 5\r\n"), "{wire}");
        assert!(wire.ends_with("\r\n\r\nhello"), "{wire}");
        let (wire, _) = written(Response::new(Body::from("hello")), true).await;
        assert!(wire.contains("\r\ncontent-length: 5\r\n"), "{wire}");
        assert!(wire.ends_with("\r\n\r\n"), "{wire}");
        let mut none = Response::new(Body::empty());
        *none.status_mut() = StatusCode::NO_CONTENT;
        let (wire, _) = written(none, false).await;
        assert!(wire.starts_with("HTTP/1.1 204 No Content\r\n"), "{wire}");
        assert!(!wire.contains("content-length"), "{wire}");
    }

    #[tokio::test]
    async fn an_answer_that_closes_its_connection_says_so() {
        let mut response = Response::new(Body::from("bye"));
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        let (wire, close) = written(response, false).await;
        assert!(close);
        assert_eq!(wire.matches("connection: close").count(), 1, "{wire}");
    }
}

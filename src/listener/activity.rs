//! What a connection is doing, and closing it when it stalls.
//!
//! hyper has one timer for an HTTP/1 connection: its header read timeout, which starts when it
//! begins waiting for a request head, so the same timer would close a kept-alive connection
//! between a runner's heartbeats. Here each connection has a small record of its phase, kept
//! by its socket (`Watched`) and by the requests it serves (`InFlight`), and a watchdog that
//! closes it when its phase lasts too long:
//!
//! - *reading a head* (the first byte of a request came, or the connection is new): at most
//!   `header_timeout`, however slowly the bytes trickle in (slowloris);
//! - *idle* (between requests): at most `idle_timeout`;
//! - *serving a request*: no limit, since a waiting long poll or a forge that holds a request
//!   is not idle. A body that arrives too slowly is `PacedBody`'s to refuse;
//! - *writing an answer nobody reads* (the socket takes no byte): at most `idle_timeout`.
//!
//! Closing means dropping the connection: nothing is in flight in the phases that time out.
//!
//! The same record says when hyper, serving a request `plain` handed it, may give the
//! connection back (`at_rest`): no request in flight, every request body read to its end
//! (`ReadToEnd`; one left unread may still be arriving, and its bytes are no request), and
//! everything written flushed to the socket; and it counts the flushes that emptied what was
//! written (`flushes`), after each of which hyper is given one more turn (`hyper_serves`).

use axum::body::Bytes;
use pin_project_lite::pin_project;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The timeouts of a connection's phases.
#[derive(Clone, Copy, Debug)]
pub struct PhaseTimeouts {
    pub header: Duration,
    pub idle: Duration,
}

/// Why the watchdog closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stalled {
    Header,
    Idle,
    Write,
}

impl Stalled {
    pub fn as_str(self) -> &'static str {
        match self {
            Stalled::Header => "header_timeout",
            Stalled::Idle => "idle_timeout",
            Stalled::Write => "write_stalled",
        }
    }
}

/// A connection's phase, shared by its socket, its requests and its watchdog. Instants are
/// milliseconds since the connection was accepted.
pub struct Activity {
    accepted: Instant,
    in_flight: AtomicU32,
    /// When the current head or idle phase began.
    phase_since: AtomicU64,
    reading_head: AtomicBool,
    /// When a write last found the socket full (`u64::MAX`: it is not).
    write_blocked_since: AtomicU64,
    /// Wakes the watchdog when a phase with a shorter deadline begins.
    changed: Notify,
    /// Requests begun on the connection, ever.
    begun: AtomicU64,
    /// Request bodies begun and not yet read to their end (`ReadToEnd`).
    bodies_unread: AtomicU32,
    /// Bytes were offered to the socket since it was last flushed.
    unflushed: AtomicBool,
    /// Flushes that emptied offered bytes into the socket, ever.
    flushes: AtomicU64,
}

impl Activity {
    /// A new connection, which is reading its first head from now.
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            accepted: Instant::now(),
            in_flight: AtomicU32::new(0),
            phase_since: AtomicU64::new(0),
            reading_head: AtomicBool::new(true),
            write_blocked_since: AtomicU64::new(u64::MAX),
            changed: Notify::new(),
            begun: AtomicU64::new(0),
            bodies_unread: AtomicU32::new(0),
            unflushed: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
        })
    }

    /// How many requests the connection has begun to serve.
    pub fn requests_begun(&self) -> u64 {
        self.begun.load(Ordering::Acquire)
    }

    /// How many times a flush has emptied what was written into the socket.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Acquire)
    }

    /// Nothing is being served, read or written: no request in flight, every body read to its
    /// end, every byte written flushed to the socket.
    pub fn at_rest(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
            && self.bodies_unread.load(Ordering::Acquire) == 0
            && !self.unflushed.load(Ordering::Acquire)
    }

    fn now_ms(&self) -> u64 {
        self.accepted.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.accepted + Duration::from_millis(ms)
    }

    fn bytes_read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 && !self.reading_head.load(Ordering::Acquire)
        {
            self.phase_since.store(self.now_ms(), Ordering::Release);
            self.reading_head.store(true, Ordering::Release);
            self.changed.notify_one();
        }
    }

    fn write_blocked(&self) {
        if self.write_blocked_since.load(Ordering::Acquire) == u64::MAX {
            self.write_blocked_since
                .store(self.now_ms(), Ordering::Release);
            self.changed.notify_one();
        }
    }

    fn write_progressed(&self) {
        self.write_blocked_since.store(u64::MAX, Ordering::Release);
    }

    /// When the connection's current phase ends it, if it can (`None` while serving).
    fn deadline(&self, t: PhaseTimeouts) -> Option<(Instant, Stalled)> {
        let blocked = self.write_blocked_since.load(Ordering::Acquire);
        let write = (blocked != u64::MAX).then(|| (self.at(blocked) + t.idle, Stalled::Write));
        let phase = if self.in_flight.load(Ordering::Acquire) > 0 {
            None
        } else {
            let since = self.at(self.phase_since.load(Ordering::Acquire));
            Some(if self.reading_head.load(Ordering::Acquire) {
                (since + t.header, Stalled::Header)
            } else {
                (since + t.idle, Stalled::Idle)
            })
        };
        match (write, phase) {
            (Some(w), Some(p)) => Some(if w.0 <= p.0 { w } else { p }),
            (w, p) => w.or(p),
        }
    }

    /// Returns when the connection has stalled in some phase, and why.
    pub async fn stalled(&self, t: PhaseTimeouts) -> Stalled {
        loop {
            let changed = self.changed.notified();
            match self.deadline(t) {
                Some((at, why)) if at <= Instant::now() => return why,
                Some((at, _)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = changed => {}
                    }
                }
                // Serving: look again when a phase that can end begins, or after a while.
                None => {
                    tokio::select! {
                        _ = tokio::time::sleep(t.idle) => {}
                        _ = changed => {}
                    }
                }
            }
        }
    }
}

/// A request being served on a connection: from the moment its head is read until its answer
/// is written or dropped.
pub struct InFlight(Arc<Activity>);

impl InFlight {
    pub fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.begun.fetch_add(1, Ordering::AcqRel);
        activity.reading_head.store(false, Ordering::Release);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        if a.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            a.phase_since.store(a.now_ms(), Ordering::Release);
            a.reading_head.store(false, Ordering::Release);
            a.changed.notify_one();
        }
    }
}

pin_project! {
    /// A socket that tells its connection's `Activity` when bytes arrive and when a write
    /// finds it full, and gives back first what was put back into it (what `plain` read of
    /// a request it hands to hyper).
    pub struct Watched<T> {
        #[pin]
        inner: T,
        activity: Arc<Activity>,
        put_back: Bytes,
    }
}

impl<T> Watched<T> {
    pub fn new(inner: T, activity: Arc<Activity>) -> Self {
        Watched {
            inner,
            activity,
            put_back: Bytes::new(),
        }
    }

    /// Bytes already read from the socket, to be read again before anything after them
    /// (and before whatever was put back earlier and is still unread).
    pub fn put_back(&mut self, bytes: Bytes) {
        if self.put_back.is_empty() {
            self.put_back = bytes;
        } else if !bytes.is_empty() {
            self.put_back = [bytes, std::mem::take(&mut self.put_back)].concat().into();
        }
    }
}

impl<T: AsyncRead> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if !this.put_back.is_empty() {
            // Counted when they first arrived.
            let n = this.put_back.len().min(buf.remaining());
            buf.put_slice(&this.put_back.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = this.inner.poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.bytes_read();
        }
        polled
    }
}

impl<T: AsyncWrite> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        this.activity.offered(!buf.is_empty());
        let polled = this.inner.poll_write(cx, buf);
        this.activity.noted_write(&polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        this.activity.offered(bufs.iter().any(|b| !b.is_empty()));
        let polled = this.inner.poll_write_vectored(cx, bufs);
        this.activity.noted_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let polled = this.inner.poll_flush(cx);
        // Plain loads and stores, no read-modify-write: only the task that polls this socket
        // writes either, and every answer's flush (each heartbeat's) passes here.
        let a = this.activity;
        if matches!(polled, Poll::Ready(Ok(()))) && a.unflushed.load(Ordering::Acquire) {
            a.unflushed.store(false, Ordering::Release);
            a.flushes
                .store(a.flushes.load(Ordering::Acquire) + 1, Ordering::Release);
        }
        polled
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

impl Activity {
    /// Bytes are offered to the socket: unflushed until its next flush. hyper flushes its own
    /// buffer into the socket before it flushes the socket, so a flush means both are empty.
    fn offered(&self, any: bool) {
        if any {
            self.unflushed.store(true, Ordering::Release);
        }
    }

    fn noted_write<T>(&self, polled: &Poll<io::Result<T>>) {
        match polled {
            Poll::Pending => self.write_blocked(),
            Poll::Ready(_) => self.write_progressed(),
        }
    }
}

pin_project! {
    /// A request body hyper reads: until it has been read to its end, its connection is not at
    /// rest (`Activity::at_rest`), since what is still to come of it is no request.
    pub struct ReadToEnd<B> {
        #[pin]
        inner: B,
        unread: Option<Arc<Activity>>,
    }
}

impl<B: http_body::Body> ReadToEnd<B> {
    pub fn new(inner: B, activity: &Arc<Activity>) -> Self {
        let unread = (!inner.is_end_stream()).then(|| {
            activity.bodies_unread.fetch_add(1, Ordering::AcqRel);
            activity.clone()
        });
        ReadToEnd { inner, unread }
    }
}

impl<B: http_body::Body> http_body::Body for ReadToEnd<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        // A reader may stop at the last frame, when the body says it has ended.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if ended && let Some(activity) = this.unread.take() {
            activity.bodies_unread.fetch_sub(1, Ordering::AcqRel);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: PhaseTimeouts = PhaseTimeouts {
        header: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    #[tokio::test]
    async fn what_was_put_back_is_read_first_then_the_socket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut far, near) = tokio::io::duplex(64);
        far.write_all(b" world").await.unwrap();
        drop(far);
        let mut socket = Watched::new(near, Activity::new());
        socket.put_back(Bytes::from_static(b"hello"));
        let mut all = String::new();
        socket.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_must_send_its_head_within_the_header_timeout() {
        let a = Activity::new();
        let started = Instant::now();
        assert_eq!(a.stalled(T).await, Stalled::Header);
        assert_eq!(started.elapsed(), T.header);
    }

    #[tokio::test(start_paused = true)]
    async fn between_requests_a_connection_may_idle_and_then_must_read_heads_in_time() {
        let a = Activity::new();
        let request = InFlight::begin(&a);
        tokio::time::sleep(Duration::from_secs(300)).await;
        // Serving for 300 s (a long poll, a held request): never stalled.
        assert!(a.deadline(T).is_none());
        drop(request);
        let idle_from = Instant::now();
        let watchdog = {
            let a = a.clone();
            tokio::spawn(async move { (a.stalled(T).await, Instant::now()) })
        };
        tokio::time::sleep(Duration::from_secs(30)).await;
        // A head begins after 30 s idle: from now on the header timeout counts.
        a.bytes_read();
        let (why, at) = watchdog.await.unwrap();
        assert_eq!(why, Stalled::Header);
        assert_eq!(at - idle_from, Duration::from_secs(30) + T.header);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_after_the_idle_timeout() {
        let a = Activity::new();
        drop(InFlight::begin(&a));
        let from = Instant::now();
        assert_eq!(a.stalled(T).await, Stalled::Idle);
        assert_eq!(from.elapsed(), T.idle);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_nobody_reads_stalls_even_while_serving() {
        let a = Activity::new();
        let _request = InFlight::begin(&a);
        a.write_blocked();
        let from = Instant::now();
        assert_eq!(a.stalled(T).await, Stalled::Write);
        assert_eq!(from.elapsed(), T.idle);
    }
}

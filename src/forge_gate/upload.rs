//! Whose turn it is while a request goes to the forge: the client's, to send more of its body,
//! or the forge's, to read it or to answer.
//!
//! The forge has `LEASEGATE_FORGE_TIMEOUT_S` to take what it was handed and to begin its
//! answer. Counting that from the start of the request counted the client's upload against the
//! forge: an artifact sent at a steady 1 MB/s for three minutes was a 504 `forge_timeout`
//! though the forge did nothing wrong. So the forwarded body (`Watched`) notes, each time it
//! is polled, whether it waits on the client (its frame is not there yet: the client's pace is
//! the listener's to police, `PacedBody`) or has handed its frame on and waits for hyper to
//! want the next one, which is waiting on the forge's socket. `Turn::forge_deadline` is then
//! when the forge is out of time: its turn's start plus the timeout, or none while the client
//! has the turn.

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// Whose turn it is, and since when.
#[derive(Clone)]
pub struct Turn(Arc<Mutex<(bool, Instant)>>);

impl Turn {
    /// The forge's turn from now: nothing is asked of the client until its body is polled.
    pub fn new() -> Self {
        Turn(Arc::new(Mutex::new((false, Instant::now()))))
    }

    fn set(&self, client: bool) {
        let mut turn = self.0.lock().expect("turn");
        if turn.0 != client {
            *turn = (client, Instant::now());
        }
    }

    /// When the forge, which has `timeout` for its turn, is out of time; `None` on the
    /// client's turn.
    pub fn forge_deadline(&self, timeout: Duration) -> Option<Instant> {
        let (client, since) = *self.0.lock().expect("turn");
        (!client).then_some(since + timeout)
    }
}

pin_project! {
    /// A forwarded request's body, which says whose turn it is.
    pub struct Watched<B> {
        #[pin]
        inner: B,
        turn: Turn,
    }
}

impl<B> Watched<B> {
    pub fn new(inner: B, turn: Turn) -> Self {
        Watched { inner, turn }
    }
}

impl<B: Body<Data = Bytes>> Body for Watched<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        this.turn.set(polled.is_pending());
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn the_forges_clock_stops_while_the_client_sends() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let turn = Turn::new();
        let mut watched = Watched::new(http_body_util::StreamBody::new(stream), turn.clone());
        let timeout = Duration::from_secs(5);
        // Connecting and writing the head: the forge's turn.
        assert_eq!(turn.forge_deadline(timeout), Some(Instant::now() + timeout));
        // Polled with nothing from the client yet: the client's turn, however long it takes.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(watched.frame().now_or_never().is_none());
        assert_eq!(turn.forge_deadline(timeout), None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(watched.frame().now_or_never().is_none());
        assert_eq!(turn.forge_deadline(timeout), None);
        // A frame comes and is handed on: the forge's turn, from then.
        tx.send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .await
            .unwrap();
        assert!(watched.frame().await.is_some());
        assert_eq!(turn.forge_deadline(timeout), Some(Instant::now() + timeout));
        // The body ends: the forge's turn still, to answer.
        drop(tx);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(watched.frame().await.is_none());
        assert_eq!(
            turn.forge_deadline(timeout),
            Some(Instant::now() + timeout - Duration::from_secs(2))
        );
    }
}

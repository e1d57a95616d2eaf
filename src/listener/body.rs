//! A request body that must keep arriving: a client that sends a body a byte at a time holds a
//! connection (and, for a forwarded upload, the forge's) as long as it likes otherwise.
//!
//! The body may pause at most `timeout` between bytes, and after its first `timeout` it must
//! have averaged at least `min_rate` bytes a second. A 64 KiB body thus has `timeout + 64 s`
//! at the default rate of 1 KiB/s; a forwarded artifact of 200 MB at 1 MB/s is never near
//! either bound. Past them the body ends in `BodyTimedOut`, which the handler answers 408.

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// How slowly a body may arrive.
#[derive(Clone, Copy, Debug)]
pub struct BodyPace {
    pub timeout: Duration,
    /// Bytes per second, averaged from the body's start, after its first `timeout`.
    pub min_rate: u64,
}

/// The error a body that arrived too slowly ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived too slowly")]
pub struct BodyTimedOut;

pin_project! {
    pub struct PacedBody<B> {
        #[pin]
        inner: B,
        pace: BodyPace,
        started: Instant,
        last_bytes: Instant,
        received: u64,
        #[pin]
        timer: Option<Sleep>,
    }
}

impl<B> PacedBody<B> {
    pub fn new(inner: B, pace: BodyPace) -> Self {
        let now = Instant::now();
        PacedBody {
            inner,
            pace,
            started: now,
            last_bytes: now,
            received: 0,
            timer: None,
        }
    }
}

/// The latest moment the next bytes may arrive: a streamed body's (`PacedBody`) and a small
/// one's that `plain` reads whole.
pub(super) fn deadline(
    pace: BodyPace,
    started: Instant,
    last_bytes: Instant,
    received: u64,
) -> Instant {
    let by_pause = last_bytes + pace.timeout;
    let earned = Duration::from_secs_f64(received as f64 / pace.min_rate.max(1) as f64);
    let by_rate = started + pace.timeout + earned;
    by_pause.min(by_rate)
}

impl<B> Body for PacedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.received += data.len() as u64;
                    *this.last_bytes = Instant::now();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let at = deadline(*this.pace, *this.started, *this.last_bytes, *this.received);
                if at <= Instant::now() {
                    return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
                }
                match this.timer.as_mut().as_pin_mut() {
                    Some(timer) => timer.reset(at),
                    None => this.timer.set(Some(tokio::time::sleep_until(at))),
                }
                let timer = this.timer.as_pin_mut().expect("set above");
                ready!(timer.poll(cx));
                Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `error` (or what caused it) is a body that arrived too slowly.
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<BodyTimedOut>() {
            return true;
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACE: BodyPace = BodyPace {
        timeout: Duration::from_secs(10),
        min_rate: 1024,
    };

    #[test]
    fn a_pause_or_a_low_average_ends_the_wait() {
        let t0 = Instant::now();
        // Nothing yet: the pause bound and the rate bound agree.
        assert_eq!(deadline(PACE, t0, t0, 0), t0 + PACE.timeout);
        // 64 KiB at once: the next bytes may take `timeout` to come.
        assert_eq!(deadline(PACE, t0, t0, 65_536), t0 + PACE.timeout);
        // A byte every 5 s: after 20 s and 4 bytes the average is far too low.
        let late = t0 + Duration::from_secs(20);
        assert!(deadline(PACE, t0, late, 4) < late);
        // A steady 2 KiB/s: always ahead of the rate bound.
        let t = t0 + Duration::from_secs(30);
        assert_eq!(deadline(PACE, t0, t, 2048 * 30), t + PACE.timeout);
    }
}

//! Request latency per route template, as a tower layer of its own.
//!
//! A layer rather than `axum::middleware::from_fn`: that one boxes its future and, through
//! `Next`, a clone of every service inside it, per request, and a waiting long poll holds
//! both for up to 30 s (docs/BENCHMARKS.md, long polls). This future is the inner service's
//! future with a clock and two labels beside it, kept in the request's one boxed future.

use crate::app::AppState;
use crate::metrics::{MethodLabel, RouteLabel};
use axum::extract::{MatchedPath, Request};
use axum::response::Response;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;
use tower::{Layer, Service};

/// Observes every request's latency into `leasegate_http_request_duration_seconds`.
#[derive(Clone)]
pub struct LatencyLayer {
    state: AppState,
}

impl LatencyLayer {
    pub fn new(state: AppState) -> Self {
        LatencyLayer { state }
    }
}

impl<S> Layer<S> for LatencyLayer {
    type Service = Latency<S>;

    fn layer(&self, inner: S) -> Latency<S> {
        Latency {
            inner,
            state: self.state.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Latency<S> {
    inner: S,
    state: AppState,
}

impl<S> Service<Request> for Latency<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = LatencyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        // Never per id: the route's template, so that the series stay few.
        let route = RouteLabel::of(req.extensions().get::<MatchedPath>());
        let method = MethodLabel::of(req.method());
        LatencyFuture {
            inner: self.inner.call(req),
            observed: Some(Observed {
                state: self.state.clone(),
                method,
                route,
                started: Instant::now(),
            }),
        }
    }
}

/// What is needed to observe the request once its answer is ready.
struct Observed {
    state: AppState,
    method: MethodLabel,
    route: RouteLabel,
    started: Instant,
}

pin_project_lite::pin_project! {
    pub struct LatencyFuture<F> {
        #[pin]
        inner: F,
        observed: Option<Observed>,
    }
}

impl<F, E> Future for LatencyFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        if let (Ok(response), Some(observed)) = (&result, this.observed.take()) {
            observed.state.metrics().observe_request(
                observed.method,
                observed.route,
                response.status().as_u16(),
                observed.started.elapsed().as_secs_f64(),
            );
        }
        Poll::Ready(result)
    }
}

//! The one pipeline every forge's fetch (the call in which a runner asks for work) goes
//! through, and the one path every forwarded request takes.
//!
//! A fetch is: identify the caller (the forge's part, before the pipeline), judge it
//! (`decide::judge`), record what was refused (`decide::record`), then forward it, forward it
//! marked (observe), or answer the forge's "no work" without asking the forge — at once, or
//! after holding it up to `LEASEGATE_FORGE_HOLD_S`, judged again every second and forwarded as
//! soon as the runner may have work. Each forge is a small implementation of `Forge`: what its
//! "no work" looks like, whether it holds a refusal, and whether a forwarded fetch still waiting
//! at the forge is watched (cancelled and answered "no work" when its runner stops being
//! admitted).
//!
//! Every request a forge's routes forward, fetch or not, goes through `forward`. What a forge
//! reads of the jobs on their way (for ejection) wraps it: the answer to a fetch for a bound
//! runner goes through `Forge::handed_out`, and a job's report through
//! `job_watch::forward_report`.

use super::decide::{self, Judged, Verdict};
use super::upstream::{Forwarder, Peer};
use super::{GateState, Upstream, WOULD_REFUSE_HEADER};
use crate::domain::forge::{ForgeIdentity, ForgeKind};
use crate::domain::ids::RunnerId;
use crate::domain::time::Millis;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;
use std::time::Duration;

/// How often a held fetch, or a watched one waiting at the forge, is judged again.
pub const RECHECK: Duration = Duration::from_secs(1);

/// The most of a refused fetch's body read before its "no work" (it is a few bytes; reading
/// it keeps the connection for the runner's next call).
const DRAIN_BYTES: usize = 64 * 1024;

/// How long a refused fetch's body may take to arrive before "no work" is answered anyway.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// One forge, as the pipeline sees it.
pub trait Forge: Send + Sync + 'static {
    /// What a fetch's "no work" needs of its request (Forgejo's codec, GitLab's
    /// `last_update`).
    type NoWork: Send;

    const KIND: ForgeKind;

    /// Whether a refused fetch is held before its "no work", as the forge itself holds a fetch
    /// when it has no work (GitLab, Woodpecker), so that a refused runner does not ask in a
    /// tight loop. A forge whose runners wait between fetches themselves answers at once.
    const HOLDS: bool;

    /// Whether a forwarded fetch still waiting at the forge is judged again every second and,
    /// once its runner is refused, cancelled and answered "no work" (a forge whose fetch waits
    /// for work as long as there is none: Woodpecker).
    const WATCHES: bool = false;

    /// Where the forge's requests go, and through which forwarder.
    fn route(gate: &GateState) -> (&Forwarder, &Upstream);

    /// The forge's "no work", answered without the forge, carrying the refusal's `code` where
    /// the forge's runners and their operators can read it (`REFUSAL_HEADER`).
    fn no_work(how: Self::NoWork, code: &'static str) -> Response;

    /// The forge's answer to a fetch it got for the bound `runner`, before it goes back to the
    /// runner: where a forge notes the job it handed out (GitLab: `job_watch::job_taken`).
    fn handed_out(
        _gate: &GateState,
        _runner: &RunnerId,
        answer: Response,
    ) -> impl Future<Output = Response> + Send {
        std::future::ready(answer)
    }
}

/// A fetch, its caller identified by its forge.
pub struct Fetch<F: Forge> {
    /// The request, its path canonical.
    pub request: Request,
    pub peer: Peer,
    /// Who asks (`None`: the runner named itself in no way the gate reads).
    pub identity: Option<ForgeIdentity>,
    /// The token it presents, where a binding may check it (a Forgejo runner's).
    pub token: Option<String>,
    pub no_work: F::NoWork,
}

/// `request` forwarded to `F`'s forge, and its answer.
pub async fn forward<F: Forge>(gate: &GateState, request: Request, peer: Peer) -> Response {
    let (forwarder, upstream) = F::route(gate);
    forwarder.forward(upstream, request, peer).await
}

/// A fetch judged, recorded, and forwarded or answered "no work".
pub async fn fetch<F: Forge>(gate: &GateState, fetch: Fetch<F>) -> Response {
    let hold = if F::HOLDS {
        gate.settings().hold
    } else {
        Duration::ZERO
    };
    let deadline = tokio::time::Instant::now() + hold;
    let mut recorded = false;
    let code = loop {
        let now = Millis::now();
        let code = match decide::judge(gate, fetch.identity.as_ref(), fetch.token.as_deref(), now)
            .await
        {
            Ok(judged) => {
                if !recorded {
                    recorded = true;
                    if let Err(e) =
                        decide::record(gate, F::KIND, fetch.identity.as_ref(), &judged, now).await
                    {
                        tracing::warn!(error = %e, "cannot record a forge refusal");
                    }
                }
                match &judged.verdict {
                    Verdict::Refuse(r) => r.code(),
                    _ => {
                        count(gate, F::KIND, &judged);
                        return admitted(gate, fetch, judged).await;
                    }
                }
            }
            Err(e) => {
                // Fail closed: without the store the gate cannot tell, so no runner gets work.
                tracing::warn!(error = %e, "the forge gate cannot judge a fetch: answering no work");
                "unavailable"
            }
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break code;
        }
        tokio::select! {
            _ = tokio::time::sleep(left.min(RECHECK)) => {}
            _ = gate.shutdown().cancelled() => break code,
        }
    };
    gate.metrics()
        .forge_fetch(F::KIND.as_str(), "refused", code);
    refused::<F>(fetch.request, fetch.no_work, code).await
}

/// A fetch the gate lets through: forwarded, marked when the pool observes, watched while it
/// waits at the forge where the forge says so.
async fn admitted<F: Forge>(gate: &GateState, fetch: Fetch<F>, judged: Judged) -> Response {
    let Fetch {
        request,
        peer,
        identity,
        token,
        no_work,
    } = fetch;
    let mut answer = if F::WATCHES && judged.subject.is_some() {
        let forwarded = forward::<F>(gate, request, peer);
        match watched::<F>(gate, forwarded, identity.as_ref(), token.as_deref()).await {
            Ok(answer) => answer,
            Err(code) => {
                gate.metrics()
                    .forge_fetch(F::KIND.as_str(), "cancelled", code);
                return F::no_work(no_work, code);
            }
        }
    } else {
        forward::<F>(gate, request, peer).await
    };
    if let Some((runner, _)) = &judged.subject {
        answer = F::handed_out(gate, runner, answer).await;
    }
    if let Verdict::Observe(r) = &judged.verdict {
        answer
            .headers_mut()
            .insert(WOULD_REFUSE_HEADER, HeaderValue::from_static(r.code()));
    }
    answer
}

/// The forge's answer to a forwarded fetch, or the code of the refusal its runner met while
/// the fetch waited at the forge (the forwarded request is then dropped, which cancels it).
async fn watched<F: Forge>(
    gate: &GateState,
    forwarded: impl Future<Output = Response>,
    identity: Option<&ForgeIdentity>,
    token: Option<&str>,
) -> Result<Response, &'static str> {
    tokio::pin!(forwarded);
    loop {
        tokio::select! {
            answer = &mut forwarded => return Ok(answer),
            _ = tokio::time::sleep(RECHECK) => {}
        }
        let now = Millis::now();
        // A store that cannot answer is no reason to cancel a fetch already at the forge.
        let Ok(judged) = decide::judge(gate, identity, token, now).await else {
            continue;
        };
        if let Verdict::Refuse(r) = &judged.verdict {
            if let Err(e) = decide::record(gate, F::KIND, identity, &judged, now).await {
                tracing::warn!(error = %e, "cannot record a forge refusal");
            }
            return Err(r.code());
        }
    }
}

/// "No work", once what the runner sent has been read.
async fn refused<F: Forge>(request: Request, how: F::NoWork, code: &'static str) -> Response {
    let _ = tokio::time::timeout(
        DRAIN_WAIT,
        axum::body::to_bytes(request.into_body(), DRAIN_BYTES),
    )
    .await;
    F::no_work(how, code)
}

/// The metric of an admitted fetch.
fn count(gate: &GateState, forge: ForgeKind, judged: &Judged) {
    let (outcome, code) = match &judged.verdict {
        Verdict::Forward if judged.subject.is_some() => ("forwarded", "none"),
        Verdict::Forward => ("unbound_passed", "none"),
        Verdict::Untouched => ("untouched", "none"),
        Verdict::Observe(r) => ("observed", r.code()),
        Verdict::Refuse(r) => ("refused", r.code()),
    };
    gate.metrics().forge_fetch(forge.as_str(), outcome, code);
}

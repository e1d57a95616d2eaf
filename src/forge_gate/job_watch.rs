//! The forge gate's reading of jobs on their way between a runner and its forge, for ejection
//! (`domain/ejection.rs`): which leasegate runner took a GitLab job (from the `201` the gate
//! relays), and how each job ended (the runner's final report, read by `job_ends.rs`).
//!
//! A report counts only once the forge has accepted it (a `2xx`): anyone may send a report
//! naming a job, and only the forge knows the job's token. What the gate reads never changes
//! what it forwards: a body too large to read is forwarded as it came, uncounted.

use super::GateState;
use super::job_ends::{self, forgejo_key, gitlab_key};
use super::pipeline::{self, Forge};
use super::upstream::Peer;
use crate::domain::ejection::JobEnd;
use crate::domain::forge::ForgeIdentity;
use crate::domain::ids::RunnerId;
use crate::domain::time::Millis;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;

/// The largest report read (a final job update is a few KB).
const MAX_REPORT_BYTES: u64 = 1024 * 1024;

/// The largest `201` answer read for its job id; a larger one is relayed unread.
const MAX_JOB_BYTES: usize = 16 * 1024 * 1024;

/// A job's end read from a report, to be counted once the forge accepts the report.
pub struct Report {
    key: String,
    end: JobEnd,
    /// The runner whose job it is, when the report names it (Forgejo's `x-runner-uuid`);
    /// otherwise the runner that took the job (`forge_job_runner`).
    runner: Option<RunnerId>,
}

/// Which report a request is, by its canonical path and method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportKind {
    /// GitLab's `PUT /api/v4/jobs/{id}`.
    GitlabJobUpdate(i64),
    /// Forgejo's `UpdateTask`.
    ForgejoUpdateTask,
}

/// The body of `request` when it is small enough to read, with the request rebuilt from it.
async fn read_small(request: Request) -> (Request, Option<Bytes>) {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A compressed report is the forge's to read: runners send theirs plain.
    let encoded = request
        .headers()
        .get(CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    if encoded || declared.is_none_or(|n| n > MAX_REPORT_BYTES) {
        return (request, None);
    }
    let (parts, body) = request.into_parts();
    match body.collect().await {
        Ok(collected) => {
            let bytes = collected.to_bytes();
            let request = Request::from_parts(parts, Body::from(bytes.clone()));
            (request, Some(bytes))
        }
        // The runner went away mid-body: forward what cannot be read as an empty body, which
        // the forge refuses as it would the broken one.
        Err(_) => (Request::from_parts(parts, Body::empty()), None),
    }
}

/// A runner's report of `kind` forwarded to `F`'s forge (the one forwarding path), its job's
/// end read on the way and counted once the forge has accepted it.
pub async fn forward_report<F: Forge>(
    gate: &GateState,
    kind: ReportKind,
    request: Request,
    peer: Peer,
) -> Response {
    let (request, report) = read_report(gate, kind, request).await;
    let answer = pipeline::forward::<F>(gate, request, peer).await;
    counted(gate, report, answer.status()).await;
    answer
}

/// Reads a job's end from a report of `kind` before it is forwarded.
async fn read_report(
    gate: &GateState,
    kind: ReportKind,
    request: Request,
) -> (Request, Option<Report>) {
    let (request, bytes) = read_small(request).await;
    let Some(bytes) = bytes else {
        return (request, None);
    };
    let report = match kind {
        ReportKind::GitlabJobUpdate(id) => job_ends::gitlab_update(&bytes).map(|end| Report {
            key: gitlab_key(id),
            end,
            runner: None,
        }),
        ReportKind::ForgejoUpdateTask => {
            let json = request
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|c| c.starts_with("application/json"));
            let read = if json {
                job_ends::forgejo_update_json(&bytes)
            } else {
                job_ends::forgejo_update_proto(&bytes)
            };
            match read {
                Some((task, end)) => {
                    forgejo_runner(gate, request.headers().clone())
                        .await
                        .map(|runner| Report {
                            key: forgejo_key(task),
                            end,
                            runner: Some(runner),
                        })
                }
                None => None,
            }
        }
    };
    (request, report)
}

/// The leasegate runner bound to the Forgejo runner sending `request`, when the binding owns
/// its token (as for a fetch: `decide.rs`).
async fn forgejo_runner(gate: &GateState, headers: HeaderMap) -> Option<RunnerId> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let identity = ForgeIdentity::forgejo(header("x-runner-uuid")?).ok()?;
    match gate.store().gate_forge_runner(&identity).await {
        Ok(Some((runner, binding))) if binding.owns_fetch(header("x-runner-token")) => Some(runner),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whose job report this is: not counted");
            None
        }
    }
}

/// Counts `report` once the forge has answered it with `answer`.
async fn counted(gate: &GateState, report: Option<Report>, answer: StatusCode) {
    let Some(report) = report else { return };
    if !answer.is_success() {
        return;
    }
    let runner = match report.runner {
        Some(runner) => Some(runner),
        None => match gate.store().forge_job_runner(&report.key).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, job = %report.key, "cannot tell whose job ended: not counted");
                None
            }
        },
    };
    let Some(runner) = runner else { return };
    let now = Millis::now();
    let rules = gate.status_rules();
    match gate
        .store()
        .forge_job_ended(&report.key, &runner, report.end, now, rules)
        .await
    {
        Ok(Some((pool, effect))) => gate.metrics().job_end_seen(&runner, &pool, &effect),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, runner_id = %runner, job = %report.key, "cannot count a job's end")
        }
    }
}

/// Notes which runner took the job in a GitLab `201` answer to its job request, relaying the
/// answer unchanged.
pub async fn job_taken(gate: &GateState, runner: &RunnerId, answer: Response) -> Response {
    if answer.status() != StatusCode::CREATED {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    let (body, bytes) = peek(body, MAX_JOB_BYTES).await;
    if let Some(id) = bytes.as_deref().and_then(job_ends::job_of) {
        let key = gitlab_key(id);
        if let Err(e) = gate
            .store()
            .forge_job_taken(&key, runner, Millis::now())
            .await
        {
            tracing::warn!(error = %e, runner_id = %runner, job = %key, "cannot note whose job this is");
        }
    }
    Response::from_parts(parts, body)
}

/// The whole of `body` when it is at most `limit` bytes; either way a body that relays it all.
async fn peek(mut body: Body, limit: usize) -> (Body, Option<Bytes>) {
    let mut read: Vec<Bytes> = Vec::new();
    let mut len = 0;
    loop {
        match body.frame().await {
            None => {
                let whole: Bytes = read.concat().into();
                return (Body::from(whole.clone()), Some(whole));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    len += data.len();
                    read.push(data);
                }
                if len > limit {
                    // Too long to read: relay what was read, then the rest as it comes.
                    let head =
                        futures_util::stream::iter(read.into_iter().map(Ok::<_, axum::Error>));
                    let rest = body.into_data_stream();
                    return (
                        Body::from_stream(futures_util::StreamExt::chain(head, rest)),
                        None,
                    );
                }
            }
            Some(Err(e)) => {
                // The forge broke off: relay what came, and the break.
                let head = futures_util::stream::iter(
                    read.into_iter()
                        .map(Ok::<_, axum::Error>)
                        .chain(std::iter::once(Err(e))),
                );
                return (Body::from_stream(head), None);
            }
        }
    }
}

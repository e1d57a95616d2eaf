//! Leasing: the gated lease with its long poll, and the lease-scoped calls (start, extend,
//! complete, abandon) authorised by the lease token.
//!
//! A refused lease never reads a job: the verdict is decided from the attestation, the runner
//! and its pool before the store is asked to claim anything.

use super::auth::{Credential, LeaseBearer, throttled};
use super::json::{JsonBody, OptionalJson};
use super::problem::Problem;
use super::views;
use super::views::{LeaseGrant, LeaseView};
use crate::app::AppState;
use crate::client::Client;
use crate::domain::ids::{LeaseId, RunnerId};
use crate::domain::job::Job;
use crate::domain::lease::{LeaseCall, Outcome};
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::gate::Turn;
use crate::problem::ApiError;
use crate::secrets::{generate_token, hash_token};
use crate::store::{Claim, Lease};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;

use std::time::Duration;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/lease", post(lease))
        .route("/api/v1/leases/{id}/start", post(start))
        .route("/api/v1/leases/{id}/extend", post(extend))
        .route("/api/v1/leases/{id}/complete", post(complete))
        .route("/api/v1/leases/{id}/abandon", post(abandon))
}

/// The longest a lease request may wait for a job (PROTOCOL.md).
const MAX_WAIT_S: u64 = 30;

#[derive(Deserialize, utoipa::ToSchema)]
struct LeaseBody {
    /// The signed attestation (a JWT).
    attestation: String,
    /// Seconds to wait for a job, 0 to 30 (default 0).
    #[serde(default)]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 30)]
    wait_s: Option<serde_json::Number>,
}

fn wait_seconds(wait: Option<serde_json::Number>) -> Result<u64, ApiError> {
    let Some(n) = wait else { return Ok(0) };
    match super::json::whole(&n).and_then(|s| u64::try_from(s).ok()) {
        Some(s) if s <= MAX_WAIT_S => Ok(s),
        _ => Err(ApiError::bad_request(format!(
            "wait_s: must be a whole number from 0 to {MAX_WAIT_S}"
        ))),
    }
}

#[utoipa::path(post, path = "/api/v1/lease", tag = "leasing",
    request_body = LeaseBody,
    responses(
        (status = 200, description = "Granted: the job moves `queued → leased`.", body = LeaseGrant),
        (status = 204, description = "No job within `wait_s`."),
        (status = 400, description = "`bad_request`: a bad `wait_s`, a malformed body or a bad digest.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Rules 1-5: `attestation_invalid`, `attestation_expired`, `attestation_replayed`.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`runner_revoked`.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Refused by rules 7-13 (`Retry-After`): `runner_cordoned`, `probe_failed`, `probe_stale`, `pool_image_unresolved`, `image_unreported`, `image_drift`, `runner_quarantined`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn lease(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<LeaseBody>,
) -> Result<Response, ApiError> {
    let wait_s = wait_seconds(body.wait_s)?;
    // Admission runs in a future of its own on the heap, so that what it holds (the token, the
    // runner, the pool, the verdict) is freed before a long poll waits: ten thousand waiting
    // requests then hold little more than their runner's id and pool. Its turn comes first,
    // so that a request waiting for one has not made that future yet.
    let turn = state.gate().turn().await;
    match Box::pin(admit(&state, turn, body.attestation)).await? {
        Admission::Granted(response) => Ok(response),
        Admission::Wait {
            runner_id,
            pool,
            observed,
        } => Ok(mark_observed(
            wait_for_job(&state, runner_id, pool, wait_s).await?,
            observed,
        )),
    }
}

enum Admission {
    Granted(Response),
    Wait {
        runner_id: RunnerId,
        pool: PoolName,
        /// What would have been refused, in a pool that only observes.
        observed: Option<&'static str>,
    },
}

/// An answer in a pool that observes, marked with what it would have refused.
fn mark_observed(mut response: Response, observed: Option<&'static str>) -> Response {
    if let Some(code) = observed {
        response.headers_mut().insert(
            crate::forge_gate::WOULD_REFUSE_HEADER,
            axum::http::HeaderValue::from_static(code),
        );
    }
    response
}

/// Rules 1–13, and the first claim in the same round as the attestation's record.
async fn admit(
    state: &AppState,
    turn: Turn<'_>,
    attestation: String,
) -> Result<Admission, ApiError> {
    // The lease token is made only for a verdict that lets the runner lease: a refusal (the
    // path a broken runner hammers) costs no random bytes and no hash.
    let mut first_token = None;
    let (admitted, first_grant) = state
        .gate()
        .admit_and_claim(turn, &attestation, Millis::now(), |a| {
            let token = generate_token("lgl_");
            let claim = claim_for(state, &token, a.runner.id.clone(), a.pool.name.clone());
            first_token = Some(token);
            claim
        })
        .await?;
    if let Some(refusal) = admitted.enforced_refusal() {
        return Err(ApiError::conflict(refusal.code(), refusal.detail())
            .retry_after(refusal.retry_after_s(state.settings().heartbeat_interval_s)));
    }
    let observed = admitted.observed_refusal().map(|r| r.code());
    Ok(match first_grant {
        Some((lease, job)) => {
            let token = first_token.expect("a grant follows a claim, which made its token");
            Admission::Granted(mark_observed(granted(state, token, lease, job), observed))
        }
        None => Admission::Wait {
            runner_id: admitted.runner.id.clone(),
            pool: admitted.pool.name,
            observed,
        },
    })
}

fn claim_for(state: &AppState, token: &str, runner_id: RunnerId, pool: PoolName) -> Claim {
    Claim {
        runner_id,
        pool,
        lease_id: LeaseId::generate(),
        token_hash: hash_token(token),
        ttl_s: state.settings().lease_ttl_s,
        now: Millis::now(),
    }
}

/// The long poll: claims whenever the pool's signal (or the re-check timer) says there may be
/// a job, until `wait_s` is up.
async fn wait_for_job(
    state: &AppState,
    runner_id: RunnerId,
    pool: PoolName,
    wait_s: u64,
) -> Result<Response, ApiError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_s);
    let signal = state.store().job_signal();
    let notify = signal.for_pool(pool.as_str());
    // Where wake-ups can be lost (across replicas), re-check now and then all the same.
    let recheck = signal
        .recheck_interval()
        .unwrap_or(Duration::from_secs(MAX_WAIT_S + 1));
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        // Registered before the claim, so an enqueue between the claim and the wait still wakes us.
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(grant) = claim_now(state, &runner_id, &pool).await? {
            return Ok(grant);
        }
        // One timer for the re-check and the deadline, which the loop's head tells apart.
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline.min(now + recheck)) => {}
            _ = state.shutdown().cancelled() => return Ok(StatusCode::NO_CONTENT.into_response()),
        }
    }
}

/// One claim for a waiting poll. A function of its own, so that what a claim holds (the token,
/// the claim, the store's call) is gone while the poll waits, and the waiting future has room
/// for one or the other rather than both: ten thousand polls may wait at once.
async fn claim_now(
    state: &AppState,
    runner_id: &RunnerId,
    pool: &PoolName,
) -> Result<Option<Response>, ApiError> {
    let token = generate_token("lgl_");
    let claim = claim_for(state, &token, runner_id.clone(), pool.clone());
    Ok(state
        .store()
        .claim_job(&claim)
        .await?
        .map(|(lease, job)| granted(state, token, lease, job)))
}

/// The answer to a granted lease, counted and logged.
fn granted(state: &AppState, token: String, lease: Lease, job: Job) -> Response {
    record_ids(Some(&job.id.to_string()), Some(&lease.id.to_string()));
    state.lease_granted(&lease, &job);
    Json(views::lease_grant(token, &lease, &job)).into_response()
}

/// Puts the job and lease ids on the request's span, so every log line of it carries them.
fn record_ids(job_id: Option<&str>, lease_id: Option<&str>) {
    let span = tracing::Span::current();
    if let Some(j) = job_id {
        span.record("job_id", j);
    }
    if let Some(l) = lease_id {
        span.record("lease_id", l);
    }
}

async fn run_call(
    state: &AppState,
    client: Client,
    id: String,
    token: &str,
    call: LeaseCall,
) -> Result<Json<LeaseView>, ApiError> {
    let lease_id = LeaseId::parse("id", &id)?;
    let token_hash = hash_token(token);
    let rules = state.settings().status_rules();
    let done = throttled(state, client, Credential::Lease, async {
        Ok(state
            .store()
            .lease_call(&lease_id, &token_hash, &call, Millis::now(), rules)
            .await?)
    })
    .await?;
    let (lease, job) = (done.lease, done.job);
    let span = tracing::Span::current();
    span.record("runner_id", tracing::field::display(&lease.runner_id));
    span.record("pool", tracing::field::display(&lease.pool));
    record_ids(Some(&job.id.to_string()), Some(&lease.id.to_string()));
    state.lease_called(&call, &lease, &job);
    state.job_ended(&lease.runner_id, &lease.pool, &done.ejection);
    Ok(Json(views::lease(&lease, &job)))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
struct TtlBody {
    /// 1 to 3600 seconds; default the lease TTL.
    #[serde(default)]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 3600)]
    ttl_s: Option<serde_json::Number>,
}

fn ttl_seconds(ttl: Option<serde_json::Number>, default: i64) -> Result<i64, ApiError> {
    let Some(n) = ttl else { return Ok(default) };
    match super::json::whole(&n) {
        Some(s) if (1..=3600).contains(&s) => Ok(s),
        _ => Err(ApiError::bad_request(
            "ttl_s: must be a whole number from 1 to 3600",
        )),
    }
}

#[utoipa::path(post, path = "/api/v1/leases/{id}/start", tag = "leasing",
    security(("lease_token" = [])),
    params(("id" = String, Path, description = "The lease id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Started: an attempt is used, job `leased → running`.", body = LeaseView),
        (status = 409, description = "`lease_started`, `lease_finished`, `job_cancelled`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn start(
    State(state): State<AppState>,
    client: Client,
    Path(id): Path<String>,
    LeaseBearer(token): LeaseBearer,
) -> Result<Json<LeaseView>, ApiError> {
    let ttl_s = state.settings().lease_ttl_s;
    run_call(&state, client, id, &token, LeaseCall::Start { ttl_s }).await
}

#[utoipa::path(post, path = "/api/v1/leases/{id}/extend", tag = "leasing",
    security(("lease_token" = [])),
    params(("id" = String, Path, description = "The lease id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    request_body(content = Option<TtlBody>, description = "Optional: an empty body counts as `{}`."),
    responses(
        (status = 200, description = "Extended: `expires_at = now + ttl_s`.", body = LeaseView),
        (status = 409, description = "`lease_finished`, `job_cancelled`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn extend(
    State(state): State<AppState>,
    client: Client,
    Path(id): Path<String>,
    LeaseBearer(token): LeaseBearer,
    OptionalJson(body): OptionalJson<TtlBody>,
) -> Result<Json<LeaseView>, ApiError> {
    let ttl_s = ttl_seconds(body.ttl_s, state.settings().lease_ttl_s)?;
    run_call(&state, client, id, &token, LeaseCall::Extend { ttl_s }).await
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = Outcome)]
enum OutcomeBody {
    Succeeded,
    Failed,
    Errored,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct CompleteBody {
    outcome: OutcomeBody,
    #[serde(default, deserialize_with = "super::json::whole_number")]
    exit_code: Option<i64>,
    #[serde(default)]
    message: Option<String>,
}

fn clean_message(m: Option<String>) -> Option<String> {
    m.map(|m| crate::domain::text::sanitize(&m, 2048))
}

#[utoipa::path(post, path = "/api/v1/leases/{id}/complete", tag = "leasing",
    security(("lease_token" = [])),
    params(("id" = String, Path, description = "The lease id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    request_body = CompleteBody,
    responses(
        (status = 200, description = "Completed.", body = LeaseView),
        (status = 409, description = "`lease_not_started`, `lease_finished`, `job_cancelled`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn complete(
    State(state): State<AppState>,
    client: Client,
    Path(id): Path<String>,
    LeaseBearer(token): LeaseBearer,
    JsonBody(body): JsonBody<CompleteBody>,
) -> Result<Json<LeaseView>, ApiError> {
    let outcome = match body.outcome {
        OutcomeBody::Succeeded => Outcome::Succeeded,
        OutcomeBody::Failed => Outcome::Failed,
        OutcomeBody::Errored => Outcome::Errored,
    };
    let call = LeaseCall::Complete {
        outcome,
        exit_code: body.exit_code,
        message: clean_message(body.message),
    };
    run_call(&state, client, id, &token, call).await
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
struct AbandonBody {
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/leases/{id}/abandon", tag = "leasing",
    security(("lease_token" = [])),
    params(("id" = String, Path, description = "The lease id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    request_body(content = Option<AbandonBody>, description = "Optional: an empty body counts as `{}`."),
    responses(
        (status = 200, description = "Abandoned: the job returns to the queue without using an attempt.", body = LeaseView),
        (status = 409, description = "`lease_started`, `lease_finished`, `job_cancelled`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn abandon(
    State(state): State<AppState>,
    client: Client,
    Path(id): Path<String>,
    LeaseBearer(token): LeaseBearer,
    OptionalJson(body): OptionalJson<AbandonBody>,
) -> Result<Json<LeaseView>, ApiError> {
    let reason = body.reason.map(|r| crate::domain::text::sanitize(&r, 128));
    let call = LeaseCall::Abandon {
        reason,
        message: clean_message(body.message),
    };
    run_call(&state, client, id, &token, call).await
}

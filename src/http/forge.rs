//! The forge's endpoints: enqueue a job (idempotently), read its story, cancel it, and ask the
//! gate alone about a runner (`gate/check`) for a forge that keeps its own queue.

use super::auth::ForgeAuth;
use super::json::JsonBody;
use super::problem::Problem;
use super::runners::AttestationBody;
use super::views;
use super::views::{GateDecision, JobSummary, JobView};
use crate::app::AppState;
use crate::domain::ids::JobId;
use crate::domain::job::{DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_RANGE};
use crate::domain::pool_name::PoolName;
use crate::domain::text::without_controls;
use crate::domain::time::Millis;
use crate::gate::{AdmitError, Purpose};
use crate::problem::ApiError;
use crate::store::NewJob;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/jobs", post(enqueue))
        .route("/api/v1/jobs/{id}", get(read))
        .route("/api/v1/jobs/{id}/cancel", post(cancel))
        .route("/api/v1/gate/check", post(gate_check))
}

#[derive(Deserialize, utoipa::ToSchema)]
struct EnqueueBody {
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pool: String,
    /// Any JSON, handed to the runner; default null.
    #[serde(default)]
    payload: Value,
    /// 1 to 100, default 3.
    #[serde(default, deserialize_with = "super::json::whole_number")]
    #[schema(minimum = 1, maximum = 100)]
    max_attempts: Option<i64>,
    /// 1 to 256 characters, no control character: the same key answers with the same job.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    idempotency_key: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/jobs", tag = "forge",
    security(("forge_token" = [])),
    request_body = EnqueueBody,
    responses(
        (status = 201, description = "Enqueued.", body = JobSummary),
        (status = 200, description = "The job of this `idempotency_key`, enqueued before.", body = JobSummary),
        (status = 400, description = "`bad_request`: a bad `max_attempts` or `idempotency_key`, or a malformed body.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`unknown_pool`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn enqueue(
    _: ForgeAuth,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<EnqueueBody>,
) -> Result<(StatusCode, Json<JobSummary>), ApiError> {
    if let Some(key) = &body.idempotency_key {
        // Counted in characters, as JSON Schema's `maxLength` counts them.
        if key.is_empty() || key.chars().count() > 256 {
            return Err(ApiError::bad_request(
                "idempotency_key: 1 to 256 characters",
            ));
        }
        without_controls("idempotency_key", key)?;
    }
    let new = match new_job(body) {
        Ok(new) => new,
        // A key already used answers with its job, even when this body differs (or is wrong).
        Err((error, Some(key))) => match state.store().job_by_idempotency_key(&key).await? {
            Some(job) => return Ok((StatusCode::OK, Json(views::job_summary(&job)))),
            None => return Err(error),
        },
        Err((error, None)) => return Err(error),
    };
    let (job, created) = state.store().enqueue_job(new, Millis::now()).await?;
    if created {
        tracing::info!(job_id = %job.id, pool = %job.pool, "job enqueued");
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(views::job_summary(&job))))
}

/// The job a body asks for, or why it cannot be enqueued (with the body's idempotency key).
fn new_job(body: EnqueueBody) -> Result<NewJob, (ApiError, Option<String>)> {
    let max_attempts = body.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
    if !MAX_ATTEMPTS_RANGE.contains(&max_attempts) {
        let error = ApiError::bad_request("max_attempts: must be from 1 to 100");
        return Err((error, body.idempotency_key));
    }
    let Ok(pool) = PoolName::parse(&body.pool) else {
        let error =
            ApiError::unprocessable("unknown_pool", format!("no pool named {:?}", body.pool));
        return Err((error, body.idempotency_key));
    };
    Ok(NewJob {
        id: JobId::generate(),
        pool,
        payload: body.payload,
        max_attempts,
        idempotency_key: body.idempotency_key,
    })
}

#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "forge",
    security(("forge_token" = [])),
    params(("id" = String, Path, description = "The job id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "The job and its story.", body = JobView),
        (status = 404, description = "`not_found`: no such job.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn read(
    _: ForgeAuth,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let (job, events) = state
        .store()
        .get_job(&JobId::parse("id", &id)?)
        .await?
        .ok_or_else(|| ApiError::not_found("job"))?;
    Ok(Json(views::job(&job, &events)))
}

#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "forge",
    security(("forge_token" = [])),
    params(("id" = String, Path, description = "The job id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Cancelled; the job view.", body = JobView),
        (status = 404, description = "`not_found`: no such job.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`job_finished`: already succeeded, failed or cancelled.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn cancel(
    _: ForgeAuth,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let job_id = JobId::parse("id", &id)?;
    state
        .store()
        .cancel_job(&job_id, Millis::now())
        .await?
        .ok_or_else(|| ApiError::not_found("job"))?;
    let (job, events) = state
        .store()
        .get_job(&job_id)
        .await?
        .ok_or_else(|| ApiError::not_found("job"))?;
    tracing::info!(job_id = %job.id, "job cancelled");
    Ok(Json(views::job(&job, &events)))
}

/// The lease's judgement without a lease. Rules 1–6 are refusals here too; only a bad forge
/// token is a 401, and a malformed body a 400.
#[utoipa::path(post, path = "/api/v1/gate/check", tag = "forge",
    security(("forge_token" = [])),
    request_body = AttestationBody,
    responses(
        (status = 200, description = "The lease's judgement without a lease: `allow` or `refuse` (rules 1-13).", body = GateDecision),
        (status = 400, description = "`bad_request`: a malformed body or a bad digest.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn gate_check(
    _: ForgeAuth,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<AttestationBody>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let decision = |allow: bool, code: Option<&str>, detail: Option<String>, runner, pool| {
        Json(GateDecision {
            decision: if allow { "allow" } else { "refuse" }.to_string(),
            code: code.map(str::to_string),
            detail,
            runner_id: runner,
            pool,
        })
    };
    let turn = state.gate().turn().await;
    match state
        .gate()
        .admit(turn, &body.attestation, Purpose::GateCheck, Millis::now())
        .await
    {
        Ok(admitted) => {
            let runner = Some(admitted.runner.id.to_string());
            let pool = Some(admitted.pool.name.to_string());
            if let Some(r) = admitted.observed_refusal() {
                // A pool that observes allows, and says what it would have refused.
                let mut answer =
                    decision(true, Some(r.code()), Some(r.detail()), runner, pool).into_response();
                answer.headers_mut().insert(
                    crate::forge_gate::WOULD_REFUSE_HEADER,
                    axum::http::HeaderValue::from_static(r.code()),
                );
                return Ok(answer);
            }
            Ok(match &admitted.verdict {
                Ok(()) => decision(true, None, None, runner, pool),
                Err(r) => decision(false, Some(r.code()), Some(r.detail()), runner, pool),
            }
            .into_response())
        }
        Err(AdmitError::Store(e)) => Err(e.into()),
        Err(e @ AdmitError::BadRequest(_)) => Err(e.into()),
        Err(e) => {
            Ok(decision(false, Some(e.code()), Some(e.to_string()), None, None).into_response())
        }
    }
}

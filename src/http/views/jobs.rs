//! What the forge is answered about its jobs (enqueued, read, cancelled), the job a lease
//! carries, and the gate's decision on a runner (`POST /api/v1/gate/check`).

use crate::domain::ids::{JobId, LeaseId, RunnerId};
use crate::domain::job::{Job, JobEvent as StoredJobEvent};
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::store::Lease;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// `201`/`200` to `POST /api/v1/jobs`.
#[derive(Serialize, ToSchema)]
pub struct JobSummary {
    #[schema(value_type = String)]
    pub id: JobId,
    pub state: String,
}

pub fn job_summary(job: &Job) -> JobSummary {
    JobSummary {
        id: job.id.clone(),
        state: job.state.as_str().to_string(),
    }
}

/// The job as a runner holding a lease sees it.
#[derive(Serialize, ToSchema)]
pub struct LeasedJob {
    #[schema(value_type = String)]
    pub id: JobId,
    #[schema(value_type = String)]
    pub pool: PoolName,
    pub state: String,
    /// Whatever the forge enqueued.
    pub payload: Value,
    /// The attempt this lease is, or will be once started.
    pub attempt: i64,
    pub max_attempts: i64,
}

pub fn leased_job(job: &Job, lease: &Lease) -> LeasedJob {
    LeasedJob {
        id: job.id.clone(),
        pool: job.pool.clone(),
        state: job.state.as_str().to_string(),
        payload: job.payload.clone(),
        attempt: lease.attempt,
        max_attempts: job.max_attempts,
    }
}

/// One step of a job's story. Every key is always sent, `null` where there is no value:
/// optional fields are required and nullable, here and in every view.
#[derive(Serialize, ToSchema)]
pub struct JobEvent {
    #[schema(value_type = String)]
    pub at: Millis,
    /// `enqueued`, `leased`, `started`, `returned`, `requeued`, `completed`, `failed`,
    /// `cancelled`.
    pub kind: String,
    #[schema(required = true, value_type = Option<String>)]
    pub runner_id: Option<RunnerId>,
    #[schema(required = true, value_type = Option<String>)]
    pub lease_id: Option<LeaseId>,
    #[schema(required = true)]
    pub reason: Option<String>,
    #[schema(required = true)]
    pub detail: Option<String>,
}

pub fn job_event(e: &StoredJobEvent) -> JobEvent {
    JobEvent {
        at: e.at,
        kind: e.kind.clone(),
        runner_id: e.runner_id.clone(),
        lease_id: e.lease_id.clone(),
        reason: e.reason.clone(),
        detail: e.detail.clone(),
    }
}

/// A job as the forge reads it.
#[derive(Serialize, ToSchema)]
pub struct JobView {
    #[schema(value_type = String)]
    pub id: JobId,
    #[schema(value_type = String)]
    pub pool: PoolName,
    /// `queued`, `leased`, `running`, `succeeded`, `failed`, `cancelled`.
    pub state: String,
    pub payload: Value,
    pub attempts: i64,
    pub max_attempts: i64,
    pub returns: i64,
    #[schema(required = true)]
    pub last_error: Option<String>,
    #[schema(required = true)]
    pub idempotency_key: Option<String>,
    #[schema(required = true, value_type = Option<String>)]
    pub lease_id: Option<LeaseId>,
    #[schema(value_type = String)]
    pub created_at: Millis,
    #[schema(value_type = String)]
    pub updated_at: Millis,
    pub events: Vec<JobEvent>,
}

pub fn job(job: &Job, events: &[StoredJobEvent]) -> JobView {
    JobView {
        id: job.id.clone(),
        pool: job.pool.clone(),
        state: job.state.as_str().to_string(),
        payload: job.payload.clone(),
        attempts: job.attempts,
        max_attempts: job.max_attempts,
        returns: job.returns,
        last_error: job.last_error.clone(),
        idempotency_key: job.idempotency_key.clone(),
        lease_id: job.lease_id.clone(),
        created_at: job.created_at,
        updated_at: job.updated_at,
        events: events.iter().map(job_event).collect(),
    }
}

/// `200` to `POST /api/v1/gate/check`.
#[derive(Serialize, ToSchema)]
pub struct GateDecision {
    /// `allow` or `refuse`.
    #[schema(example = "allow")]
    pub decision: String,
    #[schema(required = true)]
    pub code: Option<String>,
    #[schema(required = true)]
    pub detail: Option<String>,
    #[schema(required = true)]
    pub runner_id: Option<String>,
    #[schema(required = true)]
    pub pool: Option<String>,
}

//! The JSON shapes of PROTOCOL.md, built from domain values. One function per shape, so that
//! a runner or a job looks the same in every response that carries it. A shape that is a
//! struct here (deriving `Serialize` and `ToSchema`) is at once the answer and its schema in
//! the OpenAPI document; the ones still built with `json!` are described a second time in
//! `schema.rs`.

use crate::app::Settings;
use crate::domain::digest::ImageDigest;
use crate::domain::ids::{JobId, LeaseId, RunnerId};
use crate::domain::job::{Job, JobEvent as StoredJobEvent};
use crate::domain::pool::{GateMode, ImagePolicy, ImageSource, Pool, PoolName, ResolverStatus};
use crate::domain::roll::RollHealth;
use crate::domain::runner::Runner;
use crate::domain::time::Millis;
use crate::store::{Lease, QueueDepth, RunnerHistory};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
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

/// `200` to `POST /api/v1/lease`: a lease was granted.
#[derive(Serialize, ToSchema)]
pub struct LeaseGrant {
    #[schema(value_type = String)]
    pub lease_id: LeaseId,
    /// The bearer token of the lease calls (`lgl_…`), shown once.
    pub lease_token: String,
    /// RFC 3339 UTC.
    #[schema(value_type = String)]
    pub expires_at: Millis,
    pub job: LeasedJob,
}

pub fn lease_grant(token: String, lease: &Lease, job: &Job) -> LeaseGrant {
    LeaseGrant {
        lease_id: lease.id.clone(),
        lease_token: token,
        expires_at: lease.expires_at,
        job: leased_job(job, lease),
    }
}

/// `200` to the lease calls (start, extend, complete, abandon).
#[derive(Serialize, ToSchema)]
pub struct LeaseView {
    #[schema(value_type = String)]
    pub lease_id: LeaseId,
    /// `leased`, `running`, `completed`, `abandoned`, `expired`, `cancelled` or `revoked`.
    pub state: String,
    /// RFC 3339 UTC; after `complete` or `abandon`, when the lease ended.
    #[schema(value_type = String)]
    pub expires_at: Millis,
    pub job: LeasedJob,
}

pub fn lease(lease: &Lease, job: &Job) -> LeaseView {
    LeaseView {
        lease_id: lease.id.clone(),
        state: lease.state.as_str().to_string(),
        expires_at: lease.expires_at,
        job: leased_job(job, lease),
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

/// `201` to `POST /api/v1/runners`.
#[derive(Serialize, ToSchema)]
pub struct Registered {
    #[schema(value_type = String)]
    pub runner_id: RunnerId,
    #[schema(value_type = String)]
    pub pool: PoolName,
    /// The `aud` every attestation must carry.
    pub audience: String,
    pub heartbeat_interval_s: i64,
    pub attestation_max_age_s: i64,
    pub probe_max_age_s: i64,
}

/// `200` to `POST /api/v1/runners/heartbeat`.
#[derive(Serialize, ToSchema)]
pub struct Heartbeat {
    #[schema(value_type = String)]
    pub runner_id: RunnerId,
    /// `healthy`, `probe_failed`, `probe_stale`, `pool_image_unresolved`, `image_unreported`,
    /// `drifted`, `cordoned` or `quarantined`.
    pub status: String,
    /// The refusal's code when `status` is not `healthy`.
    #[schema(required = true)]
    pub code: Option<String>,
    #[schema(required = true)]
    pub detail: Option<String>,
    #[schema(value_type = Vec<String>)]
    pub expected_image_ids: Vec<ImageDigest>,
    /// Null when the pool's policy is `off`, its set is empty, or no image was reported.
    #[schema(required = true)]
    pub image_current: Option<bool>,
    pub next_heartbeat_s: i64,
    /// `recycle` exactly when `image_current` is false, else `none`.
    #[schema(example = "none")]
    pub action: String,
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

/// `201` to `POST /api/v1/admin/pools/{name}/registration-tokens`.
#[derive(Serialize, ToSchema)]
pub struct RegistrationToken {
    /// The single-use token (`lgr_…`), shown once.
    pub token: String,
    #[schema(value_type = String)]
    pub pool: PoolName,
    #[schema(value_type = String)]
    pub expires_at: Millis,
}

/// `202` to `POST /api/v1/admin/registry-events`: the pools being resolved.
#[derive(Serialize, ToSchema)]
pub struct PoolsResolving {
    pub pools: Vec<String>,
}

/// A runner whose image is outside its pool's set.
#[derive(Serialize, ToSchema)]
pub struct DriftedRunner {
    #[schema(value_type = String)]
    pub runner_id: RunnerId,
    #[schema(value_type = String)]
    pub pool: PoolName,
    #[schema(value_type = String)]
    pub running_image_id: ImageDigest,
    #[schema(value_type = Vec<String>)]
    pub expected_image_ids: Vec<ImageDigest>,
}

/// A runner the drift report cannot judge, and why.
#[derive(Serialize, ToSchema)]
pub struct SkippedRunner {
    #[schema(value_type = String)]
    pub runner_id: RunnerId,
    /// `revoked`, `pool_policy_off`, `pool_image_unresolved`, `never_attested`, `stale`,
    /// `image_unreported`.
    pub reason: String,
}

/// A pool's roll health.
#[derive(Serialize, ToSchema)]
#[schema(as = RollHealth)]
pub struct RollHealthView {
    #[schema(value_type = String)]
    pub pool: PoolName,
    pub roll_stalled: bool,
    pub drifted: i64,
    pub live: i64,
}

impl RollHealthView {
    pub fn new(pool: &PoolName, h: &RollHealth) -> Self {
        RollHealthView {
            pool: pool.clone(),
            roll_stalled: h.roll_stalled,
            drifted: h.drifted as i64,
            live: h.live as i64,
        }
    }
}

/// `200` to `GET /api/v1/admin/drift`.
#[derive(Serialize, ToSchema)]
pub struct DriftReport {
    pub drifted: Vec<DriftedRunner>,
    pub skipped: Vec<SkippedRunner>,
    pub pools: Vec<RollHealthView>,
}

/// What the pool view adds from outside the pool record: its runners' standing and the
/// resolver's status under the configured threshold.
pub struct PoolStanding {
    pub runners_by_status: BTreeMap<&'static str, i64>,
    pub roll: RollHealth,
    pub resolver_status: Option<ResolverStatus>,
}

/// The outcome of a pool's last registry resolution.
#[derive(Serialize, ToSchema)]
pub struct Resolution {
    #[schema(value_type = String)]
    pub at: Millis,
    pub ok: bool,
    #[schema(required = true)]
    pub error: Option<String>,
}

/// A pool as the admin API shows it.
#[derive(Serialize, ToSchema)]
pub struct PoolView {
    #[schema(value_type = String)]
    pub name: PoolName,
    #[schema(required = true)]
    pub image_ref: Option<String>,
    pub image_policy: ImagePolicy,
    pub image_source: ImageSource,
    pub gate_mode: GateMode,
    #[schema(value_type = Vec<String>)]
    pub expected_image_ids: Vec<ImageDigest>,
    #[schema(value_type = Vec<String>)]
    pub previous_image_ids: Vec<ImageDigest>,
    #[schema(required = true, value_type = Option<String>)]
    pub previous_valid_until: Option<Millis>,
    pub drift_grace_s: i64,
    pub resolve_interval_s: i64,
    #[schema(required = true)]
    pub last_resolution: Option<Resolution>,
    /// `ok`, `never_resolved` or `resolver_failing` for registry pools; null for manual ones.
    #[schema(required = true, value_type = Option<String>)]
    pub resolver_status: Option<ResolverStatus>,
    pub resolution_failures: i64,
    #[schema(required = true, value_type = Option<String>)]
    pub resolved_digest: Option<ImageDigest>,
    #[schema(required = true, value_type = Option<String>)]
    pub resolved_image_id: Option<ImageDigest>,
    #[schema(required = true, value_type = Option<String>)]
    pub next_resolve_at: Option<Millis>,
    pub roll_stalled: bool,
    pub runners_by_status: BTreeMap<&'static str, i64>,
    pub queued_jobs: i64,
    #[schema(required = true, value_type = Option<String>)]
    pub oldest_queued_at: Option<Millis>,
    #[schema(value_type = String)]
    pub created_at: Millis,
    #[schema(value_type = String)]
    pub updated_at: Millis,
}

/// `200` to `GET /api/v1/admin/pools`.
#[derive(Serialize, ToSchema)]
pub struct PoolList {
    pub pools: Vec<PoolView>,
}

pub fn pool(pool: &Pool, standing: &PoolStanding, depth: QueueDepth) -> PoolView {
    PoolView {
        name: pool.name.clone(),
        image_ref: pool.image_ref.clone(),
        image_policy: pool.image_policy,
        image_source: pool.image_source,
        gate_mode: pool.gate_mode,
        expected_image_ids: pool.expected_image_ids.clone(),
        previous_image_ids: pool.previous_image_ids.clone(),
        previous_valid_until: pool.previous_valid_until,
        drift_grace_s: pool.drift_grace_s,
        resolve_interval_s: pool.resolve_interval_s,
        last_resolution: pool.last_resolution.as_ref().map(|r| Resolution {
            at: r.at,
            ok: r.ok,
            error: r.error.clone(),
        }),
        resolver_status: standing.resolver_status,
        resolution_failures: pool.resolution_failures,
        resolved_digest: pool.resolved_digest.clone(),
        resolved_image_id: pool.resolved_image_id.clone(),
        next_resolve_at: pool.next_resolve_at,
        roll_stalled: standing.roll.roll_stalled,
        runners_by_status: standing.runners_by_status.clone(),
        queued_jobs: depth.queued,
        oldest_queued_at: depth.oldest_queued_at,
        created_at: pool.created_at,
        updated_at: pool.updated_at,
    }
}

pub fn runner(runner: &Runner, pool: &Pool, settings: &Settings, now: Millis) -> Value {
    let observed = runner.observe(pool, now, settings.status_rules());
    let latest = runner.latest.as_ref();
    let probe = latest.map(|l| &l.state.probe);
    let image = latest.map(|l| &l.state.image);
    json!({
        "runner_id": runner.id,
        "name": runner.name,
        "pool": runner.pool,
        "labels": runner.labels,
        "status": observed.status.as_str(),
        "code": observed.refusal.as_ref().map(|r| r.code()),
        "detail": observed.refusal.as_ref().map(|r| r.detail()),
        "last_attestation_at": latest.map(|l| l.received_at),
        "probe_ok": probe.map(|p| p.ok),
        "probe_checked_at": probe.map(|p| p.checked_at),
        "probe_error": probe.and_then(|p| p.error.clone()),
        "runtime": probe.map(|p| p.runtime.clone()),
        "runtime_version": probe.and_then(|p| p.runtime_version.clone()),
        "image_id": image.and_then(|i| i.id.clone()),
        "image_digest": image.and_then(|i| i.digest.clone()),
        "image_ref": image.and_then(|i| i.image_ref.clone()),
        "expected_image_ids": pool.expected_image_ids,
        "image_current": observed.image_current,
        "cordoned": runner.gate.cordoned,
        "quarantined_at": runner.gate.quarantined_at,
        "revoked_at": runner.revoked_at,
        "registered_at": runner.registered_at,
        "current_lease": runner.current_lease.as_ref().map(|l| json!({
            "lease_id": l.lease_id,
            "job_id": l.job_id,
            "state": l.state.as_str(),
            "expires_at": l.expires_at,
        })),
        "forge_runners": runner.forge_runners.iter().map(super::forge_bindings::view).collect::<Vec<_>>(),
        "last_rejected_attestation": runner.last_rejection.as_ref().map(|r| json!({
            "at": r.at, "code": r.code, "detail": r.detail,
        })),
    })
}

pub fn runner_history(history: &RunnerHistory) -> Value {
    json!({
        "attestations": history.attestations.iter().map(|a| json!({
            "at": a.received_at,
            "status": a.status,
            "probe_ok": a.probe_ok,
            "runtime": a.runtime,
            "runtime_version": a.runtime_version,
            "checked_at": a.checked_at,
            "error": a.error,
            "image_id": a.image.id,
            "image_digest": a.image.digest,
        })).collect::<Vec<_>>(),
        "status_changes": history.status_changes.iter().map(|c| json!({
            "at": c.at, "from": c.from, "to": c.to, "detail": c.detail,
        })).collect::<Vec<_>>(),
        // One entry per run of refusals with one code: its latest time and detail, its first
        // time and how many it holds.
        "refusals": history.refusals.iter().map(|r| json!({
            "at": r.at, "code": r.code, "detail": r.detail, "count": r.count,
            "first_at": r.first_at,
        })).collect::<Vec<_>>(),
        "leases": history.leases.iter().map(|l| json!({
            "lease_id": l.id, "job_id": l.job_id, "state": l.state.as_str(), "attempt": l.attempt,
            "granted_at": l.granted_at, "started_at": l.started_at, "expires_at": l.expires_at,
            "ended_at": l.ended_at,
        })).collect::<Vec<_>>(),
    })
}

/// An audit entry as the API shows it.
pub fn audit_entry(r: &crate::domain::audit::Recorded) -> super::schema::AuditEntry {
    let e = &r.entry;
    super::schema::AuditEntry {
        seq: r.seq,
        at: e.at.rfc3339(),
        actor: e.actor.clone(),
        action: e.action.as_str().to_string(),
        target_kind: e.action.target_kind().as_str().to_string(),
        target: e.target.clone(),
        detail: e.detail.clone(),
        client: e.client.clone(),
    }
}

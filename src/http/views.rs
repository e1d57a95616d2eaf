//! The JSON shapes of PROTOCOL.md, built from domain values. One function per shape, so that
//! a runner or a job looks the same in every response that carries it.

use crate::app::Settings;
use crate::domain::job::{Job, JobEvent};
use crate::domain::pool::{Pool, ResolverStatus};
use crate::domain::roll::RollHealth;
use crate::domain::runner::Runner;
use crate::domain::time::Millis;
use crate::store::{Lease, QueueDepth, RunnerHistory};
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub fn job_summary(job: &Job) -> Value {
    json!({"id": job.id, "state": job.state.as_str()})
}

/// The job as a runner holding a lease sees it.
pub fn leased_job(job: &Job, lease: &Lease) -> Value {
    json!({
        "id": job.id,
        "pool": job.pool,
        "state": job.state.as_str(),
        "payload": job.payload,
        "attempt": lease.attempt,
        "max_attempts": job.max_attempts,
    })
}

pub fn lease(lease: &Lease, job: &Job) -> Value {
    json!({
        "lease_id": lease.id,
        "state": lease.state.as_str(),
        "expires_at": lease.expires_at,
        "job": leased_job(job, lease),
    })
}

pub fn job_event(e: &JobEvent) -> Value {
    json!({
        "at": e.at,
        "kind": e.kind,
        "runner_id": e.runner_id,
        "lease_id": e.lease_id,
        "reason": e.reason,
        "detail": e.detail,
    })
}

pub fn job(job: &Job, events: &[JobEvent]) -> Value {
    json!({
        "id": job.id,
        "pool": job.pool,
        "state": job.state.as_str(),
        "payload": job.payload,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "returns": job.returns,
        "last_error": job.last_error,
        "idempotency_key": job.idempotency_key,
        "lease_id": job.lease_id,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "events": events.iter().map(job_event).collect::<Vec<_>>(),
    })
}

/// What the pool view adds from outside the pool record: its runners' standing and the
/// resolver's status under the configured threshold.
pub struct PoolStanding {
    pub runners_by_status: BTreeMap<&'static str, i64>,
    pub roll: RollHealth,
    pub resolver_status: Option<ResolverStatus>,
}

pub fn pool(pool: &Pool, standing: &PoolStanding, depth: QueueDepth) -> Value {
    json!({
        "name": pool.name,
        "image_ref": pool.image_ref,
        "image_policy": pool.image_policy,
        "image_source": pool.image_source,
        "gate_mode": pool.gate_mode,
        "expected_image_ids": pool.expected_image_ids,
        "previous_image_ids": pool.previous_image_ids,
        "previous_valid_until": pool.previous_valid_until,
        "drift_grace_s": pool.drift_grace_s,
        "resolve_interval_s": pool.resolve_interval_s,
        "last_resolution": pool.last_resolution,
        "resolver_status": standing.resolver_status,
        "resolution_failures": pool.resolution_failures,
        "resolved_digest": pool.resolved_digest,
        "resolved_image_id": pool.resolved_image_id,
        "next_resolve_at": pool.next_resolve_at,
        "roll_stalled": standing.roll.roll_stalled,
        "runners_by_status": standing.runners_by_status,
        "queued_jobs": depth.queued,
        "oldest_queued_at": depth.oldest_queued_at,
        "created_at": pool.created_at,
        "updated_at": pool.updated_at,
    })
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

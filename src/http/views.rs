//! The JSON shapes of PROTOCOL.md, built from domain values. One function per shape, so that
//! a runner or a job looks the same in every response that carries it. Each shape is a struct
//! deriving `Serialize` and `ToSchema`: the answer a handler sends and its schema in the
//! OpenAPI document are one definition. Optional fields are sent as `null`, never left out
//! (`#[schema(required = true)]`), except a forge runner's key of the other kind.

use super::schema::AuditEntry;
use crate::app::Settings;
use crate::domain::digest::ImageDigest;
use crate::domain::disk::{DiskFigure, DiskWarning};
use crate::domain::ids::{JobId, LeaseId, RunnerId};
use crate::domain::image_set::ImageSource;
use crate::domain::images::Undescribed;
use crate::domain::job::{Job, JobEvent as StoredJobEvent};
use crate::domain::pool::{GateMode, ImagePolicy, Pool, ResolverStatus};
use crate::domain::pool_name::PoolName;
use crate::domain::roll::RollHealth;
use crate::domain::runner::Runner;
use crate::domain::time::Millis;
use crate::store::{Lease, QueueDepth, RunnerHistory};
use serde::Serialize;
use serde_json::Value;
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
    /// The refs of the runner's several images (`images`) off their pool's current sets, or
    /// absent where the pool does not accept that: what a recycle must pull. Empty otherwise.
    pub pull: Vec<String>,
    /// The current set of each image in `pull`, by ref: what the runner must come onto (and
    /// what an agent that recycles once per set remembers, as it does `expected_image_ids`).
    pub expected_images: Vec<ExpectedImage>,
}

/// One image's current set, in a heartbeat's answer.
#[derive(Serialize, ToSchema)]
pub struct ExpectedImage {
    #[serde(rename = "ref")]
    pub image_ref: String,
    #[schema(value_type = Vec<String>)]
    pub expected_image_ids: Vec<ImageDigest>,
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
    /// Its single image's id; null when only its several images drifted.
    #[schema(required = true, value_type = Option<String>)]
    pub running_image_id: Option<ImageDigest>,
    #[schema(value_type = Vec<String>)]
    pub expected_image_ids: Vec<ImageDigest>,
    /// The refs of its several images (`images`) off their current sets: what to pull.
    pub images: Vec<String>,
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
    /// Runners under the pool's disk warning line.
    pub disk_warned: i64,
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
    /// Where the pool's runners register with GitHub Actions; null when they do not.
    #[schema(required = true)]
    pub github: Option<GithubPoolView>,
    /// Below what disk figures its runners are warned of; null when never.
    #[schema(required = true)]
    pub disk_warning: Option<DiskWarning>,
    /// Its live runners whose disk is under that line, whatever their status.
    pub runners_disk_warned: i64,
    /// When its runners are ejected for infrastructure failures in a row.
    pub ejection: crate::domain::ejection::EjectionPolicy,
    /// The images its runners may run, each with its own sets (`domain::images`).
    pub images: Vec<PoolImageView>,
    /// `refuse` or `ignore` an attested image the pool does not describe.
    pub undescribed_images: Undescribed,
    pub runners_by_status: BTreeMap<&'static str, i64>,
    pub queued_jobs: i64,
    #[schema(required = true, value_type = Option<String>)]
    pub oldest_queued_at: Option<Millis>,
    #[schema(value_type = String)]
    pub created_at: Millis,
    #[schema(value_type = String)]
    pub updated_at: Millis,
}

/// One image a pool describes.
#[derive(Serialize, ToSchema)]
pub struct PoolImageView {
    #[serde(rename = "ref")]
    pub image_ref: String,
    /// `manual`, or `registry`: its set is what `ref` resolves to.
    pub image_source: ImageSource,
    #[schema(value_type = Vec<String>)]
    pub expected_image_ids: Vec<ImageDigest>,
    #[schema(value_type = Vec<String>)]
    pub previous_image_ids: Vec<ImageDigest>,
    #[schema(required = true, value_type = Option<String>)]
    pub previous_valid_until: Option<Millis>,
    pub drift_grace_s: i64,
    pub absent_ok: bool,
    /// A registry entry's resolver record, as a registry pool's own (null for manual ones).
    #[schema(required = true, value_type = Option<String>)]
    pub resolved_digest: Option<ImageDigest>,
    #[schema(required = true, value_type = Option<String>)]
    pub resolved_image_id: Option<ImageDigest>,
    #[schema(required = true)]
    pub last_resolution: Option<Resolution>,
    pub resolution_failures: i64,
}

/// A pool's `github` object: where its runners register with GitHub Actions.
#[derive(Serialize, ToSchema)]
pub struct GithubPoolView {
    /// `orgs/ORG`, `repos/OWNER/REPO` or `enterprises/ENTERPRISE`.
    pub scope: String,
    pub runner_group_id: i64,
    /// The labels every registration carries.
    pub labels: Vec<String>,
    /// The runner's work folder, relative to its directory.
    pub work_folder: String,
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
        github: pool.github.as_ref().map(|g| GithubPoolView {
            scope: g.scope.as_str().to_string(),
            runner_group_id: g.runner_group_id,
            labels: g.labels.clone(),
            work_folder: g.work_folder.clone(),
        }),
        disk_warning: pool.disk_warning,
        runners_disk_warned: standing.disk_warned,
        ejection: pool.ejection,
        images: pool
            .images
            .iter()
            .map(|i| PoolImageView {
                image_ref: i.image_ref.clone(),
                image_source: i.image_source,
                expected_image_ids: i.expected_image_ids.clone(),
                previous_image_ids: i.previous_image_ids.clone(),
                previous_valid_until: i.previous_valid_until,
                drift_grace_s: i.drift_grace_s,
                absent_ok: i.absent_ok,
                resolved_digest: i.resolved_digest.clone(),
                resolved_image_id: i.resolved_image_id.clone(),
                last_resolution: i.last_resolution.as_ref().map(|r| Resolution {
                    at: r.at,
                    ok: r.ok,
                    error: r.error.clone(),
                }),
                resolution_failures: i.resolution_failures,
            })
            .collect(),
        undescribed_images: pool.undescribed_images,
        runners_by_status: standing.runners_by_status.clone(),
        queued_jobs: depth.queued,
        oldest_queued_at: depth.oldest_queued_at,
        created_at: pool.created_at,
        updated_at: pool.updated_at,
    }
}

/// A runner's live lease.
#[derive(Serialize, ToSchema)]
pub struct CurrentLease {
    pub lease_id: String,
    pub job_id: String,
    pub state: String,
    pub expires_at: String,
}

/// A runner as the admin API lists it.
#[derive(Serialize, ToSchema)]
pub struct RunnerView {
    pub runner_id: String,
    pub name: String,
    pub pool: String,
    pub labels: BTreeMap<String, String>,
    /// `revoked`, `unknown`, `stale`, or one of the heartbeat's statuses.
    pub status: String,
    #[schema(required = true)]
    pub code: Option<String>,
    #[schema(required = true)]
    pub detail: Option<String>,
    #[schema(required = true)]
    pub last_attestation_at: Option<String>,
    #[schema(required = true)]
    pub probe_ok: Option<bool>,
    #[schema(required = true)]
    pub probe_checked_at: Option<String>,
    #[schema(required = true)]
    pub probe_error: Option<String>,
    #[schema(required = true)]
    pub runtime: Option<String>,
    #[schema(required = true)]
    pub runtime_version: Option<String>,
    #[schema(required = true)]
    pub image_id: Option<String>,
    #[schema(required = true)]
    pub image_digest: Option<String>,
    #[schema(required = true)]
    pub image_ref: Option<String>,
    pub expected_image_ids: Vec<String>,
    #[schema(required = true)]
    pub image_current: Option<bool>,
    pub cordoned: bool,
    #[schema(required = true)]
    pub quarantined_at: Option<String>,
    #[schema(required = true)]
    pub revoked_at: Option<String>,
    pub registered_at: String,
    #[schema(required = true)]
    pub current_lease: Option<CurrentLease>,
    /// The forge runners bound to it, for the forge gate.
    pub forge_runners: Vec<ForgeRunnerView>,
    /// Forge runners its agent claims (`forge_runners` in its attestation) that another runner
    /// holds, so not bound to it (`forge_runner_taken`); `last_fetch_at` is null.
    pub forge_runners_taken: Vec<ForgeRunnerView>,
    /// Its last attestation signed by its key and refused under rules 3–4 (`attestation_invalid`,
    /// `attestation_expired`, `clock_skew`), with why; null when there was none.
    #[schema(required = true)]
    pub last_rejected_attestation: Option<RejectedAttestation>,
    /// The host its latest attestation named (`host`, or `agent.hostname`); null when none.
    #[schema(required = true)]
    pub host: Option<String>,
    /// The agent's version its latest attestation named (`agent.version`); null when none.
    #[schema(required = true)]
    pub agent_version: Option<String>,
    /// The filesystems its latest probe measured (`probe.disk`); empty when none were.
    pub disk: Vec<DiskFigure>,
    /// Why its disk is under its pool's `disk_warning` line; null when it is not (or the
    /// pool draws none). The status is unchanged by it.
    #[schema(required = true)]
    pub disk_warning: Option<String>,
    /// Its standing under its pool's ejection policy.
    pub ejection: EjectionView,
    /// The several images its latest attestation named (`images`), each as its pool judges
    /// it; empty when it named none.
    pub images: Vec<RunnerImageView>,
}

/// A runner's standing under outlier ejection.
#[derive(Serialize, ToSchema)]
pub struct EjectionView {
    /// `ejected` (refused: `runner_ejected`), `would_eject` (the rule called for an ejection
    /// that was not made) or null.
    #[schema(required = true)]
    pub state: Option<&'static str>,
    /// Infrastructure failures in a row since it last ran a job to its end or was ejected.
    pub failures_in_a_row: i64,
    /// Those failures by reason (`errored`, `abandoned`, `runner_system_failure`,
    /// `image_pull_failure`, `no_step_started`).
    pub failures: BTreeMap<&'static str, u32>,
    /// Its ejections so far, before one is forgotten per 8 × `base_s` without one.
    pub ejections: i64,
    /// The ejection in force; null when none.
    #[schema(required = true)]
    pub ejected: Option<EjectedView>,
    /// The ejection called for and not made; null when none.
    #[schema(required = true)]
    pub would_eject: Option<WouldEjectView>,
}

#[derive(Serialize, ToSchema)]
pub struct EjectedView {
    pub at: String,
    /// Refused until then, and after it until a passing probe checked after it.
    pub until: String,
    /// Which ejection it is (its length is `nth × base_s`, at most 8 × `base_s`).
    pub nth: i64,
    /// The failures in a row that ejected it, by reason.
    pub failures: BTreeMap<&'static str, u32>,
}

#[derive(Serialize, ToSchema)]
pub struct WouldEjectView {
    pub at: String,
    /// `observe` (the pool observes), `max_share` (its share is ejected already) or
    /// `last_admitted` (it is the pool's last admitted runner).
    pub why: &'static str,
    /// Until when it would have been ejected.
    pub until: String,
    pub failures: BTreeMap<&'static str, u32>,
}

fn tally(t: &crate::domain::ejection::Tally) -> BTreeMap<&'static str, u32> {
    t.counts().map(|(r, n)| (r.as_str(), n)).collect()
}

/// A runner's ejection record as the views show it.
pub fn ejection(r: &crate::domain::ejection::EjectionRecord) -> EjectionView {
    EjectionView {
        state: if r.ejected.is_some() {
            Some("ejected")
        } else if r.would_eject.is_some() {
            Some("would_eject")
        } else {
            None
        },
        failures_in_a_row: r.streak.total(),
        failures: tally(&r.streak),
        ejections: r.ejections,
        ejected: r.ejected.map(|e| EjectedView {
            at: rfc3339(e.at),
            until: rfc3339(e.until),
            nth: e.nth,
            failures: tally(&e.failures),
        }),
        would_eject: r.would_eject.map(|w| WouldEjectView {
            at: rfc3339(w.at),
            why: w.why.as_str(),
            until: rfc3339(w.until),
            failures: tally(&w.failures),
        }),
    }
}

/// One of a runner's several images.
#[derive(Serialize, ToSchema)]
pub struct RunnerImageView {
    #[serde(rename = "ref")]
    pub image_ref: String,
    #[schema(required = true, value_type = Option<String>)]
    pub id: Option<ImageDigest>,
    #[schema(required = true, value_type = Option<String>)]
    pub digest: Option<ImageDigest>,
    pub labels: Vec<String>,
    pub absent: bool,
    /// On its pool entry's current set; null when the pool does not describe its ref (or its
    /// policy is `off`).
    #[schema(required = true)]
    pub current: Option<bool>,
}

/// A forge runner bound to a leasegate runner: `uuid` for `forgejo`, `token_sha256` for
/// `gitlab`.
#[derive(Serialize, ToSchema)]
pub struct ForgeRunnerView {
    /// `forgejo` (Gitea's runners too), `gitlab`, `buildkite` or `woodpecker`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// A GitLab runner's token's SHA-256, or a Forgejo runner's when the binding holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// A GitLab runner's machine; absent: the token alone (any machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_id: Option<String>,
    /// A Buildkite agent's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// A Woodpecker agent's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<i64>,
    /// The last time the gate saw it ask for work (written at most every 30 s; never for a
    /// Buildkite agent, whose work does not pass the gate).
    #[schema(required = true)]
    pub last_fetch_at: Option<String>,
}

/// An attestation the gate refused, as noted on its runner.
#[derive(Serialize, ToSchema)]
pub struct RejectedAttestation {
    pub at: String,
    pub code: String,
    pub detail: String,
}

/// `200` to `GET /api/v1/admin/runners`.
#[derive(Serialize, ToSchema)]
pub struct RunnerList {
    pub runners: Vec<RunnerView>,
    /// Pass as `cursor` for the next page; null on the last.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// One recorded attestation.
#[derive(Serialize, ToSchema)]
pub struct AttestationRecord {
    pub at: String,
    pub status: String,
    pub probe_ok: bool,
    pub runtime: String,
    #[schema(required = true)]
    pub runtime_version: Option<String>,
    pub checked_at: String,
    #[schema(required = true)]
    pub error: Option<String>,
    #[schema(required = true)]
    pub image_id: Option<String>,
    #[schema(required = true)]
    pub image_digest: Option<String>,
}

/// One change of a runner's status.
#[derive(Serialize, ToSchema)]
pub struct StatusChange {
    pub at: String,
    #[schema(required = true)]
    pub from: Option<String>,
    pub to: String,
    #[schema(required = true)]
    pub detail: Option<String>,
}

/// A run of refused leases, gate checks or forge fetches with one code, one entry however
/// many it holds.
#[derive(Serialize, ToSchema)]
pub struct RefusalRecord {
    /// The run's latest refusal.
    pub at: String,
    pub code: String,
    /// The latest refusal's detail.
    pub detail: String,
    /// How many refusals the run holds.
    pub count: i64,
    /// The run's first refusal.
    pub first_at: String,
}

/// One of a runner's leases.
#[derive(Serialize, ToSchema)]
pub struct LeaseRecord {
    pub lease_id: String,
    pub job_id: String,
    pub state: String,
    pub attempt: i64,
    pub granted_at: String,
    #[schema(required = true)]
    pub started_at: Option<String>,
    pub expires_at: String,
    #[schema(required = true)]
    pub ended_at: Option<String>,
}

/// `201` to `POST /api/v1/github/runners`: a single-use GitHub registration.
#[derive(Serialize, ToSchema)]
pub struct GithubRegistrationGrant {
    /// GitHub's id of the runner it registered.
    pub github_runner_id: i64,
    /// The name it is registered under: the runner's name, `-` and 8 hex digits.
    pub name: String,
    /// What GitHub's runner runs with: `./run.sh --jitconfig <this>`. A secret: it registers
    /// the runner. leasegate keeps no copy.
    pub encoded_jit_config: String,
    /// When it is withdrawn if its runner has not come online by then.
    pub expires_at: String,
}

/// One GitHub registration leasegate minted for a runner, with each step it went through.
#[derive(Serialize, ToSchema)]
pub struct GithubRegistrationRecord {
    #[schema(required = true)]
    pub github_runner_id: Option<i64>,
    pub name: String,
    /// `orgs/ORG`, `repos/OWNER/REPO` or `enterprises/ENTERPRISE`.
    pub scope: String,
    /// `minting`, `minted`, `online`, `busy`, `done` or `deleted`.
    pub state: String,
    pub minted_at: String,
    /// When it is withdrawn if it never comes online.
    pub expires_at: String,
    #[schema(required = true)]
    pub online_at: Option<String>,
    #[schema(required = true)]
    pub busy_at: Option<String>,
    /// The last time it was in GitHub's list.
    #[schema(required = true)]
    pub seen_at: Option<String>,
    #[schema(required = true)]
    pub ended_at: Option<String>,
    /// `done`, or why it was withdrawn: `unused`, `offline`, or the refusal's code.
    #[schema(required = true)]
    pub end_reason: Option<String>,
    /// Minted in a pool that observes for a runner the gate would have refused: the code.
    #[schema(required = true)]
    pub would_refuse: Option<String>,
}

pub fn github_registration(
    r: &crate::domain::github::registration::Registration,
) -> GithubRegistrationRecord {
    GithubRegistrationRecord {
        github_runner_id: r.github_runner_id,
        name: r.name.clone(),
        scope: r.scope.as_str().to_string(),
        state: r.state.as_str().to_string(),
        minted_at: rfc3339(r.minted_at),
        expires_at: rfc3339(r.expires_at),
        online_at: r.online_at.map(rfc3339),
        busy_at: r.busy_at.map(rfc3339),
        seen_at: r.seen_at.map(rfc3339),
        ended_at: r.ended_at.map(rfc3339),
        end_reason: r.end_reason.clone(),
        would_refuse: r.would_refuse.clone(),
    }
}

/// A pause leasegate made on one of the runner's Buildkite agents.
#[derive(Serialize, ToSchema)]
pub struct BuildkitePauseRecord {
    /// Buildkite's id of the agent.
    pub agent_id: String,
    pub agent_name: String,
    /// The refusal it was made for, and the note it carried (`leasegate: CODE: DETAIL`).
    pub code: String,
    pub note: String,
    pub paused_at: String,
    /// When Buildkite lifts it by itself unless leasegate resumes the agent first.
    pub until: String,
    #[schema(required = true)]
    pub ended_at: Option<String>,
    /// `resumed` (by leasegate), `lapsed` (its timeout passed), `undone` (found no longer
    /// paused), `replaced` (found paused by somebody else since) or `gone` (no longer
    /// connected); null while it holds.
    #[schema(required = true)]
    pub end: Option<String>,
}

/// What leasegate notes of one of the runner's Buildkite agent names.
#[derive(Serialize, ToSchema)]
pub struct BuildkiteAgentRecord {
    pub agent_name: String,
    /// The last time its agents were listed while the runner was refused.
    #[schema(required = true)]
    pub checked_at: Option<String>,
    /// In an observing pool: the refusal it would be paused for.
    #[schema(required = true)]
    pub would_pause: Option<String>,
    /// An agent of this name paused by somebody else, left alone.
    #[schema(required = true)]
    pub left_alone: Option<String>,
    /// Failed calls in a row (a pause or resume that failed), the last one's error and when,
    /// and when it is tried again; 0 and nulls when the last call went through.
    pub failures: i64,
    #[schema(required = true)]
    pub error: Option<String>,
    #[schema(required = true)]
    pub error_at: Option<String>,
    #[schema(required = true)]
    pub retry_at: Option<String>,
}

pub fn buildkite_pause(p: &crate::domain::buildkite::Pause) -> BuildkitePauseRecord {
    BuildkitePauseRecord {
        agent_id: p.agent_id.clone(),
        agent_name: p.agent_name.clone(),
        code: p.code.clone(),
        note: p.note.clone(),
        paused_at: rfc3339(p.paused_at),
        until: rfc3339(p.until),
        ended_at: p.ended_at.map(rfc3339),
        end: p.end.map(|e| e.as_str().to_string()),
    }
}

pub fn buildkite_agent(w: &crate::domain::buildkite::AgentWatch) -> BuildkiteAgentRecord {
    BuildkiteAgentRecord {
        agent_name: w.agent_name.clone(),
        checked_at: w.checked_at.map(rfc3339),
        would_pause: w.observed_code.clone(),
        left_alone: w.left_alone.clone(),
        failures: w.failures,
        error: w.error.clone(),
        error_at: w.error_at.map(rfc3339),
        retry_at: w.next_try_at.map(rfc3339),
    }
}

/// A runner with its history, newest first (`GET /api/v1/admin/runners/{id}`, cordon,
/// uncordon, revoke).
#[derive(Serialize, ToSchema)]
pub struct RunnerDetail {
    #[serde(flatten)]
    pub runner: RunnerView,
    pub attestations: Vec<AttestationRecord>,
    pub status_changes: Vec<StatusChange>,
    pub refusals: Vec<RefusalRecord>,
    pub leases: Vec<LeaseRecord>,
    /// Its GitHub registrations, newest first (at most 20).
    pub github_registrations: Vec<GithubRegistrationRecord>,
    /// The pauses leasegate made on its Buildkite agents, newest first (at most 20).
    pub buildkite_pauses: Vec<BuildkitePauseRecord>,
    /// What leasegate notes of each of its Buildkite agent names (a pause that failed, one of
    /// somebody else's left alone, what an observing pool would pause).
    pub buildkite_agents: Vec<BuildkiteAgentRecord>,
    /// What operators did to this runner, newest first (at most 50).
    pub audit: Vec<AuditEntry>,
}

fn rfc3339(m: Millis) -> String {
    m.rfc3339()
}

pub fn runner(runner: &Runner, pool: &Pool, settings: &Settings, now: Millis) -> RunnerView {
    let observed = runner.observe(pool, now, settings.status_rules());
    let latest = runner.latest.as_ref();
    let probe = latest.map(|l| &l.state.probe);
    let image = latest.map(|l| &l.state.image);
    RunnerView {
        runner_id: runner.id.to_string(),
        name: runner.name.clone(),
        pool: runner.pool.to_string(),
        labels: runner.labels.clone(),
        status: observed.status.as_str().to_string(),
        code: observed.refusal.as_ref().map(|r| r.code().to_string()),
        detail: observed.refusal.as_ref().map(|r| r.detail()),
        last_attestation_at: latest.map(|l| rfc3339(l.received_at)),
        probe_ok: probe.map(|p| p.ok),
        probe_checked_at: probe.map(|p| rfc3339(p.checked_at)),
        probe_error: probe.and_then(|p| p.error.clone()),
        runtime: probe.map(|p| p.runtime.clone()),
        runtime_version: probe.and_then(|p| p.runtime_version.clone()),
        image_id: image.and_then(|i| i.id.as_ref().map(|d| d.to_string())),
        image_digest: image.and_then(|i| i.digest.as_ref().map(|d| d.to_string())),
        image_ref: image.and_then(|i| i.image_ref.clone()),
        expected_image_ids: pool
            .expected_image_ids
            .iter()
            .map(|d| d.to_string())
            .collect(),
        image_current: observed.image_current,
        cordoned: runner.gate.cordoned,
        quarantined_at: runner.gate.quarantined_at.map(rfc3339),
        revoked_at: runner.revoked_at.map(rfc3339),
        registered_at: rfc3339(runner.registered_at),
        current_lease: runner.current_lease.as_ref().map(|l| CurrentLease {
            lease_id: l.lease_id.to_string(),
            job_id: l.job_id.to_string(),
            state: l.state.as_str().to_string(),
            expires_at: rfc3339(l.expires_at),
        }),
        forge_runners: runner
            .forge_runners
            .iter()
            .map(super::forge_bindings::view)
            .collect(),
        forge_runners_taken: runner
            .forge_runners_taken
            .iter()
            .map(super::forge_bindings::spec_view)
            .collect(),
        last_rejected_attestation: runner.last_rejection.as_ref().map(|r| RejectedAttestation {
            at: rfc3339(r.at),
            code: r.code.clone(),
            detail: r.detail.clone(),
        }),
        host: runner.agent.host.clone(),
        agent_version: runner.agent.version.clone(),
        disk: probe.map(|p| p.disk.clone()).unwrap_or_default(),
        disk_warning: observed.disk_warning,
        ejection: ejection(&runner.ejection),
        images: latest.map_or_else(Vec::new, |l| {
            l.state
                .images
                .iter()
                .map(|i| RunnerImageView {
                    image_ref: i.image_ref.clone(),
                    id: i.id.clone(),
                    digest: i.digest.clone(),
                    labels: i.labels.clone(),
                    absent: i.absent,
                    current: if pool.image_policy == ImagePolicy::Off {
                        None
                    } else {
                        crate::domain::images::current(std::slice::from_ref(i), &pool.images)
                    },
                })
                .collect()
        }),
    }
}

/// A runner with its history and the audit entries on it.
pub fn runner_detail(
    runner: RunnerView,
    history: &RunnerHistory,
    audit: Vec<AuditEntry>,
) -> RunnerDetail {
    RunnerDetail {
        runner,
        attestations: history
            .attestations
            .iter()
            .map(|a| AttestationRecord {
                at: rfc3339(a.received_at),
                status: a.status.clone(),
                probe_ok: a.probe_ok,
                runtime: a.runtime.clone(),
                runtime_version: a.runtime_version.clone(),
                checked_at: rfc3339(a.checked_at),
                error: a.error.clone(),
                image_id: a.image.id.as_ref().map(|d| d.to_string()),
                image_digest: a.image.digest.as_ref().map(|d| d.to_string()),
            })
            .collect(),
        status_changes: history
            .status_changes
            .iter()
            .map(|c| StatusChange {
                at: rfc3339(c.at),
                from: c.from.clone(),
                to: c.to.clone(),
                detail: c.detail.clone(),
            })
            .collect(),
        // One entry per run of refusals with one code: its latest time and detail, its first
        // time and how many it holds.
        refusals: history
            .refusals
            .iter()
            .map(|r| RefusalRecord {
                at: rfc3339(r.at),
                code: r.code.clone(),
                detail: r.detail.clone(),
                count: r.count,
                first_at: rfc3339(r.first_at),
            })
            .collect(),
        leases: history
            .leases
            .iter()
            .map(|l| LeaseRecord {
                lease_id: l.id.to_string(),
                job_id: l.job_id.to_string(),
                state: l.state.as_str().to_string(),
                attempt: l.attempt,
                granted_at: rfc3339(l.granted_at),
                started_at: l.started_at.map(rfc3339),
                expires_at: rfc3339(l.expires_at),
                ended_at: l.ended_at.map(rfc3339),
            })
            .collect(),
        github_registrations: history
            .github_registrations
            .iter()
            .map(github_registration)
            .collect(),
        buildkite_pauses: history
            .buildkite_pauses
            .iter()
            .map(buildkite_pause)
            .collect(),
        buildkite_agents: history
            .buildkite_agents
            .iter()
            .map(buildkite_agent)
            .collect(),
        audit,
    }
}

/// An audit entry as the API shows it.
pub fn audit_entry(r: &crate::domain::audit::Recorded) -> AuditEntry {
    let e = &r.entry;
    AuditEntry {
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

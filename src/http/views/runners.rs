//! A runner as operators see it: its standing, images, lease and forge runners, judged now.

use super::ejection::{EjectionView, ejection};
use super::forge_runners::{ForgeRunnerView, bound_forge_runner, forge_runner};
use crate::app::Settings;
use crate::domain::digest::ImageDigest;
use crate::domain::disk::DiskFigure;
use crate::domain::pool::{ImagePolicy, Pool};
use crate::domain::runner::Runner;
use crate::domain::time::Millis;
use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

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
        last_attestation_at: latest.map(|l| l.received_at.rfc3339()),
        probe_ok: probe.map(|p| p.ok),
        probe_checked_at: probe.map(|p| p.checked_at.rfc3339()),
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
        quarantined_at: runner.gate.quarantined_at.map(|m| m.rfc3339()),
        revoked_at: runner.revoked_at.map(|m| m.rfc3339()),
        registered_at: runner.registered_at.rfc3339(),
        current_lease: runner.current_lease.as_ref().map(|l| CurrentLease {
            lease_id: l.lease_id.to_string(),
            job_id: l.job_id.to_string(),
            state: l.state.as_str().to_string(),
            expires_at: l.expires_at.rfc3339(),
        }),
        forge_runners: runner
            .forge_runners
            .iter()
            .map(bound_forge_runner)
            .collect(),
        forge_runners_taken: runner
            .forge_runners_taken
            .iter()
            .map(forge_runner)
            .collect(),
        last_rejected_attestation: runner.last_rejection.as_ref().map(|r| RejectedAttestation {
            at: r.at.rfc3339(),
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

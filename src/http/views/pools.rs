//! Pools as operators see them (their image policy, resolution and queue), the registration
//! tokens minted for them, and the pools a registry's push starts resolving.

use crate::domain::digest::ImageDigest;
use crate::domain::disk::DiskWarning;
use crate::domain::image_set::ImageSource;
use crate::domain::images::Undescribed;
use crate::domain::pool::{GateMode, ImagePolicy, Pool, ResolverStatus};
use crate::domain::pool_name::PoolName;
use crate::domain::roll::RollHealth;
use crate::domain::time::Millis;
use crate::store::QueueDepth;
use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

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

//! The drift report a fleet roller polls (`GET /api/v1/admin/drift`): the runners off their
//! pool's images, the ones skipped, and each pool's roll health.

use crate::domain::digest::ImageDigest;
use crate::domain::ids::RunnerId;
use crate::domain::pool_name::PoolName;
use crate::domain::roll::RollHealth;
use serde::Serialize;
use utoipa::ToSchema;

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

//! What a runner's agent is answered when it registers and when it heartbeats.

use crate::domain::digest::ImageDigest;
use crate::domain::ids::RunnerId;
use crate::domain::pool_name::PoolName;
use serde::Serialize;
use utoipa::ToSchema;

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

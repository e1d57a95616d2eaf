//! What a runner is answered when it is leased a job, and by the lease-scoped calls.

use super::jobs::{LeasedJob, leased_job};
use crate::domain::ids::LeaseId;
use crate::domain::job::Job;
use crate::domain::time::Millis;
use crate::store::Lease;
use serde::Serialize;
use utoipa::ToSchema;

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

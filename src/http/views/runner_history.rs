//! A runner's detail (`GET /api/v1/admin/runners/{id}`): its view and its recent history
//! (attestations, status changes, refusals, leases, GitHub registrations, Buildkite pauses,
//! operators' actions).

use super::buildkite::{
    BuildkiteAgentRecord, BuildkitePauseRecord, buildkite_agent, buildkite_pause,
};
use super::github::{GithubRegistrationRecord, github_registration};
use super::operators::AuditEntry;
use super::runners::RunnerView;
use crate::store::RunnerHistory;
use serde::Serialize;
use utoipa::ToSchema;

/// How many of a runner's audit entries its detail shows.
pub const RUNNER_AUDIT_SHOWN: i64 = 50;

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
                at: a.received_at.rfc3339(),
                status: a.status.clone(),
                probe_ok: a.probe_ok,
                runtime: a.runtime.clone(),
                runtime_version: a.runtime_version.clone(),
                checked_at: a.checked_at.rfc3339(),
                error: a.error.clone(),
                image_id: a.image.id.as_ref().map(|d| d.to_string()),
                image_digest: a.image.digest.as_ref().map(|d| d.to_string()),
            })
            .collect(),
        status_changes: history
            .status_changes
            .iter()
            .map(|c| StatusChange {
                at: c.at.rfc3339(),
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
                at: r.at.rfc3339(),
                code: r.code.clone(),
                detail: r.detail.clone(),
                count: r.count,
                first_at: r.first_at.rfc3339(),
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
                granted_at: l.granted_at.rfc3339(),
                started_at: l.started_at.map(|m| m.rfc3339()),
                expires_at: l.expires_at.rfc3339(),
                ended_at: l.ended_at.map(|m| m.rfc3339()),
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

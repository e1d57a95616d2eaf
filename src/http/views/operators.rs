//! Operators' named tokens and the audit trail of what operators did.

use serde::Serialize;
use utoipa::ToSchema;

/// One change by an operator.
#[derive(Serialize, ToSchema)]
pub struct AuditEntry {
    /// The entry's place in the trail: pass it as `cursor` for the entries before it.
    pub seq: i64,
    pub at: String,
    /// The operator's name (`bootstrap` for the configured admin token).
    pub actor: String,
    /// `runner_cordon`, `runner_uncordon`, `runner_revoke`, `runner_forge_runners`,
    /// `pool_put`, `pool_patch`, `pool_delete`, `pool_resolve`, `registration_token_create`,
    /// `operator_token_create`, `operator_token_revoke`, `page_login`, `page_logout`; and the
    /// steps of GitHub registrations, whose actor is `leasegate`: `github_runner_minted`,
    /// `github_runner_online`, `github_runner_busy`, `github_runner_done`,
    /// `github_runner_deleted`.
    pub action: String,
    /// `runner`, `pool` or `operator`.
    pub target_kind: String,
    /// The runner id, pool name or operator name acted on.
    pub target: String,
    #[schema(required = true)]
    pub detail: Option<String>,
    /// The client's address.
    pub client: String,
}

/// `200` to `GET /api/v1/admin/audit`.
#[derive(Serialize, ToSchema)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    /// Pass as `cursor` for the next (older) page; `null` on the last.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// An operator's token as listed (the token itself is shown once, when created).
#[derive(Serialize, ToSchema)]
pub struct OperatorTokenView {
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    pub role: String,
    pub created_at: String,
    pub created_by: String,
}

/// `201` to `POST /api/v1/admin/tokens`: the token, shown this once.
#[derive(Serialize, ToSchema)]
pub struct CreatedOperatorToken {
    #[serde(flatten)]
    pub operator: OperatorTokenView,
    /// The bearer token (`lgo_…`): only its hash is kept.
    pub token: String,
}

/// `200` to `GET /api/v1/admin/tokens`.
#[derive(Serialize, ToSchema)]
pub struct OperatorTokenList {
    pub tokens: Vec<OperatorTokenView>,
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

//! GitHub registrations: the one a runner is granted, and those recorded in its history.

use serde::Serialize;
use utoipa::ToSchema;

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
        minted_at: r.minted_at.rfc3339(),
        expires_at: r.expires_at.rfc3339(),
        online_at: r.online_at.map(|m| m.rfc3339()),
        busy_at: r.busy_at.map(|m| m.rfc3339()),
        seen_at: r.seen_at.map(|m| m.rfc3339()),
        ended_at: r.ended_at.map(|m| m.rfc3339()),
        end_reason: r.end_reason.clone(),
        would_refuse: r.would_refuse.clone(),
    }
}

//! Forge runners as the API reads them (`views::forge_runners` shows them): `{"kind": "forgejo", "uuid": "…",
//! "token_sha256": "…"}` for a Forgejo or Gitea runner (`"gitea"` is accepted as the same;
//! the token's SHA-256 optional), `{"kind": "gitlab", "token_sha256": "…", "system_id": "…"}`
//! for a GitLab runner (the machine's `system_id` optional), `{"kind": "buildkite",
//! "agent_name": "…"}` for a Buildkite agent, `{"kind": "woodpecker", "agent_id": N}` for a
//! Woodpecker agent. A registration may carry them; an
//! operator replaces them with `PUT /api/v1/admin/runners/{id}/forge-runners`; the agent's
//! heartbeats may claim them (`forge_runners` in the attestation).

use crate::domain::forge::ForgeRunner;
use crate::problem::ApiError;
use serde::Deserialize;

use crate::domain::forge::MAX_FORGE_RUNNERS;

/// One forge runner in a request; its schema is `constraints::forge_runner`.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct ForgeRunnerSpec {
    /// `forgejo` (or `gitea`), `gitlab` or `woodpecker`.
    kind: String,
    /// A Forgejo or Gitea runner's uuid (its `.runner` file's `uuid`).
    #[serde(default)]
    uuid: Option<String>,
    /// The SHA-256 of a GitLab runner's authentication token, or of a Forgejo or Gitea
    /// runner's token; 64 lowercase hex characters.
    #[serde(default)]
    token_sha256: Option<String>,
    /// A GitLab runner's machine (`.runner_system_id`).
    #[serde(default)]
    system_id: Option<String>,
    /// A Buildkite agent's name.
    #[serde(default)]
    agent_name: Option<String>,
    /// A Woodpecker agent's id (its agent config file's `agent_id`).
    #[serde(default, deserialize_with = "super::json::whole_number")]
    agent_id: Option<i64>,
}

impl utoipa::PartialSchema for ForgeRunnerSpec {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        super::constraints::placeholder()
    }
}

impl utoipa::ToSchema for ForgeRunnerSpec {
    fn name() -> std::borrow::Cow<'static, str> {
        "ForgeRunnerSpec".into()
    }
}

/// The forge runners of `specs`, checked, without repeats (the first of an identity named
/// twice counts).
pub fn identities(specs: &[ForgeRunnerSpec]) -> Result<Vec<ForgeRunner>, ApiError> {
    if specs.len() > MAX_FORGE_RUNNERS {
        return Err(ApiError::bad_request(format!(
            "forge_runners: at most {MAX_FORGE_RUNNERS}"
        )));
    }
    let mut out: Vec<ForgeRunner> = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let runner = ForgeRunner::parse(
            &s.kind,
            s.uuid.as_deref(),
            s.token_sha256.as_deref(),
            s.system_id.as_deref(),
            s.agent_name.as_deref(),
            s.agent_id,
        )
        .map_err(|e| ApiError::bad_request(format!("forge_runners[{i}].{e}")))?;
        if !out.iter().any(|o| o.identity == runner.identity) {
            out.push(runner);
        }
    }
    Ok(out)
}

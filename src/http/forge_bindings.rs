//! Forge runners as the API writes and shows them: `{"kind": "forgejo", "uuid": "…"}` for a
//! Forgejo or Gitea runner (`"gitea"` is accepted as the same), `{"kind": "gitlab",
//! "token_sha256": "…"}` for a GitLab runner. A registration may carry them; an operator
//! replaces them with `PUT /api/v1/admin/runners/{id}/forge-runners`.

use super::problem::ApiError;
use crate::domain::forge::{ForgeBinding, ForgeIdentity, ForgeKind};
use serde::Deserialize;

/// The most forge runners one leasegate runner may carry (a gitlab-runner `config.toml` with
/// many `[[runners]]` stays far below it).
pub const MAX_FORGE_RUNNERS: usize = 64;

/// One forge runner in a request; its schema is `constraints::forge_runner`.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct ForgeRunnerSpec {
    /// `forgejo` (or `gitea`) or `gitlab`.
    kind: String,
    /// A Forgejo or Gitea runner's uuid (its `.runner` file's `uuid`).
    #[serde(default)]
    uuid: Option<String>,
    /// The SHA-256 of a GitLab runner's authentication token, 64 lowercase hex characters.
    #[serde(default)]
    token_sha256: Option<String>,
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

/// The identities of `specs`, checked, without repeats.
pub fn identities(specs: &[ForgeRunnerSpec]) -> Result<Vec<ForgeIdentity>, ApiError> {
    if specs.len() > MAX_FORGE_RUNNERS {
        return Err(ApiError::bad_request(format!(
            "forge_runners: at most {MAX_FORGE_RUNNERS}"
        )));
    }
    let mut out: Vec<ForgeIdentity> = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let identity = ForgeIdentity::parse(&s.kind, s.uuid.as_deref(), s.token_sha256.as_deref())
            .map_err(|e| ApiError::bad_request(format!("forge_runners[{i}].{e}")))?;
        if !out.contains(&identity) {
            out.push(identity);
        }
    }
    Ok(out)
}

/// A binding as views show it: the key its kind is named by, and no other.
pub fn view(b: &ForgeBinding) -> super::views::ForgeRunnerView {
    let key = Some(b.identity.key.clone());
    let (uuid, token_sha256) = match b.identity.kind {
        ForgeKind::Forgejo => (key, None),
        ForgeKind::Gitlab => (None, key),
    };
    super::views::ForgeRunnerView {
        kind: b.identity.kind.as_str().to_string(),
        uuid,
        token_sha256,
        last_fetch_at: b.last_fetch_at.map(|m| m.rfc3339()),
    }
}

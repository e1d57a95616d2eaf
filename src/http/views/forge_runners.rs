//! Forge runners bound to a runner, as every view shows them: the key of their kind, and
//! when a binding last fetched work.

use crate::domain::forge::{ForgeBinding, ForgeKind, ForgeRunner};
use serde::Serialize;
use utoipa::ToSchema;

/// A forge runner bound to a leasegate runner: `uuid` for `forgejo`, `token_sha256` for
/// `gitlab`.
#[derive(Serialize, ToSchema)]
pub struct ForgeRunnerView {
    /// `forgejo` (Gitea's runners too), `gitlab`, `buildkite` or `woodpecker`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// A GitLab runner's token's SHA-256, or a Forgejo runner's when the binding holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// A GitLab runner's machine; absent: the token alone (any machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_id: Option<String>,
    /// A Buildkite agent's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// A Woodpecker agent's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<i64>,
    /// The last time the gate saw it ask for work (written at most every 30 s; never for a
    /// Buildkite agent, whose work does not pass the gate).
    #[schema(required = true)]
    pub last_fetch_at: Option<String>,
}

/// A binding as views show it.
pub fn bound_forge_runner(b: &ForgeBinding) -> ForgeRunnerView {
    let mut v = forge_runner(&b.runner());
    v.last_fetch_at = b.last_fetch_at.map(|m| m.rfc3339());
    v
}

/// A forge runner as views show it, never seen fetching.
pub fn forge_runner(r: &ForgeRunner) -> ForgeRunnerView {
    let key = Some(r.identity.key.clone());
    let (uuid, token_sha256, agent_name) = match r.identity.kind {
        ForgeKind::Forgejo => (key, r.token_sha256.clone(), None),
        ForgeKind::Gitlab => (None, key, None),
        ForgeKind::Buildkite => (None, None, key),
        ForgeKind::Woodpecker => (None, None, None),
    };
    ForgeRunnerView {
        kind: r.identity.kind.as_str().to_string(),
        uuid,
        token_sha256,
        system_id: r.identity.system_id.clone(),
        agent_name,
        agent_id: r.identity.agent_id(),
        last_fetch_at: None,
    }
}

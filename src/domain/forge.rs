//! The forge gate's vocabulary: the forges, their runners' identities, and which forge runner
//! is bound to which leasegate runner. Whether a bound runner may fetch a job now is
//! `domain::fetch`'s to judge, above the runner and its verdict; what is here sits below them,
//! since an attestation names its forge runners and a runner's record holds its bindings.
//!
//! A forge (Forgejo, Gitea, GitLab, Woodpecker) hands out work when its runner asks for it, in
//! one call.
//! leasegate, in front of the forge, answers that call itself ("no work") for a runner the gate
//! refuses, so the job stays queued in the forge and nothing is counted against it. The forge's
//! runner is known by what it presents: a Forgejo/Gitea runner by its uuid, a GitLab runner by
//! its authentication token, kept only as its SHA-256, and the `system_id` of the machine it
//! runs on (one token may serve a fleet), a Woodpecker agent by the `agent_id` its server gave
//! it. Each is bound to the leasegate runner on the same
//! machine, whose heartbeats carry the signed probe and image.
//!
//! Which binding judges a GitLab fetch: the one naming the token and the fetch's `system_id`;
//! else the token's binding without a `system_id` (the token alone: every machine presenting
//! it), if there is one; else none (`unknown_runner`). A Forgejo binding may hold the SHA-256
//! of the runner's token: then only a fetch presenting that token is judged by it, and any
//! other fetch naming the uuid is none of the gate's business (the forge refuses it).
//!
//! A Buildkite agent is bound by its name (Buildkite's `name` of a connected agent): Buildkite
//! hands out work from its own servers, where no gate stands, so leasegate pauses the agent
//! instead (`buildkite/`); no fetch of its passes through the gate.

use super::time::Millis;

/// The forges whose runners leasegate can gate. Gitea and Forgejo speak one protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ForgeKind {
    Forgejo,
    Gitlab,
    /// Gated by pausing the agent through Buildkite's REST API, not in front of a fetch.
    Buildkite,
    Woodpecker,
}

impl ForgeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ForgeKind::Forgejo => "forgejo",
            ForgeKind::Gitlab => "gitlab",
            ForgeKind::Buildkite => "buildkite",
            ForgeKind::Woodpecker => "woodpecker",
        }
    }

    /// `gitea` is accepted as `forgejo`: the same runner protocol.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "forgejo" | "gitea" => Some(ForgeKind::Forgejo),
            "gitlab" => Some(ForgeKind::Gitlab),
            "buildkite" => Some(ForgeKind::Buildkite),
            "woodpecker" => Some(ForgeKind::Woodpecker),
            _ => None,
        }
    }
}

/// A forge runner as the forge knows it: a Forgejo/Gitea runner's uuid (lowercase,
/// hyphenated), the SHA-256 of a GitLab runner's authentication token (64 lowercase hex)
/// and the machine's `system_id`, if named, or a Buildkite agent's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ForgeIdentity {
    pub kind: ForgeKind,
    /// The uuid, the token's SHA-256, or the agent's name.
    pub key: String,
    /// A GitLab machine's `system_id` (gitlab-runner's `.runner_system_id`). In a binding,
    /// `None` is the token alone (any machine); in a fetch, that it named none.
    pub system_id: Option<String>,
}

/// The longest `system_id` kept (gitlab-runner's are 14 characters: `s_` or `r_` and 12 hex).
pub const SYSTEM_ID_MAX_CHARS: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadIdentity {
    #[error("kind: `{0}` is not forgejo, gitea, gitlab, buildkite or woodpecker")]
    Kind(String),
    #[error(
        "uuid: a forgejo or gitea runner is named by its uuid (the `uuid` of its .runner file)"
    )]
    Uuid,
    #[error(
        "token_sha256: a gitlab runner is named by the SHA-256 of its token, 64 lowercase hex characters"
    )]
    TokenSha256,
    #[error(
        "token_sha256: a forgejo runner's token is given as its SHA-256, 64 lowercase hex characters"
    )]
    RunnerTokenSha256,
    #[error(
        "system_id: a gitlab runner's system_id (its .runner_system_id), 1 to 64 letters, digits, `_`, `-` or `.`"
    )]
    SystemId,
    #[error("system_id: only a gitlab runner has one")]
    SystemIdNotGitlab,
    #[error(
        "agent_name: a buildkite agent is named by its name as Buildkite shows it, 1 to 255 characters, no control characters, no space first or last"
    )]
    AgentName,
    #[error("agent_name: only a buildkite agent has one")]
    AgentNameNotBuildkite,
    #[error(
        "a buildkite agent is named by its agent_name alone (no uuid, token_sha256 or system_id)"
    )]
    BuildkiteExtra,
    #[error(
        "agent_id: a woodpecker agent is named by its agent_id (its agent config file's `agent_id`), a positive integer"
    )]
    AgentId,
    #[error("agent_id: only a woodpecker agent has one")]
    AgentIdNotWoodpecker,
    #[error("a woodpecker agent is named by its agent_id alone")]
    WoodpeckerAgentIdOnly,
}

/// The longest Buildkite agent name kept (Buildkite's names are hostnames and a spawn number).
pub const AGENT_NAME_MAX_CHARS: usize = 255;

/// Whether `s` is 64 lowercase hex characters (a SHA-256 as leasegate writes it).
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The hex SHA-256 of `s`.
pub fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// A `system_id` as a binding may name it.
pub fn check_system_id(s: &str) -> Result<String, BadIdentity> {
    let ok = (1..=SYSTEM_ID_MAX_CHARS).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(BadIdentity::SystemId)
    }
}

impl ForgeIdentity {
    /// A Forgejo/Gitea runner by the uuid it sends as `x-runner-uuid`.
    pub fn forgejo(uuid: &str) -> Result<Self, BadIdentity> {
        let uuid = uuid::Uuid::parse_str(uuid.trim()).map_err(|_| BadIdentity::Uuid)?;
        Ok(ForgeIdentity {
            kind: ForgeKind::Forgejo,
            key: uuid.hyphenated().to_string(),
            system_id: None,
        })
    }

    /// A GitLab runner by the SHA-256 of its token, as an operator or the agent gives it.
    pub fn gitlab_sha256(token_sha256: &str) -> Result<Self, BadIdentity> {
        if !is_sha256_hex(token_sha256) {
            return Err(BadIdentity::TokenSha256);
        }
        Ok(ForgeIdentity {
            kind: ForgeKind::Gitlab,
            key: token_sha256.to_string(),
            system_id: None,
        })
    }

    /// A GitLab runner by the token it presents (never kept: only its SHA-256 is).
    pub fn gitlab_token(token: &str) -> Self {
        ForgeIdentity {
            kind: ForgeKind::Gitlab,
            key: sha256_hex(token),
            system_id: None,
        }
    }

    /// A Buildkite agent by its name, compared exactly (Buildkite's own `?name=` filter is
    /// not exact).
    pub fn buildkite(name: &str) -> Result<Self, BadIdentity> {
        let ok = (1..=AGENT_NAME_MAX_CHARS).contains(&name.chars().count())
            && !name.starts_with(' ')
            && !name.ends_with(' ')
            && !name.chars().any(char::is_control);
        if !ok {
            return Err(BadIdentity::AgentName);
        }
        Ok(ForgeIdentity {
            kind: ForgeKind::Buildkite,
            key: name.to_string(),
            system_id: None,
        })
    }

    /// A Woodpecker agent by the id its server gave it (the `agent_id` of its access token, and
    /// of its agent config file).
    pub fn woodpecker(agent_id: i64) -> Self {
        ForgeIdentity {
            kind: ForgeKind::Woodpecker,
            key: agent_id.to_string(),
            system_id: None,
        }
    }

    /// A Woodpecker agent's id, for a binding: a server's ids start at 1 (an agent that has
    /// not registered yet holds -1).
    pub fn woodpecker_binding(agent_id: i64) -> Result<Self, BadIdentity> {
        if agent_id < 1 {
            return Err(BadIdentity::AgentId);
        }
        Ok(Self::woodpecker(agent_id))
    }

    /// A Woodpecker agent's id, for views (`None` for other forges).
    pub fn agent_id(&self) -> Option<i64> {
        match self.kind {
            ForgeKind::Woodpecker => self.key.parse().ok(),
            _ => None,
        }
    }

    /// The same runner on the machine named `system_id` (none: the token alone).
    pub fn on_machine(mut self, system_id: Option<String>) -> Self {
        self.system_id = system_id.filter(|s| !s.is_empty());
        self
    }
}

/// A forge runner as a binding names it: its identity and, for a Forgejo runner, the SHA-256
/// of its token when known (a fetch is then judged only when it presents that token).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ForgeRunner {
    pub identity: ForgeIdentity,
    /// A Forgejo runner's token's SHA-256; always `None` for GitLab, whose key is one.
    pub token_sha256: Option<String>,
}

impl ForgeRunner {
    /// From the parts of a binding as the API and the `forge_runners` claim write it:
    /// `forgejo` (or `gitea`) with `uuid` and an optional `token_sha256`, `gitlab` with
    /// `token_sha256` and an optional `system_id`, `buildkite` with `agent_name` alone, or
    /// `woodpecker` with `agent_id` alone.
    pub fn parse(
        kind: &str,
        uuid: Option<&str>,
        token_sha256: Option<&str>,
        system_id: Option<&str>,
        agent_name: Option<&str>,
        agent_id: Option<i64>,
    ) -> Result<Self, BadIdentity> {
        let kind = ForgeKind::parse(kind).ok_or_else(|| BadIdentity::Kind(kind.to_string()))?;
        if kind != ForgeKind::Buildkite && agent_name.is_some() {
            return Err(BadIdentity::AgentNameNotBuildkite);
        }
        if kind != ForgeKind::Woodpecker && agent_id.is_some() {
            return Err(BadIdentity::AgentIdNotWoodpecker);
        }
        match kind {
            ForgeKind::Woodpecker => {
                if uuid.is_some() || token_sha256.is_some() || system_id.is_some() {
                    return Err(BadIdentity::WoodpeckerAgentIdOnly);
                }
                Ok(ForgeRunner::of(ForgeIdentity::woodpecker_binding(
                    agent_id.ok_or(BadIdentity::AgentId)?,
                )?))
            }
            ForgeKind::Forgejo => {
                if system_id.is_some() {
                    return Err(BadIdentity::SystemIdNotGitlab);
                }
                let identity = ForgeIdentity::forgejo(uuid.ok_or(BadIdentity::Uuid)?)?;
                let token_sha256 = match token_sha256 {
                    Some(t) if is_sha256_hex(t) => Some(t.to_string()),
                    Some(_) => return Err(BadIdentity::RunnerTokenSha256),
                    None => None,
                };
                Ok(ForgeRunner {
                    identity,
                    token_sha256,
                })
            }
            ForgeKind::Gitlab => {
                let identity =
                    ForgeIdentity::gitlab_sha256(token_sha256.ok_or(BadIdentity::TokenSha256)?)?
                        .on_machine(system_id.map(check_system_id).transpose()?);
                Ok(ForgeRunner {
                    identity,
                    token_sha256: None,
                })
            }
            ForgeKind::Buildkite => {
                if uuid.is_some() || token_sha256.is_some() || system_id.is_some() {
                    return Err(BadIdentity::BuildkiteExtra);
                }
                let name = agent_name.ok_or(BadIdentity::AgentName)?;
                Ok(ForgeRunner::of(ForgeIdentity::buildkite(name)?))
            }
        }
    }

    /// A binding by identity alone.
    pub fn of(identity: ForgeIdentity) -> Self {
        ForgeRunner {
            identity,
            token_sha256: None,
        }
    }

    /// From the JSON object the API and the claim write (`{"kind": …}`), unknown members
    /// refused.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, String> {
        let Some(o) = v.as_object() else {
            return Err("a forge runner is an object".into());
        };
        if let Some(k) = o.keys().find(|k| {
            ![
                "kind",
                "uuid",
                "token_sha256",
                "system_id",
                "agent_name",
                "agent_id",
            ]
            .contains(&k.as_str())
        }) {
            return Err(format!("unknown member `{k}`"));
        }
        let text = |name: &str| -> Result<Option<&str>, String> {
            match o.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s)),
                Some(_) => Err(format!("{name}: a string")),
            }
        };
        let kind = text("kind")?.ok_or("kind: required")?;
        let agent_id = match o.get("agent_id") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(v.as_i64().ok_or("agent_id: an integer")?),
        };
        Self::parse(
            kind,
            text("uuid")?,
            text("token_sha256")?,
            text("system_id")?,
            text("agent_name")?,
            agent_id,
        )
        .map_err(|e| e.to_string())
    }

    /// The JSON object the API and the claim write.
    pub fn to_json(&self) -> serde_json::Value {
        let mut o = serde_json::Map::new();
        o.insert("kind".into(), self.identity.kind.as_str().into());
        match self.identity.kind {
            ForgeKind::Forgejo => {
                o.insert("uuid".into(), self.identity.key.clone().into());
                if let Some(t) = &self.token_sha256 {
                    o.insert("token_sha256".into(), t.clone().into());
                }
            }
            ForgeKind::Gitlab => {
                o.insert("token_sha256".into(), self.identity.key.clone().into());
                if let Some(s) = &self.identity.system_id {
                    o.insert("system_id".into(), s.clone().into());
                }
            }
            ForgeKind::Buildkite => {
                o.insert("agent_name".into(), self.identity.key.clone().into());
            }
            ForgeKind::Woodpecker => {
                o.insert("agent_id".into(), self.identity.agent_id().into());
            }
        }
        serde_json::Value::Object(o)
    }

    /// How an operator reads it in an audit entry or a log line.
    pub fn label(&self) -> String {
        let i = &self.identity;
        let mut out = format!("{}:{}", i.kind.as_str(), i.key);
        if let Some(s) = &i.system_id {
            out.push_str(&format!(" system_id {s}"));
        }
        if self.token_sha256.is_some() {
            out.push_str(" (token checked)");
        }
        out
    }
}

/// The most forge runners one leasegate runner may carry (a gitlab-runner `config.toml` with
/// many `[[runners]]` stays far below it).
pub const MAX_FORGE_RUNNERS: usize = 64;

/// A binding of a forge runner to a leasegate runner, as views show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgeBinding {
    pub identity: ForgeIdentity,
    /// A Forgejo runner's token's SHA-256, when the binding holds it.
    pub token_sha256: Option<String>,
    /// The last fetch the gate saw from it (updated at most every `FETCH_NOTE_INTERVAL_S`).
    pub last_fetch_at: Option<Millis>,
}

/// How often a binding's `last_fetch_at` is written: a forge runner asks every few seconds,
/// and a write per ask would be most of the store's work.
pub const FETCH_NOTE_INTERVAL_S: i64 = 30;

impl ForgeBinding {
    /// Whether a fetch at `now` should be written down.
    pub fn fetch_worth_noting(&self, now: Millis) -> bool {
        self.last_fetch_at
            .is_none_or(|at| now.secs_since(at) >= FETCH_NOTE_INTERVAL_S)
    }

    /// Whether a fetch presenting `token` is this binding's runner's: always, unless the
    /// binding holds the runner's token's SHA-256 and the fetch presents another token (or
    /// none). Such a fetch only names the uuid; the forge refuses its token.
    pub fn owns_fetch(&self, token: Option<&str>) -> bool {
        use subtle::ConstantTimeEq;
        match &self.token_sha256 {
            None => true,
            Some(want) => {
                token.is_some_and(|t| bool::from(sha256_hex(t).as_bytes().ct_eq(want.as_bytes())))
            }
        }
    }

    /// The binding as a binding's spec names it.
    pub fn runner(&self) -> ForgeRunner {
        ForgeRunner {
            identity: self.identity.clone(),
            token_sha256: self.token_sha256.clone(),
        }
    }
}

/// A runner's standing for what acts on it through a forge's API rather than at its fetch
/// (GitHub's registrations, Buildkite's pauses): the lease's rules (`fetch::standing`), a
/// refusal in a pool that only observes kept apart. The answer is kept here, below the rules
/// that give it, because those registrations sit beside a pool's GitHub settings, under the
/// pool that the rules read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    Admitted,
    /// Refused, in a pool that enforces: its code and detail.
    Refused {
        code: String,
        detail: String,
    },
    /// Would be refused, in a pool that observes.
    Observed {
        code: String,
        detail: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = Millis(1_800_000_000_000);
    #[test]
    fn identities_are_normalised_and_checked() {
        let a = ForgeIdentity::forgejo("0B9A7E3C-55A1-4D4A-9C9D-1E2F3A4B5C6D").unwrap();
        assert_eq!(a.key, "0b9a7e3c-55a1-4d4a-9c9d-1e2f3a4b5c6d");
        assert_eq!(
            ForgeRunner::parse("gitea", Some(&a.key), None, None, None, None)
                .unwrap()
                .identity,
            a
        );
        assert_eq!(ForgeIdentity::forgejo("not-a-uuid"), Err(BadIdentity::Uuid));
        let t = ForgeIdentity::gitlab_token("glrt-secret");
        assert_eq!(t.key.len(), 64);
        assert_eq!(ForgeIdentity::gitlab_sha256(&t.key).unwrap(), t);
        assert_eq!(
            ForgeIdentity::gitlab_sha256(&t.key.to_uppercase()),
            Err(BadIdentity::TokenSha256)
        );
        assert!(matches!(
            ForgeRunner::parse("github", None, None, None, None, None),
            Err(BadIdentity::Kind(_))
        ));
    }

    #[test]
    fn a_woodpecker_agent_is_bound_by_its_agent_id_alone() {
        let agent = ForgeRunner::parse("woodpecker", None, None, None, None, Some(42)).unwrap();
        assert_eq!(agent.identity, ForgeIdentity::woodpecker(42));
        assert_eq!(agent.identity.agent_id(), Some(42));
        assert_eq!(
            agent.to_json(),
            serde_json::json!({"kind": "woodpecker", "agent_id": 42})
        );
        assert_eq!(ForgeRunner::from_json(&agent.to_json()).unwrap(), agent);
        for bad in [0, -1] {
            assert_eq!(
                ForgeRunner::parse("woodpecker", None, None, None, None, Some(bad)),
                Err(BadIdentity::AgentId)
            );
        }
        assert_eq!(
            ForgeRunner::parse("woodpecker", None, None, None, None, None),
            Err(BadIdentity::AgentId)
        );
        assert_eq!(
            ForgeRunner::parse("woodpecker", None, None, Some("s_1"), None, Some(1)),
            Err(BadIdentity::WoodpeckerAgentIdOnly)
        );
        let uuid = "0b9a7e3c-55a1-4d4a-9c9d-1e2f3a4b5c6d";
        assert_eq!(
            ForgeRunner::parse("forgejo", Some(uuid), None, None, None, Some(1)),
            Err(BadIdentity::AgentIdNotWoodpecker)
        );
        assert!(
            ForgeRunner::from_json(&serde_json::json!({"kind": "woodpecker", "agent_id": "42"}))
                .is_err()
        );
    }

    #[test]
    fn bindings_name_a_machine_or_a_token_and_round_trip_as_json() {
        let t = sha256_hex("glrt-fleet");
        let machine =
            ForgeRunner::parse("gitlab", None, Some(&t), Some("s_0123456789ab"), None, None)
                .unwrap();
        assert_eq!(
            machine.identity.system_id.as_deref(),
            Some("s_0123456789ab")
        );
        assert_eq!(ForgeRunner::from_json(&machine.to_json()).unwrap(), machine);
        let bare = ForgeRunner::parse("gitlab", None, Some(&t), None, None, None).unwrap();
        assert_ne!(bare.identity, machine.identity);
        assert_eq!(bare.to_json().get("system_id"), None);
        for bad in ["", "has space", &"x".repeat(65)] {
            assert_eq!(
                ForgeRunner::parse("gitlab", None, Some(&t), Some(bad), None, None),
                Err(BadIdentity::SystemId)
            );
        }
        let uuid = "0b9a7e3c-55a1-4d4a-9c9d-1e2f3a4b5c6d";
        assert_eq!(
            ForgeRunner::parse("forgejo", Some(uuid), None, Some("s_1"), None, None),
            Err(BadIdentity::SystemIdNotGitlab)
        );
        assert_eq!(
            ForgeRunner::parse("forgejo", Some(uuid), Some("secret"), None, None, None),
            Err(BadIdentity::RunnerTokenSha256)
        );
        let checked =
            ForgeRunner::parse("forgejo", Some(uuid), Some(&t), None, None, None).unwrap();
        assert_eq!(ForgeRunner::from_json(&checked.to_json()).unwrap(), checked);
        assert!(
            ForgeRunner::from_json(&serde_json::json!({"kind": "gitlab", "token": "glrt-x"}))
                .unwrap_err()
                .contains("token")
        );
    }

    #[test]
    fn a_buildkite_agent_is_bound_by_its_exact_name() {
        let a =
            ForgeRunner::parse("buildkite", None, None, None, Some("ci-1 (x86)"), None).unwrap();
        assert_eq!(a.identity.kind, ForgeKind::Buildkite);
        assert_eq!(a.identity.key, "ci-1 (x86)");
        assert_eq!(
            a.to_json(),
            serde_json::json!({"kind": "buildkite", "agent_name": "ci-1 (x86)"})
        );
        assert_eq!(ForgeRunner::from_json(&a.to_json()).unwrap(), a);
        for bad in ["", " padded", "line\nbreak", &"x".repeat(256)] {
            assert_eq!(
                ForgeRunner::parse("buildkite", None, None, None, Some(bad), None),
                Err(BadIdentity::AgentName),
                "{bad:?}"
            );
        }
        assert_eq!(
            ForgeRunner::parse("buildkite", None, None, None, None, None),
            Err(BadIdentity::AgentName)
        );
        assert_eq!(
            ForgeRunner::parse("buildkite", None, None, Some("s_1"), Some("a"), None),
            Err(BadIdentity::BuildkiteExtra)
        );
        let t = sha256_hex("glrt-x");
        assert_eq!(
            ForgeRunner::parse("gitlab", None, Some(&t), None, Some("a"), None),
            Err(BadIdentity::AgentNameNotBuildkite)
        );
    }

    #[test]
    fn a_binding_holding_the_token_owns_only_the_fetches_presenting_it() {
        let uuid = ForgeIdentity::forgejo("0b9a7e3c-55a1-4d4a-9c9d-1e2f3a4b5c6d").unwrap();
        let mut b = ForgeBinding {
            identity: uuid,
            token_sha256: None,
            last_fetch_at: None,
        };
        assert!(b.owns_fetch(None) && b.owns_fetch(Some("anything")));
        b.token_sha256 = Some(sha256_hex("the-token"));
        assert!(b.owns_fetch(Some("the-token")));
        assert!(!b.owns_fetch(Some("a-guess")));
        assert!(!b.owns_fetch(None));
    }

    #[test]
    fn fetches_are_noted_at_most_every_interval() {
        let b = |at: Option<Millis>| ForgeBinding {
            identity: ForgeIdentity::gitlab_token("t"),
            token_sha256: None,
            last_fetch_at: at,
        };
        assert!(b(None).fetch_worth_noting(NOW));
        assert!(!b(Some(NOW.minus_secs(5))).fetch_worth_noting(NOW));
        assert!(b(Some(NOW.minus_secs(FETCH_NOTE_INTERVAL_S))).fetch_worth_noting(NOW));
    }
}

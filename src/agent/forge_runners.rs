//! The forge runners on this machine, read from their own files, for the forge gate:
//!
//! - a Forgejo or Gitea runner's `.runner` (JSON: its `uuid` and `token`), or forgejo-runner's
//!   `config.yaml` (from version 12 it may keep its registrations there, under
//!   `server.connections.<name>`: `url`, `uuid`, `token`);
//! - gitlab-runner's `config.toml` (every `[[runners]]` entry's `token`) and the
//!   `.runner_system_id` beside it, which tells this machine apart from others sharing a token;
//! - a Woodpecker agent's config file (`{"agent_id": N}`, written when the agent registers).
//!
//! A Buildkite agent has no file leasegate reads: its name is given (`--buildkite-agent-name`)
//! and claimed as it is.
//!
//! Of each token only its SHA-256 leaves this machine. `register` binds what it reads; the
//! heartbeat reads the files again before every beat and claims what it finds
//! (`forge_runners` in the attestation), so the bindings follow a renewed token or a new
//! registration within one beat.

use crate::domain::forge::{
    ForgeIdentity, ForgeRunner, MAX_FORGE_RUNNERS, check_system_id, sha256_hex,
};
use std::path::{Path, PathBuf};

/// The forge runners' files named on the command line, and the Buildkite agents' names.
#[derive(Clone, Debug, Default)]
pub struct ForgeFiles {
    pub forgejo: Vec<PathBuf>,
    pub gitlab: Vec<PathBuf>,
    pub buildkite_agents: Vec<String>,
    pub woodpecker: Vec<PathBuf>,
}

impl ForgeFiles {
    /// Whether any file is named: with none, the agent claims nothing and leaves the bindings
    /// to the operator.
    pub fn any(&self) -> bool {
        !self.forgejo.is_empty()
            || !self.gitlab.is_empty()
            || !self.buildkite_agents.is_empty()
            || !self.woodpecker.is_empty()
    }

    /// Every forge runner the files name, each once, at most `MAX_FORGE_RUNNERS`.
    pub fn read(&self) -> Result<Vec<ForgeRunner>, String> {
        let mut found: Vec<ForgeRunner> = Vec::new();
        let mut add = |more: Vec<ForgeRunner>| {
            for r in more {
                if !found.iter().any(|f| f.identity == r.identity) {
                    found.push(r);
                }
            }
        };
        for path in &self.forgejo {
            add(from_forgejo_file(path)?);
        }
        for path in &self.gitlab {
            add(from_gitlab_config(path)?);
        }
        for name in &self.buildkite_agents {
            let identity = ForgeIdentity::buildkite(name)
                .map_err(|e| format!("--buildkite-agent-name {name:?}: {e}"))?;
            add(vec![ForgeRunner::of(identity)]);
        }
        for path in &self.woodpecker {
            add(vec![from_woodpecker_agent_config(path)?]);
        }
        if found.len() > MAX_FORGE_RUNNERS {
            return Err(format!(
                "{} forge runners found: at most {MAX_FORGE_RUNNERS} may be bound to one runner",
                found.len()
            ));
        }
        Ok(found)
    }
}

/// The forge runners of a Forgejo/Gitea runner's `.runner` or forgejo-runner's `config.yaml`.
pub fn from_forgejo_file(path: &Path) -> Result<Vec<ForgeRunner>, String> {
    let what = |e: &dyn std::fmt::Display| format!("--forgejo-runner-file {}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| what(&e))?;
    // YAML reads JSON too: one parser for both files.
    let v: serde_norway::Value = serde_norway::from_str(&text).map_err(|e| {
        what(&format!(
            "neither the runner's JSON registration nor a YAML config ({e})"
        ))
    })?;
    if v.get("uuid").is_some() {
        return Ok(vec![registration(&v).map_err(|e| what(&e))?]);
    }
    let Some(connections) = v
        .get("server")
        .and_then(|s| s.get("connections"))
        .and_then(|c| c.as_mapping())
    else {
        return Err(what(
            &"no `uuid` (a .runner file: is the runner registered?) and no \
              `server.connections` (a config.yaml of forgejo-runner 12 or later)",
        ));
    };
    let found = connections
        .iter()
        .map(|(name, c)| {
            registration(c).map_err(|e| {
                what(&format!(
                    "server.connections.{}: {e}",
                    name.as_str().unwrap_or("?")
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if found.is_empty() {
        return Err(what(&"server.connections names no runner"));
    }
    Ok(found)
}

/// One registration: a `uuid` and, when present, the `token` (kept as its SHA-256).
fn registration(v: &serde_norway::Value) -> Result<ForgeRunner, String> {
    let uuid = v
        .get("uuid")
        .and_then(|u| u.as_str())
        .ok_or("no `uuid` (is the runner registered?)")?;
    let identity = ForgeIdentity::forgejo(uuid).map_err(|e| e.to_string())?;
    let token = v
        .get("token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty());
    Ok(ForgeRunner {
        identity,
        token_sha256: token.map(sha256_hex),
    })
}

/// The forge runners of a gitlab-runner `config.toml`: one per `[[runners]]` with a token, on
/// the machine named by the `.runner_system_id` beside it (if there is one).
pub fn from_gitlab_config(path: &Path) -> Result<Vec<ForgeRunner>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--gitlab-config {}: {e}", path.display()))?;
    let config: toml::Table = text
        .parse()
        .map_err(|e| format!("--gitlab-config {}: not TOML ({e})", path.display()))?;
    let runners = config
        .get("runners")
        .and_then(|r| r.as_array())
        .ok_or_else(|| format!("--gitlab-config {}: no [[runners]]", path.display()))?;
    let system_id = system_id_beside(path)?;
    let found: Vec<ForgeRunner> = runners
        .iter()
        .filter_map(|r| r.get("token")?.as_str())
        .filter(|t| !t.is_empty())
        .map(|t| ForgeRunner::of(ForgeIdentity::gitlab_token(t).on_machine(system_id.clone())))
        .collect();
    if found.is_empty() {
        return Err(format!(
            "--gitlab-config {}: no [[runners]] entry has a token (is the runner registered?)",
            path.display()
        ));
    }
    Ok(found)
}

/// The agent a Woodpecker agent's config file names: its `agent_id`, which the agent writes
/// there once its server has registered it (`-1`, or no file, before).
pub fn from_woodpecker_agent_config(path: &Path) -> Result<ForgeRunner, String> {
    let what =
        |e: &dyn std::fmt::Display| format!("--woodpecker-agent-config {}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| what(&e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| what(&e))?;
    let agent_id = v
        .get("agent_id")
        .and_then(|a| a.as_i64())
        .ok_or_else(|| what(&"no integer `agent_id`"))?;
    let identity = ForgeIdentity::woodpecker_binding(agent_id).map_err(|_| {
        what(&format!(
            "agent_id {agent_id}: the agent has not registered with its server yet (start it once)"
        ))
    })?;
    Ok(ForgeRunner::of(identity))
}

/// gitlab-runner's `.runner_system_id` in the directory of `config`: `None` when there is none
/// (a gitlab-runner older than 15.11 writes none; its runners are bound by token alone).
fn system_id_beside(config: &Path) -> Result<Option<String>, String> {
    let path = config
        .parent()
        .unwrap_or(Path::new("."))
        .join(".runner_system_id");
    match std::fs::read_to_string(&path) {
        Ok(text) => check_system_id(text.trim())
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::forge::ForgeKind;

    const UUID: &str = "0b9a7e3c-55a1-4d4a-9c9d-1e2f3a4b5c6d";

    #[test]
    fn reads_a_forgejo_runner_file_and_a_gitlab_config() {
        let dir = tempfile::tempdir().unwrap();
        let runner = dir.path().join(".runner");
        std::fs::write(
            &runner,
            r#"{"WARNING": "generated", "id": 3, "uuid": "0B9A7E3C-55A1-4D4A-9C9D-1E2F3A4B5C6D", "name": "r", "token": "t", "address": "https://forge.example", "labels": ["ubuntu-latest:docker://node:20"]}"#,
        )
        .unwrap();
        let ids = from_forgejo_file(&runner).unwrap();
        assert_eq!(
            (ids[0].identity.kind, ids[0].identity.key.as_str()),
            (ForgeKind::Forgejo, UUID)
        );
        assert_eq!(ids[0].token_sha256, Some(sha256_hex("t")));

        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            "concurrent = 2\ncheck_interval = 0\n\n[[runners]]\n  name = \"a\"\n  url = \"https://gitlab.example\"\n  id = 1\n  token = \"glrt-one\"\n  executor = \"shell\"\n\n[[runners]]\n  name = \"b\"\n  url = \"https://gitlab.example\"\n  token = \"glrt-two\"\n  executor = \"docker\"\n",
        )
        .unwrap();
        let ids = from_gitlab_config(&config).unwrap();
        assert_eq!(
            ids,
            vec![
                ForgeRunner::of(ForgeIdentity::gitlab_token("glrt-one")),
                ForgeRunner::of(ForgeIdentity::gitlab_token("glrt-two"))
            ]
        );
        // The token itself never leaves: only its hash is an identity.
        assert!(!ids[0].identity.key.contains("glrt"));
        // With gitlab-runner's system id beside it, each is this machine's.
        std::fs::write(dir.path().join(".runner_system_id"), "s_0123456789ab\n").unwrap();
        let ids = from_gitlab_config(&config).unwrap();
        assert!(
            ids.iter()
                .all(|i| i.identity.system_id.as_deref() == Some("s_0123456789ab"))
        );
        std::fs::write(dir.path().join(".runner_system_id"), "not one\n").unwrap();
        assert!(from_gitlab_config(&config).is_err());

        std::fs::write(&config, "concurrent = 1\n").unwrap();
        assert!(
            from_gitlab_config(&config)
                .unwrap_err()
                .contains("no [[runners]]")
        );
        assert!(from_forgejo_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn reads_the_connections_of_a_forgejo_runner_config() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "log:\n  level: info\nrunner:\n  capacity: 1\nserver:\n  connections:\n    forgejo:\n      url: https://forge.example/\n      uuid: {UUID}\n      token: secret-one\n      labels: [docker]\n    other:\n      url: https://other.example/\n      uuid: 1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9\n      token: secret-two\n"
            ),
        )
        .unwrap();
        let ids = from_forgejo_file(&config).unwrap();
        assert_eq!(ids.len(), 2);
        assert_eq!(ids[0].identity.key, UUID);
        assert_eq!(ids[0].token_sha256, Some(sha256_hex("secret-one")));
        assert_eq!(ids[1].token_sha256, Some(sha256_hex("secret-two")));

        // A config that keeps its registration in .runner (before version 12) says so.
        std::fs::write(&config, "runner:\n  file: .runner\n").unwrap();
        assert!(
            from_forgejo_file(&config)
                .unwrap_err()
                .contains("server.connections")
        );
        std::fs::write(&config, "server:\n  connections:\n    a:\n      url: x\n").unwrap();
        assert!(from_forgejo_file(&config).unwrap_err().contains("uuid"));

        // Both kinds of file at once, a repeat counted once.
        let runner = dir.path().join(".runner");
        std::fs::write(
            &runner,
            format!(r#"{{"uuid": "{UUID}", "token": "secret-one"}}"#),
        )
        .unwrap();
        std::fs::write(
            &config,
            format!(
                "server:\n  connections:\n    f:\n      uuid: {UUID}\n      token: secret-one\n"
            ),
        )
        .unwrap();
        let mut files = ForgeFiles {
            forgejo: vec![runner, config],
            gitlab: vec![],
            buildkite_agents: vec![],
            woodpecker: vec![],
        };
        assert_eq!(files.read().unwrap().len(), 1);
        // Buildkite agents by name, beside them; a name Buildkite cannot show is refused.
        files.buildkite_agents = vec!["ci-1".into(), "ci-2".into(), "ci-1".into()];
        let read = files.read().unwrap();
        assert_eq!(read.len(), 3);
        assert_eq!(read[2].identity, ForgeIdentity::buildkite("ci-2").unwrap());
        files.buildkite_agents = vec![" ci-1".into()];
        assert!(files.read().unwrap_err().contains("--buildkite-agent-name"));
    }

    #[test]
    fn reads_a_woodpecker_agents_config_once_it_has_registered() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("agent.conf");
        std::fs::write(&config, r#"{"agent_id": 17}"#).unwrap();
        let agent = from_woodpecker_agent_config(&config).unwrap();
        assert_eq!(agent.identity, ForgeIdentity::woodpecker(17));
        std::fs::write(&config, r#"{"agent_id": -1}"#).unwrap();
        let unregistered = from_woodpecker_agent_config(&config).unwrap_err();
        assert!(unregistered.contains("not registered"), "{unregistered}");
        std::fs::write(&config, r#"{"id": 17}"#).unwrap();
        assert!(from_woodpecker_agent_config(&config).is_err());
    }
}

//! The forge runners on this machine, read from their own files, for the forge gate: a
//! Forgejo or Gitea runner's `.runner` (JSON; its `uuid`) and gitlab-runner's `config.toml`
//! (every `[[runners]]` entry's `token`, of which only the SHA-256 leaves this machine).

use crate::domain::forge::ForgeIdentity;
use std::path::Path;

/// The forge runner of a Forgejo/Gitea runner's registration file.
pub fn from_forgejo_runner_file(path: &Path) -> Result<ForgeIdentity, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--forgejo-runner-file {}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "--forgejo-runner-file {}: not the runner's JSON registration ({e})",
            path.display()
        )
    })?;
    let uuid = v["uuid"].as_str().ok_or_else(|| {
        format!(
            "--forgejo-runner-file {}: no `uuid` (is the runner registered?)",
            path.display()
        )
    })?;
    ForgeIdentity::forgejo(uuid)
        .map_err(|e| format!("--forgejo-runner-file {}: {e}", path.display()))
}

/// The forge runners of a gitlab-runner `config.toml`: one per `[[runners]]` with a token.
pub fn from_gitlab_config(path: &Path) -> Result<Vec<ForgeIdentity>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--gitlab-config {}: {e}", path.display()))?;
    let config: toml::Table = text
        .parse()
        .map_err(|e| format!("--gitlab-config {}: not TOML ({e})", path.display()))?;
    let runners = config
        .get("runners")
        .and_then(|r| r.as_array())
        .ok_or_else(|| format!("--gitlab-config {}: no [[runners]]", path.display()))?;
    let identities: Vec<ForgeIdentity> = runners
        .iter()
        .filter_map(|r| r.get("token")?.as_str())
        .filter(|t| !t.is_empty())
        .map(ForgeIdentity::gitlab_token)
        .collect();
    if identities.is_empty() {
        return Err(format!(
            "--gitlab-config {}: no [[runners]] entry has a token (is the runner registered?)",
            path.display()
        ));
    }
    Ok(identities)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::forge::ForgeKind;

    #[test]
    fn reads_a_forgejo_runner_file_and_a_gitlab_config() {
        let dir = tempfile::tempdir().unwrap();
        let runner = dir.path().join(".runner");
        std::fs::write(
            &runner,
            r#"{"WARNING": "generated", "id": 3, "uuid": "0B9A7E3C-55A1-4D4A-9C9D-1E2F3A4B5C6D", "name": "r", "token": "t", "address": "https://forge.example", "labels": ["ubuntu-latest:docker://node:20"]}"#,
        )
        .unwrap();
        let id = from_forgejo_runner_file(&runner).unwrap();
        assert_eq!(
            (id.kind, id.key.as_str()),
            (ForgeKind::Forgejo, "0b9a7e3c-55a1-4d4a-9c9d-1e2f3a4b5c6d")
        );

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
                ForgeIdentity::gitlab_token("glrt-one"),
                ForgeIdentity::gitlab_token("glrt-two")
            ]
        );
        // The token itself never leaves: only its hash is an identity.
        assert!(!ids[0].key.contains("glrt"));

        std::fs::write(&config, "concurrent = 1\n").unwrap();
        assert!(
            from_gitlab_config(&config)
                .unwrap_err()
                .contains("no [[runners]]")
        );
        assert!(from_forgejo_runner_file(&dir.path().join("missing")).is_err());
    }
}

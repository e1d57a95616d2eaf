//! The runner's state file: who the service says this runner is, and the parameters it was
//! given at registration (JSON, mode 0600).
//!
//! Why a file: `register` spends a single-use token, so its answer must outlive the process;
//! every later command (preflight, heartbeat, lease) reads the runner ID, the audience and the
//! server's URL from here instead of asking the operator to repeat them.

use super::file_access;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerState {
    pub runner_id: String,
    /// The name this runner registered with.
    pub name: String,
    pub pool: String,
    /// The service's base URL, e.g. `https://leasegate.example`.
    pub server: String,
    /// The `aud` every attestation must carry.
    pub audience: String,
    pub heartbeat_interval_s: u64,
    pub attestation_max_age_s: u64,
    pub probe_max_age_s: u64,
    /// RFC 3339, for the operator reading the file.
    #[serde(default)]
    pub registered_at: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{0} already exists; it names a registered runner (move it aside to register again)")]
    Exists(PathBuf),
    /// This process's user may not read it (or its directory): the sentence says who, where
    /// and what to change.
    #[error("{explanation}")]
    Denied { path: PathBuf, explanation: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a leasegate runner state file: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

fn io(path: &Path, source: std::io::Error) -> StateError {
    match source.kind() {
        std::io::ErrorKind::PermissionDenied => StateError::Denied {
            path: path.to_path_buf(),
            explanation: file_access::explain_denied(
                "state file",
                path,
                &file_access::User::current(),
                &file_access::refusal(path),
            ),
        },
        _ => StateError::Io {
            path: path.to_path_buf(),
            source,
        },
    }
}

impl RunnerState {
    pub fn load(path: &Path) -> Result<Self, StateError> {
        let text = std::fs::read_to_string(path).map_err(|e| io(path, e))?;
        serde_json::from_str(&text).map_err(|e| StateError::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// Fails early, before a registration token is spent, when `path` is taken.
    pub fn ensure_absent(path: &Path) -> Result<(), StateError> {
        if path.exists() {
            Err(StateError::Exists(path.to_path_buf()))
        } else {
            Ok(())
        }
    }

    /// Writes the state to a new file at `path` (mode 0600), never over an existing one.
    pub fn create(&self, path: &Path) -> Result<(), StateError> {
        let fail = |source| io(path, source);
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(fail)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => StateError::Exists(path.to_path_buf()),
                _ => fail(e),
            })?;
        let mut text = serde_json::to_string_pretty(self).expect("state serialises");
        text.push('\n');
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn state_round_trips_privately_and_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner.json");
        let state = RunnerState {
            runner_id: "r-1".into(),
            name: "build-01".into(),
            pool: "linux".into(),
            server: "http://127.0.0.1:8080".into(),
            audience: "leasegate".into(),
            heartbeat_interval_s: 15,
            attestation_max_age_s: 60,
            probe_max_age_s: 300,
            registered_at: None,
        };
        RunnerState::ensure_absent(&path).unwrap();
        state.create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(RunnerState::load(&path).unwrap(), state);
        assert!(matches!(state.create(&path), Err(StateError::Exists(_))));
        assert!(RunnerState::ensure_absent(&path).is_err());
    }
}

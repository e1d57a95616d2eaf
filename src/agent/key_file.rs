//! The runner's private key on disk: created once with mode 0600, never overwritten, and
//! refused when others can read it.
//!
//! Why so strict: the key is the runner's whole identity. Anyone who can read it can attest as
//! this runner, so a key that was ever readable by others must be treated as leaked (rotate it)
//! rather than silently used; and overwriting one would orphan the registered runner.

use super::file_access;
use super::keys::RunnerKey;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error(
        "{0} already exists; refusing to overwrite a runner key (move it aside to make a new one)"
    )]
    Exists(PathBuf),
    #[error(
        "{path} is readable or writable by group or others (mode {mode:04o}); a key that others could read must be rotated (or, if it never left this machine, `chmod 600 {path}`)"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    /// This process's user may not read it (or its directory): the sentence says who, where
    /// and what to change.
    #[error("{explanation}")]
    Denied { path: PathBuf, explanation: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeyFileError + '_ {
    move |source| match source.kind() {
        std::io::ErrorKind::PermissionDenied => KeyFileError::Denied {
            path: path.to_path_buf(),
            explanation: file_access::explain_denied(
                "key",
                path,
                &file_access::User::current(),
                &file_access::refusal(path),
            ),
        },
        _ => KeyFileError::Io {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// Generates a key and writes it to `path` as PKCS#8 PEM, mode 0600. A missing parent
/// directory is created with mode 0700. Fails if `path` exists.
pub fn create(path: &Path) -> Result<RunnerKey, KeyFileError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io(parent))?;
    }
    let key = RunnerKey::generate();
    // `create_new` makes "refuse to overwrite" atomic: no window between a check and the write.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => KeyFileError::Exists(path.to_path_buf()),
            _ => io(path)(e),
        })?;
    let written = file
        .write_all(key.to_pkcs8_pem().as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        // A half-written key must not be mistaken for a key later.
        let _ = std::fs::remove_file(path);
        return Err(io(path)(e));
    }
    Ok(key)
}

/// Reads the key at `path`, refusing one that group or others may read or write.
pub fn load(path: &Path) -> Result<RunnerKey, KeyFileError> {
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if !meta.is_file() {
        return Err(KeyFileError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    let pem = std::fs::read_to_string(path).map_err(io(path))?;
    RunnerKey::from_pkcs8_pem(&pem).map_err(|reason| KeyFileError::Invalid {
        path: path.to_path_buf(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_keys_are_private_load_back_and_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/runner.key");
        let key = create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load(&path).unwrap().public_x(), key.public_x());
        assert!(matches!(create(&path), Err(KeyFileError::Exists(_))));
        assert_eq!(load(&path).unwrap().public_x(), key.public_x(), "unchanged");
    }

    #[test]
    fn a_key_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner.key");
        create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = load(&path).err().unwrap();
        assert!(err.to_string().contains("mode 0644"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(load(&path).is_ok());
    }
}

//! Where a SQLite database is to live, checked before `serve` writes anything: its directory
//! exists and takes new files, and the database's files, where they exist, can be written.
//!
//! SQLite opens a file it cannot write read-only, without a word, and the service would then
//! start and fail every write after. `serve` also creates its lock file and the generated
//! tokens beside the database. So a place where that cannot work stops the start here, with
//! the path and what to do, rather than half way through or a second later in the logs.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Checks that the SQLite database at `path` can be created or written.
pub fn check(path: &Path) -> anyhow::Result<()> {
    let dir = directory(path);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => anyhow::bail!(
            "DATABASE_URL: {} is not a directory; name a file in a directory",
            dir.display()
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => anyhow::bail!("{}", missing(path, dir)),
        Err(e) => anyhow::bail!(
            "DATABASE_URL: cannot reach the directory {}: {e}",
            dir.display()
        ),
    }
    takes_new_files(dir).map_err(|e| {
        anyhow::anyhow!(
            "the directory {} of the SQLite database cannot be written: {e}. The database, \
             its -wal, -shm and .lock files and any generated token files are created there: \
             make it writable by the user leasegate runs as, or name another place in \
             DATABASE_URL",
            shown(dir)
        )
    })?;
    for file in files_of(path) {
        match std::fs::OpenOptions::new().write(true).open(&file) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!(
                "the SQLite file {} cannot be written: {e}. Make it writable by the user \
                 leasegate runs as (chown, chmod u+w), or copy the database somewhere writable \
                 and name that in DATABASE_URL",
                shown(&file)
            ),
        }
    }
    Ok(())
}

/// A path as the error shows it: absolute, so that `.` says which directory it is.
fn shown(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// The file's directory: `.` for a bare file name.
fn directory(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// The files SQLite and `serve` keep for the database at `path`.
fn files_of(path: &Path) -> Vec<PathBuf> {
    let with = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    vec![
        path.to_path_buf(),
        with("-wal"),
        with("-shm"),
        with(".lock"),
    ]
}

/// Whether a file can be created in `dir`: tried, not deduced from modes, which root ignores
/// and which say nothing of a read-only mount or an immutable directory.
fn takes_new_files(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(
        ".leasegate-write-check-{}",
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// The error for a missing directory. A relative path whose directory exists from `/` was
/// most likely meant as absolute: `sqlite://tmp/x.db` is `tmp/x.db`, `sqlite:///tmp/x.db` is
/// `/tmp/x.db`.
fn missing(path: &Path, dir: &Path) -> String {
    let absolute = Path::new("/").join(path);
    if path.is_relative() && directory(&absolute).is_dir() {
        return format!(
            "DATABASE_URL: the directory {} does not exist in the working directory; did you \
             mean sqlite://{} (three slashes for an absolute path)?",
            dir.display(),
            absolute.display()
        );
    }
    format!(
        "DATABASE_URL: the directory {} of the SQLite file does not exist; create it \
         (mkdir -p {}) or name a file in a directory that exists",
        dir.display(),
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_named_and_a_lost_slash_is_pointed_out() {
        let dir = tempfile::tempdir().unwrap();
        let nowhere = dir.path().join("no/such/dir/x.db");
        let e = check(&nowhere).unwrap_err().to_string();
        assert!(
            e.contains("no/such/dir of the SQLite file does not exist"),
            "{e}"
        );
        assert!(e.contains("mkdir -p"), "{e}");
        // `tmp` is not in the test's working directory (the crate), but `/tmp` is.
        assert!(!Path::new("tmp").exists());
        let e = check(Path::new("tmp/x.db")).unwrap_err().to_string();
        assert!(
            e.contains("did you mean sqlite:///tmp/x.db (three slashes for an absolute path)?"),
            "{e}"
        );
    }

    #[test]
    fn a_writable_place_passes_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        check(&dir.path().join("x.db")).unwrap();
        std::fs::write(dir.path().join("x.db"), b"").unwrap();
        check(&dir.path().join("x.db")).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the file made here: {left:?}");
        let file = dir.path().join("x.db");
        let e = check(&file.join("y.db")).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }

    #[test]
    fn the_files_are_the_database_its_journal_its_shared_memory_and_the_lock() {
        let names: Vec<_> = files_of(Path::new("/d/x.db"))
            .into_iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            names,
            ["/d/x.db", "/d/x.db-wal", "/d/x.db-shm", "/d/x.db.lock"]
        );
    }
}

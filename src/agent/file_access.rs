//! Why this process may not read one of the runner's own files (its key, its state), said for
//! the user it runs as, with what to change.
//!
//! Why: the same files are read by the runner unit's `ExecStartPre=` preflight, which runs as
//! the runner's user, and by the heartbeat, which may run as root or as that user. A bare
//! `Permission denied (os error 13)` does not say which user was refused, nor which directory
//! refused it; the usual cause is a key made by root in root's 0700 directory. Everything here
//! is read from `/proc/self/status`, `/etc/passwd` and the files' own metadata, so that the
//! explanation needs no privilege and no C library call.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The user this process acts as (its effective UID, which file permissions are checked
/// against), with its name when `/etc/passwd` has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// `None` only without `/proc`.
    pub uid: Option<u32>,
    pub name: Option<String>,
}

impl User {
    pub fn current() -> User {
        let uid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| effective_uid(&s));
        User {
            uid,
            name: match uid {
                Some(uid) => user_name(uid),
                None => std::env::var("USER").ok(),
            },
        }
    }

    pub fn of_uid(uid: u32) -> User {
        User {
            uid: Some(uid),
            name: user_name(uid),
        }
    }

    /// The name to give `chown`: the user's name, or its UID.
    pub fn chown_name(&self) -> String {
        match (&self.name, self.uid) {
            (Some(name), _) => name.clone(),
            (None, Some(uid)) => uid.to_string(),
            (None, None) => "<user>".into(),
        }
    }
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.name, self.uid) {
            (Some(name), Some(uid)) => write!(f, "user {name} (uid {uid})"),
            (Some(name), None) => write!(f, "user {name}"),
            (None, Some(uid)) => write!(f, "uid {uid}"),
            (None, None) => f.write_str("this process's user"),
        }
    }
}

/// The effective UID from `/proc/self/status`'s `Uid:` line (real, effective, saved, fs).
fn effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The name `/etc/passwd` gives `uid`. Users known only to NSS (LDAP, sssd) have none here;
/// the UID is said instead.
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd_name(&passwd, uid)
}

fn passwd_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id: u32 = fields.nth(1)?.parse().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_string())
    })
}

/// The part of `path` that refuses this process: the first directory on the way that it may
/// not search, or else the file itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub at: PathBuf,
    pub owner: Option<User>,
    pub mode: Option<u32>,
}

/// Finds where `path` refuses this process. A directory that may not be searched makes every
/// name under it unreadable (`EACCES` on the next component), so the first component whose
/// metadata cannot be read points at its parent.
pub fn refusal(path: &Path) -> Refusal {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut at = path.clone();
    let mut prefix = PathBuf::new();
    for component in path.components() {
        prefix.push(component);
        if let Err(e) = std::fs::metadata(&prefix)
            && e.kind() == std::io::ErrorKind::PermissionDenied
        {
            at = prefix.parent().map_or(prefix.clone(), Path::to_path_buf);
            break;
        }
    }
    let meta = std::fs::metadata(&at).ok();
    Refusal {
        owner: meta.as_ref().map(|m| User::of_uid(m.uid())),
        mode: meta.map(|m| m.mode() & 0o7777),
        at,
    }
}

/// The sentence for a file of the runner's (`what`: "key", "state file") that `user` may not
/// read: who was refused, where, and the ownership and modes that work.
pub fn explain_denied(what: &str, path: &Path, user: &User, refusal: &Refusal) -> String {
    let mut s = format!("{}: permission denied for {user}", path.display());
    if refusal.at != path {
        s.push_str(&format!(": it may not enter {}", refusal.at.display()));
    }
    if let (Some(owner), Some(mode)) = (&refusal.owner, refusal.mode) {
        s.push_str(&format!(
            " (owned by {}, mode {mode:04o})",
            owner.chown_name()
        ));
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    s.push_str(&format!(
        ". The {what} and its directory must belong to the user that runs `leasegate runner` \
         (the runner's own user for a rootless runner): `chown {u}: {d} {p}`, \
         `chmod 0700 {d}`, `chmod 0600 {p}` (docs/RUNNERS.md, \"Who owns the key\")",
        u = user.chown_name(),
        d = dir.display(),
        p = path.display(),
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_uid_is_the_second_of_four() {
        let status = "Name:\tleasegate\nUmask:\t0022\nUid:\t1000\t998\t998\t998\nGid:\t1000\n";
        assert_eq!(effective_uid(status), Some(998));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn passwd_names_uids() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      gitlab-runner:x:998:997:GitLab Runner:/home/gitlab-runner:/bin/bash\n\
                      broken-line\n";
        assert_eq!(passwd_name(passwd, 998).as_deref(), Some("gitlab-runner"));
        assert_eq!(passwd_name(passwd, 0).as_deref(), Some("root"));
        assert_eq!(passwd_name(passwd, 4242), None);
        let me = User::current();
        let uid = me.uid.expect("Linux has /proc");
        assert!(me.to_string().contains(&format!("uid {uid}")), "{me}");
    }

    #[test]
    fn the_sentence_names_the_user_the_directory_and_the_fix() {
        let user = User {
            uid: Some(998),
            name: Some("gitlab-runner".into()),
        };
        let refusal = Refusal {
            at: PathBuf::from("/etc/leasegate"),
            owner: Some(User {
                uid: Some(0),
                name: Some("root".into()),
            }),
            mode: Some(0o700),
        };
        let path = Path::new("/etc/leasegate/runner-build-01.key");
        assert_eq!(
            explain_denied("key", path, &user, &refusal),
            "/etc/leasegate/runner-build-01.key: permission denied for user gitlab-runner (uid 998): \
             it may not enter /etc/leasegate (owned by root, mode 0700). The key and its directory \
             must belong to the user that runs `leasegate runner` (the runner's own user for a \
             rootless runner): `chown gitlab-runner: /etc/leasegate /etc/leasegate/runner-build-01.key`, \
             `chmod 0700 /etc/leasegate`, `chmod 0600 /etc/leasegate/runner-build-01.key` \
             (docs/RUNNERS.md, \"Who owns the key\")"
        );
    }

    #[test]
    fn a_readable_path_is_refused_at_the_file_itself() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("runner.key");
        std::fs::write(&file, "x").unwrap();
        let r = refusal(&file);
        assert_eq!(r.at, file);
        assert!(r.owner.is_some() && r.mode.is_some());
    }
}

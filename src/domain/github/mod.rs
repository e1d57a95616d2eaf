//! GitHub Actions under the gate: where a pool's runners register with GitHub (`GithubPool`),
//! and what becomes of each registration leasegate mints (`registration`).
//!
//! GitHub's runner takes its work from GitHub's own broker, where no gate can stand. What a
//! third party can hold is the registration: leasegate keeps the GitHub credential and mints
//! a single-use ("just-in-time") registration only for a runner the lease's rules admit, so a
//! machine whose runtime is broken or whose image drifted never comes online in GitHub.

pub mod registration;

use serde::{Deserialize, Serialize};

/// The most labels GitHub takes on one runner (`generate-jitconfig`: `labels`, 1 to 100).
pub const MAX_LABELS: usize = 100;
/// The longest label leasegate passes on.
pub const MAX_LABEL_CHARS: usize = 100;
/// The longest `work_folder`.
pub const MAX_WORK_FOLDER_CHARS: usize = 255;
/// The folder GitHub's runner works in when none is named.
pub const DEFAULT_WORK_FOLDER: &str = "_work";
/// The runner group every organization and enterprise has.
pub const DEFAULT_RUNNER_GROUP_ID: i64 = 1;
/// The largest runner group id taken (JSON's largest exact integer).
pub const MAX_RUNNER_GROUP_ID: i64 = (1 << 53) - 1;

/// What a scope's runners are registered to: an organization, a repository or an enterprise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeKind {
    Organization,
    Repository,
    Enterprise,
}

impl ScopeKind {
    /// The permission a GitHub App (or a token) needs to register and remove runners here.
    pub fn permission_needed(self) -> &'static str {
        match self {
            ScopeKind::Organization => {
                "a GitHub App with the organization permission \"Self-hosted runners: write\" \
                 (or a token with the admin:org scope)"
            }
            ScopeKind::Repository => {
                "a GitHub App with the repository permission \"Administration: write\" \
                 (or a token with the repo scope)"
            }
            ScopeKind::Enterprise => {
                "a token with the manage_runners:enterprise scope (or an enterprise App with \
                 \"Self-hosted runners: write\")"
            }
        }
    }
}

/// `orgs/ORG`, `repos/OWNER/REPO` or `enterprises/ENTERPRISE`: the part of GitHub's REST paths
/// before `/actions/runners`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GithubScope(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadGithubPool {
    #[error(
        "github.scope: `{0}` is not orgs/ORG, repos/OWNER/REPO or enterprises/ENTERPRISE \
         (names of letters, digits, `-`, `_` and `.`, at most 100 characters each)"
    )]
    Scope(String),
    #[error(
        "github.runner_group_id: must be a whole number from 1 to {MAX_RUNNER_GROUP_ID} (1 is \
         the default group)"
    )]
    RunnerGroup,
    #[error("github.labels: GitHub takes 1 to {MAX_LABELS} labels")]
    LabelCount,
    #[error(
        "github.labels[{0}]: 1 to {MAX_LABEL_CHARS} characters, no comma, no control or \
         invisible character, not only spaces"
    )]
    Label(usize),
    #[error(
        "github.work_folder: a relative path of at most {MAX_WORK_FOLDER_CHARS} characters \
         inside the runner's directory: segments of letters, digits, `-`, `_` and `.`, none \
         starting with `.`, joined by `/`"
    )]
    WorkFolder,
}

/// A path inside the runner's directory: segments of letters, digits, `-`, `_` and `.`, none
/// starting with `.` (so none is `..`), joined by single `/`s.
fn relative_folder(s: &str) -> bool {
    s.len() <= MAX_WORK_FOLDER_CHARS
        && s.split('/').all(|segment| {
            segment
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
}

/// A name GitHub puts in a path: letters, digits, `-`, `_`, `.`, and not `.` or `..`.
fn path_name(s: &str) -> bool {
    (1..=100).contains(&s.len())
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl GithubScope {
    pub fn parse(s: &str) -> Result<Self, BadGithubPool> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = match parts.as_slice() {
            ["orgs", org] | ["enterprises", org] => path_name(org),
            ["repos", owner, repo] => path_name(owner) && path_name(repo),
            _ => false,
        };
        if ok {
            Ok(GithubScope(s.to_string()))
        } else {
            Err(BadGithubPool::Scope(s.chars().take(200).collect()))
        }
    }

    /// For values read back from the store, which only ever holds parsed scopes.
    pub fn from_trusted(s: String) -> Self {
        GithubScope(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn kind(&self) -> ScopeKind {
        match self.0.split('/').next() {
            Some("repos") => ScopeKind::Repository,
            Some("enterprises") => ScopeKind::Enterprise,
            _ => ScopeKind::Organization,
        }
    }
}

impl std::fmt::Display for GithubScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a pool's runners register with GitHub: the pool's optional `github` object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GithubPool {
    pub scope: GithubScope,
    pub runner_group_id: i64,
    /// The labels every registration carries (`runs-on:` matches them), in the given order.
    pub labels: Vec<String>,
    /// The runner's work folder, relative to its directory.
    pub work_folder: String,
}

/// The `github` object as stored (a JSON column) and as the pool view shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GithubPoolRecord {
    pub scope: String,
    pub runner_group_id: i64,
    pub labels: Vec<String>,
    pub work_folder: String,
}

impl GithubPool {
    /// The pool's `github` object, checked: a scope GitHub has, a runner group from 1, 1 to
    /// 100 labels GitHub can take, and a relative work folder.
    pub fn new(
        scope: &str,
        runner_group_id: i64,
        labels: Vec<String>,
        work_folder: Option<String>,
    ) -> Result<Self, BadGithubPool> {
        let scope = GithubScope::parse(scope)?;
        if !(1..=MAX_RUNNER_GROUP_ID).contains(&runner_group_id) {
            return Err(BadGithubPool::RunnerGroup);
        }
        if labels.is_empty() || labels.len() > MAX_LABELS {
            return Err(BadGithubPool::LabelCount);
        }
        for (i, label) in labels.iter().enumerate() {
            let fits = (1..=MAX_LABEL_CHARS).contains(&label.chars().count())
                && !label.trim().is_empty()
                && !label.contains(',')
                && super::text::plain_name("label", label).is_ok();
            if !fits {
                return Err(BadGithubPool::Label(i));
            }
        }
        let work_folder = work_folder.unwrap_or_else(|| DEFAULT_WORK_FOLDER.to_string());
        if !relative_folder(&work_folder) {
            return Err(BadGithubPool::WorkFolder);
        }
        Ok(GithubPool {
            scope,
            runner_group_id,
            labels,
            work_folder,
        })
    }

    pub fn record(&self) -> GithubPoolRecord {
        GithubPoolRecord {
            scope: self.scope.as_str().to_string(),
            runner_group_id: self.runner_group_id,
            labels: self.labels.clone(),
            work_folder: self.work_folder.clone(),
        }
    }

    /// From its stored record, which was checked when it was written.
    pub fn from_record(r: GithubPoolRecord) -> Self {
        GithubPool {
            scope: GithubScope::from_trusted(r.scope),
            runner_group_id: r.runner_group_id,
            labels: r.labels,
            work_folder: r.work_folder,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn scopes_are_an_organization_a_repository_or_an_enterprise() {
        for (s, kind) in [
            ("orgs/acme", ScopeKind::Organization),
            ("repos/acme/web.site", ScopeKind::Repository),
            ("enterprises/acme-corp", ScopeKind::Enterprise),
        ] {
            assert_eq!(GithubScope::parse(s).unwrap().kind(), kind, "{s}");
        }
        for bad in [
            "acme",
            "orgs/",
            "orgs/acme/x",
            "repos/acme",
            "repos/acme/..",
            "users/acme",
            "orgs/ac me",
            "orgs/acme?x=1",
            "/orgs/acme",
        ] {
            assert!(GithubScope::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_pools_github_object_is_checked_and_defaults_its_work_folder() {
        let p = GithubPool::new("orgs/acme", 1, labels(&["linux", "x64"]), None).unwrap();
        assert_eq!(p.work_folder, "_work");
        assert_eq!(GithubPool::from_record(p.record()), p);
        assert_eq!(
            GithubPool::new("orgs/acme", 0, labels(&["linux"]), None),
            Err(BadGithubPool::RunnerGroup)
        );
        assert_eq!(
            GithubPool::new("orgs/acme", 1, vec![], None),
            Err(BadGithubPool::LabelCount)
        );
        let many: Vec<String> = (0..101).map(|i| format!("l{i}")).collect();
        assert_eq!(
            GithubPool::new("orgs/acme", 1, many, None),
            Err(BadGithubPool::LabelCount)
        );
        for (i, bad) in ["a,b", " ", "x\u{200b}", "bell\u{7}"].iter().enumerate() {
            assert_eq!(
                GithubPool::new("orgs/acme", 1, labels(&["ok", bad]), None),
                Err(BadGithubPool::Label(1)),
                "{i}: {bad:?}"
            );
        }
        let nested = GithubPool::new("orgs/acme", 1, labels(&["x"]), Some("jobs/w.1".into()));
        assert_eq!(nested.unwrap().work_folder, "jobs/w.1");
        for bad in [
            "/tmp/w",
            "../w",
            "a/../../w",
            "",
            "a//b",
            "a/",
            ".hidden",
            "a b",
        ] {
            assert_eq!(
                GithubPool::new("orgs/acme", 1, labels(&["x"]), Some(bad.into())),
                Err(BadGithubPool::WorkFolder),
                "{bad}"
            );
        }
    }
}

//! The audit trail: what an operator changed, who, when, on what, and from where.
//!
//! Every write an operator makes through the admin API or the page is one `Entry`, recorded
//! in the same transaction as the write itself (so that a change is never without its author)
//! and logged under the `leasegate::audit` target. Entries are kept like the rest of the
//! history (`retention`).

use super::time::Millis;
use serde::Serialize;

/// What was done. The stable names are the API's and the logs'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    RunnerCordon,
    RunnerUncordon,
    RunnerRevoke,
    RunnerForgeRunners,
    PoolPut,
    PoolPatch,
    PoolDelete,
    PoolResolve,
    RegistrationTokenCreate,
    OperatorTokenCreate,
    OperatorTokenRevoke,
    PageLogin,
    PageLogout,
    /// The steps of a GitHub registration leasegate minted for a runner (the service's own
    /// doing, at the runner's request or the watcher's look).
    GithubRunnerMinted,
    GithubRunnerOnline,
    GithubRunnerBusy,
    GithubRunnerDone,
    GithubRunnerDeleted,
    /// Outlier ejection (the service's own doing, from a job's end), and an operator's
    /// reinstatement.
    RunnerEject,
    RunnerWouldEject,
    RunnerReinstate,
}

/// What kind of thing an action is done to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    Runner,
    Pool,
    Operator,
}

impl TargetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Runner => "runner",
            TargetKind::Pool => "pool",
            TargetKind::Operator => "operator",
        }
    }
}

impl Action {
    pub const ALL: [Action; 21] = [
        Action::RunnerCordon,
        Action::RunnerUncordon,
        Action::RunnerRevoke,
        Action::RunnerForgeRunners,
        Action::PoolPut,
        Action::PoolPatch,
        Action::PoolDelete,
        Action::PoolResolve,
        Action::RegistrationTokenCreate,
        Action::OperatorTokenCreate,
        Action::OperatorTokenRevoke,
        Action::PageLogin,
        Action::PageLogout,
        Action::GithubRunnerMinted,
        Action::GithubRunnerOnline,
        Action::GithubRunnerBusy,
        Action::GithubRunnerDone,
        Action::GithubRunnerDeleted,
        Action::RunnerEject,
        Action::RunnerWouldEject,
        Action::RunnerReinstate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::RunnerCordon => "runner_cordon",
            Action::RunnerUncordon => "runner_uncordon",
            Action::RunnerRevoke => "runner_revoke",
            Action::RunnerForgeRunners => "runner_forge_runners",
            Action::PoolPut => "pool_put",
            Action::PoolPatch => "pool_patch",
            Action::PoolDelete => "pool_delete",
            Action::PoolResolve => "pool_resolve",
            Action::RegistrationTokenCreate => "registration_token_create",
            Action::OperatorTokenCreate => "operator_token_create",
            Action::OperatorTokenRevoke => "operator_token_revoke",
            Action::PageLogin => "page_login",
            Action::PageLogout => "page_logout",
            Action::GithubRunnerMinted => "github_runner_minted",
            Action::GithubRunnerOnline => "github_runner_online",
            Action::GithubRunnerBusy => "github_runner_busy",
            Action::GithubRunnerDone => "github_runner_done",
            Action::GithubRunnerDeleted => "github_runner_deleted",
            Action::RunnerEject => "runner_eject",
            Action::RunnerWouldEject => "runner_would_eject",
            Action::RunnerReinstate => "runner_reinstate",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// The kind of thing the action's target names.
    pub fn target_kind(self) -> TargetKind {
        match self {
            Action::RunnerCordon
            | Action::RunnerUncordon
            | Action::RunnerRevoke
            | Action::RunnerForgeRunners
            | Action::GithubRunnerMinted
            | Action::GithubRunnerOnline
            | Action::GithubRunnerBusy
            | Action::GithubRunnerDone
            | Action::GithubRunnerDeleted
            | Action::RunnerEject
            | Action::RunnerWouldEject
            | Action::RunnerReinstate => TargetKind::Runner,
            Action::PoolPut
            | Action::PoolPatch
            | Action::PoolDelete
            | Action::PoolResolve
            | Action::RegistrationTokenCreate => TargetKind::Pool,
            Action::OperatorTokenCreate
            | Action::OperatorTokenRevoke
            | Action::PageLogin
            | Action::PageLogout => TargetKind::Operator,
        }
    }
}

/// One change by an operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub at: Millis,
    /// The operator's name (`bootstrap` for the configured admin token).
    pub actor: String,
    pub action: Action,
    /// The runner id, pool name or operator name acted on.
    pub target: String,
    /// What else says what the change was (a role, a ttl, a pool's new policy), short.
    pub detail: Option<String>,
    /// The client's address, as the listener resolved it (behind trusted proxies, the
    /// forwarded one).
    pub client: String,
}

impl Entry {
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// An entry as stored, with its place in the trail (increasing; the paging cursor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub seq: i64,
    pub entry: Entry,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_have_stable_names() {
        for a in Action::ALL {
            assert_eq!(Action::parse(a.as_str()), Some(a));
            assert_eq!(
                serde_json::to_value(a).unwrap(),
                serde_json::json!(a.as_str())
            );
        }
        assert_eq!(Action::parse("drop_tables"), None);
        assert_eq!(Action::RunnerRevoke.target_kind(), TargetKind::Runner);
        assert_eq!(Action::PoolDelete.target_kind().as_str(), "pool");
    }
}

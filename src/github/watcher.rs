//! The watcher: every `LEASEGATE_GITHUB_POLL_S` one replica lists each scope's runners (one
//! list call per scope, not one per registration) and moves every registration leasegate
//! minted through its life (`domain::github::registration::watch`): `online`, `busy`, `done`;
//! or withdraws it (`DELETE`) when it was never used, its listener went away, or its runner
//! stopped being admitted while it waits. A busy registration is never deleted, and a `422` to
//! a delete (it just took a job) leaves it to be watched on. Runners leasegate did not mint
//! are never looked at: only its own registrations' ids are.
//!
//! The verdict on a registration's runner is the lease's (`domain::fetch::judge_fetch`: rules
//! 7–13 over its latest attestation, which must be fresh), so a machine that breaks while its
//! listener waits loses its registration at the next look.

use super::Github;
use super::actions::{Deleted, ListedRunner};
use super::context::GithubContext;
use crate::domain::audit::Action;
use crate::domain::fetch::{FetchRules, standing};
use crate::domain::github::GithubScope;
use crate::domain::github::registration::{
    Listed, MINTING_WINDOW_S, Registration, State, Verdict, Withdrawal, watch,
};
use crate::domain::ids::RunnerId;
use crate::domain::pool::Pool;
use crate::domain::pool_name::PoolName;
use crate::domain::runner::Runner;
use crate::domain::time::Millis;
use crate::store::StoreResult;
use crate::turns::{Turn, every_turn};
use std::collections::{BTreeMap, HashMap};

const TASK: &str = "github";

/// What one look did, for the log and the tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchReport {
    /// Scopes listed, and those whose list failed.
    pub listed: usize,
    pub failed: usize,
    /// Registrations that moved on (online, busy, done), and those withdrawn.
    pub moved: usize,
    pub withdrawn: usize,
}

/// Runs the watcher until shutdown: a look every poll interval, by the replica that holds the
/// `github` task for it.
pub async fn run(cx: GithubContext, github: std::sync::Arc<Github>) {
    let poll = github.settings().poll;
    // Held a little under one interval, so that this replica takes it again next tick and
    // another takes over within one interval of this one stopping.
    let turn = Turn {
        task: TASK,
        who: "the GitHub watcher",
        tick: poll,
        hold: poll * 9 / 10,
        release: false,
    };
    every_turn(cx.store(), cx.shutdown(), turn, |now| {
        let (cx, github) = (cx.clone(), github.clone());
        async move { watch_once(&cx, &github, now).await.map(|_| ()) }
    })
    .await;
}

/// One look at every outstanding registration at `now`.
pub async fn watch_once(
    cx: &GithubContext,
    github: &Github,
    now: Millis,
) -> StoreResult<WatchReport> {
    let store = cx.store();
    let outstanding = store.outstanding_github_registrations().await?;
    let mut report = WatchReport::default();
    if outstanding.is_empty() {
        return Ok(report);
    }
    let runner_ids: Vec<RunnerId> = outstanding.iter().map(|r| r.runner_id.clone()).collect();
    let runners: HashMap<RunnerId, Runner> = store
        .runners_by_id(&runner_ids)
        .await?
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect();
    let pools: HashMap<PoolName, Pool> = store
        .list_pools()
        .await?
        .into_iter()
        .map(|p| (p.name.clone(), p))
        .collect();
    let mut by_scope: BTreeMap<GithubScope, Vec<Registration>> = BTreeMap::new();
    for reg in outstanding {
        by_scope.entry(reg.scope.clone()).or_default().push(reg);
    }
    let rules = cx.rules();
    for (scope, regs) in by_scope {
        let listed = match github.list_runners(&scope).await {
            Ok(l) => l,
            Err(e) => {
                report.failed += 1;
                tracing::warn!(scope = %scope, error = %e, "cannot list GitHub's runners; the registrations stay as they were until the next look");
                continue;
            }
        };
        report.listed += 1;
        let by_id: HashMap<i64, &ListedRunner> = listed.iter().map(|r| (r.id, r)).collect();
        for reg in regs {
            if reg.state == State::Minting {
                settle_reservation(cx, reg, &listed, now).await?;
                continue;
            }
            let seen = reg.github_runner_id.and_then(|id| by_id.get(&id).copied());
            let verdict = verdict_on(&reg, &runners, &pools, now, rules);
            let (moved, withdrawn) = step(cx, github, reg, seen, &verdict, now).await?;
            report.moved += usize::from(moved);
            report.withdrawn += usize::from(withdrawn);
        }
    }
    Ok(report)
}

/// The lease's verdict on the registration's runner now.
fn verdict_on(
    reg: &Registration,
    runners: &HashMap<RunnerId, Runner>,
    pools: &HashMap<PoolName, Pool>,
    now: Millis,
    rules: FetchRules,
) -> Verdict {
    let found = runners
        .get(&reg.runner_id)
        .and_then(|r| Some((r, pools.get(&r.pool)?)));
    standing(found, now, rules)
}

/// A reservation older than its window: its replica died between asking GitHub and writing
/// down the answer. Found in the list, it is adopted (and, nobody holding its JIT config,
/// withdrawn as unused in time); not found, it is cleared.
async fn settle_reservation(
    cx: &GithubContext,
    reg: Registration,
    listed: &[ListedRunner],
    now: Millis,
) -> StoreResult<()> {
    if now.secs_since(reg.minted_at) < MINTING_WINDOW_S {
        return Ok(());
    }
    let store = cx.store();
    match listed.iter().find(|r| r.name == reg.name) {
        Some(found) => {
            let mut adopted = reg.clone();
            adopted.github_runner_id = Some(found.id);
            adopted.state = State::Minted;
            adopted.seen_at = Some(now);
            store
                .record_github_registration(&adopted, State::Minting, None)
                .await?;
            tracing::warn!(runner_id = %reg.runner_id, github_runner_id = found.id, name = %reg.name, "an unrecorded GitHub registration found and adopted; it will be withdrawn unused");
        }
        None => store.release_github_registration(&reg.id).await?,
    }
    Ok(())
}

/// One registration's step; whether it moved on, and whether it was withdrawn.
async fn step(
    cx: &GithubContext,
    github: &Github,
    reg: Registration,
    seen: Option<&ListedRunner>,
    verdict: &Verdict,
    now: Millis,
) -> StoreResult<(bool, bool)> {
    let listed = seen.map_or(Listed::Absent, |r| Listed::Present {
        online: r.online,
        busy: r.busy,
    });
    let watched = watch(&reg, listed, verdict, now);
    let mut next = reg.clone();
    if seen.is_some() {
        next.seen_at = Some(now);
    }
    next.state = watched.state;
    if next.state == State::Online || next.state == State::Busy {
        next.online_at.get_or_insert(now);
    }
    if next.state == State::Busy {
        next.busy_at.get_or_insert(now);
    }
    if let Some(observed) = &watched.observed {
        next.observed_code = Some(observed.reason.clone());
        cx.metrics().github("would_delete", &observed.reason);
        tracing::info!(runner_id = %reg.runner_id, github_runner_id = ?reg.github_runner_id, code = %observed.reason, detail = %observed.detail, "GitHub registration kept in an observing pool; it would be withdrawn");
    }
    let mut withdrawn = false;
    if let Some(w) = &watched.withdraw {
        let id = reg
            .github_runner_id
            .expect("a minted registration has GitHub's id");
        match github.delete_runner(&reg.scope, id).await {
            Ok(Deleted::Deleted | Deleted::Gone) => {
                end(&mut next, watched.ends_as(), &w.reason, now);
                withdrawn = true;
            }
            Ok(Deleted::Busy) => {
                cx.metrics().github("kept", "busy");
                tracing::info!(runner_id = %reg.runner_id, github_runner_id = id, reason = %w.reason, "GitHub registration not withdrawn: it has just taken a job");
            }
            Err(e) => {
                tracing::warn!(runner_id = %reg.runner_id, github_runner_id = id, error = %e, "cannot withdraw a GitHub registration; trying at the next look")
            }
        }
    } else if next.state == State::Done && reg.state != State::Done {
        end(&mut next, State::Done, "done", now);
    }
    if next == reg {
        return Ok((false, false));
    }
    record(cx, &reg, &next, watched.withdraw.as_ref(), now).await?;
    Ok((next.state != reg.state, withdrawn))
}

fn end(next: &mut Registration, state: State, reason: &str, now: Millis) {
    next.state = state;
    next.ended_at = Some(now);
    next.end_reason = Some(reason.to_string());
}

/// Writes `next` over `prior` with the audit entry of the step it made, and counts and logs
/// it.
async fn record(
    cx: &GithubContext,
    prior: &Registration,
    next: &Registration,
    withdrawal: Option<&Withdrawal>,
    now: Millis,
) -> StoreResult<()> {
    let step = (next.state != prior.state).then_some(next.state);
    let action = match step {
        Some(State::Online) => Some(Action::GithubRunnerOnline),
        Some(State::Busy) => Some(Action::GithubRunnerBusy),
        Some(State::Done) => Some(Action::GithubRunnerDone),
        Some(State::Deleted) => Some(Action::GithubRunnerDeleted),
        _ => None,
    };
    let why = match (step, withdrawal) {
        (Some(State::Deleted), Some(w)) => Some(format!("withdrawn ({}): {}", w.reason, w.detail)),
        _ => None,
    };
    let audit = action.map(|a| next.audit(a, now, "-", why.as_deref()));
    let written = cx
        .store()
        .record_github_registration(next, prior.state, audit.as_ref())
        .await?;
    let Some(step) = step.filter(|_| written) else {
        return Ok(());
    };
    let code = next.end_reason.as_deref().unwrap_or("none");
    cx.metrics().github(step.as_str(), code);
    let (runner_id, id) = (&next.runner_id, next.github_runner_id);
    match step {
        State::Deleted => {
            tracing::info!(runner_id = %runner_id, github_runner_id = ?id, name = %next.name, reason = code, detail = why.as_deref().unwrap_or(""), "GitHub registration withdrawn")
        }
        _ => {
            tracing::info!(runner_id = %runner_id, github_runner_id = ?id, name = %next.name, state = step.as_str(), "GitHub registration {}", step.as_str())
        }
    }
    Ok(())
}

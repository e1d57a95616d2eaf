//! The watcher: every `TICK` one replica reads the bound Buildkite agent names, judges each
//! one's runner as the forge gate judges a fetch (`domain::fetch::judge_fetch`: rules 7–13
//! over its latest attestation, which must be fresh), and, where the verdict calls for it
//! (`domain::buildkite::next_step`), lists the agents of that name and pauses or resumes them.
//! Reading the store every tick, not waiting on a slow poll of anything, is what puts a pause
//! within seconds of a refusal.
//!
//! Each pause made or ended is written down before the next is made, so a replica that takes
//! over (or this one, restarted) knows which pauses are leasegate's. A call that fails is
//! logged with the agent, shown on the runner (its detail's `buildkite_agents`) and tried
//! again after a back-off; an observing pool's would-be pauses are logged and counted, never
//! made.

use super::Buildkite;
use super::api::{Paused, Resumed};
use super::context::BuildkiteContext;
use super::settings::BuildkiteSettings;
use crate::domain::buildkite::{
    Act, AgentWatch, Pause, PauseEnd, Step, Verdict, exactly, next_step, note, on_admitted,
    on_refused,
};
use crate::domain::fetch::{FetchRules, standing};
use crate::domain::ids::RunnerId;
use crate::domain::pool::Pool;
use crate::domain::pool_name::PoolName;
use crate::domain::runner::Runner;
use crate::domain::time::Millis;
use crate::store::StoreResult;
use crate::turns::{Turn, every_turn};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

const TASK: &str = "buildkite";
const FORGE: &str = "buildkite";
/// How often the verdicts are read.
pub const TICK: Duration = Duration::from_secs(2);
/// How long one replica holds the turn: longer than a look may take (`LOOK_BUDGET`), so that
/// two replicas never act at once; a replica that dies holding it is replaced after it.
const HOLD_S: u64 = 60;
/// A look stops making calls after this; the rest waits for the next tick.
const LOOK_BUDGET: Duration = Duration::from_secs(40);

/// What one look did, for the log and the tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchReport {
    pub paused: usize,
    pub resumed: usize,
    /// Pauses found ended without a call (lapsed, undone, replaced, gone).
    pub ended: usize,
    pub observed: usize,
    pub failed: usize,
}

/// Runs the watcher until shutdown: a look every tick, by the replica holding the
/// `buildkite` task for it.
pub async fn run(cx: BuildkiteContext, settings: BuildkiteSettings) {
    let buildkite = match Buildkite::new(settings) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "the Buildkite watcher cannot start");
            return;
        }
    };
    let s = buildkite.settings();
    tracing::info!(api = %s.api_url, org = %s.org, pause_minutes = s.pause_minutes, "pausing refused runners' Buildkite agents");
    let turn = Turn {
        task: TASK,
        who: "the Buildkite watcher",
        tick: TICK,
        hold: Duration::from_secs(HOLD_S),
        release: true,
    };
    let buildkite = std::sync::Arc::new(buildkite);
    every_turn(cx.store(), cx.shutdown(), turn, |now| {
        let (cx, buildkite) = (cx.clone(), buildkite.clone());
        async move { watch_once(&cx, &buildkite, now).await.map(|_| ()) }
    })
    .await;
}

/// One look at every bound agent name at `now`.
pub async fn watch_once(
    cx: &BuildkiteContext,
    buildkite: &Buildkite,
    now: Millis,
) -> StoreResult<WatchReport> {
    let store = cx.store();
    let seen = store.buildkite_state().await?;
    let mut report = WatchReport::default();
    if seen.bindings.is_empty() && seen.pauses.is_empty() && seen.watches.is_empty() {
        return Ok(report);
    }
    let runner_ids: Vec<RunnerId> = seen.bindings.iter().map(|(_, r)| r.clone()).collect();
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
    let rules = cx.rules();
    // Pauses whose timeout passed: Buildkite lifted them by itself.
    let mut live: Vec<Pause> = Vec::new();
    for p in seen.pauses {
        if p.live(now) {
            live.push(p);
        } else {
            end_pause(cx, &p, PauseEnd::Lapsed, now).await?;
            report.ended += 1;
        }
    }
    let bound: HashMap<&str, &RunnerId> =
        seen.bindings.iter().map(|(n, r)| (n.as_str(), r)).collect();
    let mut watches: HashMap<String, AgentWatch> = seen
        .watches
        .into_iter()
        .map(|w| (w.agent_name.clone(), w))
        .collect();
    let names: BTreeSet<String> = bound
        .keys()
        .map(|n| n.to_string())
        .chain(live.iter().map(|p| p.agent_name.clone()))
        .chain(watches.keys().cloned())
        .collect();
    let started = Instant::now();
    for name in names {
        if started.elapsed() > LOOK_BUDGET {
            tracing::warn!(
                "the Buildkite watcher ran out of time for this look; the rest waits for the next"
            );
            break;
        }
        let runner_id = bound.get(name.as_str()).copied();
        let of_name: Vec<&Pause> = live.iter().filter(|p| p.agent_name == name).collect();
        let verdict = match runner_id {
            Some(id) => verdict_on(id, &runners, &pools, now, rules),
            None => Verdict::Unbound,
        };
        let prior = watches.remove(&name);
        let Some(owner) = runner_id.or(of_name.first().map(|p| &p.runner_id)) else {
            // Unbound, with no pause of leasegate's left: nothing more to note.
            if prior.is_some() {
                store.forget_buildkite_watch(&name).await?;
            }
            continue;
        };
        let mut watch = prior
            .clone()
            .unwrap_or_else(|| AgentWatch::new(&name, owner));
        watch.runner_id = owner.clone();
        match next_step(&verdict, &of_name, &watch, now) {
            Step::Wait => {
                if matches!(verdict, Verdict::Admitted | Verdict::Unbound) {
                    // The refusal is over: what was noted of it no longer holds.
                    watch.checked_at = None;
                    watch.observed_code = None;
                    watch.left_alone = None;
                }
            }
            Step::Observe => {
                if let Verdict::Observed { code, detail } = &verdict {
                    cx.metrics().forge_action(FORGE, "pause", "observed");
                    tracing::info!(agent_name = %name, runner_id = %owner, code = %code, detail = %detail, "Buildkite agent not paused: its pool observes; it would be paused");
                    watch.observed_code = Some(code.clone());
                    report.observed += 1;
                }
            }
            Step::Look => {
                look(
                    cx,
                    buildkite,
                    &verdict,
                    &of_name,
                    &mut watch,
                    &mut report,
                    now,
                )
                .await?
            }
        }
        if prior.as_ref() != Some(&watch) {
            store.record_buildkite_watch(&watch).await?;
        }
    }
    Ok(report)
}

/// The lease's verdict on the runner `id` now.
fn verdict_on(
    id: &RunnerId,
    runners: &HashMap<RunnerId, Runner>,
    pools: &HashMap<PoolName, Pool>,
    now: Millis,
    rules: FetchRules,
) -> Verdict {
    let found = runners.get(id).and_then(|r| Some((r, pools.get(&r.pool)?)));
    standing(found, now, rules).into()
}

/// Lists the agents of `watch`'s name and pauses them (refused) or resumes leasegate's pauses
/// on them (admitted, observed or unbound).
async fn look(
    cx: &BuildkiteContext,
    buildkite: &Buildkite,
    verdict: &Verdict,
    live: &[&Pause],
    watch: &mut AgentWatch,
    report: &mut WatchReport,
    now: Millis,
) -> StoreResult<()> {
    let name = watch.agent_name.clone();
    let action = match verdict {
        Verdict::Refused { .. } => "pause",
        _ => "resume",
    };
    let listed = match buildkite.api().list(&name).await {
        Ok(l) => l,
        Err(e) => {
            failed(
                cx,
                watch,
                action,
                format!("listing agents named {name:?}: {e}"),
                now,
            );
            report.failed += 1;
            return Ok(());
        }
    };
    let agents = exactly(&listed, &name);
    let acts = match verdict {
        Verdict::Refused { .. } => {
            watch.checked_at = Some(now);
            watch.observed_code = None;
            on_refused(&agents, live)
        }
        _ => {
            watch.checked_at = None;
            on_admitted(&agents, live)
        }
    };
    if agents.is_empty() && matches!(verdict, Verdict::Refused { .. }) {
        tracing::debug!(agent_name = %name, runner_id = %watch.runner_id, "no connected Buildkite agent of this name to pause");
    }
    let mut left_alone = None;
    let mut any_failed = false;
    for act in acts {
        match act {
            Act::Pause { id } => {
                let Verdict::Refused { code, detail } = verdict else {
                    continue;
                };
                let text = note(code, detail);
                let minutes = buildkite.settings().pause_minutes;
                match buildkite.api().pause(&id, &text, minutes).await {
                    Ok(Paused::Paused) => {
                        let pause = Pause {
                            agent_id: id.clone(),
                            agent_name: name.clone(),
                            runner_id: watch.runner_id.clone(),
                            code: code.clone(),
                            note: text,
                            paused_at: now,
                            until: now.plus_secs(i64::from(minutes) * 60),
                            ended_at: None,
                            end: None,
                        };
                        cx.store().record_buildkite_pause(&pause).await?;
                        cx.metrics().forge_action(FORGE, "pause", "done");
                        tracing::info!(agent_name = %name, agent_id = %id, runner_id = %watch.runner_id, code = %code, detail = %detail, minutes, "Buildkite agent paused");
                        report.paused += 1;
                    }
                    Ok(Paused::Refused) => {
                        tracing::info!(agent_name = %name, agent_id = %id, runner_id = %watch.runner_id, "Buildkite would not pause the agent (422: already paused, or no longer connected); looking again shortly");
                    }
                    Ok(Paused::Gone) => {}
                    Err(e) => {
                        let error = format!("pausing agent {id} ({name:?}): {e}");
                        failed(cx, watch, "pause", error, now);
                        report.failed += 1;
                        any_failed = true;
                    }
                }
            }
            Act::Resume(pause) => match buildkite.api().resume(&pause.agent_id).await {
                Ok(Resumed::Resumed) => {
                    end_pause(cx, &pause, PauseEnd::Resumed, now).await?;
                    cx.metrics().forge_action(FORGE, "resume", "done");
                    report.resumed += 1;
                }
                Ok(Resumed::NotPaused) => {
                    end_pause(cx, &pause, PauseEnd::Undone, now).await?;
                    report.ended += 1;
                }
                Ok(Resumed::Gone) => {
                    end_pause(cx, &pause, PauseEnd::Gone, now).await?;
                    report.ended += 1;
                }
                Err(e) => {
                    let error = format!("resuming agent {} ({name:?}): {e}", pause.agent_id);
                    failed(cx, watch, "resume", error, now);
                    report.failed += 1;
                    any_failed = true;
                }
            },
            Act::End(pause, end) => {
                end_pause(cx, &pause, end, now).await?;
                report.ended += 1;
            }
            Act::LeaveAlone { id, by } => {
                let seen = format!("agent {id}: {by}");
                if watch.left_alone.as_deref() != Some(seen.as_str()) {
                    tracing::info!(agent_name = %name, agent_id = %id, runner_id = %watch.runner_id, left_alone = %by, "Buildkite agent paused by somebody else: left alone (leasegate pauses it once that pause is over, while its runner is refused)");
                }
                left_alone = Some(seen);
            }
        }
    }
    watch.left_alone = left_alone;
    if any_failed {
        // The back-off, not the look's interval, says when to try again.
        watch.checked_at = None;
    } else {
        watch.succeeded();
    }
    Ok(())
}

/// A call failed: logged with the agent, counted, noted on the watch (shown on the runner)
/// and put off by the back-off.
fn failed(
    cx: &BuildkiteContext,
    watch: &mut AgentWatch,
    action: &'static str,
    error: String,
    now: Millis,
) {
    watch.failed(error.clone(), now);
    cx.metrics().forge_action(FORGE, action, "failed");
    tracing::warn!(agent_name = %watch.agent_name, runner_id = %watch.runner_id, action, failures = watch.failures, retry_at = %watch.next_try_at.map(Millis::rfc3339).unwrap_or_default(), error = %error, "a Buildkite call failed; trying again after a back-off");
}

/// Writes down that `pause` ended, and logs it.
async fn end_pause(
    cx: &BuildkiteContext,
    pause: &Pause,
    end: PauseEnd,
    now: Millis,
) -> StoreResult<()> {
    cx.store()
        .record_buildkite_pause(&pause.ended(end, now))
        .await?;
    tracing::info!(agent_name = %pause.agent_name, agent_id = %pause.agent_id, runner_id = %pause.runner_id, end = end.as_str(), "Buildkite pause ended");
    Ok(())
}

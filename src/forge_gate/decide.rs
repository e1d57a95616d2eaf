//! The forge gate's verdict on one fetch: forward it, forward it marked (the pool observes), or
//! answer it "no work" ourselves; and what a verdict leaves behind (the metric, the refusal on
//! the runner's record, a log line, the binding's last fetch).
//!
//! A forge runner asks every few seconds, and a refused one goes on asking: its refusals are
//! written to its runner's record and logged once per runner and code every
//! `RECORD_INTERVAL_S`, and counted every time.

use super::ForgeSettings;
use crate::app::AppState;
use crate::domain::forge::{FetchRefusal, FetchRules, ForgeIdentity, ForgeKind, judge_fetch};
use crate::domain::ids::RunnerId;
use crate::domain::pool::{GateMode, PoolName};
use crate::domain::time::Millis;
use crate::store::StoreResult;
use std::collections::HashMap;
use std::sync::Mutex;

/// How often one runner's repeated refusal (same code) is written down and logged.
pub const RECORD_INTERVAL_S: i64 = 30;

/// The most (runner, code) pairs remembered for that; past it the memory starts over.
const MAX_REMEMBERED: usize = 20_000;

/// What to do with a fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it: the runner may have work (or is unbound, and unbound runners pass).
    Forward,
    /// Forward it, marked with what would have been refused: the runner's pool observes.
    Observe(FetchRefusal),
    /// Answer "no work" without asking the forge.
    Refuse(FetchRefusal),
}

impl Verdict {
    pub fn refusal(&self) -> Option<&FetchRefusal> {
        match self {
            Verdict::Forward => None,
            Verdict::Observe(r) | Verdict::Refuse(r) => Some(r),
        }
    }
}

/// A fetch judged, with whose it was.
#[derive(Clone, Debug)]
pub struct Judged {
    pub verdict: Verdict,
    /// The leasegate runner and its pool, when the forge runner is bound.
    pub subject: Option<(RunnerId, PoolName)>,
}

/// The gate's memory of recent refusals, so that a runner asking every 2 s is not written down
/// every 2 s.
#[derive(Default)]
pub struct Recent {
    recorded: Mutex<HashMap<(String, &'static str), Millis>>,
}

impl Recent {
    /// Whether a refusal with `code` of `who` at `now` should be written down.
    fn due(&self, who: &str, code: &'static str, now: Millis) -> bool {
        let mut recorded = self.recorded.lock().expect("recent refusals");
        if recorded.len() >= MAX_REMEMBERED {
            recorded.clear();
        }
        let key = (who.to_string(), code);
        match recorded.get(&key) {
            Some(at) if now.secs_since(*at) < RECORD_INTERVAL_S => false,
            _ => {
                recorded.insert(key, now);
                true
            }
        }
    }
}

/// Judges a fetch from `identity` (`None`: the forge runner named itself in no way the gate
/// reads) at `now`, reading only.
pub async fn judge(
    state: &AppState,
    settings: &ForgeSettings,
    identity: Option<&ForgeIdentity>,
    now: Millis,
) -> StoreResult<Judged> {
    let unbound = || Judged {
        verdict: if settings.pass_unbound {
            Verdict::Forward
        } else {
            Verdict::Refuse(FetchRefusal::UnknownRunner)
        },
        subject: None,
    };
    let Some(identity) = identity else {
        return Ok(unbound());
    };
    let store = state.store();
    let Some((runner_id, binding)) = store.forge_runner(identity).await? else {
        return Ok(unbound());
    };
    if binding.fetch_worth_noting(now) {
        store.note_forge_fetch(identity, now).await?;
    }
    // The latest attestation must be read as it is now: a heartbeat may just have come.
    let Some(runner) = store.get_runner(&runner_id).await? else {
        return Ok(unbound());
    };
    let Some(pool) = store.gate_pool(&runner.pool).await? else {
        return Ok(unbound());
    };
    let s = state.settings();
    let rules = FetchRules {
        attestation_max_age_s: s.rules.max_age_s,
        probe_max_age_s: s.probe_max_age_s,
    };
    let verdict = match judge_fetch(&runner, &pool, now, rules) {
        Ok(()) => Verdict::Forward,
        Err(r) if pool.gate_mode == GateMode::Observe => Verdict::Observe(r),
        Err(r) => Verdict::Refuse(r),
    };
    Ok(Judged {
        verdict,
        subject: Some((runner.id, pool.name)),
    })
}

/// Writes down and logs a refusal (at most once per runner and code per interval).
pub async fn record(
    state: &AppState,
    recent: &Recent,
    forge: ForgeKind,
    identity: Option<&ForgeIdentity>,
    judged: &Judged,
    now: Millis,
) -> StoreResult<()> {
    let Some(refusal) = judged.verdict.refusal() else {
        return Ok(());
    };
    let observed = matches!(judged.verdict, Verdict::Observe(_));
    let code = refusal.code();
    match &judged.subject {
        Some((runner, pool)) => {
            if !recent.due(runner.as_str(), code, now) {
                return Ok(());
            }
            let detail = format!("{} fetch: {}", forge.as_str(), refusal.detail());
            state
                .store()
                .record_refusal(runner, code, &detail, now)
                .await?;
            tracing::info!(runner_id = %runner, pool = %pool, forge = forge.as_str(), code, observed, "forge fetch refused");
        }
        None => {
            let who = identity.map_or("unnamed", |i| i.key.as_str());
            if recent.due(who, code, now) {
                tracing::info!(
                    forge = forge.as_str(),
                    forge_runner = who,
                    code,
                    "forge fetch refused"
                );
            }
        }
    }
    Ok(())
}

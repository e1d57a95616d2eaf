//! The forge gate's verdict on one fetch: forward it, forward it marked (the pool observes), or
//! answer it "no work" ourselves; and what a verdict leaves behind (the metric, the refusal on
//! the runner's record, a log line, the binding's last fetch).
//!
//! A forge runner asks every few seconds, and a refused one goes on asking: its refusals are
//! written to its runner's record and logged once per runner and code every
//! `RECORD_INTERVAL_S`, and counted every time. Fetches naming no bound runner (anyone may
//! send them, with any uuid or token) are logged within a budget of their own, and all the
//! gate's refusal lines within a total one; what a budget holds back is counted in the next
//! line that is written.
//!
//! A Forgejo binding holding the runner's token's SHA-256 judges only a fetch presenting that
//! token: any other fetch naming its uuid is forwarded untouched, leaving nothing behind (no
//! header, no last fetch, no refusal), so that knowing a runner's uuid tells nothing of it.
//!
//! The binding, the runner and its pool are read as the lease's gate reads the runner and its
//! pool: from the store's cache (`gate_forge_runner`, `gate_runner`, `gate_pool`), which every
//! change to them invalidates and every attestation this process accepts updates. A refusal
//! for an attestation or probe too old is the one verdict the cache can get wrong (another
//! replica's heartbeat with the same facts is not announced), so it is read again first.

use super::GateState;
use crate::domain::fetch::{FetchRefusal, judge_fetch};
use crate::domain::forge::{ForgeIdentity, ForgeKind};
use crate::domain::ids::RunnerId;
use crate::domain::pool::GateMode;
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::store::StoreResult;
use std::collections::HashMap;
use std::sync::Mutex;

/// How often one runner's repeated refusal (same code) is written down and logged.
pub const RECORD_INTERVAL_S: i64 = 30;

/// The most (runner, code) pairs remembered for that; past it the memory starts over. Only
/// bound runners are remembered, so only registered runners fill it.
const MAX_REMEMBERED: usize = 20_000;

/// The most lines logged per `RECORD_INTERVAL_S` for fetches naming no bound runner.
pub const UNBOUND_LINES_PER_INTERVAL: u32 = 10;

/// The most refusal lines logged per `RECORD_INTERVAL_S` in all.
pub const LINES_PER_INTERVAL: u32 = 200;

/// What to do with a fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it: the runner may have work (or is unbound, and unbound runners pass).
    Forward,
    /// Forward it, marked with what would have been refused: the runner's pool observes.
    Observe(FetchRefusal),
    /// Answer "no work" without asking the forge.
    Refuse(FetchRefusal),
    /// Forward it as if the gate were not there: it names a bound runner without that
    /// runner's token, and the forge will refuse it.
    Untouched,
}

impl Verdict {
    pub fn refusal(&self) -> Option<&FetchRefusal> {
        match self {
            Verdict::Forward | Verdict::Untouched => None,
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

/// A budget of log lines per `RECORD_INTERVAL_S`, counting what it holds back.
#[derive(Debug)]
struct LineBudget {
    per_interval: u32,
    window_start: Option<Millis>,
    used: u32,
    held_back: u64,
}

impl LineBudget {
    const fn new(per_interval: u32) -> Self {
        LineBudget {
            per_interval,
            window_start: None,
            used: 0,
            held_back: 0,
        }
    }

    /// `Some(lines held back before this one)` when a line may be written at `now`.
    fn take(&mut self, now: Millis) -> Option<u64> {
        if self
            .window_start
            .is_none_or(|at| now.secs_since(at) >= RECORD_INTERVAL_S)
        {
            self.window_start = Some(now);
            self.used = 0;
        }
        if self.used >= self.per_interval {
            self.held_back += 1;
            return None;
        }
        self.used += 1;
        Some(std::mem::take(&mut self.held_back))
    }

    /// Gives back a line taken and not written.
    fn give_back(&mut self, held_back: u64) {
        self.used = self.used.saturating_sub(1);
        self.held_back += held_back;
    }
}

/// The gate's memory of recent refusals, so that a runner asking every 2 s is not written down
/// every 2 s, and of the lines logged, so that no one fills the journal.
pub struct Recent {
    recorded: Mutex<HashMap<(String, &'static str), Millis>>,
    unbound: Mutex<LineBudget>,
    total: Mutex<LineBudget>,
}

impl Default for Recent {
    fn default() -> Self {
        Recent {
            recorded: Mutex::default(),
            unbound: Mutex::new(LineBudget::new(UNBOUND_LINES_PER_INTERVAL)),
            total: Mutex::new(LineBudget::new(LINES_PER_INTERVAL)),
        }
    }
}

/// Whether a refusal is written down and logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Note {
    /// Written to the runner's record (bound runners only).
    record: bool,
    /// Logged, with how many lines were held back before it.
    log: Option<u64>,
}

impl Recent {
    /// Whether a refusal with `code` of `runner` (`None`: no bound runner) at `now` is
    /// written down and logged.
    fn note(&self, runner: Option<&RunnerId>, code: &'static str, now: Millis) -> Note {
        let record = match runner {
            Some(runner) => {
                let mut recorded = self.recorded.lock().expect("recent refusals");
                if recorded.len() >= MAX_REMEMBERED {
                    recorded.clear();
                }
                let key = (runner.as_str().to_string(), code);
                match recorded.get(&key) {
                    Some(at) if now.secs_since(*at) < RECORD_INTERVAL_S => false,
                    _ => {
                        recorded.insert(key, now);
                        true
                    }
                }
            }
            None => {
                let mut unbound = self.unbound.lock().expect("unbound lines");
                let Some(held_back) = unbound.take(now) else {
                    return Note {
                        record: false,
                        log: None,
                    };
                };
                let mut total = self.total.lock().expect("refusal lines");
                return match total.take(now) {
                    Some(more) => Note {
                        record: false,
                        log: Some(held_back + more),
                    },
                    None => {
                        unbound.give_back(held_back);
                        Note {
                            record: false,
                            log: None,
                        }
                    }
                };
            }
        };
        let log = if record {
            self.total.lock().expect("refusal lines").take(now)
        } else {
            None
        };
        Note { record, log }
    }
}

/// Judges a fetch from `identity` (`None`: the forge runner named itself in no way the gate
/// reads), presenting `token` (a Forgejo runner's `x-runner-token`), at `now`.
pub async fn judge(
    gate: &GateState,
    identity: Option<&ForgeIdentity>,
    token: Option<&str>,
    now: Millis,
) -> StoreResult<Judged> {
    let unbound = || Judged {
        verdict: if gate.settings().pass_unbound {
            Verdict::Forward
        } else {
            Verdict::Refuse(FetchRefusal::UnknownRunner)
        },
        subject: None,
    };
    let Some(identity) = identity else {
        return Ok(unbound());
    };
    let store = gate.store();
    let Some((runner_id, binding)) = store.gate_forge_runner(identity).await? else {
        return Ok(unbound());
    };
    if !binding.owns_fetch(token) {
        return Ok(Judged {
            verdict: Verdict::Untouched,
            subject: None,
        });
    }
    if binding.fetch_worth_noting(now) {
        store
            .note_forge_fetch(identity, &binding.identity, now)
            .await?;
    }
    let Some(runner) = store.gate_runner(&runner_id).await? else {
        return Ok(unbound());
    };
    let Some(pool) = store.gate_pool(&runner.record.pool).await? else {
        return Ok(unbound());
    };
    let mut judged = judge_fetch(&runner.record, &pool, now, gate.rules());
    if judged
        .as_ref()
        .is_err_and(FetchRefusal::may_rest_on_an_older_attestation)
    {
        // Another replica may have recorded a newer attestation that it does not announce
        // (`store::verdict_cache`): such a refusal is confirmed against the database.
        let Some(runner) = store.gate_runner_now(&runner_id).await? else {
            return Ok(unbound());
        };
        judged = judge_fetch(&runner.record, &pool, now, gate.rules());
    }
    let verdict = match judged {
        Ok(()) => Verdict::Forward,
        Err(r) if pool.gate_mode == GateMode::Observe => Verdict::Observe(r),
        Err(r) => Verdict::Refuse(r),
    };
    Ok(Judged {
        verdict,
        subject: Some((runner_id, pool.name)),
    })
}

/// Writes down and logs a refusal (at most once per runner and code per interval, and within
/// the budgets of lines).
pub async fn record(
    gate: &GateState,
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
    let note = gate
        .gate()
        .recent
        .note(judged.subject.as_ref().map(|(r, _)| r), code, now);
    match &judged.subject {
        Some((runner, pool)) => {
            if note.record {
                let detail = format!("{} fetch: {}", forge.as_str(), refusal.detail());
                gate.store()
                    .record_refusal(runner, code, &detail, now)
                    .await?;
            }
            if let Some(held_back) = note.log {
                tracing::info!(runner_id = %runner, pool = %pool, forge = forge.as_str(), code, observed, lines_held_back = held_back, "forge fetch refused");
            }
        }
        None => {
            if let Some(held_back) = note.log {
                let who = identity.map_or("unnamed", |i| i.key.as_str());
                tracing::info!(
                    forge = forge.as_str(),
                    forge_runner = who,
                    code,
                    lines_held_back = held_back,
                    "forge fetch refused"
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_uuids_get_a_bounded_number_of_lines_and_bound_runners_theirs() {
        let recent = Recent::default();
        let start = Millis(1_800_000_000_000);
        // 5,807 fetches with random uuids in 5 s, as seen in the wild.
        let mut lines = 0;
        for i in 0..5_807 {
            let now = Millis(start.0 + i * 5_000 / 5_807);
            if recent.note(None, "unknown_runner", now).log.is_some() {
                lines += 1;
            }
        }
        assert_eq!(lines, UNBOUND_LINES_PER_INTERVAL);
        // Meanwhile a bound runner's refusal is written down and logged, once per interval.
        let r = RunnerId("r1".into());
        let first = recent.note(Some(&r), "probe_failed", Millis(start.0 + 5_000));
        assert_eq!(
            first,
            Note {
                record: true,
                log: Some(0)
            }
        );
        let again = recent.note(Some(&r), "probe_failed", Millis(start.0 + 6_000));
        assert_eq!(
            again,
            Note {
                record: false,
                log: None
            }
        );
        // The next interval's first unbound line says how many were held back.
        let later = Millis(start.0 + RECORD_INTERVAL_S * 1000);
        let next = recent.note(None, "unknown_runner", later).log;
        assert_eq!(next, Some(5_807 - u64::from(UNBOUND_LINES_PER_INTERVAL)));
    }

    #[test]
    fn all_lines_together_stay_within_the_total() {
        let recent = Recent::default();
        let now = Millis(1_800_000_000_000);
        let logged = (0..1_000)
            .filter(|i| {
                let r = RunnerId(format!("r{i}"));
                recent.note(Some(&r), "probe_failed", now).log.is_some()
            })
            .count();
        assert_eq!(logged, LINES_PER_INTERVAL as usize);
        // Each was still written down on its runner.
        let r = RunnerId("r-new".into());
        assert!(recent.note(Some(&r), "probe_failed", now).record);
        assert_eq!(recent.note(None, "unknown_runner", now).log, None);
    }
}

//! How loaded a pool is for an ejection: its live runners, those ejected already, and whether
//! another is admitted, counted from its runners' observed statuses.
//!
//! Why not in `ejection`: counting needs each runner's status, and a status comes from the
//! verdict, which itself refuses an ejected runner (`verdict::Refusal::Ejected`). So ejection's
//! vocabulary and its rule (`ejection::record`, which takes the load as a value) sit below the
//! verdict, and this count sits above the runner's observation.

use super::ejection::PoolLoad;
use super::ids::RunnerId;
use super::pool::{GateMode, Pool};
use super::runner::{RunnerSummary, StatusRules};
use super::status::RunnerStatus;
use super::time::Millis;

/// The load of `pool` for an ejection of `runner`, from its runners' summaries.
pub fn of(
    runner: &RunnerId,
    summaries: &[RunnerSummary],
    pool: &Pool,
    now: Millis,
    rules: StatusRules,
) -> PoolLoad {
    let mut load = PoolLoad {
        observe: pool.gate_mode == GateMode::Observe,
        ..PoolLoad::default()
    };
    for s in summaries.iter().filter(|s| s.pool == pool.name) {
        let status = s.observe(pool, now, rules).status;
        let live = !matches!(
            status,
            RunnerStatus::Revoked | RunnerStatus::Stale | RunnerStatus::Unknown
        );
        let admitted = status == RunnerStatus::Healthy;
        if &s.id == runner {
            load.live += i64::from(live);
            continue;
        }
        load.live += i64::from(live);
        load.ejected += i64::from(live && s.gate.ejection.is_some());
        load.others_admitted += i64::from(admitted);
    }
    load
}

//! A pool's recent past, for the page's timelines: one sample a minute of its runners by
//! status, its refusals, and its roll (live runners, and those on an image outside the current
//! set), and the buckets a window of them is drawn in.
//!
//! Samples are taken by one replica a minute (`crate::timeline`) and kept a day; the page draws
//! the last hour a minute a bar and the last day a quarter hour a bar (`http::page::timeline`).

use super::pool_name::PoolName;
use super::roll::roll_health;
use super::runner::{RunnerSummary, StatusRules};
use super::time::Millis;
use std::collections::BTreeMap;

/// How often a pool is sampled, and how long samples are kept.
pub const SAMPLE_EVERY_S: i64 = 60;
pub const SAMPLES_KEPT_S: i64 = 86_400;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSample {
    pub pool: PoolName,
    pub at: Millis,
    /// Runners by status (`healthy`, `probe_failed`, …), revoked ones left out.
    pub counts: BTreeMap<String, i64>,
    /// Refusals in the runs of refusals that went on in the minute before `at`.
    pub refusals: i64,
    /// Live runners, and the live ones on an image outside the current set.
    pub live: i64,
    pub drifted: i64,
}

impl PoolSample {
    /// The sample of `pool` at `now` from its runners, and the refusals counted since the
    /// minute began.
    pub fn take(
        pool: &super::pool::Pool,
        runners: &[RunnerSummary],
        refusals: i64,
        now: Millis,
        rules: StatusRules,
    ) -> PoolSample {
        let mut counts = BTreeMap::new();
        for r in runners
            .iter()
            .filter(|r| r.pool == pool.name && !r.is_revoked())
        {
            let status = r.observe(pool, now, rules).status;
            *counts.entry(status.as_str().to_string()).or_insert(0) += 1;
        }
        let health = roll_health(pool, runners, now, rules, 1.0);
        PoolSample {
            pool: pool.name.clone(),
            at: now,
            counts,
            refusals,
            live: health.live as i64,
            drifted: health.drifted as i64,
        }
    }
}

/// `samples` (any order) in `n` buckets of `width_s` ending at `end`: each bucket the latest
/// sample in it (runner counts are states), refusals summed (they are events). A bucket with no
/// sample is `None`.
pub fn buckets(
    samples: &[PoolSample],
    end: Millis,
    width_s: i64,
    n: usize,
) -> Vec<Option<PoolSample>> {
    let start = end.0 - width_s * 1000 * n as i64;
    let mut out: Vec<Option<PoolSample>> = vec![None; n];
    let mut sorted: Vec<&PoolSample> = samples
        .iter()
        .filter(|s| s.at.0 > start && s.at <= end)
        .collect();
    sorted.sort_by_key(|s| s.at);
    for s in sorted {
        let i = (((s.at.0 - start - 1) / (width_s * 1000)) as usize).min(n - 1);
        let refusals = out[i].as_ref().map_or(0, |b| b.refusals) + s.refusals;
        out[i] = Some(PoolSample {
            refusals,
            ..s.clone()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: i64, healthy: i64, refusals: i64) -> PoolSample {
        PoolSample {
            pool: PoolName::parse("linux").unwrap(),
            at: Millis::from_secs(at_s),
            counts: BTreeMap::from([("healthy".to_string(), healthy)]),
            refusals,
            live: healthy,
            drifted: 0,
        }
    }

    #[test]
    fn buckets_keep_the_latest_state_and_sum_the_events() {
        let samples = [sample(60, 3, 1), sample(120, 4, 2), sample(300, 5, 7)];
        let b = buckets(&samples, Millis::from_secs(300), 150, 2);
        let first = b[0].as_ref().unwrap();
        assert_eq!((first.counts["healthy"], first.refusals), (4, 3));
        let second = b[1].as_ref().unwrap();
        assert_eq!((second.counts["healthy"], second.refusals), (5, 7));
        let sparse = buckets(&samples, Millis::from_secs(600), 60, 5);
        assert!(
            sparse.iter().all(Option::is_none),
            "nothing in the last five minutes"
        );
    }
}

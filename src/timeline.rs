//! Sampling pools in the background for the page's timelines: once a minute, one replica
//! (the `sample` task's claim) records each pool's runners by status, its refusals of the
//! minute and its roll (`domain::timeline`). The pruner deletes samples after a day.

use crate::app::AppState;
use crate::domain::time::Millis;
use crate::domain::timeline::{PoolSample, SAMPLE_EVERY_S};
use crate::store::StoreResult;
use std::collections::BTreeMap;
use std::time::Duration;

const TASK: &str = "sample";

/// One turn at `now`: the samples taken, or `None` when another replica holds the task. The
/// claim is not let go: it holds until the next turn is due.
pub async fn sample_once(state: &AppState, now: Millis) -> StoreResult<Option<Vec<PoolSample>>> {
    let store = state.store();
    // Held until the next turn is due: of replicas that try in one minute, one samples.
    let until = now.plus_secs(SAMPLE_EVERY_S - 5);
    if !store.claim_task(TASK, now, until).await? {
        return Ok(None);
    }
    take_samples(state, now).await.map(Some)
}

/// Samples every pool at `now` and records the samples (whoever holds the task).
pub async fn take_samples(state: &AppState, now: Millis) -> StoreResult<Vec<PoolSample>> {
    let store = state.store();
    let pools = store.list_pools().await?;
    let runners = store.runner_summaries(None, false).await?;
    let by_runner = store
        .refusal_counts_since(now.minus_secs(SAMPLE_EVERY_S))
        .await?;
    let mut refusals: BTreeMap<&str, i64> = BTreeMap::new();
    for r in &runners {
        if let Some(n) = by_runner.get(&r.id) {
            *refusals.entry(r.pool.as_str()).or_insert(0) += n;
        }
    }
    let rules = state.settings().status_rules();
    let samples: Vec<PoolSample> = pools
        .iter()
        .map(|p| {
            let n = refusals.get(p.name.as_str()).copied().unwrap_or(0);
            PoolSample::take(p, &runners, n, now, rules)
        })
        .collect();
    store.record_pool_samples(&samples).await?;
    Ok(samples)
}

pub async fn run(state: AppState) {
    let shutdown = state.shutdown().clone();
    let mut tick = tokio::time::interval(Duration::from_secs(SAMPLE_EVERY_S as u64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if let Err(e) = sample_once(&state, Millis::now()).await {
            tracing::warn!(error = %e, "sampling pools failed; retrying next minute");
        }
    }
}

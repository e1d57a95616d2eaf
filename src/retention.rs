//! Pruning in the background: what is past its retention (`domain::retention`) is deleted in
//! short batches, by one replica at a time, and counted in `/metrics`.
//!
//! Every `PRUNE_INTERVAL` a replica tries to claim the `prune` task; the one that gets it
//! prunes at most `MAX_BATCHES` batches of each kind (so that a backlog is worked off over a
//! few turns, never in one long run), then lets the task go. A claim that is never released
//! (the replica died) lapses after `CLAIM_S`.

use crate::domain::retention::Retention;
use crate::domain::time::Millis;
use crate::metrics::Metrics;
use crate::store::{DynStore, PruneReport, StoreResult};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// Batches of each kind per turn (of `store::sql::retention::BATCH` rows each).
pub const MAX_BATCHES: u32 = 40;
/// How long a replica's claim on the task holds if it never lets go.
pub const CLAIM_S: i64 = 300;
const TASK: &str = "prune";

/// One turn at `now`: `None` when another replica holds the task.
pub async fn prune_once(
    store: &DynStore,
    metrics: &Metrics,
    retention: Retention,
    now: Millis,
) -> StoreResult<Option<PruneReport>> {
    let until = now.plus_secs(CLAIM_S);
    if !store.claim_task(TASK, now, until).await? {
        return Ok(None);
    }
    let pruned = store.prune(&retention.horizons(now), MAX_BATCHES).await;
    // Let go whether or not the turn went through (the next may), but only of our own claim:
    // one that lapsed and was taken by another replica meanwhile is that replica's.
    let released = store.release_task(TASK, until, now).await;
    let report = pruned?;
    released?;
    for (kind, n) in &report.kinds {
        metrics.pruned(kind, *n);
    }
    if report.total() > 0 {
        tracing::info!(rows = report.total(), kinds = ?report.kinds, "pruned past retention");
    }
    Ok(Some(report))
}

pub async fn run(
    store: DynStore,
    metrics: Arc<Metrics>,
    retention: Retention,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(PRUNE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if let Err(e) = prune_once(&store, &metrics, retention, Millis::now()).await {
            tracing::warn!(error = %e, "pruning failed; retrying next turn");
        }
    }
}

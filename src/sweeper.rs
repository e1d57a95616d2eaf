//! Housekeeping in the background: lease expiry (within 2 s of `expires_at`, as PROTOCOL.md
//! promises) and purging replay state that can no longer matter.
//!
//! `sweep_once` is what tests call; `run` calls it every second until shutdown.

use crate::domain::time::Millis;
use crate::metrics::Metrics;
use crate::store::{DynStore, StoreResult, SweepReport};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

pub async fn sweep_once(
    store: &DynStore,
    metrics: &Metrics,
    now: Millis,
) -> StoreResult<SweepReport> {
    let report = store.sweep(now).await?;
    for ended in &report.ended {
        metrics.lease_ended(ended, "lease_expired");
    }
    if report.leases_expired > 0 {
        tracing::info!(
            leases_expired = report.leases_expired,
            "expired overdue leases"
        );
    }
    Ok(report)
}

pub async fn run(store: DynStore, metrics: std::sync::Arc<Metrics>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if let Err(e) = sweep_once(&store, &metrics, Millis::now()).await {
            tracing::warn!(error = %e, "sweep failed; retrying next tick");
        }
    }
}

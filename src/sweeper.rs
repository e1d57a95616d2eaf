//! Housekeeping in the background: lease expiry (within 2 s of `expires_at`, as PROTOCOL.md
//! promises), and purging spilled replay state and page sessions that can no longer matter.
//!
//! `sweep_once` is what tests call; `run` calls it every second until shutdown.
//!
//! Expiry is a sweep, not a timer per lease: a lease's deadline lives in the database, so it
//! survives a restart, and on PostgreSQL any replica may end any lease. Correctness does not
//! hang on the sweep's timing: a lease call past `expires_at` is refused whether or not the
//! sweep has run (`domain::lease::apply_call`), and a claim takes only queued jobs. What the
//! sweep does is give the job back (requeued, or failed when its attempts are spent) and wake
//! the pool's waiters. It ends leases through the same rules and fences as the lease calls, so
//! an expiry racing a call, or another replica's sweep, touches nothing that moved on. It works
//! in short transactions, each job taken with `SKIP LOCKED` on PostgreSQL (one that another
//! transaction holds is left for the next tick), so replicas sweep side by side and SQLite's
//! one writer is never held long. A stalled tick is not made up in a burst
//! (`MissedTickBehavior::Delay`).

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

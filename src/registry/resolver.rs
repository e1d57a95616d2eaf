//! Resolving pools: one attempt for one pool (the admin `resolve` call, a registry push
//! notification, the background task), and the background task itself.
//!
//! An attempt resolves what of the pool follows a registry: its single `image_ref` (a
//! `registry` pool), then each of its registry entries (`images` with `image_source:
//! registry`), one after the other, recorded together by `Store::record_image_resolutions`.
//!
//! An attempt reads the pool, asks the registry (network, outside any transaction), then
//! records the outcome through `Store::record_resolution`, which applies the pure
//! `Pool::apply_resolution` under the pool's row lock. If an operator changed the pool's
//! `image_ref` meanwhile, the outcome is dropped rather than applied to the wrong reference.
//!
//! The background task wakes every `TICK`, lists the registry pools that are due
//! (`next_resolve_at` passed, or never resolved) and claims each through
//! `Store::claim_resolution`, whose due check and claim are one atomic statement: with several
//! PostgreSQL replicas, exactly one replica resolves a due pool. A claim outlives a replica
//! that dies mid-attempt only until it expires. At most `CONCURRENCY` attempts run at once, so
//! that one slow registry does not hold up the others' pools.
//!
//! A pool that resolved before is asked with a `HEAD` first, and the same digest ends the
//! attempt there: Docker Hub counts manifest `GET`s against its pull limits, not `HEAD`s. The
//! schedule (`next_resolve_at`) is in the database, so it survives restarts and is shared by
//! replicas; the admin `resolve` call and push notifications attempt without a claim, which is
//! harmless, since each outcome is applied under the pool's row lock.

use super::Registry;
use crate::domain::digest::ImageDigest;
use crate::domain::image_set::{ImageSource, ResolutionOutcome};
use crate::domain::images::PoolImage;
use crate::domain::pool::Pool;
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::store::{DynStore, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How often the background task looks for due pools.
pub const TICK: Duration = Duration::from_secs(1);
/// How many resolutions one replica runs at once.
pub const CONCURRENCY: usize = 4;

/// Why a pool could not be resolved on request.
#[derive(Debug, thiserror::Error)]
pub enum ResolvePoolError {
    #[error("no such pool")]
    NotFound,
    #[error(
        "pool {0} takes its images from its operator (image_source manual, and no registry entry in images), not a registry"
    )]
    NotRegistry(PoolName),
    /// The attempt failed; the pool (with the failure recorded) kept its set.
    #[error("{error}")]
    Failed { pool: Box<Pool>, error: String },
    /// The pool's reference changed while the attempt ran; nothing was applied.
    #[error("pool {0} changed while it was being resolved; nothing was applied")]
    Changed(PoolName),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Resolves the pool `name` now, whatever its schedule; answers when the attempt is over.
pub async fn resolve_pool(
    store: &DynStore,
    registry: &Registry,
    name: &PoolName,
) -> Result<Pool, ResolvePoolError> {
    let pool = store
        .get_pool(name)
        .await?
        .ok_or(ResolvePoolError::NotFound)?;
    resolve_loaded(store, registry, pool).await
}

/// One attempt on a pool already read (or claimed): its single image, then its registry
/// entries. A failure of either is the attempt's failure, after both were tried.
async fn resolve_loaded(
    store: &DynStore,
    registry: &Registry,
    pool: Pool,
) -> Result<Pool, ResolvePoolError> {
    if !pool.resolves() {
        return Err(ResolvePoolError::NotRegistry(pool.name));
    }
    let mut pool = pool;
    let mut failed = None;
    if pool.image_source == ImageSource::Registry {
        match resolve_single(store, registry, pool).await {
            Ok(p) => pool = p,
            Err(ResolvePoolError::Failed { pool: p, error }) => {
                pool = *p;
                failed = Some(error);
            }
            Err(e) => return Err(e),
        }
    }
    if pool.images.iter().any(PoolImage::is_registry) {
        let (p, entry_failure) = resolve_entries(store, registry, pool).await?;
        pool = p;
        failed = failed.or(entry_failure);
    }
    match failed {
        Some(error) => Err(ResolvePoolError::Failed {
            pool: Box::new(pool),
            error,
        }),
        None => Ok(pool),
    }
}

/// Resolves each registry entry of `pool` (with a `HEAD` first where it resolved before),
/// records them together; the pool, and the first entry's failure in words naming its ref.
async fn resolve_entries(
    store: &DynStore,
    registry: &Registry,
    pool: Pool,
) -> Result<(Pool, Option<String>), ResolvePoolError> {
    let mut outcomes = Vec::new();
    for entry in pool.images.iter().filter(|i| i.is_registry()) {
        let outcome = registry
            .resolve(&entry.image_ref, entry.resolved_digest.as_ref())
            .await;
        outcomes.push((entry.image_ref.clone(), outcome));
    }
    let recorded = store
        .record_image_resolutions(&pool.name, &outcomes, Millis::now())
        .await?
        .ok_or(ResolvePoolError::NotFound)?;
    let mut failure = None;
    for (image_ref, outcome) in &outcomes {
        let before = pool.images.iter().find(|i| &i.image_ref == image_ref);
        let after = recorded.images.iter().find(|i| &i.image_ref == image_ref);
        match outcome {
            ResolutionOutcome::Resolved(image)
                if before.map(|b| &b.expected_image_ids)
                    != after.map(|a| &a.expected_image_ids) =>
            {
                tracing::info!(
                    pool = %pool.name,
                    image_ref,
                    digest = %image.digest,
                    image_id = image.image_id.as_ref().map(|d| d.to_string()),
                    "pool image entry resolved to a new set"
                );
            }
            ResolutionOutcome::Resolved(_) | ResolutionOutcome::Unchanged { .. } => {
                tracing::debug!(pool = %pool.name, image_ref, "pool image entry resolved, unchanged");
            }
            ResolutionOutcome::Failed { error } => {
                tracing::warn!(
                    pool = %pool.name,
                    image_ref,
                    failures = after.map(|a| a.resolution_failures),
                    error,
                    "pool image entry resolution failed; keeping its last known good set"
                );
                failure.get_or_insert_with(|| format!("image {image_ref}: {error}"));
            }
        }
    }
    Ok((recorded, failure))
}

/// Resolves a registry pool's single `image_ref` and records it.
async fn resolve_single(
    store: &DynStore,
    registry: &Registry,
    pool: Pool,
) -> Result<Pool, ResolvePoolError> {
    let name = pool.name.clone();
    let Some(image_ref) = pool.image_ref.clone() else {
        return Err(ResolvePoolError::NotRegistry(name));
    };
    let outcome = registry
        .resolve(&image_ref, pool.resolved_digest.as_ref())
        .await;
    let recorded = store
        .record_resolution(&name, &image_ref, &outcome, Millis::now())
        .await?
        .ok_or_else(|| ResolvePoolError::Changed(name.clone()))?;
    match outcome {
        ResolutionOutcome::Resolved(image) => {
            if recorded.expected_image_ids != pool.expected_image_ids {
                tracing::info!(
                    pool = %name,
                    image_ref,
                    digest = %image.digest,
                    image_id = image.image_id.as_ref().map(|d| d.to_string()),
                    accepted = recorded.expected_image_ids.len(),
                    previous_valid_until = recorded.previous_valid_until.map(|m| m.to_string()),
                    "pool image resolved to a new set"
                );
            } else {
                tracing::debug!(pool = %name, image_ref, digest = %image.digest, "pool image resolved, unchanged");
            }
            Ok(recorded)
        }
        ResolutionOutcome::Unchanged { digest } => {
            tracing::debug!(pool = %name, image_ref, %digest, "pool image unchanged (HEAD)");
            Ok(recorded)
        }
        ResolutionOutcome::Failed { error } => {
            tracing::warn!(
                pool = %name,
                image_ref,
                failures = recorded.resolution_failures,
                error,
                "pool image resolution failed; keeping the last known good set"
            );
            Err(ResolvePoolError::Failed {
                pool: Box::new(recorded),
                error,
            })
        }
    }
}

/// An attempt nobody waits for: its outcome is recorded and logged by `resolve_loaded`;
/// only a store failure (the outcome could not be recorded) is left to log here.
async fn background_attempt(store: &DynStore, registry: &Registry, pool: Pool) {
    match resolve_loaded(store, registry, pool).await {
        Err(ResolvePoolError::Store(e)) => {
            tracing::warn!(error = %e, "cannot record a pool resolution");
        }
        Err(ResolvePoolError::Changed(pool)) => {
            tracing::info!(pool = %pool, "pool changed during its resolution; dropped the outcome");
        }
        _ => {}
    }
}

/// Claims the due registry pools at `now` and starts an attempt for each, up to the free
/// permits. Returns how many it started.
async fn start_due(
    store: &DynStore,
    registry: &Arc<Registry>,
    permits: &Arc<Semaphore>,
    running: &mut JoinSet<()>,
    now: Millis,
) -> Result<usize, StoreError> {
    let per_reference = registry.settings().timeout.as_secs() as i64 * 4 + 30;
    let mut started = 0;
    for pool in store.list_pools().await? {
        if !pool.resolution_due(now) {
            continue;
        }
        // Its references are resolved one after the other: the claim covers them all.
        let references = 1 + pool.images.iter().filter(|i| i.is_registry()).count() as i64;
        let claim_for = per_reference * references;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            break;
        };
        let Some(claimed) = store
            .claim_resolution(&pool.name, now, now.plus_secs(claim_for))
            .await?
        else {
            continue;
        };
        let (store, registry) = (store.clone(), registry.clone());
        running.spawn(async move {
            background_attempt(&store, &registry, claimed).await;
            drop(permit);
        });
        started += 1;
    }
    Ok(started)
}

/// The background resolver: until `shutdown`, resolves every registry pool when it is due
/// (at once for a pool never resolved). In-flight attempts are abandoned at shutdown; their
/// claims expire on their own.
pub async fn run(store: DynStore, registry: Arc<Registry>, shutdown: CancellationToken) {
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let mut running = JoinSet::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => break,
        }
        while running.try_join_next().is_some() {}
        if let Err(e) = start_due(&store, &registry, &permits, &mut running, Millis::now()).await {
            tracing::warn!(error = %e, "cannot look for pools to resolve; retrying next tick");
        }
    }
    running.shutdown().await;
}

/// How often, and how far apart, a notified resolution looks again for the pushed digest.
pub const NOTIFIED_ATTEMPTS: u32 = 10;
pub const NOTIFIED_RETRY: Duration = Duration::from_millis(500);

/// Starts a resolution of each pool in the background (a registry push notification), so
/// that the notification is answered at once, as registries expect. A registry notifies a
/// manifest push before it moves the tag, so a resolution that does not find the pushed
/// digest yet looks again, up to `NOTIFIED_ATTEMPTS` times `NOTIFIED_RETRY` apart; it stops
/// at the first failure (recorded as any other) and leaves the rest to the schedule.
pub fn spawn_resolutions(
    store: &DynStore,
    registry: &Arc<Registry>,
    pools: Vec<(Pool, Option<ImageDigest>)>,
) {
    for (pool, pushed) in pools {
        let (store, registry) = (store.clone(), registry.clone());
        tokio::spawn(async move {
            let name = pool.name.clone();
            let mut current = pool;
            for attempt in 1..=NOTIFIED_ATTEMPTS {
                if attempt > 1 {
                    tokio::time::sleep(NOTIFIED_RETRY).await;
                    match store.get_pool(&name).await {
                        Ok(Some(p)) => current = p,
                        _ => return,
                    }
                }
                match resolve_loaded(&store, &registry, current.clone()).await {
                    Ok(resolved)
                        if pushed
                            .as_ref()
                            .is_none_or(|p| resolved.resolved_digests().any(|d| d == p)) =>
                    {
                        return;
                    }
                    Ok(_) => {}
                    Err(ResolvePoolError::Store(e)) => {
                        tracing::warn!(error = %e, "cannot record a pool resolution");
                        return;
                    }
                    Err(_) => return,
                }
            }
            tracing::info!(pool = %name, "the pushed digest did not show under the tag; left to the schedule");
        });
    }
}

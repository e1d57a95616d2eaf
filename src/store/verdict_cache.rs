//! The gate's inputs kept in memory: each runner's key, pool, cordon, quarantine and
//! revocation, and each pool's expected images.
//!
//! A runner's key is kept decoded beside its record (`GateRunner`): decompressing the point
//! is a good part of a verification's cost, and the key can only change with the record, so
//! whatever drops the record drops its key. The record is shared, not copied, by each request.
//!
//! Every attestation needs them and they change rarely (an operator's cordon, a revocation, an
//! abandoned lease's quarantine, a pool edit or a registry roll), so reading them from the
//! database on every request would double its reads. Entries are dropped by the writes that
//! change them, as each write says (`engine::Change`, applied by `gated::Held`): in this process
//! once the write has committed, on other PostgreSQL replicas from the `NOTIFY` the write sends
//! in its transaction. A TTL bounds what a lost notification could leave stale.
//!
//! A read that started before a write and finishes after its invalidation must not put the old
//! value back: every invalidation bumps a generation, and a value read under an older
//! generation is not kept.
//!
//! What a stale entry could do is bounded: a claim re-reads the runner's revocation and cordon
//! under its row lock, so no job goes to a revoked or cordoned runner whatever the cache says.

use crate::domain::ids::RunnerId;
use crate::domain::pool::Pool;
use crate::domain::pool_name::PoolName;
use crate::domain::runner::Runner;
use crate::verifier::RunnerKey;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How long an entry may live without an invalidation: the bound on staleness should a
/// cross-replica notification be lost.
pub const TTL: Duration = Duration::from_secs(30);

/// A runner as the gate judges it: its record and its key, decoded from the record.
#[derive(Clone, Debug)]
pub struct GateRunner {
    pub record: Arc<Runner>,
    pub key: RunnerKey,
}

impl GateRunner {
    pub fn new(runner: Runner) -> Self {
        GateRunner {
            key: RunnerKey::parse(&runner.public_key_x),
            record: Arc::new(runner),
        }
    }
}

#[derive(Clone, Default)]
pub struct VerdictCache {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    generation: AtomicU64,
    runners: RwLock<HashMap<RunnerId, (GateRunner, Instant)>>,
    pools: RwLock<HashMap<PoolName, (Pool, Instant)>>,
}

impl VerdictCache {
    /// The generation to pass to `keep_*` for a value about to be read from the database.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    pub fn runner(&self, id: &RunnerId) -> Option<GateRunner> {
        let map = self.inner.runners.read().unwrap_or_else(|e| e.into_inner());
        map.get(id)
            .filter(|(_, at)| at.elapsed() < TTL)
            .map(|(r, _)| r.clone())
    }

    pub fn pool(&self, name: &PoolName) -> Option<Pool> {
        let map = self.inner.pools.read().unwrap_or_else(|e| e.into_inner());
        map.get(name)
            .filter(|(_, at)| at.elapsed() < TTL)
            .map(|(p, _)| p.clone())
    }

    /// Keeps `runner`, read under `generation`, unless something was invalidated since.
    pub fn keep_runner(&self, generation: u64, runner: &GateRunner) {
        let mut map = self
            .inner
            .runners
            .write()
            .unwrap_or_else(|e| e.into_inner());
        // Checked under the write lock: invalidations take it too, after bumping.
        if self.generation() == generation {
            map.insert(runner.record.id.clone(), (runner.clone(), Instant::now()));
        }
    }

    pub fn keep_pool(&self, generation: u64, pool: &Pool) {
        let mut map = self.inner.pools.write().unwrap_or_else(|e| e.into_inner());
        if self.generation() == generation {
            map.insert(pool.name.clone(), (pool.clone(), Instant::now()));
        }
    }

    pub fn forget_runner(&self, id: &RunnerId) {
        self.bump();
        let mut map = self
            .inner
            .runners
            .write()
            .unwrap_or_else(|e| e.into_inner());
        map.remove(id);
    }

    pub fn forget_pool(&self, name: &PoolName) {
        self.bump();
        let mut map = self.inner.pools.write().unwrap_or_else(|e| e.into_inner());
        map.remove(name);
    }

    /// After a lost connection to the change feed: anything may have changed.
    pub fn forget_all(&self) {
        self.bump();
        self.inner
            .runners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.inner
            .pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn bump(&self) {
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::image_set::ImageSource;
    use crate::domain::pool::{ImagePolicy, PoolSpec};
    use crate::domain::time::Millis;
    use crate::domain::verdict::GateState;

    fn runner(id: &str) -> Runner {
        Runner {
            forge_runners: vec![],
            forge_runners_taken: vec![],
            last_rejection: None,
            agent: Default::default(),
            ejection: Default::default(),
            id: RunnerId(id.into()),
            name: id.into(),
            pool: PoolName::from_trusted("p".into()),
            labels: Default::default(),
            public_key_x: "x".into(),
            gate: GateState::default(),
            revoked_at: None,
            registered_at: Millis(0),
            latest: None,
            current_lease: None,
        }
    }

    #[test]
    fn a_read_from_before_an_invalidation_is_not_kept() {
        let cache = VerdictCache::default();
        let before = cache.generation();
        cache.forget_runner(&RunnerId("r1".into()));
        cache.keep_runner(before, &GateRunner::new(runner("r1")));
        assert!(cache.runner(&RunnerId("r1".into())).is_none());
        cache.keep_runner(cache.generation(), &GateRunner::new(runner("r1")));
        assert!(cache.runner(&RunnerId("r1".into())).is_some());
    }

    #[test]
    fn forgetting_drops_what_it_names_and_forget_all_everything() {
        let cache = VerdictCache::default();
        let pool = Pool::apply(
            PoolName::from_trusted("p".into()),
            None,
            PoolSpec {
                gate_mode: Default::default(),
                image_ref: None,
                expected_image_ids: vec![],
                image_policy: ImagePolicy::Report,
                image_source: ImageSource::Manual,
                drift_grace_s: 900,
                resolve_interval_s: 300,
                github: None,
                disk_warning: None,
                ejection: Default::default(),
                images: Vec::new(),
                undescribed_images: Default::default(),
            },
            Millis(0),
        );
        cache.keep_runner(cache.generation(), &GateRunner::new(runner("r1")));
        cache.keep_runner(cache.generation(), &GateRunner::new(runner("r2")));
        cache.keep_pool(cache.generation(), &pool);
        cache.forget_runner(&RunnerId("r1".into()));
        assert!(cache.runner(&RunnerId("r1".into())).is_none());
        assert!(cache.runner(&RunnerId("r2".into())).is_some());
        cache.forget_pool(&pool.name);
        assert!(cache.pool(&pool.name).is_none());
        cache.forget_all();
        assert!(cache.runner(&RunnerId("r2".into())).is_none());
    }

    #[test]
    fn a_runners_key_is_dropped_with_its_record_and_read_again_from_the_new_one() {
        use base64::Engine;
        let x = |seed: u8| {
            let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]).verifying_key();
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.as_bytes())
        };
        let cache = VerdictCache::default();
        let id = RunnerId("r1".into());
        let mut old = runner("r1");
        old.public_key_x = x(1);
        cache.keep_runner(cache.generation(), &GateRunner::new(old));
        assert_eq!(cache.runner(&id).unwrap().key, RunnerKey::parse(&x(1)));
        // A write that changes the runner (a revocation, another key) forgets it: the next
        // read keeps the record as it is now, key and all.
        let before = cache.generation();
        cache.forget_runner(&id);
        let mut new = runner("r1");
        new.public_key_x = x(2);
        cache.keep_runner(before, &GateRunner::new(new.clone()));
        assert!(
            cache.runner(&id).is_none(),
            "read before the change: not kept"
        );
        cache.keep_runner(cache.generation(), &GateRunner::new(new));
        let kept = cache.runner(&id).unwrap();
        assert_eq!(kept.key, RunnerKey::parse(&x(2)));
        assert_ne!(kept.key, RunnerKey::parse(&x(1)));
        assert_eq!(RunnerKey::parse(&kept.record.public_key_x), kept.key);
    }
}

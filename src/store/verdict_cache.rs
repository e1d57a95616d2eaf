//! The gate's inputs kept in memory: each runner's key, pool, cordon, quarantine, revocation
//! and latest attestation, each pool's expected images, and which runner each forge runner is
//! bound to. The lease path reads the runner and its pool; the forge gate the binding, the
//! runner and its pool, in that order.
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
//! A runner's latest attestation changes with every heartbeat, too often to be a change every
//! replica forgets: a round writes the attestations it accepted through to this process's
//! entries once committed (`attested`), and says a runner changed, for every replica, only
//! when its attestation's facts or status did (`sql::round`). That write-through also renews
//! the entry's TTL, up to `MAX_AGE` from its read: a round that committed without changing its
//! runner's gate, and whose row holds the cordon, quarantine and ejection its attestation was
//! judged by, is a sign the entry still holds, and without it a runner heartbeating every
//! 15 s had its entry read again (two statements on the pool) every other heartbeat. A round
//! whose row does not hold them (the entry missed a change: a notification lost, a change made
//! behind the service) forgets the entry instead (`record::Plan::stale`), so a missed change
//! outlives no more than the round after it. Another replica's entry may thus hold an older
//! attestation with the same facts (and the same running image, but perhaps not the same other
//! images it claims), which can only be judged too old or refused for those images: the forge
//! gate confirms such a refusal against the database (`forge_gate::decide`).
//!
//! A binding (or its absence, for a forge runner bound to none) is dropped, every one, by any
//! change of the bindings (`Change::ForgeRunners`): they change when an operator or an agent
//! binds, or a runner is revoked, rarely. Absences are kept only while few entries are held, so
//! that fetches naming random uuids cannot fill memory; past `MAX_BINDINGS` entries a binding
//! takes the place of another (an identity carries what its request named, a GitLab
//! `system_id`, so one runner's token could otherwise add entries without end).
//!
//! What a stale entry could do is bounded: a claim re-reads the runner's revocation and cordon
//! under its row lock, so no job goes to a revoked or cordoned runner whatever the cache says.

use crate::domain::forge::{ForgeBinding, ForgeIdentity};
use crate::domain::ids::RunnerId;
use crate::domain::pool::Pool;
use crate::domain::pool_name::PoolName;
use crate::domain::runner::{LatestAttestation, Runner};
use crate::domain::time::Millis;
use crate::domain::verdict::AttestedState;
use crate::verifier::RunnerKey;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
// tokio's clock, so that tests can move it; outside a runtime (the SQLite writer's thread)
// it is the system's.
use tokio::time::Instant;

/// How long an entry may live without an invalidation and without being renewed: the bound on
/// staleness should a cross-replica notification be lost (a lost connection to the change feed
/// forgets everything at once; this is the bound for what nothing detected).
pub const TTL: Duration = Duration::from_secs(30);

/// The longest a runner's entry lives after it was read from the database, however often its
/// rounds renew it (`attested`).
pub const MAX_AGE: Duration = Duration::from_secs(300);

/// The most bindings held before an absence is no longer kept.
pub const MAX_BINDINGS: usize = 50_000;

/// What a forge runner's identity is bound to: its runner and the binding, or nothing.
pub type Bound = Option<(RunnerId, ForgeBinding)>;

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

/// A runner's entry: when it was read from the database, and when last renewed (or read).
struct HeldRunner {
    runner: GateRunner,
    read: Instant,
    renewed: Instant,
}

impl HeldRunner {
    fn fresh(&self) -> bool {
        // One reading of the clock: this is on every attestation's path.
        let now = Instant::now();
        now - self.renewed < TTL && now - self.read < MAX_AGE
    }
}

#[derive(Clone, Default)]
pub struct VerdictCache {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    generation: AtomicU64,
    runners: RwLock<HashMap<RunnerId, HeldRunner>>,
    pools: RwLock<HashMap<PoolName, (Pool, Instant)>>,
    /// By the identity a fetch named (a GitLab fetch's `system_id` included).
    bindings: RwLock<HashMap<ForgeIdentity, (Bound, Instant)>>,
}

impl VerdictCache {
    /// The generation to pass to `keep_*` for a value about to be read from the database.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    pub fn runner(&self, id: &RunnerId) -> Option<GateRunner> {
        let map = self.inner.runners.read().unwrap_or_else(|e| e.into_inner());
        map.get(id)
            .filter(|held| held.fresh())
            .map(|held| held.runner.clone())
    }

    pub fn pool(&self, name: &PoolName) -> Option<Pool> {
        let map = self.inner.pools.read().unwrap_or_else(|e| e.into_inner());
        map.get(name)
            .filter(|(_, at)| at.elapsed() < TTL)
            .map(|(p, _)| p.clone())
    }

    /// What the forge runner `identity` is bound to: `None` when not held.
    pub fn binding(&self, identity: &ForgeIdentity) -> Option<Bound> {
        let map = self
            .inner
            .bindings
            .read()
            .unwrap_or_else(|e| e.into_inner());
        map.get(identity)
            .filter(|(_, at)| at.elapsed() < TTL)
            .map(|(b, _)| b.clone())
    }

    /// Keeps `runner`, read under `generation`, unless something was invalidated since (or an
    /// attestation newer than its latest was written through meanwhile).
    pub fn keep_runner(&self, generation: u64, runner: &GateRunner) {
        let mut map = self
            .inner
            .runners
            .write()
            .unwrap_or_else(|e| e.into_inner());
        // Checked under the write lock: invalidations take it too, after bumping.
        if self.generation() != generation {
            return;
        }
        let newer_held = map
            .get(&runner.record.id)
            .is_some_and(|held| received_at(&held.runner.record) > received_at(&runner.record));
        if !newer_held {
            let now = Instant::now();
            map.insert(
                runner.record.id.clone(),
                HeldRunner {
                    runner: runner.clone(),
                    read: now,
                    renewed: now,
                },
            );
        }
    }

    /// Writes an attestation accepted (and committed) for runner `id` through to its entry, if
    /// held, fresh and not already newer, and renews the entry's TTL (up to `MAX_AGE` from its
    /// read). Not an invalidation: the facts the entry was judged on are the same or, if not,
    /// the round also said the runner changed.
    pub fn attested(&self, id: &RunnerId, received: Millis, state: &AttestedState) {
        let mut map = self
            .inner
            .runners
            .write()
            .unwrap_or_else(|e| e.into_inner());
        // An entry already past its time is not brought back: the next request reads it.
        let Some(held) = map.get_mut(id).filter(|held| held.fresh()) else {
            return;
        };
        if received_at(&held.runner.record) >= Some(received) {
            return;
        }
        // In place when no request holds the record (the usual case on a heartbeat's round);
        // a request that does keeps the record it was judged on.
        Arc::make_mut(&mut held.runner.record).latest = Some(LatestAttestation {
            received_at: received,
            state: state.clone(),
        });
        held.renewed = Instant::now();
    }

    pub fn keep_pool(&self, generation: u64, pool: &Pool) {
        let mut map = self.inner.pools.write().unwrap_or_else(|e| e.into_inner());
        if self.generation() == generation {
            map.insert(pool.name.clone(), (pool.clone(), Instant::now()));
        }
    }

    /// Keeps what `identity` is bound to, read under `generation`.
    pub fn keep_binding(&self, generation: u64, identity: &ForgeIdentity, bound: &Bound) {
        let mut map = self
            .inner
            .bindings
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if self.generation() != generation {
            return;
        }
        if map.len() >= MAX_BINDINGS && !map.contains_key(identity) {
            if bound.is_none() {
                return;
            }
            // Full: a binding takes the place of another entry. The identity carries what
            // its request named (a GitLab `system_id`), so one runner's token could otherwise
            // add entries without end.
            if let Some(other) = map.keys().next().cloned() {
                map.remove(&other);
            }
        }
        map.insert(identity.clone(), (bound.clone(), Instant::now()));
    }

    /// Notes on the entry of the forge runner that fetched as `identity` that its binding's
    /// fetch was written down at `at`.
    pub fn noted_fetch(&self, identity: &ForgeIdentity, at: Millis) {
        let mut map = self
            .inner
            .bindings
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((Some((_, binding)), _)) = map.get_mut(identity) {
            binding.last_fetch_at = binding.last_fetch_at.max(Some(at));
        }
    }

    pub fn forget_bindings(&self) {
        self.bump();
        self.inner
            .bindings
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
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
        self.inner
            .bindings
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn bump(&self) {
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
    }
}

fn received_at(runner: &Runner) -> Option<Millis> {
    runner.latest.as_ref().map(|l| l.received_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::image_set::ImageSource;
    use crate::domain::pool::{ImagePolicy, PoolSpec};
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

    fn state(at: i64) -> AttestedState {
        AttestedState {
            probe: crate::domain::attestation::Probe {
                ok: true,
                runtime: "podman".into(),
                runtime_version: None,
                checked_at: Millis(at),
                error: None,
                exit_code: None,
                disk: Vec::new(),
            },
            image: Default::default(),
            images: Vec::new(),
        }
    }

    fn latest_of(cache: &VerdictCache, id: &RunnerId) -> Option<Millis> {
        received_at(&cache.runner(id).unwrap().record)
    }

    #[test]
    fn an_accepted_attestation_is_written_through_and_an_older_one_never_put_back() {
        let cache = VerdictCache::default();
        let id = RunnerId("r1".into());
        // Not held: nothing to write through (the next read gets it from the database).
        cache.attested(&id, Millis(10), &state(10));
        assert!(cache.runner(&id).is_none());
        let generation = cache.generation();
        cache.keep_runner(generation, &GateRunner::new(runner("r1")));
        cache.attested(&id, Millis(10), &state(10));
        assert_eq!(latest_of(&cache, &id), Some(Millis(10)));
        assert_eq!(
            cache
                .runner(&id)
                .unwrap()
                .record
                .latest
                .as_ref()
                .unwrap()
                .state,
            state(10)
        );
        // Out of order: the newer stays.
        cache.attested(&id, Millis(5), &state(5));
        assert_eq!(latest_of(&cache, &id), Some(Millis(10)));
        // A read that began before the write-through, kept after it, does not undo it.
        cache.keep_runner(generation, &GateRunner::new(runner("r1")));
        assert_eq!(latest_of(&cache, &id), Some(Millis(10)));
        // Writing through is no invalidation: reads in flight are still kept.
        assert_eq!(cache.generation(), generation);
    }

    #[tokio::test(start_paused = true)]
    async fn a_runner_whose_rounds_write_through_is_kept_past_the_ttl_up_to_its_max_age() {
        let cache = VerdictCache::default();
        let (renewed, idle) = (RunnerId("r1".into()), RunnerId("r2".into()));
        cache.keep_runner(cache.generation(), &GateRunner::new(runner("r1")));
        cache.keep_runner(cache.generation(), &GateRunner::new(runner("r2")));
        // A heartbeat every 15 s: r1's rounds renew it, r2 has none.
        let step = Duration::from_secs(15);
        let beats = (MAX_AGE.as_secs() / step.as_secs()) as i64;
        for beat in 1..beats {
            tokio::time::advance(step).await;
            let at = beat * 15_000;
            cache.attested(&renewed, Millis(at), &state(at));
            assert!(cache.runner(&renewed).is_some(), "renewed at {at} ms");
            assert_eq!(
                cache.runner(&idle).is_some(),
                at < TTL.as_millis() as i64,
                "r2 at {at} ms"
            );
        }
        // However often renewed, it is read again once it is `MAX_AGE` old.
        tokio::time::advance(step).await;
        cache.attested(&renewed, Millis(beats * 15_000), &state(beats * 15_000));
        assert!(cache.runner(&renewed).is_none(), "read again at MAX_AGE");
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_past_its_ttl_is_not_brought_back_by_a_write_through() {
        let cache = VerdictCache::default();
        let id = RunnerId("r1".into());
        cache.keep_runner(cache.generation(), &GateRunner::new(runner("r1")));
        tokio::time::advance(TTL).await;
        assert!(cache.runner(&id).is_none());
        cache.attested(&id, Millis(10), &state(10));
        assert!(cache.runner(&id).is_none());
        // What the next request reads is kept, with the attestation as the database has it.
        cache.keep_runner(cache.generation(), &GateRunner::new(runner("r1")));
        assert!(cache.runner(&id).is_some());
    }

    #[test]
    fn bindings_and_absences_are_kept_until_any_binding_changes() {
        let cache = VerdictCache::default();
        let identity = |n: u32| ForgeIdentity {
            kind: crate::domain::forge::ForgeKind::Forgejo,
            key: format!("uuid-{n}"),
            system_id: None,
        };
        let bound: Bound = Some((
            RunnerId("r1".into()),
            ForgeBinding {
                identity: identity(1),
                token_sha256: None,
                last_fetch_at: None,
            },
        ));
        cache.keep_binding(cache.generation(), &identity(1), &bound);
        cache.keep_binding(cache.generation(), &identity(2), &None);
        assert_eq!(cache.binding(&identity(1)), Some(bound.clone()));
        assert_eq!(cache.binding(&identity(2)), Some(None));
        assert_eq!(cache.binding(&identity(3)), None);
        // The fetch noted is remembered on the entry, so it is not noted again at once.
        cache.noted_fetch(&identity(1), Millis(7));
        let (_, binding) = cache.binding(&identity(1)).unwrap().unwrap();
        assert_eq!(binding.last_fetch_at, Some(Millis(7)));
        // Any change of the bindings drops them all, and what was read before it.
        let before = cache.generation();
        cache.forget_bindings();
        assert_eq!(cache.binding(&identity(1)), None);
        assert_eq!(cache.binding(&identity(2)), None);
        cache.keep_binding(before, &identity(1), &bound);
        assert_eq!(cache.binding(&identity(1)), None);
        // Absences stop being kept once many entries are held; bindings are still kept, each
        // in the place of another, so that the entries never pass the bound.
        for n in 0..MAX_BINDINGS as u32 {
            cache.keep_binding(cache.generation(), &identity(10 + n), &None);
        }
        cache.keep_binding(cache.generation(), &identity(2), &None);
        assert_eq!(cache.binding(&identity(2)), None);
        for n in 0..100 {
            cache.keep_binding(cache.generation(), &identity(1_000_000 + n), &bound);
        }
        cache.keep_binding(cache.generation(), &identity(1), &bound);
        assert_eq!(cache.binding(&identity(1)), Some(bound));
        let held = cache.inner.bindings.read().unwrap().len();
        assert_eq!(held, MAX_BINDINGS);
    }
}

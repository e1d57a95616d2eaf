//! What this process holds in memory of the database, and how a committed change reaches it.
//!
//! Apart from `gated` (the store's calls) and `group_commit` (its rounds), which both apply
//! what their writes changed to it, and from the engine's listener (PostgreSQL), which
//! applies other replicas' changes.

use super::engine::Change;
use super::signal::JobSignal;
use super::verdict_cache::VerdictCache;

/// What this process holds in memory of the database: the gate's cached inputs and the long
/// polls' wake-ups. Cheap to clone; the engine's listener (PostgreSQL) holds one too.
#[derive(Clone)]
pub struct Held {
    pub cache: VerdictCache,
    pub signal: JobSignal,
}

impl Held {
    pub fn new(signal: JobSignal) -> Self {
        Held {
            cache: VerdictCache::default(),
            signal,
        }
    }

    /// Applies what a committed write changed (here or on another replica).
    pub fn apply(&self, change: &Change) {
        match change {
            Change::Runner(id) => self.cache.forget_runner(id),
            Change::Pool(name) => self.cache.forget_pool(name),
            Change::ForgeRunners => self.cache.forget_bindings(),
            Change::JobQueued(pool) => self.signal.notify_one(pool.as_str()),
            Change::JobsReturned(pool) => self.signal.notify(pool.as_str()),
            // The engine's own (SQLite's spill index), applied by it.
            Change::Spilled { .. } => {}
        }
    }

    /// Changes may have been missed (another replica's, while the listener reconnected):
    /// forget every cached input and wake every waiter.
    pub fn lost(&self) {
        self.cache.forget_all();
        self.signal.notify_all();
    }
}

//! The in-memory index of spilled jtis, for an engine whose database this process alone
//! writes (SQLite); why it exists is told in `sql/replay.rs`.
//!
//! Its own module because both sides of the engine interface name it: `engine::Db` hands it
//! out, and the statements of `sql::replay` use it.

use crate::domain::ids::RunnerId;
use crate::domain::time::Millis;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// The spilled jtis of a database this process alone writes (SQLite), in memory: what the
/// spill table holds, as 64-bit hashes of (runner, key), with when each may be forgotten.
#[derive(Default)]
pub struct SpillIndex {
    inner: Mutex<Spills>,
}

#[derive(Default)]
struct Spills {
    until: HashMap<u64, Millis>,
    /// In the order remembered, for `purge`: an entry behind a longer-lived one waits for it,
    /// which only keeps an expired jti (that rule 4 refuses anyway) a little longer.
    order: VecDeque<(Millis, u64)>,
}

fn slot(runner: &RunnerId, key: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (runner.as_str(), key).hash(&mut h);
    h.finish()
}

impl SpillIndex {
    pub fn remember(&self, runner: &RunnerId, key: &str, until: Millis) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slot(runner, key);
        let kept = s.until.entry(slot).or_insert(until);
        *kept = (*kept).max(until);
        s.order.push_back((until, slot));
    }

    /// Whether the runner spilled `key`.
    pub fn contains(&self, runner: &RunnerId, key: &str) -> bool {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.until.contains_key(&slot(runner, key))
    }

    /// Forgets what expired before `now`; how many.
    pub fn purge(&self, now: Millis) -> u64 {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut purged = 0;
        while let Some(&(until, slot)) = s.order.front() {
            if until >= now {
                break;
            }
            s.order.pop_front();
            if s.until.get(&slot).is_some_and(|&u| u < now) {
                s.until.remove(&slot);
                purged += 1;
            }
        }
        purged
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .until
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_in_memory_finds_each_runners_own_spills_until_they_expire() {
        let index = SpillIndex::default();
        let (r1, r2) = (RunnerId("r1".into()), RunnerId("r2".into()));
        index.remember(&r1, "k1", Millis(100));
        index.remember(&r1, "k2", Millis(300));
        index.remember(&r2, "k3", Millis(200));
        let found = |r: &RunnerId, keys: &[&str]| -> Vec<String> {
            keys.iter()
                .filter(|k| index.contains(r, k))
                .map(|k| k.to_string())
                .collect()
        };
        assert_eq!(found(&r1, &["k1", "k2", "k3"]), vec!["k1", "k2"]);
        assert_eq!(found(&r2, &["k1", "k3"]), vec!["k3"]);
        assert_eq!(index.purge(Millis(150)), 1);
        assert_eq!(found(&r1, &["k1", "k2"]), vec!["k2"]);
        // k3 (200) waits behind k2 (300): still found, as an expired jti is refused anyway.
        assert_eq!(index.purge(Millis(250)), 0);
        assert_eq!(index.purge(Millis(301)), 2);
        assert!(index.is_empty());
    }
}

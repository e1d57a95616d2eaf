//! Wake-ups for long polls: one `Notify` per pool, fired after an enqueue commits.
//!
//! An enqueue wakes one waiter (`notify_one`): one job, one claim, however many runners wait.
//! Waking every waiter for each job would have each of them claim, and all but one find
//! nothing; with ten thousand waiting that is ten thousand claims per job. A waiter that is
//! woken but goes away before it claims hands the wake-up on (tokio's `Notified` does so when
//! dropped). A requeue of several jobs at once wakes every waiter of the pool.
//!
//! A waiter registers (`Notified::enable`) before it tries to claim, so an enqueue that lands
//! between its failed claim and its wait still wakes it. Writes say when they queue jobs
//! (`engine::Change`); the store applies that here once they commit, and other PostgreSQL
//! replicas from the `NOTIFY` the write sent.
//!
//! Waiters also claim again without a wake-up every `recheck_interval` (each engine's
//! `RECHECK_INTERVAL`), so a lost notification, or a wake-up taken by a waiter that was
//! cordoned while it waited, delays a job by at most that and never strands it. A long poll's
//! attestation is judged once, at its start; every claim it makes re-checks revocation and
//! cordon in its round, under the runner's row lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Clone, Default)]
pub struct JobSignal {
    pools: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    /// How often waiters re-check without a wake-up; `None` where wake-ups cannot be lost.
    recheck: Option<Duration>,
}

impl JobSignal {
    /// A signal whose waiters also re-check every `interval` (for engines spanning replicas).
    pub fn with_recheck(interval: Duration) -> Self {
        JobSignal {
            recheck: Some(interval),
            ..Default::default()
        }
    }

    pub fn recheck_interval(&self) -> Option<Duration> {
        self.recheck
    }

    /// Wakes every waiter of every pool (after a lost connection, say).
    pub fn notify_all(&self) {
        let all: Vec<Arc<Notify>> = {
            let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            pools.values().cloned().collect()
        };
        for n in all {
            n.notify_waiters();
        }
    }

    /// The notifier of `pool`; waiters call `notified()` on it.
    pub fn for_pool(&self, pool: &str) -> Arc<Notify> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.entry(pool.to_string()).or_default().clone()
    }

    /// Wakes one waiter of `pool`, for one new job (or the next one to wait, if none waits).
    pub fn notify_one(&self, pool: &str) {
        self.for_pool(pool).notify_one();
    }

    /// Wakes every waiter of `pool`.
    pub fn notify(&self, pool: &str) {
        let notify = {
            let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            pools.get(pool).cloned()
        };
        if let Some(n) = notify {
            n.notify_waiters();
        }
    }
}

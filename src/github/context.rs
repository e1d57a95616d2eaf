//! What GitHub's side touches of the running service: the store, the metrics, the gate a
//! runner's attestation is judged by (`mint`), the rules a waiting registration's runner is
//! judged by (`watcher`) and the shutdown signal that stops the watcher.
//!
//! The service hands these over (`AppState::github_context`) rather than lending its whole
//! state: GitHub's side then knows nothing of the service it is part of, and what it may touch
//! is written here.

use crate::domain::fetch::FetchRules;
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::store::DynStore;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// GitHub's side's view of the service. Cheap to clone.
#[derive(Clone)]
pub struct GithubContext {
    store: DynStore,
    metrics: Arc<Metrics>,
    gate: Gate,
    rules: FetchRules,
    shutdown: CancellationToken,
}

impl GithubContext {
    pub fn new(
        store: DynStore,
        metrics: Arc<Metrics>,
        gate: Gate,
        rules: FetchRules,
        shutdown: CancellationToken,
    ) -> Self {
        GithubContext {
            store,
            metrics,
            gate,
            rules,
            shutdown,
        }
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Judges a runner's attestation as a lease's is (`mint`).
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The rules a registration's runner is judged by while it waits (`watcher`).
    pub fn rules(&self) -> FetchRules {
        self.rules
    }

    /// Cancelled on SIGTERM: the watcher stops.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }
}

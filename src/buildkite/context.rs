//! What Buildkite's side touches of the running service: the store, the metrics, the rules a
//! bound agent's runner is judged by and the shutdown signal that stops the watcher.
//!
//! The service hands these over (`AppState::buildkite_context`) rather than lending its whole
//! state: Buildkite's side then knows nothing of the service it is part of, and what it may
//! touch is written here.

use crate::domain::fetch::FetchRules;
use crate::metrics::Metrics;
use crate::store::DynStore;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Buildkite's side's view of the service. Cheap to clone.
#[derive(Clone)]
pub struct BuildkiteContext {
    store: DynStore,
    metrics: Arc<Metrics>,
    rules: FetchRules,
    shutdown: CancellationToken,
}

impl BuildkiteContext {
    pub fn new(
        store: DynStore,
        metrics: Arc<Metrics>,
        rules: FetchRules,
        shutdown: CancellationToken,
    ) -> Self {
        BuildkiteContext {
            store,
            metrics,
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

    /// The rules a bound agent's runner is judged by.
    pub fn rules(&self) -> FetchRules {
        self.rules
    }

    /// Cancelled on SIGTERM: the watcher stops.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }
}

//! The running service's shared state: the store, the settings, the secrets, the shutdown
//! signal. Cheap to clone; every handler gets one.

use crate::domain::attestation::AttestationRules;
use crate::domain::ids::RunnerId;
use crate::domain::runner::Runner;
use crate::domain::runner::StatusRules;
use crate::domain::time::Millis;
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::store::{DynStore, StoreResult};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The settings handlers need, derived once from the configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub rules: AttestationRules,
    pub probe_max_age_s: i64,
    pub lease_ttl_s: i64,
    pub heartbeat_interval_s: i64,
    pub max_body_bytes: usize,
    /// Consecutive failed resolutions after which a registry pool is `resolver_failing`.
    pub resolver_failure_threshold: i64,
    /// The share of live runners on a superseded image above which a roll is stalled.
    pub roll_stalled_share: f64,
    /// Whether this replica runs the background registry resolver.
    pub background_resolver: bool,
}

impl Settings {
    pub fn status_rules(&self) -> StatusRules {
        StatusRules {
            probe_max_age_s: self.probe_max_age_s,
            heartbeat_interval_s: self.heartbeat_interval_s,
        }
    }
}

/// The two bearer secrets.
#[derive(Clone)]
pub struct Secrets {
    pub admin: String,
    pub forge: String,
}

#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    store: DynStore,
    settings: Settings,
    secrets: Secrets,
    gate: Gate,
    metrics: Arc<Metrics>,
    /// Resolves registry pools' image references.
    registry: Arc<Registry>,
    /// Cancelled on SIGTERM: long polls answer 204 at once and `/readyz` turns 503.
    shutdown: CancellationToken,
}

impl AppState {
    pub fn new(
        store: DynStore,
        settings: Settings,
        secrets: Secrets,
        registry: Arc<Registry>,
        shutdown: CancellationToken,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        let gate = Gate {
            store: store.clone(),
            rules: settings.rules.clone(),
            probe_max_age_s: settings.probe_max_age_s,
            metrics: metrics.clone(),
        };
        let inner = Inner {
            store,
            settings,
            secrets,
            gate,
            metrics,
            registry,
            shutdown,
        };
        AppState {
            inner: Arc::new(inner),
        }
    }

    pub fn store(&self) -> &DynStore {
        &self.inner.store
    }

    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    pub fn secrets(&self) -> &Secrets {
        &self.inner.secrets
    }

    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Revokes a runner, ending its live leases, and counts the jobs that went back.
    pub async fn revoke_runner(&self, id: &RunnerId, now: Millis) -> StoreResult<Option<Runner>> {
        let Some((runner, ended)) = self.store().revoke_runner(id, now).await? else {
            return Ok(None);
        };
        for e in &ended {
            self.metrics().lease_ended(e, "runner_revoked");
        }
        tracing::info!(runner_id = %id, leases_ended = ended.len(), "runner revoked");
        Ok(Some(runner))
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    pub fn shutdown(&self) -> &CancellationToken {
        &self.inner.shutdown
    }
}

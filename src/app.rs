//! The running service's shared state: the store, the settings, the secrets, the shutdown
//! signal. Cheap to clone; every handler gets one.

use crate::domain::attestation::AttestationRules;
use crate::domain::runner::StatusRules;
use crate::gate::Gate;
use crate::registry::Registry;
use crate::store::DynStore;
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
        let gate = Gate {
            store: store.clone(),
            rules: settings.rules.clone(),
            probe_max_age_s: settings.probe_max_age_s,
        };
        AppState {
            inner: Arc::new(Inner {
                store,
                settings,
                secrets,
                gate,
                registry,
                shutdown,
            }),
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

    pub fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    pub fn shutdown(&self) -> &CancellationToken {
        &self.inner.shutdown
    }
}

//! What the forge gate reads while it serves: its own settings and forwarder, the store, the
//! metrics, the rules a fetch is judged by (and a job's end counted by), the trusted proxies
//! and the shutdown signal.
//!
//! The service hands these over once, when the gate's routes are made (`AppState::gate_state`),
//! rather than lending its whole state: what a forge's calls may touch is then written here,
//! and the gate knows nothing of the service it is part of.

use super::{ForgeGate, ForgeSettings};
use crate::domain::fetch::FetchRules;
use crate::domain::runner::StatusRules;
use crate::metrics::Metrics;
use crate::store::DynStore;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The forge gate's state. Cheap to clone; every forge route gets one.
#[derive(Clone)]
pub struct GateState {
    gate: Arc<ForgeGate>,
    store: DynStore,
    metrics: Arc<Metrics>,
    rules: FetchRules,
    /// The status rules a job's end is counted under (ejection).
    status_rules: StatusRules,
    trusted_proxies: Arc<[ipnet::IpNet]>,
    shutdown: CancellationToken,
}

impl GateState {
    pub fn new(
        gate: Arc<ForgeGate>,
        store: DynStore,
        metrics: Arc<Metrics>,
        rules: FetchRules,
        status_rules: StatusRules,
        trusted_proxies: Arc<[ipnet::IpNet]>,
        shutdown: CancellationToken,
    ) -> Self {
        GateState {
            gate,
            store,
            metrics,
            rules,
            status_rules,
            trusted_proxies,
            shutdown,
        }
    }

    pub fn gate(&self) -> &ForgeGate {
        &self.gate
    }

    pub fn settings(&self) -> &ForgeSettings {
        &self.gate.settings
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn rules(&self) -> FetchRules {
        self.rules
    }

    pub fn status_rules(&self) -> StatusRules {
        self.status_rules
    }

    pub fn trusted_proxies(&self) -> &[ipnet::IpNet] {
        &self.trusted_proxies
    }

    /// Cancelled on SIGTERM: a held fetch is answered at once.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }
}

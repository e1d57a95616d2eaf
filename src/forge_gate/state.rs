//! What the forge gate reads while it serves: its own settings and forwarder, the store, the
//! metrics, the rules a fetch is judged by (and a job's end counted by), the trusted proxies
//! and the shutdown signal.
//!
//! The gate takes these out of the service's state once, when its routes are made, rather
//! than borrowing the whole `AppState`: what a forge's calls may touch is then written here.

use super::{ForgeGate, ForgeSettings};
use crate::app::AppState;
use crate::domain::forge::FetchRules;
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
    /// The gate's state within the service's, when a forge is set.
    pub fn of(state: &AppState) -> Option<Self> {
        let gate = state.forge_gate()?.clone();
        let s = state.settings();
        Some(GateState {
            gate,
            store: state.store().clone(),
            metrics: state.metrics().clone(),
            rules: FetchRules {
                attestation_max_age_s: s.rules.max_age_s,
                probe_max_age_s: s.probe_max_age_s,
            },
            status_rules: s.status_rules(),
            trusted_proxies: s.listener.trusted_proxies.clone().into(),
            shutdown: state.shutdown().clone(),
        })
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

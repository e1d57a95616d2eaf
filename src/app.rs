//! The running service's shared state: the store, the settings, the secrets, the shutdown
//! signal. Cheap to clone; every handler gets one. What the service does beside a store call
//! whichever path made it (counting and logging a grant, a lease call, a revocation) lives
//! here too, so that the HTTP handlers and the demo's simulated runners show alike.
//!
//! The service's parts (the forge gate, GitHub's and Buildkite's sides) are composed here and
//! never see this state: each is handed what it touches (`gate_state`, `github_context`,
//! `buildkite_context`), so that the dependency points one way, from the service to its parts.

use crate::domain::attestation::AttestationRules;
use crate::domain::fetch::FetchRules;
use crate::domain::ids::RunnerId;
use crate::domain::job::Job;
use crate::domain::lease::{Lease, LeaseCall};
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
    /// What the listener allows its clients (timeouts, connection caps, trusted proxies).
    pub listener: crate::listener::ListenerSettings,
    /// Failed credential checks a client may make in a burst, and the span they are forgiven
    /// over.
    pub auth_failure_limit: u32,
    pub auth_failure_window_s: u64,
    /// The bearer token `/metrics` requires, if any.
    pub metrics_token: Option<String>,
    /// A listener of its own for `/metrics`, which the main listener then does not serve.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How long finished jobs and history are kept.
    pub retention: crate::domain::retention::Retention,
    /// Buildkite's side (pausing refused runners' agents), when a token and an organization
    /// are set.
    pub buildkite: Option<crate::buildkite::settings::BuildkiteSettings>,
}

impl Settings {
    pub fn status_rules(&self) -> StatusRules {
        StatusRules {
            probe_max_age_s: self.probe_max_age_s,
            heartbeat_interval_s: self.heartbeat_interval_s,
        }
    }

    /// The rules a runner is judged by where the forge, not a lease, hands out its work (the
    /// forge gate's fetches, GitHub's registrations, Buildkite's pauses).
    pub fn fetch_rules(&self) -> FetchRules {
        FetchRules {
            attestation_max_age_s: self.rules.max_age_s,
            probe_max_age_s: self.probe_max_age_s,
        }
    }
}

/// The two bearer secrets, each with the value it is being rotated from (accepted beside it
/// until the operator removes it).
#[derive(Clone)]
pub struct Secrets {
    pub admin: String,
    pub admin_previous: Option<String>,
    pub forge: String,
    pub forge_previous: Option<String>,
}

impl Secrets {
    /// Secrets without previous values (tests, `demo`).
    pub fn new(admin: impl Into<String>, forge: impl Into<String>) -> Self {
        Secrets {
            admin: admin.into(),
            admin_previous: None,
            forge: forge.into(),
            forge_previous: None,
        }
    }

    /// Whether `token` is the configured admin token, current or previous.
    pub fn is_admin(&self, token: &str) -> bool {
        matches_any(token, &self.admin, self.admin_previous.as_deref())
    }

    /// Whether `token` is the forge token, current or previous.
    pub fn is_forge(&self, token: &str) -> bool {
        matches_any(token, &self.forge, self.forge_previous.as_deref())
    }

    /// Whether a page session opened with the credential hashing to `hash` may go on: the
    /// admin token it was opened with is still accepted.
    pub fn admin_hash_valid(&self, hash: &str) -> bool {
        [Some(self.admin.as_str()), self.admin_previous.as_deref()]
            .into_iter()
            .flatten()
            .any(|t| crate::secrets::secret_matches(hash, &crate::secrets::hash_token(t)))
    }
}

/// Both comparisons always run: how long a check takes says nothing of which one matched.
fn matches_any(token: &str, current: &str, previous: Option<&str>) -> bool {
    let a = crate::secrets::secret_matches(token, current);
    let b = previous.is_some_and(|p| crate::secrets::secret_matches(token, p));
    a | b
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
    /// Failed credential checks per client, for the 429s of guessing clients.
    throttle: crate::throttle::AuthThrottle,
    /// Resolves registry pools' image references.
    registry: Arc<Registry>,
    /// Cancelled on SIGTERM: long polls answer 204 at once and `/readyz` turns 503.
    shutdown: CancellationToken,
    /// The gate in front of a forge's runner API, when a forge is set.
    forge_gate: Option<Arc<crate::forge_gate::ForgeGate>>,
    /// GitHub Actions' side (the credential, the REST client), when a credential is set.
    github: Option<Arc<crate::github::Github>>,
}

impl AppState {
    pub fn new(
        store: DynStore,
        settings: Settings,
        secrets: Secrets,
        registry: Arc<Registry>,
        forge_gate: Option<Arc<crate::forge_gate::ForgeGate>>,
        github: Option<Arc<crate::github::Github>>,
        shutdown: CancellationToken,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        let gate = Gate::new(
            store.clone(),
            settings.rules.clone(),
            settings.probe_max_age_s,
            metrics.clone(),
        );
        let throttle = crate::throttle::AuthThrottle::new(
            settings.auth_failure_limit,
            settings.auth_failure_window_s,
        );
        let inner = Inner {
            forge_gate,
            github,
            throttle,
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
    pub async fn revoke_runner(
        &self,
        id: &RunnerId,
        now: Millis,
        audit: &crate::domain::audit::Entry,
    ) -> StoreResult<Option<Runner>> {
        let Some((runner, ended)) = self.store().revoke_runner(id, now, audit).await? else {
            return Ok(None);
        };
        for e in &ended {
            self.metrics().lease_ended(e, "runner_revoked");
        }
        tracing::info!(runner_id = %id, leases_ended = ended.len(), "runner revoked");
        Ok(Some(runner))
    }

    /// A granted lease, counted and logged here whichever path granted it (a lease request,
    /// its long poll, or the demo's simulated runners), so that every grant shows alike in
    /// the metrics and the logs.
    pub fn lease_granted(&self, lease: &Lease, job: &Job) {
        self.metrics().granted(lease.pool.as_str());
        tracing::info!(runner_id = %lease.runner_id, pool = %lease.pool, job_id = %job.id, lease_id = %lease.id, "lease granted");
    }

    /// A lease call that succeeded, counted and logged (as `lease_granted`, for every path).
    pub fn lease_called(&self, call: &LeaseCall, lease: &Lease, job: &Job) {
        let metrics = self.metrics();
        match call {
            LeaseCall::Start { .. } => metrics.attempt_used(lease.pool.as_str()),
            LeaseCall::Abandon { .. } => metrics.returned(lease.pool.as_str(), "abandoned"),
            LeaseCall::Extend { .. } | LeaseCall::Complete { .. } => {}
        }
        tracing::info!(lease_id = %lease.id, job_id = %job.id, runner_id = %lease.runner_id, state = lease.state.as_str(), "lease call");
    }

    /// What a job's end did to its runner's standing, counted and logged
    /// (`Metrics::job_end_seen`).
    pub fn job_ended(
        &self,
        runner: &crate::domain::ids::RunnerId,
        pool: &crate::domain::pool_name::PoolName,
        effect: &crate::domain::ejection::Effect,
    ) {
        self.metrics().job_end_seen(runner, pool, effect);
    }

    pub fn forge_gate(&self) -> Option<&Arc<crate::forge_gate::ForgeGate>> {
        self.inner.forge_gate.as_ref()
    }

    /// What the forge gate touches of the service, when a forge is set.
    pub fn gate_state(&self) -> Option<crate::forge_gate::GateState> {
        let gate = self.forge_gate()?.clone();
        let s = self.settings();
        Some(crate::forge_gate::GateState::new(
            gate,
            self.store().clone(),
            self.metrics().clone(),
            s.fetch_rules(),
            s.status_rules(),
            s.listener.trusted_proxies.clone().into(),
            self.shutdown().clone(),
        ))
    }

    /// GitHub Actions' side; `None` when no GitHub credential is set (the feature is off).
    pub fn github(&self) -> Option<&Arc<crate::github::Github>> {
        self.inner.github.as_ref()
    }

    /// What GitHub's side touches of the service (its registrations' minting and watching).
    pub fn github_context(&self) -> crate::github::context::GithubContext {
        crate::github::context::GithubContext::new(
            self.store().clone(),
            self.metrics().clone(),
            self.gate().clone(),
            self.settings().fetch_rules(),
            self.shutdown().clone(),
        )
    }

    /// What Buildkite's side touches of the service (its watcher's pauses and resumes).
    pub fn buildkite_context(&self) -> crate::buildkite::context::BuildkiteContext {
        crate::buildkite::context::BuildkiteContext::new(
            self.store().clone(),
            self.metrics().clone(),
            self.settings().fetch_rules(),
            self.shutdown().clone(),
        )
    }

    pub fn throttle(&self) -> &crate::throttle::AuthThrottle {
        &self.inner.throttle
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    pub fn shutdown(&self) -> &CancellationToken {
        &self.inner.shutdown
    }
}

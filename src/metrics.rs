//! Prometheus metrics, in the text format on `GET /metrics`.
//!
//! One registry per running service (not a process-wide global), so tests that start several
//! services in one process each see their own numbers. Labels are low-cardinality only: pool,
//! code, status, result, route — never a runner, job or lease id. Counters are bumped where
//! the thing happens; gauges of state (queue depth, runners by status) are computed from the
//! store when scraped, so every replica reports the same truth.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolCodeLabels {
    pub pool: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    pub pool: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolStatusLabels {
    pub pool: String,
    pub status: String,
}

/// An HTTP method as a label: the methods this API answers, and `other` for anything a
/// client invents, so that no request can add a series of its own.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct MethodLabel(&'static str);

impl MethodLabel {
    pub fn of(method: &axum::http::Method) -> Self {
        use axum::http::Method;
        MethodLabel(match *method {
            Method::GET => "GET",
            Method::HEAD => "HEAD",
            Method::POST => "POST",
            Method::PUT => "PUT",
            Method::DELETE => "DELETE",
            Method::PATCH => "PATCH",
            Method::OPTIONS => "OPTIONS",
            _ => "other",
        })
    }
}

impl EncodeLabelValue for MethodLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }
}

/// A gauge raised by one while this lives.
pub struct Raised<'a>(&'a Gauge);

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A route as a label: the matched route template, or `unmatched`. It holds the router's own
/// shared template, so that counting a request copies no string.
#[derive(Clone, Debug)]
pub struct RouteLabel(Option<axum::extract::MatchedPath>);

impl RouteLabel {
    pub fn of(matched: Option<&axum::extract::MatchedPath>) -> Self {
        RouteLabel(matched.cloned())
    }

    fn as_str(&self) -> &str {
        self.0
            .as_ref()
            .map_or("unmatched", axum::extract::MatchedPath::as_str)
    }
}

impl std::hash::Hash for RouteLabel {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq for RouteLabel {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for RouteLabel {}

impl EncodeLabelValue for RouteLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        self.as_str().encode(encoder)
    }
}

/// A request's labels. The route is the matched route template (or `unmatched`) and the
/// status a number the service itself answered: every label comes from a closed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: MethodLabel,
    pub route: RouteLabel,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForgeFetchLabels {
    pub forge: &'static str,
    pub outcome: &'static str,
    pub code: &'static str,
}

/// An action leasegate took on a forge's runner by the forge's API (a Buildkite agent's pause
/// or resume) and how it came out: every label from a closed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForgeActionLabels {
    pub forge: &'static str,
    pub action: &'static str,
    pub outcome: &'static str,
}

/// A GitHub registration's step or a request's outcome, and its code (a refusal's, a reason
/// it ended, or `none`): both from closed sets.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GithubLabels {
    pub outcome: &'static str,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CredentialLabel {
    pub credential: &'static str,
}

pub struct Metrics {
    registry: Registry,
    /// Connections open now, on the service's listeners.
    pub open_connections: Gauge,
    /// Attestations waiting for a turn to be judged (`gate::JUDGED_AT_ONCE` are at once).
    pub admissions_waiting: Gauge,
    /// Attestation signatures checked, and the batches they were checked in
    /// (`signature_batches`): their ratio is the batches' mean size.
    pub signatures_checked: Counter,
    pub signature_batches: Counter,
    /// Connections the service closed or turned away, by reason (a closed set).
    pub connections_closed: Family<ReasonLabel, Counter>,
    /// Failed credential checks, by credential.
    pub auth_failures: Family<CredentialLabel, Counter>,
    /// Requests refused 429 by the throttle, by credential.
    pub auth_throttled: Family<CredentialLabel, Counter>,
    /// Job fetches of forge runners, by forge, outcome and refusal code.
    pub forge_fetches: Family<ForgeFetchLabels, Counter>,
    /// GitHub registrations: requests' outcomes and the watcher's steps, by code.
    pub github_registrations: Family<GithubLabels, Counter>,
    /// Actions on forge runners through a forge's API, by forge, action and outcome.
    pub forge_actions: Family<ForgeActionLabels, Counter>,
    pub leases_granted: Family<PoolLabel, Counter>,
    /// Rows the pruner deleted past their retention, by kind (a closed set).
    pub pruned_rows: Family<KindLabel, Counter>,
    pub lease_refusals: Family<PoolCodeLabels, Counter>,
    pub attestations: Family<ResultLabel, Counter>,
    pub jobs_returned: Family<PoolReasonLabels, Counter>,
    pub attempts_used: Family<PoolLabel, Counter>,
    pub expiry_requeues: Family<PoolLabel, Counter>,
    pub queue_depth: Family<PoolLabel, Gauge>,
    pub oldest_queued_age: Family<PoolLabel, Gauge<f64, AtomicU64>>,
    pub runners: Family<PoolStatusLabels, Gauge>,
    /// Live runners under their pool's disk warning line (`Pool::disk_warning`).
    pub runners_disk_warned: Family<PoolLabel, Gauge>,
    /// Runners ejected, by pool and the reason most of their failures had.
    pub ejections: Family<PoolReasonLabels, Counter>,
    /// Ejections the rule called for and did not make, by pool and why not.
    pub ejections_withheld: Family<PoolReasonLabels, Counter>,
    /// Runners ejected now, by pool (from the store on each scrape).
    pub ejected_runners: Family<PoolLabel, Gauge>,
    pub requests: Family<RouteLabels, Histogram>,
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Metrics {
            registry: Registry::with_prefix("leasegate"),
            open_connections: Gauge::default(),
            admissions_waiting: Gauge::default(),
            signatures_checked: Counter::default(),
            signature_batches: Counter::default(),
            connections_closed: Family::default(),
            auth_failures: Family::default(),
            auth_throttled: Family::default(),
            forge_fetches: Family::default(),
            github_registrations: Family::default(),
            forge_actions: Family::default(),
            leases_granted: Family::default(),
            pruned_rows: Family::default(),
            lease_refusals: Family::default(),
            attestations: Family::default(),
            jobs_returned: Family::default(),
            attempts_used: Family::default(),
            expiry_requeues: Family::default(),
            queue_depth: Family::default(),
            oldest_queued_age: Family::default(),
            runners: Family::default(),
            runners_disk_warned: Family::default(),
            ejections: Family::default(),
            ejections_withheld: Family::default(),
            ejected_runners: Family::default(),
            requests: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        };
        // The series an alert compares are exported from the start, at 0: a counter that
        // first appears at 1 is missed by `increase()`, and `unless` needs its other side.
        for (outcome, code) in [
            ("minted", "none"),
            ("failed", "github_refused"),
            ("failed", "github_unavailable"),
        ] {
            // Created for its side effect; the guard it hands back is let go at once.
            drop(m.github_registrations.get_or_create(&GithubLabels {
                outcome,
                code: code.to_string(),
            }));
        }
        for (action, outcome) in [
            ("pause", "done"),
            ("pause", "failed"),
            ("pause", "observed"),
            ("resume", "done"),
            ("resume", "failed"),
        ] {
            drop(m.forge_actions.get_or_create(&ForgeActionLabels {
                forge: "buildkite",
                action,
                outcome,
            }));
        }
        m.registered()
    }
}

impl Metrics {
    /// Registers every family under its name and help text.
    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "pruned_rows",
            "Rows deleted past their retention, by kind",
            self.pruned_rows.clone(),
        );
        r.register(
            "leases_granted",
            "Leases granted",
            self.leases_granted.clone(),
        );
        r.register(
            "lease_refusals",
            "Leases and gate checks refused under rules 7-13, by code",
            self.lease_refusals.clone(),
        );
        r.register(
            "attestations",
            "Attestations presented, by result (accepted or the rejection code)",
            self.attestations.clone(),
        );
        r.register(
            "jobs_returned",
            "Jobs returned to the queue without using an attempt, by reason",
            self.jobs_returned.clone(),
        );
        r.register(
            "attempts_used",
            "Attempts used (lease starts)",
            self.attempts_used.clone(),
        );
        r.register(
            "lease_expiry_requeues",
            "Jobs requeued because a started lease expired",
            self.expiry_requeues.clone(),
        );
        r.register(
            "queued_jobs",
            "Jobs waiting in the queue",
            self.queue_depth.clone(),
        );
        r.register(
            "oldest_queued_job_age_seconds",
            "Age of the oldest queued job",
            self.oldest_queued_age.clone(),
        );
        r.register("runners", "Runners by status", self.runners.clone());
        r.register(
            "runners_disk_warned",
            "Runners whose attested disk is under their pool's warning line",
            self.runners_disk_warned.clone(),
        );
        r.register(
            "ejections",
            "Runners ejected for infrastructure failures in a row, by pool and main reason",
            self.ejections.clone(),
        );
        r.register(
            "ejections_withheld",
            "Ejections called for and not made, by pool and reason (observe, max_share, last_admitted)",
            self.ejections_withheld.clone(),
        );
        r.register(
            "ejected_runners",
            "Runners ejected now, by pool",
            self.ejected_runners.clone(),
        );
        r.register(
            "open_connections",
            "HTTP connections open now",
            self.open_connections.clone(),
        );
        r.register(
            "admissions_waiting",
            "Attestations waiting for a turn to be judged (256 are judged at once)",
            self.admissions_waiting.clone(),
        );
        r.register(
            "signatures_checked",
            "Attestation signatures checked",
            self.signatures_checked.clone(),
        );
        r.register(
            "signature_batches",
            "Batches the attestation signatures were checked in (signatures_checked over this: their mean size)",
            self.signature_batches.clone(),
        );
        r.register(
            "connections_closed",
            "HTTP connections closed by the service (timeouts) or turned away (limits), by reason",
            self.connections_closed.clone(),
        );
        r.register(
            "auth_failures",
            "Failed credential checks, by credential",
            self.auth_failures.clone(),
        );
        r.register(
            "forge_fetches",
            "Job fetches of forge runners through the forge gate, by forge, outcome (forwarded, refused, observed, unbound_passed, untouched) and code",
            self.forge_fetches.clone(),
        );
        r.register(
            "github_registrations",
            "GitHub registrations: requests (minted, observed, refused, outstanding, failed) and the watcher's steps (online, busy, done, deleted, kept, would_delete), by code",
            self.github_registrations.clone(),
        );
        r.register(
            "forge_actions",
            "Actions on forge runners through a forge's API (a Buildkite agent's pause and resume), by forge, action and outcome (done, failed, observed: what an observing pool would have done)",
            self.forge_actions.clone(),
        );
        r.register(
            "auth_throttled",
            "Requests answered 429 because their client failed too many credential checks",
            self.auth_throttled.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "HTTP request latency by route",
            self.requests.clone(),
        );
        self
    }
}

impl Metrics {
    pub fn pool(pool: &str) -> PoolLabel {
        PoolLabel {
            pool: pool.to_string(),
        }
    }

    pub fn granted(&self, pool: &str) {
        self.leases_granted.get_or_create(&Self::pool(pool)).inc();
    }

    pub fn refused(&self, pool: &str, code: &str) {
        let labels = PoolCodeLabels {
            pool: pool.to_string(),
            code: code.to_string(),
        };
        self.lease_refusals.get_or_create(&labels).inc();
    }

    /// An attestation presented: `accepted`, or its rejection's code. The label is a code of
    /// the service's own, so that counting one copies no string (one per heartbeat).
    pub fn attestation(&self, result: &'static str) {
        self.attestations
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub fn returned(&self, pool: &str, reason: &str) {
        let labels = PoolReasonLabels {
            pool: pool.to_string(),
            reason: reason.to_string(),
        };
        self.jobs_returned.get_or_create(&labels).inc();
    }

    pub fn ejected(&self, pool: &str, reason: &str) {
        let labels = PoolReasonLabels {
            pool: pool.to_string(),
            reason: reason.to_string(),
        };
        self.ejections.get_or_create(&labels).inc();
    }

    pub fn ejection_withheld(&self, pool: &str, why: &str) {
        let labels = PoolReasonLabels {
            pool: pool.to_string(),
            reason: why.to_string(),
        };
        self.ejections_withheld.get_or_create(&labels).inc();
    }

    /// What a job's end did to its runner's standing, counted and logged here whichever path
    /// saw it (a lease call, the forge gate), so that an ejection shows alike from both.
    pub fn job_end_seen(
        &self,
        runner: &crate::domain::ids::RunnerId,
        pool: &crate::domain::pool_name::PoolName,
        effect: &crate::domain::ejection::Effect,
    ) {
        use crate::domain::ejection::Effect;
        let reason = effect.main_reason().map_or("none", |r| r.as_str());
        match effect {
            Effect::Ejected(e) => {
                self.ejected(pool.as_str(), reason);
                tracing::warn!(runner_id = %runner, pool = %pool, until = %e.until, nth = e.nth,
                    failures = %e.failures, "runner ejected");
            }
            Effect::Withheld(w) => {
                self.ejection_withheld(pool.as_str(), w.why.as_str());
                tracing::warn!(runner_id = %runner, pool = %pool, why = w.why.as_str(),
                    failures = %w.failures, "runner would be ejected; not ejected");
            }
            Effect::None | Effect::Reset | Effect::Counted => {}
        }
    }

    pub fn attempt_used(&self, pool: &str) {
        self.attempts_used.get_or_create(&Self::pool(pool)).inc();
    }

    pub fn expiry_requeued(&self, pool: &str) {
        self.expiry_requeues.get_or_create(&Self::pool(pool)).inc();
    }

    /// A lease ended by expiry (`lease_expired`) or revocation (`runner_revoked`).
    pub fn lease_ended(&self, ended: &crate::store::EndedLease, reason: &str) {
        let pool = ended.pool.as_str();
        if ended.before_start {
            self.returned(pool, reason);
        } else if ended.job_state == crate::domain::job::JobState::Queued
            && reason == "lease_expired"
        {
            self.expiry_requeued(pool);
        }
    }

    pub fn observe_request(
        &self,
        method: MethodLabel,
        route: RouteLabel,
        status: u16,
        seconds: f64,
    ) {
        let labels = RouteLabels {
            method,
            route,
            status,
        };
        self.requests.get_or_create(&labels).observe(seconds);
    }

    /// Counts an attestation in `admissions_waiting` for as long as the value lives, however
    /// its wait ends (a turn, or the client gone).
    pub fn admission_waiting(&self) -> Raised<'_> {
        self.admissions_waiting.inc();
        Raised(&self.admissions_waiting)
    }

    /// A batch of `signatures` attestation signatures checked together.
    pub fn signature_batch(&self, signatures: usize) {
        self.signature_batches.inc();
        self.signatures_checked.inc_by(signatures as u64);
    }

    /// A connection closed for `reason` (`header_timeout`, `idle_timeout`, `write_stalled`,
    /// `limit_total`, `limit_peer`).
    pub fn connection_closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// A forge runner's fetch: `outcome` `forwarded`, `refused`, `observed` (forwarded, would
    /// have been refused), `unbound_passed` or `untouched` (a bound uuid without its runner's
    /// token, forwarded as if the gate were not there); `code` the refusal's, or `none`.
    pub fn forge_fetch(&self, forge: &'static str, outcome: &'static str, code: &'static str) {
        self.forge_fetches
            .get_or_create(&ForgeFetchLabels {
                forge,
                outcome,
                code,
            })
            .inc();
    }

    /// A GitHub registration's request outcome or step, with its code (`none` when there is
    /// none).
    pub fn github(&self, outcome: &'static str, code: &str) {
        self.github_registrations
            .get_or_create(&GithubLabels {
                outcome,
                code: code.to_string(),
            })
            .inc();
    }

    /// An action on a forge runner through the forge's API: `action` `pause` or `resume`,
    /// `outcome` `done`, `failed` or `observed`.
    pub fn forge_action(&self, forge: &'static str, action: &'static str, outcome: &'static str) {
        self.forge_actions
            .get_or_create(&ForgeActionLabels {
                forge,
                action,
                outcome,
            })
            .inc();
    }

    pub fn auth_failed(&self, credential: &'static str) {
        self.auth_failures
            .get_or_create(&CredentialLabel { credential })
            .inc();
    }

    pub fn pruned(&self, kind: &'static str, rows: u64) {
        self.pruned_rows
            .get_or_create(&KindLabel { kind })
            .inc_by(rows);
    }

    pub fn auth_throttled(&self, credential: &'static str) {
        self.auth_throttled
            .get_or_create(&CredentialLabel { credential })
            .inc();
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

//! The gate itself: from a compact JWS to a judged, recorded attestation.
//!
//! Heartbeat, lease and `gate/check` all pass through `Gate::admit`, which applies rules 1–14
//! of PROTOCOL.md in order. Nothing is written for a failure of rules 1–6 or a bad digest,
//! except that an attestation the runner's own key signed and rules 3–4 refused (its clock,
//! most often) is noted on the runner as its last rejection; an attestation that passes them
//! is recorded with the verdict it earned, and a refusal (for a
//! lease or a gate check) is recorded beside it. No job is read here, except by a lease's
//! claim, which is made in the same write round as its attestation's record, and only when the
//! verdict lets the runner lease.
//!
//! The runner and pool the gate judges with come from the store's cache (`gate_runner`,
//! `gate_pool`); the round re-reads what a claim must not get wrong (revocation, cordon) under
//! the runner's row lock.
//!
//! An accepted attestation that names the machine's forge runners (`forge_runners`) rebinds
//! the runner to them when they differ from what it holds (a renewed token, a new
//! registration), audited, before it is answered: the forge gate judges the new forge runner
//! from the next fetch on. Without the claim the bindings are left alone.

use crate::domain::attestation::{Attestation, AttestationRules, ClaimsError, RunningImage};
use crate::domain::audit::{Action, Entry};
use crate::domain::forge::ForgeRunner;
use crate::domain::images::AttestedImage;
use crate::domain::job::Job;
use crate::domain::pool::{GateMode, Pool};
use crate::domain::runner::Runner;
use crate::domain::status::RunnerStatus;
use crate::domain::time::Millis;
use crate::domain::verdict::{AttestedState, Refusal, judge};
use crate::signature_batches::SignatureChecks;
use crate::store::{
    AttestationRecord, Claim, DynStore, GateRunner, Lease, Rejection, RoundItem, StoreError,
};
use crate::verifier::{INVALID_SIGNATURE_DETAIL, VerifyError, read_header};
use std::sync::Arc;
use tokio::sync::{Semaphore, SemaphorePermit};

/// Why an attestation was not admitted (rules 1–6, or a bad request).
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Expired(String),
    /// The runner's clock is off by more than the leeway (its offset in the detail).
    #[error("{0}")]
    ClockSkew(String),
    #[error("this attestation's jti was already accepted")]
    Replayed,
    #[error("the runner is revoked")]
    Revoked,
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AdmitError {
    pub fn code(&self) -> &'static str {
        match self {
            AdmitError::Invalid(_) => "attestation_invalid",
            AdmitError::Expired(_) => "attestation_expired",
            AdmitError::ClockSkew(_) => "clock_skew",
            AdmitError::Replayed => "attestation_replayed",
            AdmitError::Revoked => "runner_revoked",
            AdmitError::BadRequest(_) => "bad_request",
            AdmitError::Store(_) => "unavailable",
        }
    }
}

impl From<VerifyError> for AdmitError {
    fn from(e: VerifyError) -> Self {
        match e {
            VerifyError::Invalid(m) => AdmitError::Invalid(m),
            VerifyError::Claims(ClaimsError::Invalid(m)) => AdmitError::Invalid(m),
            VerifyError::Claims(ClaimsError::Expired(m)) => AdmitError::Expired(m),
            VerifyError::Claims(ClaimsError::ClockSkew { detail, .. }) => {
                AdmitError::ClockSkew(detail)
            }
            VerifyError::Claims(ClaimsError::BadText(t)) | VerifyError::BadText(t) => {
                AdmitError::BadRequest(t.to_string())
            }
        }
    }
}

/// What the attestation is presented for: only leases, gate checks and GitHub registrations
/// (a lease of GitHub's kind) record refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Heartbeat,
    Lease,
    GateCheck,
    GithubRunner,
}

/// An admitted attestation and the verdict it earned.
#[derive(Debug)]
pub struct Admitted {
    /// Shared with the gate's cache.
    pub runner: Arc<Runner>,
    pub pool: Pool,
    pub attestation: Attestation,
    pub image: RunningImage,
    /// Its several images, digests checked.
    pub images: Vec<AttestedImage>,
    pub verdict: Result<(), Refusal>,
}

impl Admitted {
    /// What it attested, as the verdict judged it.
    pub fn state(&self) -> AttestedState {
        AttestedState {
            probe: self.attestation.probe.clone(),
            image: self.image.clone(),
            images: self.images.clone(),
        }
    }

    /// The refusal that refuses: none when the pool only observes (`gate_mode: observe`),
    /// whose refusals are recorded and counted but let the runner have its job.
    pub fn enforced_refusal(&self) -> Option<&Refusal> {
        match (&self.verdict, self.pool.gate_mode) {
            (Err(r), GateMode::Enforce) => Some(r),
            _ => None,
        }
    }

    /// What would have been refused in a pool that only observes.
    pub fn observed_refusal(&self) -> Option<&Refusal> {
        match (&self.verdict, self.pool.gate_mode) {
            (Err(r), GateMode::Observe) => Some(r),
            _ => None,
        }
    }

    pub fn status(&self) -> RunnerStatus {
        self.verdict
            .as_ref()
            .err()
            .map_or(RunnerStatus::Healthy, Refusal::status)
    }
}

/// How many attestations the gate judges at once. The rest wait for a turn, in the order they
/// came, holding no more than their request: a burst of thousands (a fleet's long polls after
/// a restart) would otherwise all be judged at once, each holding its runner, its record and
/// its place in a round, and the allocator keeps the pages of that peak long after it passed
/// (docs/BENCHMARKS.md, long polls). A few rounds' worth keeps every round full.
pub const JUDGED_AT_ONCE: usize = 256;

/// The settings and the store the gate judges with.
#[derive(Clone)]
pub struct Gate {
    pub store: DynStore,
    pub rules: AttestationRules,
    pub probe_max_age_s: i64,
    pub metrics: Arc<crate::metrics::Metrics>,
    turns: Arc<Semaphore>,
    signatures: SignatureChecks,
}

/// A turn to be judged (`Gate::turn`), given back when the admission it was spent on ends.
pub struct Turn<'a> {
    _permit: SemaphorePermit<'a>,
}

impl Gate {
    pub fn new(
        store: DynStore,
        rules: AttestationRules,
        probe_max_age_s: i64,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        // Measured per engine: `SignatureChecks::new`.
        let gather_signatures = store.engine() == "sqlite";
        Gate {
            store,
            rules,
            probe_max_age_s,
            signatures: SignatureChecks::new(metrics.clone(), gather_signatures),
            metrics,
            turns: Arc::new(Semaphore::new(JUDGED_AT_ONCE)),
        }
    }

    /// Waits for a turn to be judged. Taken before anything of the admission is made, and the
    /// time it is judged at read after it, so that a wait for a turn is neither held in memory
    /// nor counted against the attestation's freshness.
    pub async fn turn(&self) -> Turn<'_> {
        // Nearly always one is free, and nothing waits or is counted.
        if let Ok(permit) = self.turns.try_acquire() {
            return Turn { _permit: permit };
        }
        let _counted = self.metrics.admission_waiting();
        Turn {
            _permit: self
                .turns
                .acquire()
                .await
                .expect("the gate never closes its turns"),
        }
    }

    /// Rules 1–13 on `token`, recording what the protocol says to record, and counting the
    /// outcome.
    pub async fn admit(
        &self,
        turn: Turn<'_>,
        token: &str,
        purpose: Purpose,
        now: Millis,
    ) -> Result<Admitted, AdmitError> {
        let (admitted, _) = self.admit_with(turn, token, purpose, now, |_| None).await?;
        Ok(admitted)
    }

    /// A lease's admission: as `admit`, and when the verdict lets the runner lease, the claim
    /// that `claim` describes is made in the same round (one transaction with the record).
    pub async fn admit_and_claim(
        &self,
        turn: Turn<'_>,
        token: &str,
        now: Millis,
        claim: impl FnOnce(&Admitted) -> Claim + Send,
    ) -> Result<(Admitted, Option<(Lease, Job)>), AdmitError> {
        self.admit_with(turn, token, Purpose::Lease, now, |a| Some(claim(a)))
            .await
    }

    async fn admit_with(
        &self,
        turn: Turn<'_>,
        token: &str,
        purpose: Purpose,
        now: Millis,
        claim: impl FnOnce(&Admitted) -> Option<Claim> + Send,
    ) -> Result<(Admitted, Option<(Lease, Job)>), AdmitError> {
        let result = self.judge_and_record(token, purpose, now, claim).await;
        drop(turn);
        match &result {
            Ok((admitted, _)) => {
                // Every log line of this request names the runner and its pool.
                let span = tracing::Span::current();
                span.record("runner_id", tracing::field::display(&admitted.runner.id));
                span.record("pool", tracing::field::display(&admitted.pool.name));
                self.metrics.attestation("accepted");
                if let (Err(refusal), Purpose::Lease | Purpose::GateCheck | Purpose::GithubRunner) =
                    (&admitted.verdict, purpose)
                {
                    self.metrics
                        .refused(admitted.pool.name.as_str(), refusal.code());
                    // Once per refusal, here, for leases and gate checks alike.
                    tracing::info!(
                        runner_id = %admitted.runner.id,
                        pool = %admitted.pool.name,
                        code = refusal.code(),
                        purpose = ?purpose,
                        "refused"
                    );
                }
            }
            Err(AdmitError::Store(_)) => {}
            Err(e) => {
                self.metrics.attestation(e.code());
                tracing::info!(code = e.code(), detail = %e, purpose = ?purpose, "attestation rejected");
            }
        }
        result
    }

    async fn judge_and_record(
        &self,
        token: &str,
        purpose: Purpose,
        now: Millis,
        claim: impl FnOnce(&Admitted) -> Option<Claim> + Send,
    ) -> Result<(Admitted, Option<(Lease, Job)>), AdmitError> {
        let unverified = read_header(token)?;
        let GateRunner {
            record: runner,
            key,
        } = self
            .store
            .gate_runner(&unverified.kid)
            .await?
            .ok_or_else(|| AdmitError::Invalid(INVALID_SIGNATURE_DETAIL.into()))?;
        if !self.signatures.holds(unverified.signature(&key)?).await {
            return Err(AdmitError::Invalid(INVALID_SIGNATURE_DETAIL.into()));
        }
        let attestation = match unverified.claims(&self.rules, now) {
            Ok(a) => a,
            Err(VerifyError::Claims(e)) => {
                // Signed by the runner's own key: what it sent is wrong (its clock, most
                // often). Noted on the runner, so that "stale" says why.
                let rejected = AdmitError::from(VerifyError::Claims(e));
                if !matches!(rejected, AdmitError::BadRequest(_)) {
                    self.store
                        .record_rejection(&runner.id, rejected.code(), &rejected.to_string(), now)
                        .await?;
                }
                return Err(rejected);
            }
            Err(e) => return Err(e.into()),
        };

        let checked = attestation.image.clone().check().and_then(|image| {
            let images = attestation
                .images
                .iter()
                .map(|e| e.clone().check())
                .collect::<Result<Vec<_>, _>>()?;
            Ok((image, images))
        });
        let (image, images) = match checked {
            Ok(both) => both,
            Err(bad) => {
                // Rules 5 and 6 still come first; then the bad digest, with nothing recorded.
                if self
                    .store
                    .jti_seen(&runner.id, &attestation.jti, now)
                    .await?
                {
                    return Err(AdmitError::Replayed);
                }
                if runner.is_revoked() {
                    return Err(AdmitError::Revoked);
                }
                return Err(AdmitError::BadRequest(format!("image: {bad}")));
            }
        };
        let pool = self
            .store
            .gate_pool(&runner.pool)
            .await?
            .ok_or_else(|| StoreError::Internal(format!("runner {} has no pool", runner.id)))?;
        let state = AttestedState {
            probe: attestation.probe.clone(),
            image: image.clone(),
            images: images.clone(),
        };
        let verdict = judge(&state, runner.gate, &pool, now, self.probe_max_age_s);
        let status = verdict
            .as_ref()
            .err()
            .map_or(RunnerStatus::Healthy, Refusal::status);
        let refusal = match (&verdict, purpose) {
            (Err(r), Purpose::Lease | Purpose::GateCheck | Purpose::GithubRunner) => {
                Some((r.code().to_string(), r.detail()))
            }
            _ => None,
        };
        let record = AttestationRecord {
            runner_id: runner.id.clone(),
            jti: attestation.jti.clone(),
            replay_until: attestation.replay_window_end(&self.rules),
            received_at: now,
            state,
            agent: attestation.agent.as_ref().map(|a| a.to_string()),
            status,
            refusal,
            judged_gate: runner.gate,
        };
        let admitted = Admitted {
            runner,
            pool,
            attestation,
            image,
            images,
            verdict,
        };
        let claim = if admitted.enforced_refusal().is_none() {
            claim(&admitted)
        } else {
            None
        };
        let item = RoundItem {
            attestation: Some(record),
            claim,
        };
        let outcome = self.store.submit(item).await?;
        match outcome.attestation {
            Some(Err(Rejection::Replayed)) => Err(AdmitError::Replayed),
            Some(Err(Rejection::Revoked)) => Err(AdmitError::Revoked),
            Some(Err(Rejection::Expired)) => Err(AdmitError::Expired(
                "the attestation's window ended while it waited to be recorded; attest again \
                 with a fresh attestation"
                    .into(),
            )),
            Some(Err(Rejection::Undecided)) => Err(AdmitError::Store(StoreError::Unavailable(
                "the database connection was lost before this attestation's round was \
                 answered, and whether it was taken cannot be told; attest again with a fresh \
                 attestation"
                    .into(),
            ))),
            // Spelled out: a verdict added later is not taken for an acceptance.
            Some(Ok(())) | None => {
                if let Some(claimed) = &admitted.attestation.forge_runners {
                    self.follow_forge_runners(&admitted.runner, claimed, now)
                        .await?;
                }
                Ok((admitted, outcome.granted))
            }
        }
    }

    /// Rebinds `runner` to the forge runners its agent `claimed`, unless it holds exactly
    /// those already. One another runner holds stays noted on it, and is tried again on every
    /// attestation, so that it is bound once freed.
    async fn follow_forge_runners(
        &self,
        runner: &Runner,
        claimed: &[ForgeRunner],
        now: Millis,
    ) -> Result<(), StoreError> {
        let mut held: Vec<ForgeRunner> = runner.forge_runners.iter().map(|b| b.runner()).collect();
        held.sort();
        let mut wanted = claimed.to_vec();
        wanted.sort();
        if held == wanted && runner.forge_runners_taken.is_empty() {
            return Ok(());
        }
        let named: Vec<String> = claimed.iter().map(ForgeRunner::label).collect();
        let audit = Entry {
            at: now,
            actor: "leasegate".into(),
            action: Action::RunnerForgeRunners,
            target: runner.id.to_string(),
            detail: Some(crate::domain::text::sanitize(
                &format!(
                    "forge_runners [{}], as the runner's attestation claims",
                    named.join(", ")
                ),
                1024,
            )),
            client: "-".into(),
        };
        let Some(followed) = self
            .store
            .follow_forge_runners(&runner.id, claimed, now, &audit)
            .await?
        else {
            return Ok(());
        };
        if !followed.changed {
            return Ok(());
        }
        tracing::info!(
            runner_id = %runner.id,
            forge_runners = followed.bound.len(),
            "forge runners follow the runner's files"
        );
        for taken in &followed.taken {
            tracing::warn!(
                runner_id = %runner.id,
                code = "forge_runner_taken",
                forge_runner = %taken.label(),
                "a forge runner on this runner's machine is bound to another runner"
            );
        }
        Ok(())
    }
}

//! A runner asks for a GitHub registration: its attestation is judged by the lease's rules
//! (`Gate::admit`, rules 1–13, the refusal recorded as a lease's is), and only a runner they
//! admit, or one a pool in `observe` would have refused, gets one. Then:
//!
//! 1. the pool must say where its runners register (`github`);
//! 2. a reservation is written first (`minting`), so that a runner holds at most one
//!    registration that has not ended, whatever replicas race: another request meanwhile is
//!    answered with the one it holds;
//! 3. GitHub mints (`generate-jitconfig`), under `<runner name>-<8 hex>`; a name GitHub
//!    already has (409) is tried once more with a new suffix;
//! 4. only GitHub's 201 makes it `minted`: on any failure the reservation goes again.
//!
//! A refusal, an unset pool or an outstanding registration makes no call to GitHub.

use super::Github;
use super::context::GithubContext;
use super::error::GithubError;
use super::settings::Secret;
use crate::domain::audit::Action;
use crate::domain::github::GithubScope;
use crate::domain::github::registration::{Registration, State, registration_name};
use crate::domain::ids::RegistrationId;
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::domain::verdict::Refusal;
use crate::gate::{AdmitError, Purpose};
use crate::store::StoreError;

/// Why no registration was minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// Rules 1–6 (or a bad request, or the store).
    #[error(transparent)]
    Admit(#[from] AdmitError),
    /// Rules 7–13, in a pool that enforces.
    #[error("{}", .0.detail())]
    Refused(Refusal),
    #[error(
        "pool {0} has no github object: PUT it with {{\"github\": {{\"scope\": …, \"labels\": […]}}}} \
         to say where its runners register"
    )]
    PoolNotGithub(PoolName),
    /// The runner already holds a registration that has not ended.
    #[error(
        "the runner holds GitHub runner {} ({}, {}): one registration at a time; ask again once \
         it has taken its job or been withdrawn",
        .0.github_runner_id.map_or_else(|| "being minted".to_string(), |id| id.to_string()),
        .0.name,
        .0.state.as_str()
    )]
    Outstanding(Box<Registration>),
    #[error("{error}")]
    Github {
        error: GithubError,
        scope: GithubScope,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl MintError {
    /// The code of `leasegate_github_registrations_total{outcome="refused"|"failed", code}`.
    fn code(&self) -> &'static str {
        match self {
            MintError::Admit(e) => e.code(),
            MintError::Refused(r) => r.code(),
            MintError::PoolNotGithub(_) => "pool_not_github",
            MintError::Outstanding(_) => "github_runner_outstanding",
            MintError::Github {
                error: GithubError::Unavailable { .. },
                ..
            } => "github_unavailable",
            MintError::Github { .. } => "github_refused",
            MintError::Store(_) => "unavailable",
        }
    }
}

/// A registration GitHub minted, with what the runner runs it with.
#[derive(Debug)]
pub struct Minted {
    pub registration: Registration,
    /// `run.sh --jitconfig <this>`: handed to the runner, never stored or logged.
    pub encoded_jit_config: Secret,
    /// In a pool that observes: the code the gate would have refused with.
    pub would_refuse: Option<&'static str>,
}

/// Judges `attestation` and, for an admitted runner, mints its registration; `client` is the
/// runner's address, for the audit trail.
pub async fn mint(
    cx: &GithubContext,
    github: &Github,
    attestation: &str,
    client: &str,
) -> Result<Minted, MintError> {
    let result = judge_and_mint(cx, github, attestation, client).await;
    let metrics = cx.metrics();
    match &result {
        Ok(m) => match m.would_refuse {
            Some(code) => metrics.github("observed", code),
            None => metrics.github("minted", "none"),
        },
        Err(e @ (MintError::Refused(_) | MintError::PoolNotGithub(_))) => {
            metrics.github("refused", e.code())
        }
        Err(MintError::Outstanding(_)) => metrics.github("outstanding", "none"),
        Err(e @ MintError::Github { .. }) => metrics.github("failed", e.code()),
        // Rules 1–6 and the store are counted where they always are.
        Err(MintError::Admit(_) | MintError::Store(_)) => {}
    }
    result
}

async fn judge_and_mint(
    cx: &GithubContext,
    github: &Github,
    attestation: &str,
    client: &str,
) -> Result<Minted, MintError> {
    let turn = cx.gate().turn().await;
    // Read after the turn, as every admission does: a wait for a turn is not held against
    // the attestation's freshness.
    let now = Millis::now();
    let admitted = cx
        .gate()
        .admit(turn, attestation, Purpose::GithubRunner, now)
        .await?;
    if let Some(refusal) = admitted.enforced_refusal() {
        return Err(MintError::Refused(refusal.clone()));
    }
    let would_refuse = admitted.observed_refusal().map(Refusal::code);
    let Some(pool) = &admitted.pool.github else {
        return Err(MintError::PoolNotGithub(admitted.pool.name.clone()));
    };
    let ttl_s = github.settings().unused_ttl_s;
    let mut reg = Registration {
        id: RegistrationId::generate(),
        runner_id: admitted.runner.id.clone(),
        pool: admitted.pool.name.clone(),
        scope: pool.scope.clone(),
        name: registration_name(&admitted.runner.name, rand::random()),
        github_runner_id: None,
        state: State::Minting,
        minted_at: now,
        expires_at: now.plus_secs(ttl_s),
        online_at: None,
        busy_at: None,
        seen_at: None,
        ended_at: None,
        end_reason: None,
        would_refuse: would_refuse.map(str::to_string),
        observed_code: None,
    };
    let store = cx.store();
    if let Some(held) = store.reserve_github_registration(&reg).await? {
        return Err(MintError::Outstanding(Box::new(held)));
    }
    let mut jit = github.generate_jitconfig(pool, &reg.name).await;
    if matches!(&jit, Err(GithubError::Refused { status: 409, .. })) {
        // The name is taken (a registration of another leasegate, or an old one): once more.
        reg.name = registration_name(&admitted.runner.name, rand::random());
        store.rename_github_registration(&reg.id, &reg.name).await?;
        jit = github.generate_jitconfig(pool, &reg.name).await;
    }
    let jit = match jit {
        Ok(jit) => jit,
        Err(error) => {
            store.release_github_registration(&reg.id).await?;
            tracing::warn!(
                runner_id = %reg.runner_id,
                scope = %reg.scope,
                error = %error,
                "GitHub did not mint a registration"
            );
            return Err(MintError::Github {
                error,
                scope: reg.scope,
            });
        }
    };
    let minted_at = Millis::now();
    reg.github_runner_id = Some(jit.runner_id);
    reg.name = jit.name;
    reg.state = State::Minted;
    reg.minted_at = minted_at;
    reg.expires_at = minted_at.plus_secs(ttl_s);
    let audit = reg.audit(
        Action::GithubRunnerMinted,
        minted_at,
        client,
        would_refuse
            .map(|code| format!("minted in an observing pool; would refuse {code}"))
            .as_deref(),
    );
    let recorded = match store
        .record_github_registration(&reg, State::Minting, Some(&audit))
        .await
    {
        Ok(true) => Ok(()),
        // The reservation is no longer the one this call made (GitHub took longer than the
        // watcher's window, and the watcher settled it meanwhile): nothing would watch what
        // GitHub made, and the runner could mint another at once.
        Ok(false) => Err(StoreError::Unavailable(
            "the registration's reservation ended while GitHub minted it; ask again".into(),
        )),
        Err(e) => Err(e),
    };
    if let Err(e) = recorded {
        // GitHub has it but leasegate could not write it down: withdraw it rather than hand
        // out a registration nobody watches (the watcher clears the reservation).
        let withdrawn = github.delete_runner(&reg.scope, jit.runner_id).await;
        tracing::error!(runner_id = %reg.runner_id, github_runner_id = jit.runner_id, error = %e, withdrawn = ?withdrawn, "a minted registration could not be recorded; withdrawn");
        return Err(e.into());
    }
    tracing::info!(
        runner_id = %reg.runner_id,
        pool = %reg.pool,
        github_runner_id = jit.runner_id,
        name = %reg.name,
        scope = %reg.scope,
        would_refuse = would_refuse.unwrap_or("-"),
        "GitHub registration minted"
    );
    Ok(Minted {
        registration: reg,
        encoded_jit_config: jit.encoded,
        would_refuse,
    })
}

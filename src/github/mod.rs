//! GitHub Actions under the gate: the just-in-time runner configuration is the lease.
//!
//! GitHub's runner takes its jobs from GitHub's own broker, where no gate can stand; what a
//! third party can hold is the registration. leasegate holds the GitHub credential and mints a
//! single-use registration (`generate-jitconfig`) only for a runner whose fresh, signed
//! attestation the lease's own rules admit (`mint`), then watches every registration it
//! minted, one list call per scope per interval, and withdraws one that is never used or whose
//! runner stops being admitted while it waits (`watcher`). A busy registration is never
//! touched: GitHub's runner takes one job per registration, so every job follows a probe.
//!
//! - `settings`: `LEASEGATE_GITHUB_*`, read and checked at start;
//! - `credential`: a token, or a GitHub App's installation token, cached and renewed;
//! - `rest`: the transport, with the headers GitHub asks for;
//! - `actions`: the runner endpoints (generate-jitconfig, list, delete);
//! - `error`: what went wrong, as wait-and-retry or tell-an-operator;
//! - `context`: what of the running service GitHub's side touches, handed over by it;
//! - `mint`: a runner's request, judged, reserved, minted and recorded;
//! - `watcher`: the background task that follows and withdraws registrations.

pub mod actions;
pub mod context;
pub mod credential;
pub mod error;
pub mod mint;
pub mod rest;
pub mod settings;
pub mod watcher;

use crate::domain::time::Millis;
use credential::Credential;
use error::GithubError;
use reqwest::{Method, StatusCode};
use rest::{Answer, Rest};
use settings::GithubSettings;

/// The GitHub side of a running service.
pub struct Github {
    settings: GithubSettings,
    rest: Rest,
    credential: Credential,
}

impl Github {
    pub fn new(settings: GithubSettings) -> anyhow::Result<Self> {
        let rest = Rest::new(&settings)?;
        let credential = Credential::new(&settings.credential);
        Ok(Github {
            settings,
            rest,
            credential,
        })
    }

    pub fn settings(&self) -> &GithubSettings {
        &self.settings
    }

    /// Sends one call with the credential; a `401` to an App's installation token fetches
    /// another and tries once more (GitHub may have revoked the one in hand).
    async fn authorized(
        &self,
        method: Method,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, GithubError> {
        let auth = self
            .credential
            .authorization(&self.rest, Millis::now())
            .await?;
        let answer = self.rest.call(method.clone(), url, &auth, body).await?;
        if answer.status != StatusCode::UNAUTHORIZED || !self.credential.forget(&auth).await {
            return Ok(answer);
        }
        tracing::info!("GitHub refused the installation token (401); fetching another");
        let auth = self
            .credential
            .authorization(&self.rest, Millis::now())
            .await?;
        self.rest.call(method, url, &auth, body).await
    }
}

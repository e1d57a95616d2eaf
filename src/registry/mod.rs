//! Registry-backed pools: resolving a pool's `image_ref` against its OCI registry.
//!
//! - [`reference`]: parsing `host[:port]/path/name[:tag|@digest]` (Docker Hub when there is no
//!   host).
//! - [`auth`]: credentials from a containers auth file, and the 401 challenge (basic or bearer
//!   token).
//! - [`client`]: `HEAD`/`GET` of manifests, digests checked against bytes.
//! - [`resolve`]: a manifest or an image index to the set of digests a pool accepts.
//! - [`resolver`]: resolving one pool through the store (the attempt, then the pure
//!   `Pool::apply_resolution`, then the write), and the background task that resolves every
//!   registry pool when it is due.
//!
//! A resolution never fails "into" a pool: whatever goes wrong, the attempt ends as a
//! `ResolutionOutcome::Failed` with an operator-readable message, and the pool keeps its last
//! known good set.

pub mod auth;
pub mod client;
pub mod reference;
pub mod resolve;
pub mod resolver;

use crate::domain::digest::ImageDigest;
use crate::domain::image_set::ResolutionOutcome;
use auth::AuthSource;
use client::{RegistryClient, RegistryError};
use reference::ImageRef;
use resolve::Platform;
use std::time::Duration;

/// The cap on a recorded resolution error, in bytes.
pub const MAX_ERROR_BYTES: usize = 1024;

/// How the service talks to registries, from its configuration.
#[derive(Clone, Debug)]
pub struct RegistrySettings {
    pub platform: Platform,
    /// `host:port` of registries reached over plain HTTP.
    pub insecure: Vec<String>,
    pub auth: AuthSource,
    /// The limit on each request to a registry.
    pub timeout: Duration,
}

impl Default for RegistrySettings {
    fn default() -> Self {
        RegistrySettings {
            platform: Platform::default(),
            insecure: Vec::new(),
            auth: AuthSource::default(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The service's registry resolver: one HTTP client (with its token cache) and the settings.
pub struct Registry {
    client: RegistryClient,
    settings: RegistrySettings,
}

impl Registry {
    pub fn new(settings: RegistrySettings) -> anyhow::Result<Registry> {
        // Fail at start-up, not at the first resolution, on an unreadable auth file.
        settings.auth.load()?;
        Ok(Registry {
            client: RegistryClient::new(settings.insecure.clone(), settings.timeout)?,
            settings,
        })
    }

    pub fn settings(&self) -> &RegistrySettings {
        &self.settings
    }

    /// Resolves `image_ref` now. With `known` (the digest the pool last resolved to), a `HEAD`
    /// that names the same digest ends the attempt as `Unchanged` without fetching anything.
    pub async fn resolve(&self, image_ref: &str, known: Option<&ImageDigest>) -> ResolutionOutcome {
        match self.try_resolve(image_ref, known).await {
            Ok(outcome) => outcome,
            Err(e) => ResolutionOutcome::Failed {
                error: crate::domain::text::sanitize(&e.to_string(), MAX_ERROR_BYTES),
            },
        }
    }

    async fn try_resolve(
        &self,
        image_ref: &str,
        known: Option<&ImageDigest>,
    ) -> Result<ResolutionOutcome, RegistryError> {
        let image =
            ImageRef::parse(image_ref).map_err(|e| RegistryError::BadReference(e.to_string()))?;
        let auth = self
            .settings
            .auth
            .load()
            .map_err(|e| RegistryError::Credentials(e.to_string()))?;
        if let Some(known) = known
            && let Some(now) = self
                .client
                .head_manifest(&image, &image.reference(), &auth)
                .await?
            && &now == known
        {
            return Ok(ResolutionOutcome::Unchanged { digest: now });
        }
        let resolved =
            resolve::resolve(&self.client, &image, &self.settings.platform, &auth).await?;
        Ok(ResolutionOutcome::Resolved(resolved))
    }
}

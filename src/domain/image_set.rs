//! An expected image set and how it changes, for a pool's single image (`pool`) and for each
//! image a pool describes (`images`) alike: where the set comes from (an operator, or its ref
//! resolved against a registry), what a resolution came to, and how a new set rolls the
//! current one into the previous one, accepted for a grace.
//!
//! Both the pool and its image entries roll their sets by the same rule and record their
//! resolutions the same way, so that rule lives below both rather than in either.

use super::digest::ImageDigest;
use super::time::Millis;
use serde::{Deserialize, Serialize};

/// Where a pool's expected image set comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ImageSource {
    /// Set by an operator or a pipeline through the admin API.
    #[default]
    Manual,
    /// Resolved by the service from `image_ref` against its OCI registry.
    Registry,
}

impl ImageSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageSource::Manual => "manual",
            ImageSource::Registry => "registry",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "manual" => Some(ImageSource::Manual),
            "registry" => Some(ImageSource::Registry),
            _ => None,
        }
    }
}

/// The outcome of the last registry resolution of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resolution {
    pub at: Millis,
    pub ok: bool,
    pub error: Option<String>,
}

/// What one attempt to resolve a pool's `image_ref` against its registry came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolutionOutcome {
    /// The reference resolved to `image`.
    Resolved(ResolvedImage),
    /// The reference still points at `digest`, the one the pool last resolved to (a `HEAD`
    /// answered it; nothing else was fetched).
    Unchanged { digest: ImageDigest },
    /// The attempt failed (network, 5xx, authentication, unknown tag, bad manifest). The
    /// message is for operators and never carries credentials.
    Failed { error: String },
}

/// What a reference resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedImage {
    /// The digest the reference points at: an image manifest, or an image index.
    pub digest: ImageDigest,
    /// The config digest (the image ID a runner's `image inspect` reports) of the service's
    /// platform, when the reference has an image for it.
    pub image_id: Option<ImageDigest>,
    /// Everything a runner of this pool may run: the digest, and for every platform its
    /// manifest digest and config digest.
    pub accepted: Vec<ImageDigest>,
}

/// The sets after `new` replaces the current set at `now`: when it differs from a non-empty
/// current set, the current set becomes the previous one, accepted for `grace_s`; otherwise
/// the previous set and its grace are left as they are (the grace is not restarted).
pub(super) fn roll_sets(
    current: &[ImageDigest],
    previous: &[ImageDigest],
    previous_valid_until: Option<Millis>,
    mut new: Vec<ImageDigest>,
    grace_s: i64,
    now: Millis,
) -> (Vec<ImageDigest>, Vec<ImageDigest>, Option<Millis>) {
    new.sort();
    new.dedup();
    if new.as_slice() != current && !current.is_empty() {
        (new, current.to_vec(), Some(now.plus_secs(grace_s)))
    } else {
        (new, previous.to_vec(), previous_valid_until)
    }
}

//! Pools: named sets of runners that share one image reference and one image policy.
//!
//! The pool decides which images its runners may run: the *current* expected set, plus the
//! *previous* set until `previous_valid_until` so that a fleet can roll without stalling.

use super::digest::ImageDigest;
use super::time::Millis;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How strictly a pool's image is enforced at the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ImagePolicy {
    /// Refuse runners whose running image is outside the accepted set.
    #[default]
    Enforce,
    /// Never refuse for the image; show and report drift only.
    Report,
    /// Ignore images entirely.
    Off,
}

/// Where a pool's expected image set comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ImageSource {
    /// Set by an operator or a pipeline through the admin API.
    #[default]
    Manual,
    /// Resolved by the service from `image_ref` against its OCI registry.
    Registry,
}

impl ImagePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePolicy::Enforce => "enforce",
            ImagePolicy::Report => "report",
            ImagePolicy::Off => "off",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "enforce" => Some(ImagePolicy::Enforce),
            "report" => Some(ImagePolicy::Report),
            "off" => Some(ImagePolicy::Off),
            _ => None,
        }
    }
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

/// A pool name: 1–63 characters of `a-z 0-9 - _ .`, starting with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PoolName(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "`{0}` is not a valid pool name (1-63 characters of a-z 0-9 - _ ., starting with a letter or digit)"
)]
pub struct BadPoolName(pub String);

impl PoolName {
    pub fn parse(s: &str) -> Result<Self, BadPoolName> {
        let first_ok = s
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let all_ok = s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        });
        if first_ok && all_ok && s.len() <= 63 {
            Ok(PoolName(s.to_string()))
        } else {
            Err(BadPoolName(s.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// For values read back from the store, which only ever holds parsed names.
    pub fn from_trusted(s: String) -> Self {
        PoolName(s)
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Default grace during which the previous image set stays accepted (PROTOCOL.md).
pub const DEFAULT_DRIFT_GRACE_S: i64 = 900;
/// Default interval between registry resolutions (PROTOCOL.md).
pub const DEFAULT_RESOLVE_INTERVAL_S: i64 = 300;

/// What an operator asks for in `PUT /api/v1/admin/pools/{name}`: the whole pool, defaults filled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub image_ref: Option<String>,
    pub expected_image_ids: Vec<ImageDigest>,
    pub image_policy: ImagePolicy,
    pub image_source: ImageSource,
    pub drift_grace_s: i64,
    pub resolve_interval_s: i64,
}

/// Why a pool spec cannot be accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolSpecError {
    /// There is no "enforce nothing" state (422 `pool_image_unresolved`).
    #[error("a manual pool with image_policy enforce needs at least one expected_image_ids entry")]
    EnforceWithoutImages,
    #[error("{0}")]
    OutOfRange(String),
}

impl PoolSpec {
    pub fn validate(&self) -> Result<(), PoolSpecError> {
        if self.image_source == ImageSource::Manual
            && self.image_policy == ImagePolicy::Enforce
            && self.expected_image_ids.is_empty()
        {
            return Err(PoolSpecError::EnforceWithoutImages);
        }
        if !(0..=30 * 86_400).contains(&self.drift_grace_s) {
            return Err(PoolSpecError::OutOfRange(
                "drift_grace_s must be between 0 and 2592000".into(),
            ));
        }
        if !(10..=86_400).contains(&self.resolve_interval_s) {
            return Err(PoolSpecError::OutOfRange(
                "resolve_interval_s must be between 10 and 86400".into(),
            ));
        }
        if self.image_source == ImageSource::Registry && self.image_ref.is_none() {
            return Err(PoolSpecError::OutOfRange(
                "a registry pool needs an image_ref to resolve".into(),
            ));
        }
        Ok(())
    }
}

/// The outcome of the last registry resolution of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resolution {
    pub at: Millis,
    pub ok: bool,
    pub error: Option<String>,
}

/// A pool as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub name: PoolName,
    pub image_ref: Option<String>,
    pub image_policy: ImagePolicy,
    pub image_source: ImageSource,
    pub expected_image_ids: Vec<ImageDigest>,
    pub previous_image_ids: Vec<ImageDigest>,
    pub previous_valid_until: Option<Millis>,
    pub drift_grace_s: i64,
    pub resolve_interval_s: i64,
    pub last_resolution: Option<Resolution>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl Pool {
    /// The pool that results from applying `spec` to `current` (or creating it) at `now`.
    ///
    /// When the expected set changes, the set it replaces stays accepted for the new spec's
    /// grace. Only the immediately previous set is kept. A registry pool keeps its resolved set
    /// (an admin PUT does not clear what the resolver found) unless the spec names one.
    pub fn apply(name: PoolName, current: Option<&Pool>, spec: PoolSpec, now: Millis) -> Pool {
        let mut expected: Vec<ImageDigest> = spec.expected_image_ids;
        expected.sort();
        expected.dedup();
        let keep_resolved = spec.image_source == ImageSource::Registry && expected.is_empty();
        let (expected, previous, previous_valid_until) = match current {
            Some(old) if keep_resolved => (
                old.expected_image_ids.clone(),
                old.previous_image_ids.clone(),
                old.previous_valid_until,
            ),
            Some(old)
                if old.expected_image_ids != expected && !old.expected_image_ids.is_empty() =>
            {
                (
                    expected,
                    old.expected_image_ids.clone(),
                    Some(now.plus_secs(spec.drift_grace_s)),
                )
            }
            Some(old) => (
                expected,
                old.previous_image_ids.clone(),
                old.previous_valid_until,
            ),
            None => (expected, Vec::new(), None),
        };
        Pool {
            name,
            image_ref: spec.image_ref,
            image_policy: spec.image_policy,
            image_source: spec.image_source,
            expected_image_ids: expected,
            previous_image_ids: previous,
            previous_valid_until,
            drift_grace_s: spec.drift_grace_s,
            resolve_interval_s: spec.resolve_interval_s,
            last_resolution: current.and_then(|p| p.last_resolution.clone()),
            created_at: current.map_or(now, |p| p.created_at),
            updated_at: now,
        }
    }

    /// Whether `image` is in the current expected set.
    pub fn is_current(&self, image: &ImageDigest) -> bool {
        self.expected_image_ids.contains(image)
    }

    /// Whether the previous set is still inside its grace at `now`.
    pub fn previous_in_grace(&self, now: Millis) -> bool {
        self.previous_valid_until.is_some_and(|until| now < until)
    }

    /// Whether `image` may lease at `now`: current set, or previous set inside its grace.
    pub fn accepts(&self, image: &ImageDigest, now: Millis) -> bool {
        self.is_current(image)
            || (self.previous_in_grace(now) && self.previous_image_ids.contains(image))
    }

    /// Whether the pool has anything to compare images with.
    pub fn is_resolved(&self) -> bool {
        !self.expected_image_ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(c: char) -> ImageDigest {
        ImageDigest::parse(&format!("sha256:{}", c.to_string().repeat(64))).unwrap()
    }

    fn spec(images: Vec<ImageDigest>) -> PoolSpec {
        PoolSpec {
            image_ref: Some("ci/runner:stable".into()),
            expected_image_ids: images,
            image_policy: ImagePolicy::Enforce,
            image_source: ImageSource::Manual,
            drift_grace_s: 900,
            resolve_interval_s: 300,
        }
    }

    #[test]
    fn names_follow_the_protocol() {
        assert!(PoolName::parse("linux-x86_64.big").is_ok());
        assert!(PoolName::parse("0pool").is_ok());
        assert!(PoolName::parse(&"a".repeat(63)).is_ok());
        for bad in ["", "-x", "_x", ".x", "Upper", "a b", "a/b", &"a".repeat(64)] {
            assert!(PoolName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn enforce_with_no_images_is_refused() {
        assert_eq!(
            spec(vec![]).validate(),
            Err(PoolSpecError::EnforceWithoutImages)
        );
        let mut report = spec(vec![]);
        report.image_policy = ImagePolicy::Report;
        assert_eq!(report.validate(), Ok(()));
    }

    #[test]
    fn a_changed_set_keeps_the_previous_one_for_the_grace() {
        let name = PoolName::parse("p").unwrap();
        let t0 = Millis(1_000_000);
        let first = Pool::apply(name.clone(), None, spec(vec![digest('a')]), t0);
        assert!(first.accepts(&digest('a'), t0));
        assert!(!first.accepts(&digest('b'), t0));

        let t1 = t0.plus_secs(10);
        let second = Pool::apply(name.clone(), Some(&first), spec(vec![digest('b')]), t1);
        assert_eq!(second.previous_image_ids, vec![digest('a')]);
        assert!(second.accepts(&digest('a'), t1.plus_secs(899)));
        assert!(!second.accepts(&digest('a'), t1.plus_secs(900)));
        assert!(!second.is_current(&digest('a')));

        // Same set again: nothing moves, the grace is not restarted.
        let third = Pool::apply(
            name.clone(),
            Some(&second),
            spec(vec![digest('b')]),
            t1.plus_secs(5),
        );
        assert_eq!(third.previous_valid_until, second.previous_valid_until);

        // Only the immediately previous set is kept.
        let fourth = Pool::apply(name, Some(&third), spec(vec![digest('c')]), t1.plus_secs(6));
        assert_eq!(fourth.previous_image_ids, vec![digest('b')]);
        assert!(!fourth.accepts(&digest('a'), t1.plus_secs(7)));
    }
}

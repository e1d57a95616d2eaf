//! Pools: named sets of runners that share one image reference and one image policy.
//!
//! The pool decides which images its runners may run: the *current* expected set, plus the
//! *previous* set until `previous_valid_until` so that a fleet can roll without stalling.

use super::digest::ImageDigest;
use super::disk::DiskWarning;
use super::image_set::{ImageSource, Resolution, ResolutionOutcome, roll_sets};
use super::images::{ImageSpec, MAX_IMAGES, MAX_REF_BYTES, PoolImage, Undescribed};
use super::pool_name::PoolName;
use super::time::Millis;
use serde::{Deserialize, Serialize};

/// How strictly a pool's image is enforced at the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
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

/// Whether a pool's refusals refuse, or only say what they would have refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GateMode {
    /// A refused runner gets no job.
    #[default]
    Enforce,
    /// Every refusal is recorded, counted and shown, but the runner gets its job (or its
    /// forge's answer) all the same, marked with what would have been refused: for turning the
    /// gate on without stopping a fleet, and reading what it would do first.
    Observe,
}

impl GateMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GateMode::Enforce => "enforce",
            GateMode::Observe => "observe",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "enforce" => Some(GateMode::Enforce),
            "observe" => Some(GateMode::Observe),
            _ => None,
        }
    }
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
    pub gate_mode: GateMode,
    pub drift_grace_s: i64,
    pub resolve_interval_s: i64,
    /// Where its runners register with GitHub Actions, if they do.
    pub github: Option<super::github::GithubPool>,
    /// Below what disk figures its runners are shown and counted as warned.
    pub disk_warning: Option<DiskWarning>,
    /// When its runners are ejected for infrastructure failures in a row.
    pub ejection: super::ejection::EjectionPolicy,
    /// The images its runners may run, each with its own set (see `domain::images`).
    pub images: Vec<ImageSpec>,
    /// What it does with an attested image it does not describe.
    pub undescribed_images: Undescribed,
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
            && self.images.is_empty()
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
        if self.images.len() > MAX_IMAGES {
            return Err(PoolSpecError::OutOfRange(format!(
                "images holds at most {MAX_IMAGES} entries"
            )));
        }
        for (i, image) in self.images.iter().enumerate() {
            // Counted in characters, as the document's maxLength counts: an attested ref is
            // at most MAX_REF_BYTES bytes, so an entry no longer than that always can match.
            let chars = image.image_ref.chars().count();
            if chars == 0 || chars > MAX_REF_BYTES {
                return Err(PoolSpecError::OutOfRange(format!(
                    "images[{i}].ref must be 1 to {MAX_REF_BYTES} characters"
                )));
            }
            if self.images[..i]
                .iter()
                .any(|o| o.image_ref == image.image_ref)
            {
                return Err(PoolSpecError::OutOfRange(format!(
                    "images[{i}].ref {} is described twice",
                    image.image_ref
                )));
            }
            if image.expected_image_ids.is_empty() && image.image_source == ImageSource::Manual {
                return Err(PoolSpecError::OutOfRange(format!(
                    "images[{i}].expected_image_ids must name at least one image id \
                     (or its image_source be registry)"
                )));
            }
            if !(0..=30 * 86_400).contains(&image.drift_grace_s) {
                return Err(PoolSpecError::OutOfRange(format!(
                    "images[{i}].drift_grace_s must be between 0 and 2592000"
                )));
            }
        }
        if let Some(w) = &self.disk_warning {
            w.check().map_err(PoolSpecError::OutOfRange)?;
        }
        if self.image_source == ImageSource::Registry && self.image_ref.is_none() {
            return Err(PoolSpecError::OutOfRange(
                "a registry pool needs an image_ref to resolve".into(),
            ));
        }
        self.ejection
            .validate()
            .map_err(PoolSpecError::OutOfRange)?;
        Ok(())
    }
}

/// How a registry pool's resolver is doing, as the pool view shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolverStatus {
    /// The last resolution succeeded, or fewer than the threshold of attempts failed since.
    Ok,
    /// No resolution of the current `image_ref` has succeeded yet.
    NeverResolved,
    /// At least the threshold of consecutive attempts failed: the pool gates on its last
    /// known good set.
    ResolverFailing,
}

/// A pool as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub name: PoolName,
    pub image_ref: Option<String>,
    pub image_policy: ImagePolicy,
    pub image_source: ImageSource,
    pub gate_mode: GateMode,
    pub expected_image_ids: Vec<ImageDigest>,
    pub previous_image_ids: Vec<ImageDigest>,
    pub previous_valid_until: Option<Millis>,
    pub drift_grace_s: i64,
    pub resolve_interval_s: i64,
    pub last_resolution: Option<Resolution>,
    /// Consecutive failed resolutions since the last success (0 for manual pools).
    pub resolution_failures: i64,
    /// The digest `image_ref` last resolved to (registry pools), `None` until the first
    /// success for the current reference.
    pub resolved_digest: Option<ImageDigest>,
    /// The config digest of the service's platform in that resolution, when there was one.
    pub resolved_image_id: Option<ImageDigest>,
    /// When the next background resolution is due (registry pools only).
    pub next_resolve_at: Option<Millis>,
    /// Where its runners register with GitHub Actions, if they do.
    pub github: Option<super::github::GithubPool>,
    /// Below what disk figures its runners are shown and counted as warned.
    pub disk_warning: Option<DiskWarning>,
    /// When its runners are ejected for infrastructure failures in a row.
    pub ejection: super::ejection::EjectionPolicy,
    /// The images its runners may run, each with its own sets and grace.
    pub images: Vec<PoolImage>,
    pub undescribed_images: Undescribed,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl Pool {
    /// The pool that results from applying `spec` to `current` (or creating it) at `now`.
    ///
    /// When the expected set changes, the set it replaces stays accepted for the new spec's
    /// grace. Only the immediately previous set is kept. A registry pool keeps its resolved set
    /// (an admin PUT does not clear what the resolver found) unless the spec names one.
    ///
    /// A registry pool whose reference is new (created, switched to `registry`, or given
    /// another `image_ref`) is due for resolution at once and starts its resolver record
    /// afresh; a set named in the spec of a registry pool stands until the next resolution.
    pub fn apply(name: PoolName, current: Option<&Pool>, spec: PoolSpec, now: Millis) -> Pool {
        let keep_resolved =
            spec.image_source == ImageSource::Registry && spec.expected_image_ids.is_empty();
        let (expected, previous, previous_valid_until) = match current {
            Some(old) if keep_resolved => (
                old.expected_image_ids.clone(),
                old.previous_image_ids.clone(),
                old.previous_valid_until,
            ),
            Some(old) => roll_sets(
                &old.expected_image_ids,
                &old.previous_image_ids,
                old.previous_valid_until,
                spec.expected_image_ids,
                spec.drift_grace_s,
                now,
            ),
            None => roll_sets(&[], &[], None, spec.expected_image_ids, 0, now),
        };
        let same_reference = current.filter(|old| {
            old.image_source == ImageSource::Registry && old.image_ref == spec.image_ref
        });
        // The schedule follows the spec's interval from the last attempt (a PUT may change it).
        let next_after_last = current
            .and_then(Pool::last_attempt_at)
            .map(|at| at.plus_secs(spec.resolve_interval_s))
            .or(Some(now));
        let images = PoolImage::apply(current.map_or(&[][..], |p| &p.images), spec.images, now);
        let (resolved_digest, resolved_image_id, resolution_failures, next_resolve_at) =
            match (spec.image_source, same_reference) {
                (ImageSource::Manual, _) => (None, None, 0, None),
                (ImageSource::Registry, None) => (None, None, 0, Some(now)),
                (ImageSource::Registry, Some(old)) if keep_resolved => (
                    old.resolved_digest.clone(),
                    old.resolved_image_id.clone(),
                    old.resolution_failures,
                    next_after_last,
                ),
                // A set named by the operator is no longer what the registry said: the next
                // resolution fetches everything again instead of trusting a HEAD.
                (ImageSource::Registry, Some(old)) => {
                    (None, None, old.resolution_failures, next_after_last)
                }
            };
        // Registry entries resolve on the pool's schedule too, a new one at once.
        let new_entry = images.iter().any(|i| {
            i.is_registry()
                && !current.is_some_and(|old| {
                    old.images
                        .iter()
                        .any(|o| o.is_registry() && o.image_ref == i.image_ref)
                })
        });
        let next_resolve_at = match next_resolve_at {
            _ if new_entry => Some(now),
            None if images.iter().any(PoolImage::is_registry) => next_after_last,
            other => other,
        };
        Pool {
            name,
            image_ref: spec.image_ref,
            image_policy: spec.image_policy,
            image_source: spec.image_source,
            gate_mode: spec.gate_mode,
            expected_image_ids: expected,
            previous_image_ids: previous,
            previous_valid_until,
            drift_grace_s: spec.drift_grace_s,
            resolve_interval_s: spec.resolve_interval_s,
            last_resolution: current.and_then(|p| p.last_resolution.clone()),
            resolution_failures,
            resolved_digest,
            resolved_image_id,
            next_resolve_at,
            github: spec.github,
            disk_warning: spec.disk_warning,
            ejection: spec.ejection,
            images,
            undescribed_images: spec.undescribed_images,
            created_at: current.map_or(now, |p| p.created_at),
            updated_at: now,
        }
    }

    /// The pool after a resolution of `image_ref` came to `outcome` at `now`; `None` when the
    /// outcome no longer applies (the pool is not a registry pool any more, its reference
    /// changed while the attempt ran, or an `Unchanged` no longer matches what it resolved).
    ///
    /// A success whose set differs from the current one rolls exactly as an operator's PUT
    /// does: the current set stays accepted for `drift_grace_s`. A failure leaves every set
    /// exactly as it was (last known good), and only records the failure and counts it.
    pub fn apply_resolution(
        &self,
        image_ref: &str,
        outcome: &ResolutionOutcome,
        now: Millis,
    ) -> Option<Pool> {
        if self.image_source != ImageSource::Registry
            || self.image_ref.as_deref() != Some(image_ref)
        {
            return None;
        }
        let mut next = self.clone();
        next.next_resolve_at = Some(now.plus_secs(self.resolve_interval_s));
        match outcome {
            ResolutionOutcome::Resolved(image) => {
                let (expected, previous, until) = roll_sets(
                    &self.expected_image_ids,
                    &self.previous_image_ids,
                    self.previous_valid_until,
                    image.accepted.clone(),
                    self.drift_grace_s,
                    now,
                );
                if expected.is_empty() {
                    return None;
                }
                if expected != self.expected_image_ids {
                    next.updated_at = now;
                }
                next.expected_image_ids = expected;
                next.previous_image_ids = previous;
                next.previous_valid_until = until;
                next.resolved_digest = Some(image.digest.clone());
                next.resolved_image_id = image.image_id.clone();
                next.resolution_failures = 0;
                next.last_resolution = Some(Resolution {
                    at: now,
                    ok: true,
                    error: None,
                });
            }
            ResolutionOutcome::Unchanged { digest } => {
                if self.resolved_digest.as_ref() != Some(digest) {
                    return None;
                }
                next.resolution_failures = 0;
                next.last_resolution = Some(Resolution {
                    at: now,
                    ok: true,
                    error: None,
                });
            }
            ResolutionOutcome::Failed { error } => {
                next.resolution_failures = self.resolution_failures.saturating_add(1);
                next.last_resolution = Some(Resolution {
                    at: now,
                    ok: false,
                    error: Some(error.clone()),
                });
            }
        }
        Some(next)
    }

    /// Whether anything of it is resolved against a registry: its single image, or an entry
    /// of its `images`.
    pub fn resolves(&self) -> bool {
        self.image_source == ImageSource::Registry || self.images.iter().any(PoolImage::is_registry)
    }

    /// The last resolution attempt of its single image or of any of its entries.
    fn last_attempt_at(&self) -> Option<Millis> {
        self.images
            .iter()
            .filter_map(|i| i.last_resolution.as_ref())
            .chain(self.last_resolution.as_ref())
            .map(|r| r.at)
            .max()
    }

    /// Whether the background resolver should resolve this pool at `now`.
    pub fn resolution_due(&self, now: Millis) -> bool {
        self.resolves() && self.next_resolve_at.is_none_or(|at| at <= now)
    }

    /// The pool after its registry entries' resolutions (`(ref, outcome)`) came to what they
    /// did at `now`, each applied as `PoolImage::apply_resolution` says (an outcome for a ref
    /// that is no longer a registry entry is dropped), and the next attempt scheduled.
    pub fn apply_image_resolutions(
        &self,
        outcomes: &[(String, ResolutionOutcome)],
        now: Millis,
    ) -> Pool {
        let mut next = self.clone();
        for (image_ref, outcome) in outcomes {
            let Some(entry) = next.images.iter_mut().find(|i| &i.image_ref == image_ref) else {
                continue;
            };
            if let Some(resolved) = entry.apply_resolution(outcome, now) {
                if resolved.expected_image_ids != entry.expected_image_ids {
                    next.updated_at = now;
                }
                *entry = resolved;
            }
        }
        if next.resolves() {
            next.next_resolve_at = Some(now.plus_secs(self.resolve_interval_s));
        }
        next
    }

    /// The digests its registry-resolved parts last resolved to: its single image's and its
    /// entries'.
    pub fn resolved_digests(&self) -> impl Iterator<Item = &ImageDigest> {
        self.resolved_digest.iter().chain(
            self.images
                .iter()
                .filter_map(|i| i.resolved_digest.as_ref()),
        )
    }

    /// The resolver's status, `None` for manual pools. `failure_threshold` consecutive
    /// failures make it `resolver_failing`, whatever came before.
    pub fn resolver_status(&self, failure_threshold: i64) -> Option<ResolverStatus> {
        if self.image_source != ImageSource::Registry {
            return None;
        }
        Some(if self.resolution_failures >= failure_threshold.max(1) {
            ResolverStatus::ResolverFailing
        } else if self.resolved_digest.is_none() {
            ResolverStatus::NeverResolved
        } else {
            ResolverStatus::Ok
        })
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

    /// Whether its single image (`image_ref`, `expected_image_ids`) is judged: always, unless
    /// it describes `images` and has no set of its own (a manual pool with none).
    pub fn judges_single_image(&self) -> bool {
        self.images.is_empty()
            || self.image_source == ImageSource::Registry
            || !self.expected_image_ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures::digest;
    use crate::domain::image_set::ResolvedImage;

    fn spec(images: Vec<ImageDigest>) -> PoolSpec {
        PoolSpec {
            gate_mode: Default::default(),
            image_ref: Some("ci/runner:stable".into()),
            expected_image_ids: images,
            image_policy: ImagePolicy::Enforce,
            image_source: ImageSource::Manual,
            drift_grace_s: 900,
            resolve_interval_s: 300,
            github: None,
            disk_warning: None,
            ejection: Default::default(),
            images: Vec::new(),
            undescribed_images: Default::default(),
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

    fn registry_spec(image_ref: &str, grace: i64) -> PoolSpec {
        PoolSpec {
            gate_mode: Default::default(),
            image_ref: Some(image_ref.into()),
            expected_image_ids: vec![],
            image_policy: ImagePolicy::Enforce,
            image_source: ImageSource::Registry,
            drift_grace_s: grace,
            resolve_interval_s: 300,
            github: None,
            disk_warning: None,
            ejection: Default::default(),
            images: Vec::new(),
            undescribed_images: Default::default(),
        }
    }

    fn resolved(top: char, others: &[char]) -> ResolutionOutcome {
        let mut accepted: Vec<ImageDigest> = others.iter().map(|c| digest(*c)).collect();
        accepted.push(digest(top));
        ResolutionOutcome::Resolved(ResolvedImage {
            digest: digest(top),
            image_id: others.first().map(|c| digest(*c)),
            accepted,
        })
    }

    fn failed(error: &str) -> ResolutionOutcome {
        ResolutionOutcome::Failed {
            error: error.into(),
        }
    }

    #[test]
    fn a_new_registry_pool_is_due_and_never_resolved() {
        let t0 = Millis(1_000_000);
        let pool = Pool::apply(
            PoolName::parse("p").unwrap(),
            None,
            registry_spec("ci/runner:stable", 900),
            t0,
        );
        assert!(!pool.is_resolved());
        assert!(pool.resolution_due(t0));
        assert_eq!(pool.resolver_status(3), Some(ResolverStatus::NeverResolved));
        let manual = Pool::apply(
            PoolName::parse("m").unwrap(),
            None,
            spec(vec![digest('a')]),
            t0,
        );
        assert_eq!(manual.resolver_status(3), None);
        assert!(!manual.resolution_due(t0));
        assert_eq!(
            manual.apply_resolution("ci/runner:stable", &resolved('a', &[]), t0),
            None,
            "a manual pool takes no resolution"
        );
    }

    #[test]
    fn a_resolution_rolls_like_a_put_and_a_failure_keeps_the_last_known_good() {
        let t0 = Millis(1_000_000);
        let r = "ci/runner:stable";
        let pool = Pool::apply(
            PoolName::parse("p").unwrap(),
            None,
            registry_spec(r, 60),
            t0,
        );

        let first = pool
            .apply_resolution(r, &resolved('a', &['b']), t0)
            .unwrap();
        assert_eq!(first.expected_image_ids, vec![digest('a'), digest('b')]);
        assert!(first.previous_image_ids.is_empty());
        assert_eq!(first.previous_valid_until, None);
        assert_eq!(first.resolved_digest, Some(digest('a')));
        assert_eq!(first.resolved_image_id, Some(digest('b')));
        assert_eq!(first.resolver_status(3), Some(ResolverStatus::Ok));
        assert_eq!(first.next_resolve_at, Some(t0.plus_secs(300)));
        assert!(!first.resolution_due(t0.plus_secs(299)));
        assert!(first.resolution_due(t0.plus_secs(300)));

        // The same answer again changes nothing but the record.
        let t1 = t0.plus_secs(300);
        let same = first
            .apply_resolution(r, &resolved('a', &['b']), t1)
            .unwrap();
        assert_eq!(same.expected_image_ids, first.expected_image_ids);
        assert_eq!(same.previous_valid_until, None);
        let unchanged = first
            .apply_resolution(
                r,
                &ResolutionOutcome::Unchanged {
                    digest: digest('a'),
                },
                t1,
            )
            .unwrap();
        assert_eq!(unchanged.expected_image_ids, first.expected_image_ids);
        assert_eq!(unchanged.last_resolution.as_ref().unwrap().at, t1);
        // An Unchanged about another digest is stale: not applied.
        assert_eq!(
            first.apply_resolution(
                r,
                &ResolutionOutcome::Unchanged {
                    digest: digest('c')
                },
                t1
            ),
            None
        );

        // The tag moved: the new set is current, the old one accepted for the grace.
        let t2 = t1.plus_secs(10);
        let moved = same
            .apply_resolution(r, &resolved('c', &['d']), t2)
            .unwrap();
        assert_eq!(moved.expected_image_ids, vec![digest('c'), digest('d')]);
        assert_eq!(moved.previous_image_ids, vec![digest('a'), digest('b')]);
        assert_eq!(moved.previous_valid_until, Some(t2.plus_secs(60)));
        assert!(moved.accepts(&digest('b'), t2.plus_secs(59)));
        assert!(!moved.accepts(&digest('b'), t2.plus_secs(60)));

        // Failures: the sets stay exactly as they were, each failure is counted.
        let mut p = moved.clone();
        for n in 1..=3 {
            let at = t2.plus_secs(n * 300);
            p = p
                .apply_resolution(r, &failed("registry unreachable"), at)
                .unwrap();
            assert_eq!(p.expected_image_ids, moved.expected_image_ids);
            assert_eq!(p.previous_image_ids, moved.previous_image_ids);
            assert_eq!(p.previous_valid_until, moved.previous_valid_until);
            assert_eq!(p.resolved_digest, moved.resolved_digest);
            assert_eq!(p.resolution_failures, n);
            let last = p.last_resolution.clone().unwrap();
            assert_eq!((last.at, last.ok), (at, false));
            assert_eq!(last.error.as_deref(), Some("registry unreachable"));
            let expected_status = if n < 3 {
                ResolverStatus::Ok
            } else {
                ResolverStatus::ResolverFailing
            };
            assert_eq!(p.resolver_status(3), Some(expected_status));
        }
        // One success clears the count.
        let back = p
            .apply_resolution(r, &resolved('c', &['d']), t2.plus_secs(2000))
            .unwrap();
        assert_eq!(back.resolution_failures, 0);
        assert_eq!(back.resolver_status(3), Some(ResolverStatus::Ok));
        assert_eq!(back.previous_valid_until, moved.previous_valid_until);
    }

    #[test]
    fn a_resolution_of_a_reference_the_pool_left_is_dropped() {
        let t0 = Millis(1_000_000);
        let name = PoolName::parse("p").unwrap();
        let pool = Pool::apply(
            name.clone(),
            None,
            registry_spec("ci/runner:stable", 60),
            t0,
        );
        let pool = pool
            .apply_resolution("ci/runner:stable", &resolved('a', &[]), t0)
            .unwrap();
        assert_eq!(
            pool.apply_resolution("ci/runner:next", &resolved('b', &[]), t0),
            None
        );
        // A new reference starts the resolver's record afresh and is due at once; the set it
        // had stays until the new reference resolves.
        let t1 = t0.plus_secs(5);
        let moved = Pool::apply(
            name.clone(),
            Some(&pool),
            registry_spec("ci/runner:next", 60),
            t1,
        );
        assert_eq!(moved.expected_image_ids, vec![digest('a')]);
        assert_eq!(moved.resolved_digest, None);
        assert!(moved.resolution_due(t1));
        assert_eq!(
            moved.resolver_status(3),
            Some(ResolverStatus::NeverResolved)
        );
        // A PUT that changes only the grace keeps everything the resolver found.
        let regraced = Pool::apply(
            name.clone(),
            Some(&pool),
            registry_spec("ci/runner:stable", 0),
            t1,
        );
        assert_eq!(regraced.resolved_digest, pool.resolved_digest);
        assert_eq!(regraced.next_resolve_at, pool.next_resolve_at);
        assert_eq!(regraced.expected_image_ids, pool.expected_image_ids);
        // A shorter interval brings the next attempt forward, from the last one.
        let mut faster = registry_spec("ci/runner:stable", 60);
        faster.resolve_interval_s = 30;
        let faster = Pool::apply(name, Some(&pool), faster, t1);
        assert_eq!(faster.next_resolve_at, Some(t0.plus_secs(30)));
    }
}

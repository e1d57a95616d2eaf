//! Several images per runner: what a runner attests it may run (`images`), what its pool
//! describes of each (`Pool::images`), and how the one is judged against the other.
//!
//! Why several: a Forgejo, Gitea or GitLab docker-executor runner maps each label to an image
//! and picks one per job, and with `force_pull: false` the first pull of a tag sticks, so one
//! runner can sit on a superseded image for one label while its others are current. Each
//! attested image is judged against the pool's entry for its ref, as a pool's single image is
//! (current set, previous set inside its grace), and the first that is not accepted refuses
//! the runner, named by its ref and labels. Refs are compared as written: the pool describes
//! them as the runner's configuration spells them.
//!
//! An entry's set comes from its operator (`manual`) or from its ref resolved against its
//! registry (`registry`), exactly as a registry pool's single image: the same resolution
//! rolls it (`domain::image_set`), and a failure keeps its last known good set. The pool's resolver resolves its
//! registry entries on the pool's schedule (`domain::pool`, `registry::resolver`).

use super::digest::{ImageDigest, NotADigest};
use super::image_set::{ImageSource, Resolution, ResolutionOutcome, roll_sets};
use super::time::Millis;
use serde::{Deserialize, Serialize};

/// At most this many images per attestation and per pool.
pub const MAX_IMAGES: usize = 32;
/// At most this many labels per attested image.
pub const MAX_LABELS: usize = 32;
/// The longest ref kept, in bytes.
pub const MAX_REF_BYTES: usize = 512;

/// One image a runner attests, before its digests are checked.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ReportedEntry {
    pub image_ref: String,
    pub id: Option<String>,
    pub digest: Option<String>,
    pub labels: Vec<String>,
    /// Not present on the runner (never pulled, or removed); then there is no `id`.
    pub absent: bool,
}

impl ReportedEntry {
    /// The digests as digests: a short id or a tag is a bad request (checked after rule 6).
    pub fn check(self) -> Result<AttestedImage, NotADigest> {
        Ok(AttestedImage {
            id: self.id.as_deref().map(ImageDigest::parse).transpose()?,
            digest: self.digest.as_deref().map(ImageDigest::parse).transpose()?,
            image_ref: self.image_ref,
            labels: self.labels,
            absent: self.absent,
        })
    }
}

/// One image a runner attests, digests checked; also what is kept with its latest attestation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttestedImage {
    #[serde(rename = "ref")]
    pub image_ref: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<ImageDigest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<ImageDigest>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub absent: bool,
}

impl AttestedImage {
    /// ` (label ubuntu-latest)`, ` (labels a, b)`, or nothing.
    fn labels_said(&self) -> String {
        match self.labels.as_slice() {
            [] => String::new(),
            [one] => format!(" (label {one})"),
            many => format!(" (labels {})", many.join(", ")),
        }
    }
}

/// What a pool does with an attested ref it does not describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Undescribed {
    /// Refuse the runner (`image_drift`): an image nobody vouched for is not run.
    #[default]
    Refuse,
    /// Leave it out of the judgement.
    Ignore,
}

impl Undescribed {
    pub fn as_str(self) -> &'static str {
        match self {
            Undescribed::Refuse => "refuse",
            Undescribed::Ignore => "ignore",
        }
    }
}

/// What an operator asks of one image: its expected set (or that its registry gives it), its
/// grace, whether it may be absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSpec {
    pub image_ref: String,
    /// `registry`: the set is what `image_ref` resolves to; a set named here stands until
    /// the next resolution, and none keeps what the entry resolved to.
    pub image_source: ImageSource,
    pub expected_image_ids: Vec<ImageDigest>,
    pub drift_grace_s: i64,
    /// A runner that pulls at every job (`force_pull`) may not have it yet: absent is fine.
    pub absent_ok: bool,
}

/// One image a pool describes, as stored: its current set, and the set it replaced with the
/// end of that one's grace; for a registry entry, its resolver record too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolImage {
    pub image_ref: String,
    pub image_source: ImageSource,
    pub expected_image_ids: Vec<ImageDigest>,
    pub previous_image_ids: Vec<ImageDigest>,
    pub previous_valid_until: Option<Millis>,
    pub drift_grace_s: i64,
    pub absent_ok: bool,
    /// The digest its ref last resolved to (registry entries), `None` before the first
    /// success or after its operator named a set.
    pub resolved_digest: Option<ImageDigest>,
    /// The config digest of the service's platform in that resolution.
    pub resolved_image_id: Option<ImageDigest>,
    pub last_resolution: Option<Resolution>,
    /// Consecutive failed resolutions since the last success.
    pub resolution_failures: i64,
}

impl PoolImage {
    /// The entries `specs` make of `current` at `now`: an entry whose set changes keeps the set
    /// it replaces accepted for the spec's grace, as a pool's single image does. A registry
    /// entry given no set keeps what it resolved to; one given a set takes it until the next
    /// resolution, which then fetches everything again.
    pub fn apply(current: &[PoolImage], specs: Vec<ImageSpec>, now: Millis) -> Vec<PoolImage> {
        specs
            .into_iter()
            .map(|spec| {
                let old = current.iter().find(|c| c.image_ref == spec.image_ref);
                let registry = spec.image_source == ImageSource::Registry;
                let keep_resolved = registry && spec.expected_image_ids.is_empty();
                let (expected, previous, until) = match old {
                    Some(old) if keep_resolved => (
                        old.expected_image_ids.clone(),
                        old.previous_image_ids.clone(),
                        old.previous_valid_until,
                    ),
                    _ => roll_sets(
                        old.map_or(&[][..], |o| &o.expected_image_ids),
                        old.map_or(&[][..], |o| &o.previous_image_ids),
                        old.and_then(|o| o.previous_valid_until),
                        spec.expected_image_ids,
                        spec.drift_grace_s,
                        now,
                    ),
                };
                // The resolver record of the same registry entry carries on; any other
                // starts afresh.
                let was_registry = old.filter(|o| registry && o.is_registry());
                let (resolved_digest, resolved_image_id) = match was_registry {
                    Some(o) if keep_resolved => {
                        (o.resolved_digest.clone(), o.resolved_image_id.clone())
                    }
                    _ => (None, None),
                };
                PoolImage {
                    image_ref: spec.image_ref,
                    image_source: spec.image_source,
                    expected_image_ids: expected,
                    previous_image_ids: previous,
                    previous_valid_until: until,
                    drift_grace_s: spec.drift_grace_s,
                    absent_ok: spec.absent_ok,
                    resolved_digest,
                    resolved_image_id,
                    last_resolution: was_registry.and_then(|o| o.last_resolution.clone()),
                    resolution_failures: was_registry.map_or(0, |o| o.resolution_failures),
                }
            })
            .collect()
    }

    pub fn is_registry(&self) -> bool {
        self.image_source == ImageSource::Registry
    }

    /// Whether it has a set to judge with (a registry entry has none until it first resolves).
    pub fn is_resolved(&self) -> bool {
        !self.expected_image_ids.is_empty()
    }

    /// The entry after a resolution of its ref came to `outcome` at `now`, as a registry
    /// pool's single image takes one (`Pool::apply_resolution`): a new set rolls with the
    /// entry's grace, a failure keeps every set and is counted. `None` when it does not apply
    /// (not a registry entry, or an `Unchanged` about another digest).
    pub fn apply_resolution(&self, outcome: &ResolutionOutcome, now: Millis) -> Option<PoolImage> {
        if !self.is_registry() {
            return None;
        }
        let mut next = self.clone();
        let succeeded = Some(Resolution {
            at: now,
            ok: true,
            error: None,
        });
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
                next.expected_image_ids = expected;
                next.previous_image_ids = previous;
                next.previous_valid_until = until;
                next.resolved_digest = Some(image.digest.clone());
                next.resolved_image_id = image.image_id.clone();
                next.resolution_failures = 0;
                next.last_resolution = succeeded;
            }
            ResolutionOutcome::Unchanged { digest } => {
                if self.resolved_digest.as_ref() != Some(digest) {
                    return None;
                }
                next.resolution_failures = 0;
                next.last_resolution = succeeded;
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

    fn is_current(&self, image: &AttestedImage) -> bool {
        [&image.id, &image.digest]
            .into_iter()
            .flatten()
            .any(|d| self.expected_image_ids.contains(d))
    }

    fn accepts(&self, image: &AttestedImage, now: Millis) -> bool {
        let in_grace = self.previous_valid_until.is_some_and(|until| now < until);
        self.is_current(image)
            || (in_grace
                && [&image.id, &image.digest]
                    .into_iter()
                    .flatten()
                    .any(|d| self.previous_image_ids.contains(d)))
    }

    /// The entry as its JSON column keeps it.
    pub fn record(&self) -> PoolImageRecord {
        PoolImageRecord {
            image_ref: self.image_ref.clone(),
            image_source: self.image_source,
            expected_image_ids: self.expected_image_ids.clone(),
            previous_image_ids: self.previous_image_ids.clone(),
            previous_valid_until_ms: self.previous_valid_until.map(|m| m.0),
            drift_grace_s: self.drift_grace_s,
            absent_ok: self.absent_ok,
            resolved_digest: self.resolved_digest.clone(),
            resolved_image_id: self.resolved_image_id.clone(),
            last_resolution: self.last_resolution.as_ref().map(|r| ResolutionRecord {
                at_ms: r.at.0,
                ok: r.ok,
                error: r.error.clone(),
            }),
            resolution_failures: self.resolution_failures,
        }
    }

    pub fn from_record(r: PoolImageRecord) -> PoolImage {
        PoolImage {
            image_ref: r.image_ref,
            image_source: r.image_source,
            expected_image_ids: r.expected_image_ids,
            previous_image_ids: r.previous_image_ids,
            previous_valid_until: r.previous_valid_until_ms.map(Millis),
            drift_grace_s: r.drift_grace_s,
            absent_ok: r.absent_ok,
            resolved_digest: r.resolved_digest,
            resolved_image_id: r.resolved_image_id,
            last_resolution: r.last_resolution.map(|l| Resolution {
                at: Millis(l.at_ms),
                ok: l.ok,
                error: l.error,
            }),
            resolution_failures: r.resolution_failures,
        }
    }
}

/// A pool's image entry in storage (instants as milliseconds). What entries written before
/// registry entries existed lack reads as a manual entry's.
#[derive(Serialize, Deserialize)]
pub struct PoolImageRecord {
    #[serde(rename = "ref")]
    pub image_ref: String,
    #[serde(default)]
    pub image_source: ImageSource,
    pub expected_image_ids: Vec<ImageDigest>,
    pub previous_image_ids: Vec<ImageDigest>,
    pub previous_valid_until_ms: Option<i64>,
    pub drift_grace_s: i64,
    pub absent_ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_digest: Option<ImageDigest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_image_id: Option<ImageDigest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_resolution: Option<ResolutionRecord>,
    #[serde(default)]
    pub resolution_failures: i64,
}

/// An entry's last resolution in storage.
#[derive(Serialize, Deserialize)]
pub struct ResolutionRecord {
    pub at_ms: i64,
    pub ok: bool,
    #[serde(default)]
    pub error: Option<String>,
}

/// Why one attested image is not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The pool does not describe its ref, and refuses what it does not describe.
    Undescribed,
    /// Its entry takes its set from its registry and has not resolved yet: nothing to judge
    /// with (`pool_image_unresolved`, as a registry pool that never resolved).
    Unresolved,
    /// Not on the runner, and the pool's entry does not allow that.
    Absent,
    /// Neither its id nor its digest is accepted.
    Drifted {
        running: ImageDigest,
        expected: Vec<ImageDigest>,
    },
}

/// The first attested image a pool does not accept, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRefusal {
    pub image: AttestedImage,
    pub problem: Problem,
}

impl ImageRefusal {
    pub fn detail(&self) -> String {
        let named = format!("image {}{}", self.image.image_ref, self.image.labels_said());
        match &self.problem {
            Problem::Undescribed => {
                format!("{named} is not one its pool describes (undescribed_images: refuse)")
            }
            Problem::Unresolved => format!(
                "{named} has no accepted set yet: its pool's entry has not resolved from its registry"
            ),
            Problem::Absent => format!(
                "{named} is not present on the runner, and its pool does not accept it absent"
            ),
            Problem::Drifted { running, expected } => {
                let expected: Vec<&str> = expected.iter().map(|d| d.as_str()).collect();
                format!(
                    "{named} runs {running} but its pool expects {}",
                    expected.join(" or ")
                )
            }
        }
    }
}

/// Each attested image against the pool's entry for its ref; the first not accepted decides.
pub fn judge(
    attested: &[AttestedImage],
    described: &[PoolImage],
    undescribed: Undescribed,
    now: Millis,
) -> Result<(), Box<ImageRefusal>> {
    for image in attested {
        let refuse = |problem| {
            Err(Box::new(ImageRefusal {
                image: image.clone(),
                problem,
            }))
        };
        let Some(entry) = described.iter().find(|d| d.image_ref == image.image_ref) else {
            if undescribed == Undescribed::Refuse {
                return refuse(Problem::Undescribed);
            }
            continue;
        };
        if !entry.is_resolved() {
            return refuse(Problem::Unresolved);
        }
        match (&image.id, image.absent) {
            (_, true) if entry.absent_ok => {}
            (None, _) if image.digest.is_none() => {
                if !entry.absent_ok {
                    return refuse(Problem::Absent);
                }
            }
            _ if entry.accepts(image, now) => {}
            _ => {
                let running = image
                    .id
                    .clone()
                    .or_else(|| image.digest.clone())
                    .expect("an image with neither id nor digest is absent");
                return refuse(Problem::Drifted {
                    running,
                    expected: entry.expected_image_ids.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The described refs among `attested` whose image is not the entry's current one (absent
/// ones too, unless the entry accepts them absent): what a recycle must pull. An entry with
/// no set yet (a registry entry that never resolved) has nothing to pull.
pub fn to_pull(attested: &[AttestedImage], described: &[PoolImage]) -> Vec<String> {
    let mut refs: Vec<String> = attested
        .iter()
        .filter(|image| {
            described
                .iter()
                .find(|d| d.image_ref == image.image_ref && d.is_resolved())
                .is_some_and(|entry| {
                    let present = !image.absent && (image.id.is_some() || image.digest.is_some());
                    if present {
                        !entry.is_current(image)
                    } else {
                        !entry.absent_ok
                    }
                })
        })
        .map(|image| image.image_ref.clone())
        .collect();
    refs.sort();
    refs.dedup();
    refs
}

/// Whether every described image the runner attests is on its entry's current set: `None`
/// when none of them is described with a set (nothing to compare).
pub fn current(attested: &[AttestedImage], described: &[PoolImage]) -> Option<bool> {
    let compared = attested.iter().any(|image| {
        described
            .iter()
            .any(|d| d.image_ref == image.image_ref && d.is_resolved())
    });
    compared.then(|| to_pull(attested, described).is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures::digest;

    const NOW: Millis = Millis(1_800_000_000_000);

    fn spec(image_ref: &str, ids: &[char], grace: i64) -> ImageSpec {
        ImageSpec {
            image_ref: image_ref.into(),
            image_source: ImageSource::Manual,
            expected_image_ids: ids.iter().map(|c| digest(*c)).collect(),
            drift_grace_s: grace,
            absent_ok: false,
        }
    }

    fn running(image_ref: &str, id: char, labels: &[&str]) -> AttestedImage {
        AttestedImage {
            image_ref: image_ref.into(),
            id: Some(digest(id)),
            digest: None,
            labels: labels.iter().map(|l| l.to_string()).collect(),
            absent: false,
        }
    }

    fn three() -> Vec<PoolImage> {
        PoolImage::apply(
            &[],
            vec![
                spec("node:20-bookworm", &['a'], 900),
                spec("catthehacker/ubuntu:act-22.04", &['b'], 900),
                spec("postgres:16", &['c'], 60),
            ],
            NOW,
        )
    }

    #[test]
    fn one_drifted_of_three_refuses_naming_it_and_its_labels() {
        let pool = three();
        let ok = vec![
            running("node:20-bookworm", 'a', &["ubuntu-latest"]),
            running("catthehacker/ubuntu:act-22.04", 'b', &["ubuntu-22.04"]),
            running("postgres:16", 'c', &[]),
        ];
        assert_eq!(judge(&ok, &pool, Undescribed::Refuse, NOW), Ok(()));
        assert_eq!(current(&ok, &pool), Some(true));
        let mut one_off = ok.clone();
        one_off[1] = running(
            "catthehacker/ubuntu:act-22.04",
            'e',
            &["ubuntu-22.04", "ubuntu-latest-big"],
        );
        let refusal = judge(&one_off, &pool, Undescribed::Refuse, NOW).unwrap_err();
        assert_eq!(
            refusal.detail(),
            format!(
                "image catthehacker/ubuntu:act-22.04 (labels ubuntu-22.04, ubuntu-latest-big) runs {} but its pool expects {}",
                digest('e'),
                digest('b')
            )
        );
        assert_eq!(current(&one_off, &pool), Some(false));
        assert_eq!(to_pull(&one_off, &pool), ["catthehacker/ubuntu:act-22.04"]);
    }

    #[test]
    fn each_image_rolls_with_its_own_grace() {
        let before = three();
        let t1 = NOW.plus_secs(10);
        let rolled = PoolImage::apply(
            &before,
            vec![
                spec("node:20-bookworm", &['d'], 900),
                spec("catthehacker/ubuntu:act-22.04", &['b'], 900),
                spec("postgres:16", &['f'], 60),
            ],
            t1,
        );
        let old = vec![
            running("node:20-bookworm", 'a', &["ubuntu-latest"]),
            running("postgres:16", 'c', &[]),
        ];
        // Inside both graces: accepted, yet both to pull.
        assert_eq!(
            judge(&old, &rolled, Undescribed::Refuse, t1.plus_secs(59)),
            Ok(())
        );
        assert_eq!(to_pull(&old, &rolled), ["node:20-bookworm", "postgres:16"]);
        // postgres's 60 s are over, node's 900 s are not.
        let refusal = judge(&old, &rolled, Undescribed::Refuse, t1.plus_secs(60)).unwrap_err();
        assert_eq!(refusal.image.image_ref, "postgres:16");
        let node_only = &old[..1];
        assert_eq!(
            judge(node_only, &rolled, Undescribed::Refuse, t1.plus_secs(899)),
            Ok(())
        );
        assert!(judge(node_only, &rolled, Undescribed::Refuse, t1.plus_secs(900)).is_err());
        // The unchanged entry kept no previous set.
        assert_eq!(rolled[1].previous_valid_until, None);
    }

    #[test]
    fn undescribed_refs_refuse_or_are_ignored_and_absent_ones_as_the_entry_says() {
        let pool = three();
        let stray = vec![running("alpine:3", 'a', &["tiny"])];
        let refusal = judge(&stray, &pool, Undescribed::Refuse, NOW).unwrap_err();
        assert_eq!(
            refusal.detail(),
            "image alpine:3 (label tiny) is not one its pool describes (undescribed_images: refuse)"
        );
        assert_eq!(judge(&stray, &pool, Undescribed::Ignore, NOW), Ok(()));
        assert_eq!(current(&stray, &pool), None);

        let absent = vec![AttestedImage {
            image_ref: "postgres:16".into(),
            id: None,
            digest: None,
            labels: vec![],
            absent: true,
        }];
        let refusal = judge(&absent, &pool, Undescribed::Refuse, NOW).unwrap_err();
        assert_eq!(refusal.problem, Problem::Absent);
        assert!(refusal.detail().contains("is not present on the runner"));
        assert_eq!(to_pull(&absent, &pool), ["postgres:16"]);
        let mut force_pull = spec("postgres:16", &['c'], 60);
        force_pull.absent_ok = true;
        let lenient = PoolImage::apply(&[], vec![force_pull], NOW);
        assert_eq!(judge(&absent, &lenient, Undescribed::Refuse, NOW), Ok(()));
        assert!(to_pull(&absent, &lenient).is_empty());
        // Present, it is judged all the same.
        let drifted = vec![running("postgres:16", 'e', &[])];
        assert!(judge(&drifted, &lenient, Undescribed::Refuse, NOW).is_err());
    }

    #[test]
    fn a_digest_alone_is_judged_and_records_round_trip() {
        let pool = three();
        let by_digest = vec![AttestedImage {
            image_ref: "postgres:16".into(),
            id: Some(digest('e')),
            digest: Some(digest('c')),
            labels: vec![],
            absent: false,
        }];
        assert_eq!(judge(&by_digest, &pool, Undescribed::Refuse, NOW), Ok(()));
        let rolled = PoolImage::apply(&pool, vec![spec("postgres:16", &['f'], 60)], NOW);
        let back: Vec<PoolImage> = rolled
            .iter()
            .map(|p| {
                let json = serde_json::to_string(&p.record()).unwrap();
                PoolImage::from_record(serde_json::from_str(&json).unwrap())
            })
            .collect();
        assert_eq!(back, rolled);
    }

    fn registry_spec(image_ref: &str, grace: i64) -> ImageSpec {
        ImageSpec {
            image_source: ImageSource::Registry,
            ..spec(image_ref, &[], grace)
        }
    }

    fn resolved(top: char, config: char) -> ResolutionOutcome {
        ResolutionOutcome::Resolved(super::super::image_set::ResolvedImage {
            digest: digest(top),
            image_id: Some(digest(config)),
            accepted: vec![digest(top), digest(config)],
        })
    }

    #[test]
    fn a_registry_entry_judges_nothing_until_it_resolves_then_rolls_and_keeps_its_last_good_set() {
        let fresh = PoolImage::apply(&[], vec![registry_spec("reg.test/node:20", 60)], NOW);
        let on_a = vec![running("reg.test/node:20", 'b', &["ubuntu-latest"])];
        let refusal = judge(&on_a, &fresh, Undescribed::Refuse, NOW).unwrap_err();
        assert_eq!(refusal.problem, Problem::Unresolved);
        assert!(
            refusal.detail().contains("has not resolved"),
            "{}",
            refusal.detail()
        );
        assert_eq!(current(&on_a, &fresh), None, "nothing to compare yet");
        assert!(to_pull(&on_a, &fresh).is_empty());

        let first = fresh[0].apply_resolution(&resolved('a', 'b'), NOW).unwrap();
        assert_eq!(first.expected_image_ids, [digest('a'), digest('b')]);
        assert_eq!(first.resolved_image_id, Some(digest('b')));
        let pool = vec![first.clone()];
        assert_eq!(judge(&on_a, &pool, Undescribed::Refuse, NOW), Ok(()));

        // A PUT that names no set keeps what it resolved to.
        let again = PoolImage::apply(&pool, vec![registry_spec("reg.test/node:20", 60)], NOW);
        assert_eq!(again, pool);

        // The tag moves: the old set is accepted for the entry's grace.
        let t1 = NOW.plus_secs(5);
        let moved = first.apply_resolution(&resolved('c', 'd'), t1).unwrap();
        assert_eq!(moved.previous_valid_until, Some(t1.plus_secs(60)));
        let pool = vec![moved.clone()];
        assert_eq!(judge(&on_a, &pool, Undescribed::Refuse, t1), Ok(()));
        assert_eq!(to_pull(&on_a, &pool), ["reg.test/node:20"]);
        assert!(judge(&on_a, &pool, Undescribed::Refuse, t1.plus_secs(60)).is_err());

        // Failures keep the sets and are counted; an Unchanged about another digest is stale.
        let failed = moved
            .apply_resolution(
                &ResolutionOutcome::Failed {
                    error: "cannot reach".into(),
                },
                t1,
            )
            .unwrap();
        assert_eq!(failed.expected_image_ids, moved.expected_image_ids);
        assert_eq!(failed.resolution_failures, 1);
        assert_eq!(
            failed.apply_resolution(
                &ResolutionOutcome::Unchanged {
                    digest: digest('a')
                },
                t1
            ),
            None
        );
        let back = failed
            .apply_resolution(
                &ResolutionOutcome::Unchanged {
                    digest: digest('c'),
                },
                t1,
            )
            .unwrap();
        assert_eq!(back.resolution_failures, 0);
        // A manual entry takes no resolution; the record keeps everything.
        assert_eq!(three()[0].apply_resolution(&resolved('a', 'b'), NOW), None);
        let json = serde_json::to_string(&failed.record()).unwrap();
        assert_eq!(
            PoolImage::from_record(serde_json::from_str(&json).unwrap()),
            failed
        );
        // An entry stored before registry entries existed reads as manual.
        let old = r#"{"ref":"x","expected_image_ids":[],"previous_image_ids":[],"previous_valid_until_ms":null,"drift_grace_s":9,"absent_ok":false}"#;
        let old = PoolImage::from_record(serde_json::from_str(old).unwrap());
        assert_eq!(old.image_source, ImageSource::Manual);
    }
}

//! Rules 7–14 of PROTOCOL.md: may this runner lease now?
//!
//! `judge` is a pure function of what the runner attested, the runner's gate state, its pool and
//! `now`. The lease, the heartbeat, `gate/check` and the admin views all call it, so a runner's
//! status means the same everywhere.

use super::attestation::{Probe, RunningImage};
use super::digest::ImageDigest;
use super::ejection::Ejection;
use super::images::{self, AttestedImage, ImageRefusal, Problem};
use super::pool::{ImagePolicy, Pool};
use super::status::RunnerStatus;
use super::time::Millis;

/// The facts of one attestation that the verdict looks at; also what is kept as "latest".
#[derive(Clone, Debug, PartialEq)]
pub struct AttestedState {
    pub probe: Probe,
    pub image: RunningImage,
    /// The images it may run (`images`); empty from a runner that attests one `image`.
    pub images: Vec<AttestedImage>,
}

impl AttestedState {
    /// The images judged against a pool's `images`: the `images` claim, or, from a runner
    /// that attests only `image` (an older agent), that one when it names its ref.
    pub fn judged_images(&self) -> Vec<AttestedImage> {
        if !self.images.is_empty() {
            return self.images.clone();
        }
        let i = &self.image;
        match &i.image_ref {
            Some(r) if i.id.is_some() || i.digest.is_some() => vec![AttestedImage {
                image_ref: r.clone(),
                id: i.id.clone(),
                digest: i.digest.clone(),
                labels: Vec::new(),
                absent: false,
            }],
            _ => Vec::new(),
        }
    }
}

/// The operator- and lease-controlled parts of a runner that gate it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GateState {
    pub cordoned: bool,
    /// Set by an abandoned lease; lifted by a passing probe checked after it.
    pub quarantined_at: Option<Millis>,
    /// Set by infrastructure failures in a row (`domain::ejection`); lifted once its time has
    /// passed by a passing probe checked after it, or by an operator.
    pub ejection: Option<Ejection>,
}

impl GateState {
    /// Whether `probe` lifts the quarantine: a passing probe checked after it was set. The
    /// verdict stops refusing on it and the round that records the probe clears it
    /// (`domain::record`), by this one rule.
    pub fn quarantine_lifted_by(&self, probe: &Probe) -> bool {
        self.quarantined_at
            .is_some_and(|at| probe.ok && at < probe.checked_at)
    }
}

/// Why a runner may not lease now. Each maps to one stable `code`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    Cordoned,
    ProbeFailed {
        runtime: String,
        error: String,
    },
    ProbeStale {
        age_s: i64,
        max_age_s: i64,
    },
    PoolImageUnresolved {
        pool: String,
    },
    ImageUnreported,
    ImageDrift {
        running: String,
        expected: Vec<ImageDigest>,
    },
    /// One of its several images is not accepted (`domain::images`).
    ImageNotAccepted(Box<ImageRefusal>),
    Quarantined,
    Ejected(Ejection),
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Cordoned => "runner_cordoned",
            Refusal::ProbeFailed { .. } => "probe_failed",
            Refusal::ProbeStale { .. } => "probe_stale",
            Refusal::PoolImageUnresolved { .. } => "pool_image_unresolved",
            Refusal::ImageUnreported => "image_unreported",
            Refusal::ImageNotAccepted(r) if r.problem == Problem::Unresolved => {
                "pool_image_unresolved"
            }
            Refusal::ImageDrift { .. } | Refusal::ImageNotAccepted(_) => "image_drift",
            Refusal::Quarantined => "runner_quarantined",
            Refusal::Ejected(_) => "runner_ejected",
        }
    }

    /// For people; for a failed probe it quotes the runtime's own words.
    pub fn detail(&self) -> String {
        match self {
            Refusal::Cordoned => "the runner is cordoned by an operator".into(),
            Refusal::ProbeFailed { runtime, error } => {
                format!("cannot run a container with {runtime}: {error}")
            }
            Refusal::ProbeStale { age_s, max_age_s } => format!(
                "the runner's last container-runtime probe is {age_s} s old (at most {max_age_s} s allowed)"
            ),
            Refusal::PoolImageUnresolved { pool } => {
                format!("pool {pool} enforces its image but has no expected image yet")
            }
            Refusal::ImageUnreported => {
                "the pool enforces its image but the attestation carries no image.id".into()
            }
            Refusal::ImageDrift { running, expected } => {
                let expected: Vec<&str> = expected.iter().map(|d| d.as_str()).collect();
                format!(
                    "the runner runs {running} but its pool expects {}",
                    expected.join(" or ")
                )
            }
            Refusal::ImageNotAccepted(r) => r.detail(),
            Refusal::Quarantined => {
                "the runner abandoned a lease and must post a passing probe newer than the abandon"
                    .into()
            }
            Refusal::Ejected(e) => e.detail(),
        }
    }

    /// The runner status that this refusal stands for.
    pub fn status(&self) -> RunnerStatus {
        match self {
            Refusal::Cordoned => RunnerStatus::Cordoned,
            Refusal::ProbeFailed { .. } => RunnerStatus::ProbeFailed,
            Refusal::ProbeStale { .. } => RunnerStatus::ProbeStale,
            Refusal::PoolImageUnresolved { .. } => RunnerStatus::PoolImageUnresolved,
            Refusal::ImageUnreported => RunnerStatus::ImageUnreported,
            Refusal::ImageNotAccepted(r) if r.problem == Problem::Unresolved => {
                RunnerStatus::PoolImageUnresolved
            }
            Refusal::ImageDrift { .. } | Refusal::ImageNotAccepted(_) => RunnerStatus::Drifted,
            Refusal::Quarantined => RunnerStatus::Quarantined,
            Refusal::Ejected(_) => RunnerStatus::Ejected,
        }
    }

    /// How long a refused runner should wait before it asks again.
    pub fn retry_after_s(&self, heartbeat_interval_s: i64) -> i64 {
        match self {
            Refusal::Cordoned | Refusal::PoolImageUnresolved { .. } => 60,
            Refusal::ImageNotAccepted(r) if r.problem == Problem::Unresolved => 60,
            _ => heartbeat_interval_s.max(1),
        }
    }
}

/// Rules 7–14, in order; the first that applies decides.
pub fn judge(
    attested: &AttestedState,
    gate: GateState,
    pool: &Pool,
    now: Millis,
    probe_max_age_s: i64,
) -> Result<(), Refusal> {
    let probe = &attested.probe;
    if gate.cordoned {
        return Err(Refusal::Cordoned);
    }
    if !probe.ok {
        return Err(Refusal::ProbeFailed {
            runtime: probe.runtime.clone(),
            error: probe.error.clone().unwrap_or_default(),
        });
    }
    let age_ms = now.0 - probe.checked_at.0;
    if age_ms > probe_max_age_s * 1000 {
        return Err(Refusal::ProbeStale {
            age_s: age_ms / 1000,
            max_age_s: probe_max_age_s,
        });
    }
    if pool.image_policy == ImagePolicy::Enforce && pool.judges_single_image() {
        if !pool.is_resolved() {
            return Err(Refusal::PoolImageUnresolved {
                pool: pool.name.to_string(),
            });
        }
        let Some(id) = &attested.image.id else {
            return Err(Refusal::ImageUnreported);
        };
        let accepted = pool.accepts(id, now)
            || attested
                .image
                .digest
                .as_ref()
                .is_some_and(|d| pool.accepts(d, now));
        if !accepted {
            return Err(Refusal::ImageDrift {
                running: id.to_string(),
                expected: pool.expected_image_ids.clone(),
            });
        }
    }
    // Rule 12 for each of several images, against the pool's entry for its ref.
    if pool.image_policy == ImagePolicy::Enforce && !pool.images.is_empty() {
        let attested_images = attested.judged_images();
        if attested_images.is_empty() && !pool.judges_single_image() {
            return Err(Refusal::ImageUnreported);
        }
        images::judge(&attested_images, &pool.images, pool.undescribed_images, now)
            .map_err(Refusal::ImageNotAccepted)?;
    }
    if gate.quarantined_at.is_some() && !gate.quarantine_lifted_by(probe) {
        return Err(Refusal::Quarantined);
    }
    if let Some(e) = gate.ejection
        && e.refuses(probe.checked_at, now)
    {
        return Err(Refusal::Ejected(e));
    }
    Ok(())
}

/// Whether the runner's image is in its pool's *current* set: `None` when there is nothing to
/// compare (policy `off`, pool unresolved, no image reported). A runner is drifted whenever this
/// is `Some(false)`, even while the lease still allows it (grace, or `report`).
pub fn image_current(image: &RunningImage, pool: &Pool) -> Option<bool> {
    if pool.image_policy == ImagePolicy::Off || !pool.is_resolved() || !pool.judges_single_image() {
        return None;
    }
    if image.id.is_none() && image.digest.is_none() {
        return None;
    }
    let current = image.id.as_ref().is_some_and(|d| pool.is_current(d))
        || image.digest.as_ref().is_some_and(|d| pool.is_current(d));
    Some(current)
}

/// `image_current` over everything the runner attests: its single image, and its several
/// against the pool's `images` (`None` when neither can be compared; `Some(false)` when any
/// is off its current set).
pub fn state_current(state: &AttestedState, pool: &Pool) -> Option<bool> {
    let single = image_current(&state.image, pool);
    let several = if pool.image_policy == ImagePolicy::Off {
        None
    } else {
        images::current(&state.judged_images(), &pool.images)
    };
    match (single, several) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (None, None) => None,
        _ => Some(true),
    }
}

/// The refs a recycle must pull: the pool's described images the runner attests off their
/// current set (or absent where that is not accepted); empty under policy `off`.
pub fn refs_to_pull(state: &AttestedState, pool: &Pool) -> Vec<String> {
    if pool.image_policy == ImagePolicy::Off {
        return Vec::new();
    }
    images::to_pull(&state.judged_images(), &pool.images)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::image_set::ImageSource;
    use crate::domain::images::{ImageSpec, Undescribed};
    use crate::domain::pool::PoolSpec;
    use crate::domain::pool_name::PoolName;

    use crate::domain::fixtures::digest;

    const NOW: Millis = Millis(1_800_000_000_000);

    fn pool(policy: ImagePolicy, images: Vec<ImageDigest>) -> Pool {
        let spec = PoolSpec {
            gate_mode: Default::default(),
            image_ref: Some("ci/runner:stable".into()),
            expected_image_ids: images,
            image_policy: policy,
            image_source: ImageSource::Manual,
            drift_grace_s: 900,
            resolve_interval_s: 300,
            github: None,
            disk_warning: None,
            ejection: Default::default(),
            images: Vec::new(),
            undescribed_images: Default::default(),
        };
        Pool::apply(
            PoolName::parse("p").unwrap(),
            None,
            spec,
            NOW.minus_secs(3600),
        )
    }

    fn healthy() -> AttestedState {
        AttestedState {
            probe: Probe {
                ok: true,
                runtime: "podman".into(),
                runtime_version: Some("4.3.1".into()),
                checked_at: NOW.minus_secs(10),
                error: None,
                exit_code: None,
                disk: Vec::new(),
            },
            image: RunningImage {
                id: Some(digest('a')),
                digest: None,
                image_ref: None,
            },
            images: Vec::new(),
        }
    }

    fn code(r: Result<(), Refusal>) -> &'static str {
        r.err().map_or("ok", |r| r.code())
    }

    #[test]
    fn a_healthy_runner_on_the_expected_image_may_lease() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        assert_eq!(
            code(judge(&healthy(), GateState::default(), &p, NOW, 300)),
            "ok"
        );
    }

    #[test]
    fn cordon_comes_first() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let mut a = healthy();
        a.probe.ok = false;
        a.probe.error = Some("x".into());
        let gate = GateState {
            cordoned: true,
            ..GateState::default()
        };
        assert_eq!(code(judge(&a, gate, &p, NOW, 300)), "runner_cordoned");
    }

    #[test]
    fn failed_probe_quotes_the_runtime() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let mut a = healthy();
        a.probe.ok = false;
        a.probe.error = Some("default OCI runtime \"crun\" not found: invalid argument".into());
        let refusal = judge(&a, GateState::default(), &p, NOW, 300).unwrap_err();
        assert_eq!(refusal.code(), "probe_failed");
        assert_eq!(
            refusal.detail(),
            "cannot run a container with podman: default OCI runtime \"crun\" not found: invalid argument"
        );
        assert_eq!(refusal.status(), RunnerStatus::ProbeFailed);
    }

    #[test]
    fn old_probe_is_stale() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let mut a = healthy();
        a.probe.checked_at = NOW.minus_secs(301);
        assert_eq!(
            code(judge(&a, GateState::default(), &p, NOW, 300)),
            "probe_stale"
        );
        a.probe.checked_at = NOW.minus_secs(300);
        assert_eq!(code(judge(&a, GateState::default(), &p, NOW, 300)), "ok");
    }

    #[test]
    fn enforce_needs_a_resolved_pool_and_a_reported_image() {
        let mut unresolved = pool(ImagePolicy::Enforce, vec![digest('a')]);
        unresolved.expected_image_ids.clear();
        assert_eq!(
            code(judge(
                &healthy(),
                GateState::default(),
                &unresolved,
                NOW,
                300
            )),
            "pool_image_unresolved"
        );
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let mut a = healthy();
        a.image.id = None;
        a.image.digest = Some(digest('a'));
        assert_eq!(
            code(judge(&a, GateState::default(), &p, NOW, 300)),
            "image_unreported"
        );
    }

    #[test]
    fn drift_is_refused_under_enforce_only() {
        let mut a = healthy();
        a.image.id = Some(digest('b'));
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let refusal = judge(&a, GateState::default(), &p, NOW, 300).unwrap_err();
        assert_eq!(refusal.code(), "image_drift");
        assert!(refusal.detail().contains(digest('b').as_str()));
        assert!(refusal.detail().contains(digest('a').as_str()));
        for policy in [ImagePolicy::Report, ImagePolicy::Off] {
            let p = pool(policy, vec![digest('a')]);
            assert_eq!(code(judge(&a, GateState::default(), &p, NOW, 300)), "ok");
        }
        let mut unreported = healthy();
        unreported.image.id = None;
        let off = pool(ImagePolicy::Off, vec![]);
        assert_eq!(
            code(judge(&unreported, GateState::default(), &off, NOW, 300)),
            "ok"
        );
    }

    #[test]
    fn either_id_or_digest_matching_is_enough() {
        let p = pool(ImagePolicy::Enforce, vec![digest('d')]);
        let mut a = healthy();
        a.image.id = Some(digest('c'));
        a.image.digest = Some(digest('d'));
        assert_eq!(code(judge(&a, GateState::default(), &p, NOW, 300)), "ok");
    }

    #[test]
    fn previous_image_is_accepted_inside_the_grace_but_not_current() {
        let first = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let spec = PoolSpec {
            gate_mode: Default::default(),
            image_ref: first.image_ref.clone(),
            expected_image_ids: vec![digest('b')],
            image_policy: ImagePolicy::Enforce,
            image_source: ImageSource::Manual,
            drift_grace_s: 900,
            resolve_interval_s: 300,
            github: None,
            disk_warning: None,
            ejection: Default::default(),
            images: Vec::new(),
            undescribed_images: Default::default(),
        };
        let rolled = Pool::apply(first.name.clone(), Some(&first), spec, NOW);
        let on_a = healthy();
        assert_eq!(
            code(judge(
                &on_a,
                GateState::default(),
                &rolled,
                NOW.plus_secs(60),
                300
            )),
            "ok"
        );
        assert_eq!(image_current(&on_a.image, &rolled), Some(false));
        let mut later = on_a.clone();
        later.probe.checked_at = NOW.plus_secs(900);
        assert_eq!(
            code(judge(
                &later,
                GateState::default(),
                &rolled,
                NOW.plus_secs(901),
                300
            )),
            "image_drift"
        );
    }

    #[test]
    fn quarantine_holds_until_a_newer_passing_probe() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let a = healthy();
        let before = GateState {
            cordoned: false,
            quarantined_at: Some(a.probe.checked_at),
            ejection: None,
        };
        assert_eq!(code(judge(&a, before, &p, NOW, 300)), "runner_quarantined");
        let after = GateState {
            cordoned: false,
            quarantined_at: Some(a.probe.checked_at.minus_secs(1)),
            ejection: None,
        };
        assert_eq!(code(judge(&a, after, &p, NOW, 300)), "ok");
        assert!(!before.quarantine_lifted_by(&a.probe) && after.quarantine_lifted_by(&a.probe));
    }

    #[test]
    fn drift_outranks_quarantine() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let mut a = healthy();
        a.image.id = Some(digest('e'));
        let gate = GateState {
            cordoned: false,
            quarantined_at: Some(NOW),
            ejection: None,
        };
        assert_eq!(code(judge(&a, gate, &p, NOW, 300)), "image_drift");
    }

    fn with_images(policy: ImagePolicy, undescribed: Undescribed) -> Pool {
        let spec = PoolSpec {
            gate_mode: Default::default(),
            image_ref: None,
            expected_image_ids: vec![],
            image_policy: policy,
            image_source: ImageSource::Manual,
            drift_grace_s: 900,
            resolve_interval_s: 300,
            github: None,
            disk_warning: None,
            ejection: Default::default(),
            images: ["node:20", "postgres:16", "redis:7"]
                .iter()
                .zip(['a', 'b', 'c'])
                .map(|(r, c)| ImageSpec {
                    image_ref: r.to_string(),
                    image_source: ImageSource::Manual,
                    expected_image_ids: vec![digest(c)],
                    drift_grace_s: 900,
                    absent_ok: false,
                })
                .collect(),
            undescribed_images: undescribed,
        };
        spec.validate().unwrap();
        Pool::apply(PoolName::parse("p").unwrap(), None, spec, NOW)
    }

    fn on(images: &[(&str, char, &str)]) -> AttestedState {
        let mut a = healthy();
        a.images = images
            .iter()
            .map(|(r, c, label)| AttestedImage {
                image_ref: r.to_string(),
                id: Some(digest(*c)),
                digest: None,
                labels: vec![label.to_string()],
                absent: false,
            })
            .collect();
        a
    }

    #[test]
    fn several_images_are_judged_each_against_its_entry() {
        let p = with_images(ImagePolicy::Enforce, Undescribed::Refuse);
        let good = on(&[
            ("node:20", 'a', "ubuntu-latest"),
            ("postgres:16", 'b', "db"),
            ("redis:7", 'c', "cache"),
        ]);
        assert_eq!(code(judge(&good, GateState::default(), &p, NOW, 300)), "ok");
        assert_eq!(state_current(&good, &p), Some(true));
        let one_off = on(&[
            ("node:20", 'a', "ubuntu-latest"),
            ("postgres:16", 'e', "db"),
            ("redis:7", 'c', "cache"),
        ]);
        let refusal = judge(&one_off, GateState::default(), &p, NOW, 300).unwrap_err();
        assert_eq!(refusal.code(), "image_drift");
        assert_eq!(refusal.status(), RunnerStatus::Drifted);
        assert!(
            refusal
                .detail()
                .starts_with("image postgres:16 (label db) runs "),
            "{}",
            refusal.detail()
        );
        assert_eq!(state_current(&one_off, &p), Some(false));
        assert_eq!(refs_to_pull(&one_off, &p), ["postgres:16"]);
        // report never refuses but still says what to pull; off ignores every image.
        let report = with_images(ImagePolicy::Report, Undescribed::Refuse);
        assert_eq!(
            code(judge(&one_off, GateState::default(), &report, NOW, 300)),
            "ok"
        );
        assert_eq!(refs_to_pull(&one_off, &report), ["postgres:16"]);
        let off = with_images(ImagePolicy::Off, Undescribed::Refuse);
        assert_eq!(
            code(judge(&one_off, GateState::default(), &off, NOW, 300)),
            "ok"
        );
        assert_eq!(state_current(&one_off, &off), None);
        assert!(refs_to_pull(&one_off, &off).is_empty());
        // Nothing attested with a ref: unreported.
        let mut none = healthy();
        none.image.image_ref = None;
        assert_eq!(
            code(judge(&none, GateState::default(), &p, NOW, 300)),
            "image_unreported"
        );
    }

    #[test]
    fn an_older_agents_single_image_is_judged_by_its_ref_and_a_pool_without_images_as_before() {
        let p = with_images(ImagePolicy::Enforce, Undescribed::Refuse);
        let mut old = healthy();
        old.image.image_ref = Some("node:20".into());
        assert_eq!(code(judge(&old, GateState::default(), &p, NOW, 300)), "ok");
        old.image.image_ref = Some("node:18".into());
        assert_eq!(
            code(judge(&old, GateState::default(), &p, NOW, 300)),
            "image_drift"
        );
        let lenient = with_images(ImagePolicy::Enforce, Undescribed::Ignore);
        assert_eq!(
            code(judge(&old, GateState::default(), &lenient, NOW, 300)),
            "ok"
        );
        // A pool that describes no images ignores `images` and judges `image` as it always did.
        let single = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let new_agent = on(&[("alpine:3", 'f', "tiny")]);
        assert_eq!(
            code(judge(&new_agent, GateState::default(), &single, NOW, 300)),
            "ok"
        );
        assert_eq!(state_current(&new_agent, &single), Some(true));
    }

    #[test]
    fn an_ejected_runner_is_refused_until_its_time_and_a_newer_passing_probe() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let mut failures = crate::domain::ejection::Tally::default();
        failures.add(crate::domain::ejection::FailureReason::Errored);
        let gate = GateState {
            ejection: Some(Ejection {
                at: NOW.minus_secs(400),
                until: NOW.minus_secs(100),
                failures,
                nth: 1,
            }),
            ..GateState::default()
        };
        let mut a = healthy();
        a.probe.checked_at = NOW.minus_secs(101);
        let refusal = judge(&a, gate, &p, NOW, 300).unwrap_err();
        assert_eq!(refusal.code(), "runner_ejected");
        assert_eq!(refusal.status(), RunnerStatus::Ejected);
        assert!(
            refusal.detail().contains("errored ×1"),
            "{}",
            refusal.detail()
        );
        a.probe.checked_at = NOW.minus_secs(99);
        assert_eq!(code(judge(&a, gate, &p, NOW, 300)), "ok");
        assert_eq!(
            code(judge(&a, gate, &p, NOW.minus_secs(200), 300)),
            "runner_ejected",
            "the time has not passed"
        );
    }

    #[test]
    fn image_current_is_unknown_without_something_to_compare() {
        let a = healthy();
        assert_eq!(
            image_current(&a.image, &pool(ImagePolicy::Off, vec![digest('a')])),
            None
        );
        let mut unresolved = pool(ImagePolicy::Report, vec![]);
        unresolved.expected_image_ids.clear();
        assert_eq!(image_current(&a.image, &unresolved), None);
        let none = RunningImage::default();
        assert_eq!(
            image_current(&none, &pool(ImagePolicy::Enforce, vec![digest('a')])),
            None
        );
        assert_eq!(
            image_current(&a.image, &pool(ImagePolicy::Report, vec![digest('a')])),
            Some(true)
        );
    }
}

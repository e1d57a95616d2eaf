//! May a forge runner fetch a job from its forge now? The forge gate's verdict on a fetch, and
//! a runner's standing for what acts on it through a forge's API (GitHub's registrations,
//! Buildkite's pauses).
//!
//! The verdict on a fetch is the lease's verdict (rules 7–13) over the runner's *latest*
//! recorded attestation, which must also be fresh: a runner whose agent stopped attesting gets
//! no work, as a lease with an old attestation would get none. Who the runner is (its forge
//! identity, its bindings) is `domain::forge`'s; this judges, over the runner, its pool and the
//! verdict.

use super::forge::Standing;
use super::pool::{GateMode, Pool};
use super::runner::Runner;
use super::time::Millis;
use super::verdict::{Refusal, judge};

/// Why a forge runner's fetch is answered "no work". Each has the code a lease would get in
/// the same state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchRefusal {
    /// Bound to no leasegate runner.
    UnknownRunner,
    Revoked,
    /// No attestation recorded, or the latest is older than an attestation may be.
    NoFreshAttestation {
        age_s: Option<i64>,
        max_age_s: i64,
    },
    /// Rules 7–13 over the latest attestation.
    Refused(Refusal),
}

impl FetchRefusal {
    /// Whether the refusal may rest on a latest attestation another replica has since
    /// replaced without announcing it (`store::verdict_cache`): one too old, or a probe too
    /// old, which a newer attestation with the same facts would not meet; or the images it
    /// claims beside the one it runs, a change of which a round does not announce (only the
    /// running image is among the facts it compares).
    pub fn may_rest_on_an_older_attestation(&self) -> bool {
        matches!(
            self,
            FetchRefusal::NoFreshAttestation { age_s: Some(_), .. }
                | FetchRefusal::Refused(Refusal::ProbeStale { .. })
                | FetchRefusal::Refused(Refusal::ImageNotAccepted(_))
        )
    }

    pub fn code(&self) -> &'static str {
        match self {
            FetchRefusal::UnknownRunner => "unknown_runner",
            FetchRefusal::Revoked => "runner_revoked",
            FetchRefusal::NoFreshAttestation { .. } => "attestation_expired",
            FetchRefusal::Refused(r) => r.code(),
        }
    }

    pub fn detail(&self) -> String {
        match self {
            FetchRefusal::UnknownRunner => {
                "this forge runner is bound to no leasegate runner".into()
            }
            FetchRefusal::Revoked => "the runner is revoked".into(),
            FetchRefusal::NoFreshAttestation { age_s: None, .. } => {
                "the runner has never attested: is its leasegate heartbeat running?".into()
            }
            FetchRefusal::NoFreshAttestation {
                age_s: Some(age),
                max_age_s,
            } => format!(
                "the runner's latest attestation is {age} s old (at most {max_age_s} s allowed): is its leasegate heartbeat running?"
            ),
            FetchRefusal::Refused(r) => r.detail(),
        }
    }
}

/// The settings a fetch is judged by.
#[derive(Clone, Copy, Debug)]
pub struct FetchRules {
    /// How old the latest attestation may be (an attestation's maximum age).
    pub attestation_max_age_s: i64,
    pub probe_max_age_s: i64,
}

/// May `runner` (in `pool`) fetch work from its forge at `now`?
pub fn judge_fetch(
    runner: &Runner,
    pool: &Pool,
    now: Millis,
    rules: FetchRules,
) -> Result<(), FetchRefusal> {
    if runner.is_revoked() {
        return Err(FetchRefusal::Revoked);
    }
    let Some(latest) = &runner.latest else {
        return Err(FetchRefusal::NoFreshAttestation {
            age_s: None,
            max_age_s: rules.attestation_max_age_s,
        });
    };
    let age_s = now.secs_since(latest.received_at);
    if age_s > rules.attestation_max_age_s {
        return Err(FetchRefusal::NoFreshAttestation {
            age_s: Some(age_s),
            max_age_s: rules.attestation_max_age_s,
        });
    }
    judge(&latest.state, runner.gate, pool, now, rules.probe_max_age_s)
        .map_err(FetchRefusal::Refused)
}

/// The standing of a runner and its pool at `now`; `None` (the runner or its pool is gone)
/// stands refused as revoked.
pub fn standing(found: Option<(&Runner, &Pool)>, now: Millis, rules: FetchRules) -> Standing {
    let Some((runner, pool)) = found else {
        return Standing::Refused {
            code: "runner_revoked".into(),
            detail: "its runner or its pool is gone".into(),
        };
    };
    match judge_fetch(runner, pool, now, rules) {
        Ok(()) => Standing::Admitted,
        Err(r) if pool.gate_mode == GateMode::Observe => Standing::Observed {
            code: r.code().into(),
            detail: r.detail(),
        },
        Err(r) => Standing::Refused {
            code: r.code().into(),
            detail: r.detail(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::attestation::{Probe, RunningImage};
    use crate::domain::digest::ImageDigest;
    use crate::domain::ids::RunnerId;
    use crate::domain::image_set::ImageSource;
    use crate::domain::pool::ImagePolicy;
    use crate::domain::pool_name::PoolName;
    use crate::domain::runner::LatestAttestation;
    use crate::domain::verdict::{AttestedState, GateState};

    const NOW: Millis = Millis(1_800_000_000_000);
    const RULES: FetchRules = FetchRules {
        attestation_max_age_s: 60,
        probe_max_age_s: 300,
    };

    fn image() -> ImageDigest {
        ImageDigest::parse(&format!("sha256:{}", "a".repeat(64))).unwrap()
    }

    fn pool() -> Pool {
        Pool {
            name: PoolName::parse("linux").unwrap(),
            image_ref: None,
            image_policy: ImagePolicy::Enforce,
            image_source: ImageSource::Manual,
            gate_mode: GateMode::Enforce,
            expected_image_ids: vec![image()],
            previous_image_ids: vec![],
            previous_valid_until: None,
            drift_grace_s: 0,
            resolve_interval_s: 300,
            github: None,
            disk_warning: None,
            ejection: Default::default(),
            images: Vec::new(),
            undescribed_images: Default::default(),
            last_resolution: None,
            resolution_failures: 0,
            resolved_digest: None,
            resolved_image_id: None,
            next_resolve_at: None,
            created_at: NOW,
            updated_at: NOW,
        }
    }

    fn runner(received_s_ago: Option<i64>, ok: bool) -> Runner {
        Runner {
            id: RunnerId("r1".into()),
            name: "r1".into(),
            pool: PoolName::parse("linux").unwrap(),
            labels: Default::default(),
            public_key_x: String::new(),
            gate: GateState::default(),
            revoked_at: None,
            registered_at: NOW,
            latest: received_s_ago.map(|s| LatestAttestation {
                received_at: NOW.minus_secs(s),
                state: AttestedState {
                    probe: Probe {
                        ok,
                        runtime: "podman".into(),
                        runtime_version: None,
                        checked_at: NOW.minus_secs(s),
                        error: (!ok).then(|| "crun not found".into()),
                        exit_code: None,
                        disk: Vec::new(),
                    },
                    image: RunningImage {
                        id: Some(image()),
                        ..Default::default()
                    },
                    images: Vec::new(),
                },
            }),
            current_lease: None,
            forge_runners: vec![],
            forge_runners_taken: vec![],
            last_rejection: None,
            agent: Default::default(),
            ejection: Default::default(),
        }
    }

    #[test]
    fn a_fetch_is_judged_as_a_lease_on_the_latest_fresh_attestation() {
        assert_eq!(
            judge_fetch(&runner(Some(10), true), &pool(), NOW, RULES),
            Ok(())
        );
        let failed = judge_fetch(&runner(Some(10), false), &pool(), NOW, RULES).unwrap_err();
        assert_eq!(failed.code(), "probe_failed");
        assert!(failed.detail().contains("crun not found"));
        let old = judge_fetch(&runner(Some(61), true), &pool(), NOW, RULES).unwrap_err();
        assert_eq!(old.code(), "attestation_expired");
        assert!(old.detail().contains("61 s old"));
        let never = judge_fetch(&runner(None, true), &pool(), NOW, RULES).unwrap_err();
        assert_eq!(never.code(), "attestation_expired");
        let mut revoked = runner(Some(1), true);
        revoked.revoked_at = Some(NOW);
        assert_eq!(
            judge_fetch(&revoked, &pool(), NOW, RULES),
            Err(FetchRefusal::Revoked)
        );
        let mut cordoned = runner(Some(1), true);
        cordoned.gate.cordoned = true;
        assert_eq!(
            judge_fetch(&cordoned, &pool(), NOW, RULES)
                .unwrap_err()
                .code(),
            "runner_cordoned"
        );
    }
}

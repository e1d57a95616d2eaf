//! The pool-level guard against mass refusal: is a pool's roll stalling?
//!
//! When a pool's expected image moves, its runners are meant to follow within the grace. If
//! more than a configured share of the pool's live runners are still on an image outside the
//! current set, they will all be refused with `image_drift` once the grace is over: the roll
//! has stalled (the runners cannot pull, the recycle never happens, the tag moved by mistake).
//! This is reported, per pool, so that an operator or a fleet roller can act before the fleet
//! stops taking work; it does not change what the lease decides.

use super::pool::{ImagePolicy, Pool};
use super::runner::{RunnerSummary, StatusRules};
use super::time::Millis;
use super::verdict::{image_current, refs_to_pull};

/// Default share of live runners on a superseded image above which a roll is stalled.
pub const DEFAULT_ROLL_STALLED_SHARE: f64 = 0.5;

/// How a pool's runners stand against its current image set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RollHealth {
    /// Runners that are not revoked and attested within the staleness window.
    pub live: usize,
    /// Live runners whose reported `image.id` (and `image.digest`) is outside the current
    /// set, or any of whose several images is off its entry's current set (or absent where
    /// that is not accepted): after the grace window they are refused with `image_drift`.
    pub drifted: usize,
    /// `drifted` is more than the configured share of `live`, in an `enforce` pool.
    pub roll_stalled: bool,
}

/// Whether `runner` counts as live for the guard at `now`.
fn is_live(runner: &RunnerSummary, now: Millis, rules: StatusRules) -> bool {
    !runner.is_revoked()
        && runner
            .latest
            .as_ref()
            .is_some_and(|l| now.0 - l.received_at.0 <= rules.stale_after_s() * 1000)
}

/// Counts `pool`'s live and drifted runners among `runners` (others' runners are ignored)
/// and decides whether its roll is stalled. Only an `enforce` pool refuses for drift, so only
/// an `enforce` pool can stall; a runner that reports no `image.id` is refused for
/// `image_unreported`, not drift, and is not counted as drifted.
pub fn roll_health(
    pool: &Pool,
    runners: &[RunnerSummary],
    now: Millis,
    rules: StatusRules,
    stalled_share: f64,
) -> RollHealth {
    let mut health = RollHealth::default();
    for runner in runners
        .iter()
        .filter(|r| r.pool == pool.name && is_live(r, now, rules))
    {
        health.live += 1;
        let state = &runner.latest.as_ref().expect("live runners attested").state;
        let single_off =
            state.image.id.is_some() && image_current(&state.image, pool) == Some(false);
        if single_off || !refs_to_pull(state, pool).is_empty() {
            health.drifted += 1;
        }
    }
    health.roll_stalled = pool.image_policy == ImagePolicy::Enforce
        && health.live > 0
        && health.drifted as f64 > stalled_share * health.live as f64;
    health
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures::{attested, digest};
    use crate::domain::ids::RunnerId;
    use crate::domain::image_set::ImageSource;
    use crate::domain::pool::PoolSpec;
    use crate::domain::pool_name::PoolName;
    use crate::domain::verdict::GateState;

    const NOW: Millis = Millis(1_800_000_000_000);
    const RULES: StatusRules = StatusRules {
        probe_max_age_s: 300,
        heartbeat_interval_s: 15,
    };

    fn pool(name: &str, policy: ImagePolicy, images: &[char]) -> Pool {
        let spec = PoolSpec {
            gate_mode: Default::default(),
            image_ref: None,
            expected_image_ids: images.iter().map(|c| digest(*c)).collect(),
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
            PoolName::parse(name).unwrap(),
            None,
            spec,
            NOW.minus_secs(10),
        )
    }

    fn runner(pool: &str, n: usize, image: Option<char>, ago_s: Option<i64>) -> RunnerSummary {
        RunnerSummary {
            id: RunnerId(format!("{pool}-{n}")),
            name: format!("r{n}"),
            pool: PoolName::parse(pool).unwrap(),
            gate: GateState::default(),
            revoked_at: None,
            search: None,
            latest: ago_s.map(|ago| attested(NOW.minus_secs(ago), true, image)),
        }
    }

    #[test]
    fn more_than_the_share_on_a_superseded_image_stalls_the_roll() {
        let p = pool("p", ImagePolicy::Enforce, &['b']);
        let two_of_three = [
            runner("p", 1, Some('a'), Some(5)),
            runner("p", 2, Some('a'), Some(5)),
            runner("p", 3, Some('b'), Some(5)),
        ];
        let h = roll_health(&p, &two_of_three, NOW, RULES, 0.5);
        assert_eq!((h.live, h.drifted, h.roll_stalled), (3, 2, true));

        // Exactly the share is not more than it.
        let half = [
            runner("p", 1, Some('a'), Some(5)),
            runner("p", 2, Some('b'), Some(5)),
        ];
        let h = roll_health(&p, &half, NOW, RULES, 0.5);
        assert_eq!((h.live, h.drifted, h.roll_stalled), (2, 1, false));
        assert!(roll_health(&p, &half, NOW, RULES, 0.4).roll_stalled);
    }

    #[test]
    fn only_live_attested_runners_of_the_pool_count() {
        let p = pool("p", ImagePolicy::Enforce, &['b']);
        let mut revoked = runner("p", 1, Some('a'), Some(5));
        revoked.revoked_at = Some(NOW.minus_secs(1));
        let runners = [
            revoked,
            runner("p", 2, Some('a'), Some(100)), // stale
            runner("p", 3, Some('a'), None),      // never attested
            runner("p", 4, None, Some(5)),        // no image.id: image_unreported, not drift
            runner("q", 5, Some('a'), Some(5)),   // another pool
            runner("p", 6, Some('b'), Some(5)),
        ];
        let h = roll_health(&p, &runners, NOW, RULES, 0.5);
        assert_eq!((h.live, h.drifted, h.roll_stalled), (2, 0, false));
        assert_eq!(
            roll_health(&p, &[], NOW, RULES, 0.5),
            RollHealth::default(),
            "an empty pool is not stalled"
        );
    }

    #[test]
    fn only_enforce_pools_stall() {
        let all_old = [
            runner("p", 1, Some('a'), Some(5)),
            runner("p", 2, Some('a'), Some(5)),
        ];
        let report = pool("p", ImagePolicy::Report, &['b']);
        let h = roll_health(&report, &all_old, NOW, RULES, 0.5);
        assert_eq!((h.live, h.drifted, h.roll_stalled), (2, 2, false));
        let off = pool("p", ImagePolicy::Off, &['b']);
        let h = roll_health(&off, &all_old, NOW, RULES, 0.5);
        assert_eq!((h.drifted, h.roll_stalled), (0, false));
        // Inside the grace the old image still leases, but it will not after: stalled already.
        let mut rolled = pool("p", ImagePolicy::Enforce, &['a']);
        rolled = Pool::apply(
            rolled.name.clone(),
            Some(&rolled),
            PoolSpec {
                gate_mode: Default::default(),
                image_ref: None,
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
            },
            NOW.minus_secs(1),
        );
        assert!(rolled.accepts(&digest('a'), NOW));
        assert!(roll_health(&rolled, &all_old, NOW, RULES, 0.5).roll_stalled);
    }

    #[test]
    fn a_runner_off_one_of_its_several_images_counts_as_drifted() {
        use crate::domain::images::{AttestedImage, ImageSpec};
        let spec = PoolSpec {
            gate_mode: Default::default(),
            image_ref: None,
            expected_image_ids: Vec::new(),
            image_policy: ImagePolicy::Enforce,
            image_source: ImageSource::Manual,
            drift_grace_s: 900,
            resolve_interval_s: 300,
            github: None,
            disk_warning: None,
            ejection: Default::default(),
            images: vec![ImageSpec {
                image_ref: "node:20".into(),
                image_source: ImageSource::Manual,
                expected_image_ids: vec![digest('b')],
                drift_grace_s: 900,
                absent_ok: false,
            }],
            undescribed_images: Default::default(),
        };
        let p = Pool::apply(PoolName::parse("p").unwrap(), None, spec, NOW);
        let on = |n, id| {
            let mut r = runner("p", n, None, Some(5));
            r.latest.as_mut().unwrap().state.images = vec![AttestedImage {
                image_ref: "node:20".into(),
                id: Some(digest(id)),
                digest: None,
                labels: Vec::new(),
                absent: false,
            }];
            r
        };
        let runners = [on(1, 'a'), on(2, 'a'), on(3, 'b')];
        let h = roll_health(&p, &runners, NOW, RULES, 0.5);
        assert_eq!((h.live, h.drifted, h.roll_stalled), (3, 2, true));
    }
}

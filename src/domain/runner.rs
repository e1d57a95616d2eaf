//! Runners as operators see them: the record, its observed status, and the drift report's rules.
//!
//! The lease judges the attestation in hand; the admin views judge the *latest* recorded one at
//! the time of the request, so a runner that stops attesting turns `probe_stale` and then
//! `stale` without any write.

use super::digest::ImageDigest;
use super::ids::{JobId, LeaseId, RunnerId};
use super::lease::LeaseState;
use super::pool::{ImagePolicy, Pool};
use super::pool_name::PoolName;
use super::status::RunnerStatus;
use super::time::Millis;
use super::verdict::{
    AttestedState, GateState, Refusal, image_current, judge, refs_to_pull, state_current,
};
use std::collections::BTreeMap;

/// A registered runner, with its latest attestation when it has one.
#[derive(Clone, Debug, PartialEq)]
pub struct Runner {
    pub id: RunnerId,
    pub name: String,
    pub pool: PoolName,
    pub labels: BTreeMap<String, String>,
    /// The public key's `x` (base64url of the 32 key bytes).
    pub public_key_x: String,
    pub gate: GateState,
    pub revoked_at: Option<Millis>,
    pub registered_at: Millis,
    pub latest: Option<LatestAttestation>,
    pub current_lease: Option<CurrentLease>,
    /// The forge runners on its machine that the forge gate knows it by.
    pub forge_runners: Vec<super::forge::ForgeBinding>,
    /// The forge runners its agent last claimed (`forge_runners` in its attestation) that
    /// another runner holds: not bound to it (`forge_runner_taken`).
    pub forge_runners_taken: Vec<super::forge::ForgeRunner>,
    /// Its last attestation signed by its key and refused under rules 3–4 (a clock off, most
    /// often): what a runner that turned stale was doing meanwhile.
    pub last_rejection: Option<Rejection>,
    /// What its latest attestation says of the machine and the agent.
    pub agent: AgentInfo,
    /// Its infrastructure failures in a row, ejections and the ejection in force (the one in
    /// force is `gate.ejection` too).
    pub ejection: super::ejection::EjectionRecord,
}

/// Whether a runner matches the operators' search `q` (already lowercase): a part of its name,
/// id or host, or of one of its labels written `key=value`. The page and the admin API search
/// alike through this.
pub fn matches_search<'a>(
    q: &str,
    name: &str,
    id: &str,
    host: Option<&str>,
    labels: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> bool {
    let hit = |s: &str| s.to_lowercase().contains(q);
    q.is_empty()
        || hit(name)
        || hit(id)
        || host.is_some_and(hit)
        || labels.into_iter().any(|(k, v)| hit(&format!("{k}={v}")))
}

/// What judging a runner needs: the fleet's views read this for every runner and the whole
/// `Runner` only for the runners a page shows.
///
/// Its latest attestation's probe carries no words (runtime, version, error are empty): enough
/// to judge, not to explain. What a view explains comes from the whole runner.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerSummary {
    pub id: RunnerId,
    pub name: String,
    pub pool: PoolName,
    pub gate: GateState,
    pub revoked_at: Option<Millis>,
    pub latest: Option<LatestAttestation>,
    /// What the operators' search looks at besides name and id, when it was asked for.
    pub search: Option<SearchFields>,
}

/// A runner's labels and host, for the operators' search.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SearchFields {
    pub labels: BTreeMap<String, String>,
    pub host: Option<String>,
}

impl RunnerSummary {
    pub fn is_revoked(&self) -> bool {
        self.revoked_at.is_some()
    }

    /// As `Runner::observe`.
    pub fn observe(&self, pool: &Pool, now: Millis, rules: StatusRules) -> Observed {
        observe(
            self.latest.as_ref(),
            self.gate,
            self.is_revoked(),
            pool,
            now,
            rules,
        )
    }
}

/// The host and agent a runner's latest attestation names (optional claims `host` and
/// `agent.version`; the reference agent's `agent.hostname` counts as the host).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentInfo {
    pub host: Option<String>,
    pub version: Option<String>,
}

impl AgentInfo {
    /// From the `agent` object as recorded, cleaned for display.
    pub fn from_recorded(agent: Option<&serde_json::Value>) -> Self {
        let text = |key: &str, max: usize| {
            agent
                .and_then(|a| a.get(key))
                .and_then(serde_json::Value::as_str)
                .map(|s| super::text::sanitize(s, max))
                .filter(|s| !s.is_empty())
        };
        AgentInfo {
            host: text("host", 253).or_else(|| text("hostname", 253)),
            version: text("version", 64),
        }
    }
}

/// An attestation the gate refused, as noted on its runner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub at: Millis,
    /// `attestation_invalid`, `attestation_expired` or `clock_skew`.
    pub code: String,
    pub detail: String,
}

/// The live lease a runner holds, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLease {
    pub lease_id: LeaseId,
    pub job_id: JobId,
    pub state: LeaseState,
    pub expires_at: Millis,
}

/// The latest recorded attestation of a runner, kept in place (one row per runner).
#[derive(Clone, Debug, PartialEq)]
pub struct LatestAttestation {
    pub received_at: Millis,
    pub state: AttestedState,
}

/// The settings that observed statuses depend on.
#[derive(Clone, Copy, Debug)]
pub struct StatusRules {
    pub probe_max_age_s: i64,
    pub heartbeat_interval_s: i64,
}

impl StatusRules {
    /// A runner with no recorded attestation within three heartbeat intervals is stale.
    pub fn stale_after_s(&self) -> i64 {
        3 * self.heartbeat_interval_s
    }
}

/// A runner's status at `now` with the refusal behind it, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub status: RunnerStatus,
    pub refusal: Option<Refusal>,
    pub image_current: Option<bool>,
    /// Why its disk is under its pool's warning line (`Pool::disk_warning`), for a runner
    /// whose latest attestation is live; a warning changes no status.
    pub disk_warning: Option<String>,
}

impl Runner {
    /// What of the runner judging needs, as `Store::runner_summaries` reads it: for tests that
    /// build a whole runner and judge it as the views do.
    #[cfg(test)]
    pub fn summary(&self) -> RunnerSummary {
        RunnerSummary {
            id: self.id.clone(),
            name: self.name.clone(),
            pool: self.pool.clone(),
            gate: self.gate,
            revoked_at: self.revoked_at,
            latest: self.latest.clone(),
            search: None,
        }
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked_at.is_some()
    }

    /// The runner's status at `now`, from its latest attestation.
    pub fn observe(&self, pool: &Pool, now: Millis, rules: StatusRules) -> Observed {
        observe(
            self.latest.as_ref(),
            self.gate,
            self.is_revoked(),
            pool,
            now,
            rules,
        )
    }
}

/// A runner's status at `now` from what it last attested and how the gate holds it.
fn observe(
    latest: Option<&LatestAttestation>,
    gate: GateState,
    revoked: bool,
    pool: &Pool,
    now: Millis,
    rules: StatusRules,
) -> Observed {
    let image_now = latest.and_then(|l| state_current(&l.state, pool));
    let plain = |status| Observed {
        status,
        refusal: None,
        image_current: image_now,
        disk_warning: None,
    };
    if revoked {
        return plain(RunnerStatus::Revoked);
    }
    let Some(latest) = latest else {
        return plain(RunnerStatus::Unknown);
    };
    if now.0 - latest.received_at.0 > rules.stale_after_s() * 1000 {
        return plain(RunnerStatus::Stale);
    }
    let disk_warning = pool
        .disk_warning
        .and_then(|w| w.judge(&latest.state.probe.disk));
    match judge(&latest.state, gate, pool, now, rules.probe_max_age_s) {
        Ok(()) => Observed {
            disk_warning,
            ..plain(RunnerStatus::Healthy)
        },
        Err(refusal) => Observed {
            status: refusal.status(),
            refusal: Some(refusal),
            image_current: image_now,
            disk_warning,
        },
    }
}

/// One entry of the drift report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriftEntry {
    Drifted {
        runner_id: RunnerId,
        pool: PoolName,
        /// Its single image's id; `None` when only its several images drifted.
        running_image_id: Option<ImageDigest>,
        expected_image_ids: Vec<ImageDigest>,
        /// The refs of its several images that are off their entries' current sets.
        images: Vec<String>,
    },
    Skipped {
        runner_id: RunnerId,
        reason: &'static str,
    },
    Current,
}

/// Whether `runner` is drifted, skipped (with why) or current. Fails closed: anything unknown
/// is a skip, never a drift, so one failed inspect cannot roll a fleet.
pub fn drift_entry(
    runner: &RunnerSummary,
    pool: &Pool,
    now: Millis,
    rules: StatusRules,
) -> DriftEntry {
    let skip = |reason| DriftEntry::Skipped {
        runner_id: runner.id.clone(),
        reason,
    };
    if runner.is_revoked() {
        return skip("revoked");
    }
    if pool.image_policy == ImagePolicy::Off {
        return skip("pool_policy_off");
    }
    if pool.judges_single_image() && !pool.is_resolved() {
        return skip("pool_image_unresolved");
    }
    let Some(latest) = &runner.latest else {
        return skip("never_attested");
    };
    if now.0 - latest.received_at.0 > rules.stale_after_s() * 1000 {
        return skip("stale");
    }
    let drifted = |running_image_id, images| DriftEntry::Drifted {
        runner_id: runner.id.clone(),
        pool: pool.name.clone(),
        running_image_id,
        expected_image_ids: pool.expected_image_ids.clone(),
        images,
    };
    let pull = refs_to_pull(&latest.state, pool);
    if !pool.judges_single_image() {
        return match crate::domain::images::current(&latest.state.judged_images(), &pool.images) {
            None => skip("image_unreported"),
            Some(true) => DriftEntry::Current,
            Some(false) => drifted(None, pull),
        };
    }
    let image = &latest.state.image;
    // The running image is what `image.id` says; a digest alone is not enough to call a drift.
    let Some(running) = image.id.clone() else {
        return skip("image_unreported");
    };
    match image_current(image, pool) {
        Some(false) => drifted(Some(running), pull),
        Some(true) if !pull.is_empty() => drifted(Some(running), pull),
        Some(true) => DriftEntry::Current,
        None => skip("image_unreported"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures::{attested, digest};
    use crate::domain::image_set::ImageSource;
    use crate::domain::pool::PoolSpec;

    const NOW: Millis = Millis(1_800_000_000_000);
    const RULES: StatusRules = StatusRules {
        probe_max_age_s: 300,
        heartbeat_interval_s: 15,
    };

    fn pool(policy: ImagePolicy, images: Vec<ImageDigest>) -> Pool {
        let spec = PoolSpec {
            gate_mode: Default::default(),
            image_ref: None,
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

    fn runner(image: Option<char>, received_ago_s: Option<i64>) -> Runner {
        Runner {
            forge_runners: vec![],
            forge_runners_taken: vec![],
            last_rejection: None,
            agent: Default::default(),
            ejection: Default::default(),
            id: RunnerId("r".into()),
            name: "r".into(),
            pool: PoolName::parse("p").unwrap(),
            labels: BTreeMap::new(),
            public_key_x: String::new(),
            gate: GateState::default(),
            revoked_at: None,
            registered_at: NOW.minus_secs(7200),
            current_lease: None,
            latest: received_ago_s.map(|ago| attested(NOW.minus_secs(ago), true, image)),
        }
    }

    #[test]
    fn observed_status_ages_without_writes() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        assert_eq!(
            runner(Some('a'), None).observe(&p, NOW, RULES).status,
            RunnerStatus::Unknown
        );
        assert_eq!(
            runner(Some('a'), Some(5)).observe(&p, NOW, RULES).status,
            RunnerStatus::Healthy
        );
        assert_eq!(
            runner(Some('a'), Some(46)).observe(&p, NOW, RULES).status,
            RunnerStatus::Stale
        );
        let mut revoked = runner(Some('a'), Some(5));
        revoked.revoked_at = Some(NOW);
        assert_eq!(
            revoked.observe(&p, NOW, RULES).status,
            RunnerStatus::Revoked
        );
        let drifted = runner(Some('b'), Some(5)).observe(&p, NOW, RULES);
        assert_eq!(drifted.status, RunnerStatus::Drifted);
        assert_eq!(drifted.image_current, Some(false));
    }

    #[test]
    fn drift_report_fails_closed() {
        let p = pool(ImagePolicy::Enforce, vec![digest('a')]);
        let reason = |e: DriftEntry| match e {
            DriftEntry::Skipped { reason, .. } => reason,
            DriftEntry::Drifted { .. } => "drifted",
            DriftEntry::Current => "current",
        };
        assert_eq!(
            reason(drift_entry(
                &runner(Some('b'), Some(5)).summary(),
                &p,
                NOW,
                RULES
            )),
            "drifted"
        );
        assert_eq!(
            reason(drift_entry(
                &runner(Some('a'), Some(5)).summary(),
                &p,
                NOW,
                RULES
            )),
            "current"
        );
        assert_eq!(
            reason(drift_entry(
                &runner(None, Some(5)).summary(),
                &p,
                NOW,
                RULES
            )),
            "image_unreported"
        );
        // A digest without an image id is not enough to call a drift.
        let mut digest_only = runner(None, Some(5));
        digest_only.latest.as_mut().unwrap().state.image.digest = Some(digest('b'));
        assert_eq!(
            reason(drift_entry(&digest_only.summary(), &p, NOW, RULES)),
            "image_unreported"
        );
        assert_eq!(
            reason(drift_entry(
                &runner(Some('b'), None).summary(),
                &p,
                NOW,
                RULES
            )),
            "never_attested"
        );
        assert_eq!(
            reason(drift_entry(
                &runner(Some('b'), Some(100)).summary(),
                &p,
                NOW,
                RULES
            )),
            "stale"
        );
        let off = pool(ImagePolicy::Off, vec![digest('a')]);
        assert_eq!(
            reason(drift_entry(
                &runner(Some('b'), Some(5)).summary(),
                &off,
                NOW,
                RULES
            )),
            "pool_policy_off"
        );
        let mut unresolved = pool(ImagePolicy::Report, vec![]);
        unresolved.expected_image_ids.clear();
        assert_eq!(
            reason(drift_entry(
                &runner(Some('b'), Some(5)).summary(),
                &unresolved,
                NOW,
                RULES
            )),
            "pool_image_unresolved"
        );
        // Report pools show drift too.
        let report = pool(ImagePolicy::Report, vec![digest('a')]);
        assert_eq!(
            reason(drift_entry(
                &runner(Some('b'), Some(5)).summary(),
                &report,
                NOW,
                RULES
            )),
            "drifted"
        );
    }
}

//! Outlier ejection: a runner whose jobs keep ending in infrastructure failures is taken out of
//! its pool for a while, as a load balancer ejects a failing backend.
//!
//! A probe sees what it checks; a machine whose jobs fail for reasons of its own (its runtime
//! loses containers, its image pulls fail) passes its probe and keeps taking work. Every job's
//! end says which: `record` reads each one (`JobEnd`) and keeps, per runner, the failures in a
//! row (`EjectionRecord::streak`). On the pool's `consecutive_failures`th the runner is ejected
//! for `base_s × n`, its nth ejection (capped at `MAX_MULTIPLIER × base_s`; one ejection is
//! forgotten per `MAX_MULTIPLIER × base_s` without one), unless the pool only observes, or
//! ejecting it would take more than `max_share` of the pool's live runners, or its last
//! admitted one: then it is marked `would_eject` and keeps its work. An ejected runner is
//! refused (`verdict::Refusal::Ejected`) until its time has passed and it has posted a passing
//! probe checked after that (`released_by`).

use super::audit::{Action, Entry};
use super::ids::RunnerId;
use super::time::Millis;
use JobEnd::Infrastructure;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Failures in a row that eject a runner, unless its pool says otherwise.
pub const DEFAULT_CONSECUTIVE_FAILURES: i64 = 3;
/// The first ejection's length, in seconds.
pub const DEFAULT_BASE_S: i64 = 300;
/// The share of a pool's live runners that may be ejected at once.
pub const DEFAULT_MAX_SHARE: f64 = 0.34;
/// The longest ejection, in `base_s`; also how many `base_s` forget one ejection.
pub const MAX_MULTIPLIER: i64 = 8;
/// The bounds a pool's policy is held to.
pub const MAX_CONSECUTIVE_FAILURES: i64 = 1000;
pub const MAX_BASE_S: i64 = 86_400;

/// A pool's ejection policy (`ejection` in its JSON).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EjectionPolicy {
    /// Infrastructure failures in a row that eject a runner; 0 turns ejection off.
    pub consecutive_failures: i64,
    /// The first ejection's length; the nth lasts `n × base_s`, at most 8 × `base_s`.
    pub base_s: i64,
    /// At most `max(1, floor(max_share × live runners))` of the pool's runners are ejected at
    /// once.
    pub max_share: f64,
}

/// The share is checked to be a number from 0 to 1 (never NaN) before a policy exists.
impl Eq for EjectionPolicy {}

impl Default for EjectionPolicy {
    fn default() -> Self {
        EjectionPolicy {
            consecutive_failures: DEFAULT_CONSECUTIVE_FAILURES,
            base_s: DEFAULT_BASE_S,
            max_share: DEFAULT_MAX_SHARE,
        }
    }
}

impl EjectionPolicy {
    /// Why the policy cannot be taken, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(0..=MAX_CONSECUTIVE_FAILURES).contains(&self.consecutive_failures) {
            return Err(format!(
                "ejection.consecutive_failures must be a whole number from 0 (off) to \
                 {MAX_CONSECUTIVE_FAILURES}"
            ));
        }
        if !(1..=MAX_BASE_S).contains(&self.base_s) {
            return Err(format!(
                "ejection.base_s must be a whole number from 1 to {MAX_BASE_S}"
            ));
        }
        if !(0.0..=1.0).contains(&self.max_share) {
            return Err("ejection.max_share must be a number from 0 to 1".into());
        }
        Ok(())
    }

    pub fn is_off(&self) -> bool {
        self.consecutive_failures == 0
    }

    /// How many of `live` runners may be ejected at once.
    pub fn allowed(&self, live: i64) -> i64 {
        ((self.max_share * live as f64).floor() as i64).max(1)
    }

    /// The nth ejection's length, in seconds.
    pub fn length_s(&self, nth: i64) -> i64 {
        self.base_s.saturating_mul(nth.clamp(1, MAX_MULTIPLIER))
    }
}

/// Why a job ended without its runner running it to its end: the machine's fault, not the
/// job's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureReason {
    /// `complete` with `errored`.
    Errored,
    /// `abandon` before start.
    Abandoned,
    /// GitLab's `failure_reason: runner_system_failure`.
    RunnerSystemFailure,
    /// GitLab's `failure_reason: image_pull_failure`.
    ImagePullFailure,
    /// A Forgejo task that failed before any of its steps started.
    NoStepStarted,
}

impl FailureReason {
    pub const ALL: [FailureReason; 5] = [
        FailureReason::Errored,
        FailureReason::Abandoned,
        FailureReason::RunnerSystemFailure,
        FailureReason::ImagePullFailure,
        FailureReason::NoStepStarted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Errored => "errored",
            FailureReason::Abandoned => "abandoned",
            FailureReason::RunnerSystemFailure => "runner_system_failure",
            FailureReason::ImagePullFailure => "image_pull_failure",
            FailureReason::NoStepStarted => "no_step_started",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How a job ended, as far as its runner's machine is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobEnd {
    /// The machine failed the job (`FailureReason`).
    Infrastructure(FailureReason),
    /// The machine ran the job to its own end, whatever the job's verdict.
    RanToEnd,
}

/// Infrastructure failures counted by reason: small and `Copy`, so that the gate's state can
/// carry the failures an ejection was for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tally([u32; 5]);

impl Tally {
    pub fn add(&mut self, reason: FailureReason) {
        let n = &mut self.0[reason.index()];
        *n = n.saturating_add(1);
    }

    pub fn total(&self) -> i64 {
        self.0.iter().map(|&n| i64::from(n)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// Each reason with its count, in the order of `FailureReason::ALL`, zeros left out.
    pub fn counts(&self) -> impl Iterator<Item = (FailureReason, u32)> + '_ {
        FailureReason::ALL
            .into_iter()
            .map(|r| (r, self.0[r.index()]))
            .filter(|&(_, n)| n > 0)
    }

    /// The reason most of the failures had (the first of `ALL` on a tie).
    pub fn main_reason(&self) -> Option<FailureReason> {
        self.counts()
            .fold(
                None,
                |best: Option<(FailureReason, u32)>, (r, n)| match best {
                    Some((_, m)) if m >= n => best,
                    _ => Some((r, n)),
                },
            )
            .map(|(r, _)| r)
    }

    /// As stored: `{"errored": 2}`.
    pub fn to_json(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .counts()
            .map(|(r, n)| (r.as_str().to_string(), n.into()))
            .collect();
        serde_json::Value::Object(map).to_string()
    }

    /// From its stored form; unknown reasons are left out.
    pub fn from_json(s: &str) -> Tally {
        let mut tally = Tally::default();
        if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(s) {
            for (k, v) in map {
                if let (Some(r), Some(n)) = (FailureReason::parse(&k), v.as_u64()) {
                    tally.0[r.index()] = u32::try_from(n).unwrap_or(u32::MAX);
                }
            }
        }
        tally
    }
}

/// `errored ×2, abandoned ×1`.
impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .counts()
            .map(|(r, n)| format!("{} ×{n}", r.as_str()))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// An ejection in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ejection {
    pub at: Millis,
    /// Refused at least until then, and then until a passing probe checked after it.
    pub until: Millis,
    /// The failures in a row that ejected it.
    pub failures: Tally,
    /// Which ejection this is, after decay (its length is `nth × base_s`).
    pub nth: i64,
}

impl Ejection {
    /// Whether the runner is refused at `now`, its latest probe checked at `checked_at`.
    pub fn refuses(&self, checked_at: Millis, now: Millis) -> bool {
        now < self.until || checked_at <= self.until
    }

    /// Whether a probe (`ok`, checked at `checked_at`, received at `now`) ends it.
    pub fn released_by(&self, ok: bool, checked_at: Millis, now: Millis) -> bool {
        ok && now >= self.until && checked_at > self.until
    }

    /// For people: how many failures, their reasons, until when.
    pub fn detail(&self) -> String {
        format!(
            "the runner is ejected after {} infrastructure failures in a row ({}) until {} \
             (ejection {}); it returns with a passing probe checked after that",
            self.failures.total(),
            self.failures,
            self.until,
            self.nth
        )
    }
}

/// Why a runner the rule would eject was not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Withheld {
    /// Its pool only observes (`gate_mode: observe`).
    Observe,
    /// `max_share` of the pool's live runners are ejected already.
    MaxShare,
    /// It is its pool's last admitted runner.
    LastAdmitted,
}

impl Withheld {
    pub fn as_str(self) -> &'static str {
        match self {
            Withheld::Observe => "observe",
            Withheld::MaxShare => "max_share",
            Withheld::LastAdmitted => "last_admitted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Withheld::Observe,
            Withheld::MaxShare,
            Withheld::LastAdmitted,
        ]
        .into_iter()
        .find(|w| w.as_str() == s)
    }
}

/// An ejection the rule called for and did not make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WouldEject {
    pub at: Millis,
    pub why: Withheld,
    /// Until when it would have been ejected.
    pub until: Millis,
    pub failures: Tally,
}

/// What the service keeps of a runner for ejection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EjectionRecord {
    /// The infrastructure failures since the runner last ran a job to its end (or was ejected).
    pub streak: Tally,
    /// Its ejections so far, before decay.
    pub ejections: i64,
    /// When its latest ejection ended (or would have): decay counts from there.
    pub last_until: Option<Millis>,
    pub ejected: Option<Ejection>,
    pub would_eject: Option<WouldEject>,
}

/// Ejections left after decay at `now`: one is forgotten per `MAX_MULTIPLIER × base_s` since
/// the latest ended.
pub fn decayed(ejections: i64, last_until: Option<Millis>, base_s: i64, now: Millis) -> i64 {
    let Some(until) = last_until else {
        return ejections.max(0);
    };
    let period_ms = MAX_MULTIPLIER
        .saturating_mul(base_s.max(1))
        .saturating_mul(1000);
    let forgotten = (now.0 - until.0).max(0) / period_ms;
    (ejections - forgotten).max(0)
}

/// What an ejection would do to the pool, as the store finds it at the moment (counted by
/// `ejection_load::of`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolLoad {
    /// Its live runners (not revoked, attested within the stale limit), this one included.
    pub live: i64,
    /// Those of them ejected now, this one left out.
    pub ejected: i64,
    /// How many other runners are admitted now (no refusal of rules 7–14): with none, this
    /// one is the pool's last (whatever its own state, which its own failure, an abandon's
    /// quarantine say, may have just changed).
    pub others_admitted: i64,
    /// The pool only observes.
    pub observe: bool,
}

/// What a job's end did to its runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Nothing changed (ejection off, or already ejected, or nothing to reset).
    None,
    /// Its failures in a row were set back (it ran a job to its end).
    Reset,
    /// One more failure in a row, not yet enough.
    Counted,
    Ejected(Ejection),
    Withheld(WouldEject),
}

/// Whether `record` will ask for the pool's load: only for the failure that reaches the
/// threshold, so that the store reads the pool's runners (under its lock) only then.
pub fn needs_load(current: &EjectionRecord, end: JobEnd, policy: &EjectionPolicy) -> bool {
    matches!(end, Infrastructure(_))
        && !policy.is_off()
        && current.ejected.is_none()
        && current.streak.total() + 1 >= policy.consecutive_failures
}

/// The record after `end` at `now` under `policy`. `load` is asked only when the runner is to
/// be ejected (the store reads the pool's runners for it then, under the pool's lock).
pub fn record(
    current: &EjectionRecord,
    end: JobEnd,
    policy: &EjectionPolicy,
    load: impl FnOnce() -> PoolLoad,
    now: Millis,
) -> (EjectionRecord, Effect) {
    let mut next = *current;
    let reason = match end {
        JobEnd::RanToEnd => {
            if current.streak.is_empty() && current.would_eject.is_none() {
                return (next, Effect::None);
            }
            next.streak = Tally::default();
            next.would_eject = None;
            return (next, Effect::Reset);
        }
        // A job that ends while its runner is out started before: it adds nothing.
        Infrastructure(_) if policy.is_off() || current.ejected.is_some() => {
            return (next, Effect::None);
        }
        Infrastructure(reason) => reason,
    };
    next.streak.add(reason);
    if next.streak.total() < policy.consecutive_failures {
        return (next, Effect::Counted);
    }
    let nth = decayed(current.ejections, current.last_until, policy.base_s, now) + 1;
    let until = now.plus_secs(policy.length_s(nth));
    let failures = next.streak;
    let load = load();
    let withheld = if load.observe {
        Some(Withheld::Observe)
    } else if load.others_admitted == 0 {
        Some(Withheld::LastAdmitted)
    } else if load.ejected + 1 > policy.allowed(load.live) {
        Some(Withheld::MaxShare)
    } else {
        None
    };
    match withheld {
        // Under observe the ejection is made in all but its refusals, so that what the pool
        // would do when enforcing (how long, the nth) reads true.
        Some(why) => {
            let would = WouldEject {
                at: now,
                why,
                until,
                failures,
            };
            next.would_eject = Some(would);
            if why == Withheld::Observe {
                next.streak = Tally::default();
                next.ejections = nth;
                next.last_until = Some(until);
            }
            (next, Effect::Withheld(would))
        }
        None => {
            let ejection = Ejection {
                at: now,
                until,
                failures,
                nth,
            };
            next.streak = Tally::default();
            next.ejections = nth;
            next.last_until = Some(until);
            next.ejected = Some(ejection);
            next.would_eject = None;
            (next, Effect::Ejected(ejection))
        }
    }
}

impl Effect {
    /// The audit entry of an ejection made or withheld (the service's own doing, `client` the
    /// party whose report of the job's end it was).
    pub fn audit(&self, runner: &RunnerId, at: Millis, client: &str) -> Option<Entry> {
        let (action, detail) = match self {
            Effect::Ejected(e) => (Action::RunnerEject, e.detail()),
            Effect::Withheld(w) => (
                Action::RunnerWouldEject,
                format!(
                    "would be ejected after {} infrastructure failures in a row ({}) until {}, \
                     but not: {}",
                    w.failures.total(),
                    w.failures,
                    w.until,
                    w.why.as_str()
                ),
            ),
            Effect::None | Effect::Reset | Effect::Counted => return None,
        };
        Some(Entry {
            at,
            actor: "leasegate".into(),
            action,
            target: runner.to_string(),
            detail: Some(detail),
            client: client.to_string(),
        })
    }

    /// The reason an ejection is counted under (`leasegate_ejections_total`): what most of its
    /// failures were.
    pub fn main_reason(&self) -> Option<FailureReason> {
        match self {
            Effect::Ejected(e) => e.failures.main_reason(),
            Effect::Withheld(w) => w.failures.main_reason(),
            Effect::None | Effect::Reset | Effect::Counted => None,
        }
    }
}

/// An operator's reinstatement: out of ejection at once, failures forgotten. The count of
/// ejections stays, so a machine that fails again soon is out longer.
pub fn reinstate(current: &EjectionRecord) -> EjectionRecord {
    EjectionRecord {
        streak: Tally::default(),
        ejected: None,
        would_eject: None,
        ..*current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: Millis = Millis(1_800_000_000_000);
    const POLICY: EjectionPolicy = EjectionPolicy {
        consecutive_failures: 3,
        base_s: 300,
        max_share: 0.34,
    };

    fn roomy() -> PoolLoad {
        PoolLoad {
            live: 10,
            ejected: 0,
            others_admitted: 9,
            observe: false,
        }
    }

    fn fail(r: &EjectionRecord, at: Millis) -> (EjectionRecord, Effect) {
        record(
            r,
            Infrastructure(FailureReason::Errored),
            &POLICY,
            roomy,
            at,
        )
    }

    #[test]
    fn three_failures_in_a_row_eject_for_base_s() {
        let r = EjectionRecord::default();
        let (r, e) = fail(&r, NOW);
        assert_eq!(e, Effect::Counted);
        let (r, e) = fail(&r, NOW);
        assert_eq!(e, Effect::Counted);
        let (r, e) = fail(&r, NOW);
        let Effect::Ejected(ej) = e else {
            panic!("not ejected: {e:?}")
        };
        assert_eq!(ej.until, NOW.plus_secs(300));
        assert_eq!(ej.nth, 1);
        assert_eq!(ej.failures.total(), 3);
        assert!(r.streak.is_empty(), "an ejection resets the count");
        assert!(
            ej.detail()
                .contains("3 infrastructure failures in a row (errored ×3)")
        );
    }

    #[test]
    fn a_job_run_to_its_end_resets_the_count() {
        let (r, _) = fail(&EjectionRecord::default(), NOW);
        let (r, _) = fail(&r, NOW);
        let (r, e) = record(&r, JobEnd::RanToEnd, &POLICY, roomy, NOW);
        assert_eq!(e, Effect::Reset);
        let (r, _) = fail(&r, NOW);
        let (_, e) = fail(&r, NOW);
        assert_eq!(e, Effect::Counted);
    }

    #[test]
    fn the_second_ejection_lasts_twice_as_long_and_the_count_decays() {
        let mut r = EjectionRecord::default();
        for _ in 0..3 {
            r = fail(&r, NOW).0;
        }
        let first = r.ejected.unwrap();
        r.ejected = None; // released
        let later = first.until.plus_secs(60);
        for _ in 0..2 {
            r = fail(&r, later).0;
        }
        let (r2, e) = fail(&r, later);
        let Effect::Ejected(second) = e else {
            panic!("{e:?}")
        };
        assert_eq!((second.nth, second.until), (2, later.plus_secs(600)));
        // 8 × base_s after the first ended, one ejection is forgotten: the next is the first.
        let much_later = first.until.plus_secs(8 * 300);
        let (_, e) = fail(&r, much_later);
        let Effect::Ejected(again) = e else {
            panic!("{e:?}")
        };
        assert_eq!(again.nth, 1);
        assert_eq!(r2.ejections, 2);
    }

    #[test]
    fn the_length_is_capped_at_eight_base_s() {
        assert_eq!(POLICY.length_s(1), 300);
        assert_eq!(POLICY.length_s(8), 2400);
        assert_eq!(POLICY.length_s(20), 2400);
    }

    #[test]
    fn release_needs_the_time_and_a_probe_checked_after_it() {
        let ej = Ejection {
            at: NOW,
            until: NOW.plus_secs(300),
            failures: Tally::default(),
            nth: 1,
        };
        let after = NOW.plus_secs(301);
        assert!(
            ej.refuses(after, NOW.plus_secs(10)),
            "the time has not passed"
        );
        assert!(ej.refuses(NOW.plus_secs(200), after), "the probe is older");
        assert!(!ej.refuses(after, after));
        assert!(!ej.released_by(false, after, after), "a failing probe");
        assert!(!ej.released_by(true, NOW.plus_secs(299), after));
        assert!(ej.released_by(true, after, after));
    }

    #[test]
    fn withheld_by_the_share_the_last_admitted_and_observe() {
        let mut r = EjectionRecord::default();
        r = fail(&r, NOW).0;
        r = fail(&r, NOW).0;
        let three_one_out = || PoolLoad {
            live: 3,
            ejected: 1,
            others_admitted: 1,
            observe: false,
        };
        let failed = Infrastructure(FailureReason::RunnerSystemFailure);
        let (capped, e) = record(&r, failed, &POLICY, three_one_out, NOW);
        assert!(matches!(e, Effect::Withheld(w) if w.why == Withheld::MaxShare));
        assert!(capped.ejected.is_none());
        assert_eq!(capped.streak.total(), 3, "the next failure tries again");
        let alone = || PoolLoad {
            live: 1,
            ejected: 0,
            others_admitted: 0,
            observe: false,
        };
        let (_, e) = record(&r, failed, &POLICY, alone, NOW);
        assert!(matches!(e, Effect::Withheld(w) if w.why == Withheld::LastAdmitted));
        let observed = || PoolLoad {
            observe: true,
            ..roomy()
        };
        let (o, e) = record(&r, failed, &POLICY, observed, NOW);
        assert!(matches!(e, Effect::Withheld(w) if w.why == Withheld::Observe));
        assert!(o.ejected.is_none() && o.streak.is_empty() && o.ejections == 1);
        let (cleared, e) = record(&o, JobEnd::RanToEnd, &POLICY, roomy, NOW);
        assert_eq!(e, Effect::Reset);
        assert!(cleared.would_eject.is_none());
    }

    #[test]
    fn off_counts_nothing_and_an_ejected_runner_adds_nothing() {
        let off = EjectionPolicy {
            consecutive_failures: 0,
            ..POLICY
        };
        let (r, e) = record(
            &EjectionRecord::default(),
            Infrastructure(FailureReason::Errored),
            &off,
            roomy,
            NOW,
        );
        assert_eq!((r, e), (EjectionRecord::default(), Effect::None));
        let mut out = EjectionRecord::default();
        for _ in 0..3 {
            out = fail(&out, NOW).0;
        }
        let (same, e) = fail(&out, NOW);
        assert_eq!((same, e), (out, Effect::None));
        let back = reinstate(&out);
        assert!(back.ejected.is_none() && back.streak.is_empty());
        assert_eq!(back.ejections, 1);
    }

    #[test]
    fn policies_are_checked_field_by_field() {
        assert!(POLICY.validate().is_ok());
        let bad = |p: EjectionPolicy| p.validate().unwrap_err();
        assert!(
            bad(EjectionPolicy {
                base_s: 0,
                ..POLICY
            })
            .contains("base_s")
        );
        assert!(
            bad(EjectionPolicy {
                consecutive_failures: -1,
                ..POLICY
            })
            .contains("consecutive_failures")
        );
        assert!(
            bad(EjectionPolicy {
                max_share: 1.5,
                ..POLICY
            })
            .contains("max_share")
        );
        assert_eq!(POLICY.allowed(3), 1);
        assert_eq!(POLICY.allowed(0), 1);
        assert_eq!(POLICY.allowed(10), 3);
    }

    #[test]
    fn tallies_round_trip_and_name_their_main_reason() {
        let mut t = Tally::default();
        t.add(FailureReason::ImagePullFailure);
        t.add(FailureReason::Errored);
        t.add(FailureReason::ImagePullFailure);
        assert_eq!(Tally::from_json(&t.to_json()), t);
        assert_eq!(t.main_reason(), Some(FailureReason::ImagePullFailure));
        assert_eq!(t.to_string(), "errored ×1, image_pull_failure ×2");
    }

    #[derive(Clone, Copy, Debug)]
    enum Step {
        End(usize, bool),
        Wait(i64),
        Probe(usize),
    }

    fn any_step(runners: usize) -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..runners, any::<bool>()).prop_map(|(r, ok)| Step::End(r, ok)),
            1 => (1i64..3000).prop_map(Step::Wait),
            2 => (0..runners).prop_map(Step::Probe),
        ]
    }

    proptest! {
        /// Over any sequence of job ends, waits and passing probes in a pool of healthy
        /// runners: never more than the share ejected, never all of them, and never an
        /// ejection without `consecutive_failures` failures in a row since the runner last
        /// ran a job to its end or was ejected.
        #[test]
        fn never_more_than_the_share_nor_without_the_failures(
            n in 1usize..7,
            steps in proptest::collection::vec(any_step(7), 1..120),
            threshold in 1i64..5,
            share in 0.0f64..1.0,
        ) {
            let policy = EjectionPolicy { consecutive_failures: threshold, base_s: 60, max_share: share };
            let mut records = vec![EjectionRecord::default(); n];
            let mut in_a_row = vec![0i64; n];
            let mut now = NOW;
            for step in steps {
                match step {
                    Step::Wait(s) => now = now.plus_secs(s),
                    Step::Probe(i) if i < n
                        && records[i].ejected.is_some_and(|e| e.released_by(true, now, now)) =>
                    {
                        records[i].ejected = None;
                    }
                    Step::End(i, failed) if i < n => {
                        if records[i].ejected.is_some() {
                            continue;
                        }
                        let ejected = records.iter().filter(|r| r.ejected.is_some()).count() as i64;
                        let load = PoolLoad {
                            live: n as i64,
                            ejected,
                            others_admitted: n as i64 - 1 - ejected,
                            observe: false,
                        };
                        let end = if failed { Infrastructure(FailureReason::Errored) } else { JobEnd::RanToEnd };
                        let (next, effect) = record(&records[i], end, &policy, || load, now);
                        in_a_row[i] = if failed { in_a_row[i] + 1 } else { 0 };
                        if let Effect::Ejected(e) = effect {
                            prop_assert!(in_a_row[i] >= threshold);
                            prop_assert_eq!(e.failures.total(), in_a_row[i]);
                            in_a_row[i] = 0;
                        }
                        records[i] = next;
                    }
                    _ => {}
                }
                let out = records.iter().filter(|r| r.ejected.is_some()).count() as i64;
                prop_assert!(out <= policy.allowed(n as i64));
                prop_assert!(out < n as i64, "the pool's last admitted runner stays");
            }
        }
    }
}

//! A runner's ejection (or the one an observing pool would make), as its view shows it.

use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// A runner's standing under outlier ejection.
#[derive(Serialize, ToSchema)]
pub struct EjectionView {
    /// `ejected` (refused: `runner_ejected`), `would_eject` (the rule called for an ejection
    /// that was not made) or null.
    #[schema(required = true)]
    pub state: Option<&'static str>,
    /// Infrastructure failures in a row since it last ran a job to its end or was ejected.
    pub failures_in_a_row: i64,
    /// Those failures by reason (`errored`, `abandoned`, `runner_system_failure`,
    /// `image_pull_failure`, `no_step_started`).
    pub failures: BTreeMap<&'static str, u32>,
    /// Its ejections so far, before one is forgotten per 8 × `base_s` without one.
    pub ejections: i64,
    /// The ejection in force; null when none.
    #[schema(required = true)]
    pub ejected: Option<EjectedView>,
    /// The ejection called for and not made; null when none.
    #[schema(required = true)]
    pub would_eject: Option<WouldEjectView>,
}

#[derive(Serialize, ToSchema)]
pub struct EjectedView {
    pub at: String,
    /// Refused until then, and after it until a passing probe checked after it.
    pub until: String,
    /// Which ejection it is (its length is `nth × base_s`, at most 8 × `base_s`).
    pub nth: i64,
    /// The failures in a row that ejected it, by reason.
    pub failures: BTreeMap<&'static str, u32>,
}

#[derive(Serialize, ToSchema)]
pub struct WouldEjectView {
    pub at: String,
    /// `observe` (the pool observes), `max_share` (its share is ejected already) or
    /// `last_admitted` (it is the pool's last admitted runner).
    pub why: &'static str,
    /// Until when it would have been ejected.
    pub until: String,
    pub failures: BTreeMap<&'static str, u32>,
}

fn tally(t: &crate::domain::ejection::Tally) -> BTreeMap<&'static str, u32> {
    t.counts().map(|(r, n)| (r.as_str(), n)).collect()
}

/// A runner's ejection record as the views show it.
pub fn ejection(r: &crate::domain::ejection::EjectionRecord) -> EjectionView {
    EjectionView {
        state: if r.ejected.is_some() {
            Some("ejected")
        } else if r.would_eject.is_some() {
            Some("would_eject")
        } else {
            None
        },
        failures_in_a_row: r.streak.total(),
        failures: tally(&r.streak),
        ejections: r.ejections,
        ejected: r.ejected.map(|e| EjectedView {
            at: e.at.rfc3339(),
            until: e.until.rfc3339(),
            nth: e.nth,
            failures: tally(&e.failures),
        }),
        would_eject: r.would_eject.map(|w| WouldEjectView {
            at: w.at.rfc3339(),
            why: w.why.as_str(),
            until: w.until.rfc3339(),
            failures: tally(&w.failures),
        }),
    }
}

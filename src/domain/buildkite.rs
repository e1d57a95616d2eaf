//! Buildkite agents under the gate, by pausing: what leasegate remembers of its pauses and of
//! each bound agent name, and what it should do next, as functions of those and `now`.
//!
//! Buildkite hands out jobs from its own servers, so nothing stands where a job is taken; what
//! leasegate can do is pause an agent through Buildkite's REST API while its runner is refused
//! and resume it when it is admitted again. A pause carries a timeout (Buildkite lapses it by
//! itself) and Buildkite refuses to pause a paused agent, so a pause that lapsed while the
//! refusal lasts is made again. Only pauses leasegate made are ever resumed: every one is
//! remembered (`Pause`), and an agent found paused by somebody else is left alone.
//!
//! The watcher (`crate::buildkite::watcher`) reads the verdict, asks `next_step` what to do
//! for each agent name, and after listing the agents asks `on_refused` or `on_admitted` what
//! to do with each agent Buildkite lists by that name.

use super::ids::RunnerId;
use super::time::Millis;

/// Every note leasegate writes on a pause begins with this; a pause with another note is
/// somebody else's.
pub const NOTE_PREFIX: &str = "leasegate: ";
/// The longest note sent (a refusal's detail may be long; Buildkite shows the note in a list).
pub const NOTE_MAX_CHARS: usize = 500;
/// How soon an agent name whose runner is refused and that holds no live pause of leasegate's
/// is looked at again (it may have connected, or a pause may have lapsed meanwhile).
pub const LOOK_INTERVAL_S: i64 = 5;
/// How often a live pause is checked to still hold (somebody may have resumed the agent).
pub const CHECK_INTERVAL_S: i64 = 60;
/// The longest wait after failed calls.
pub const MAX_BACKOFF_S: i64 = 300;

/// The note of a pause for the refusal `code`, `detail`.
pub fn note(code: &str, detail: &str) -> String {
    let full = format!("{NOTE_PREFIX}{code}: {detail}");
    if full.chars().count() <= NOTE_MAX_CHARS {
        return full;
    }
    let mut cut: String = full.chars().take(NOTE_MAX_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Whether a pause's note is one leasegate wrote.
pub fn is_leasegates(note: Option<&str>) -> bool {
    note.is_some_and(|n| n.starts_with(NOTE_PREFIX))
}

/// Why a pause ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseEnd {
    /// leasegate resumed the agent: its runner was admitted again (or unbound).
    Resumed,
    /// Its timeout passed: Buildkite lifted it.
    Lapsed,
    /// The agent was found no longer paused before the timeout (somebody resumed it).
    Undone,
    /// The agent was found paused by somebody else's pause since (left to them).
    Replaced,
    /// The agent is no longer connected (Buildkite lists connected agents only).
    Gone,
}

impl PauseEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseEnd::Resumed => "resumed",
            PauseEnd::Lapsed => "lapsed",
            PauseEnd::Undone => "undone",
            PauseEnd::Replaced => "replaced",
            PauseEnd::Gone => "gone",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            PauseEnd::Resumed,
            PauseEnd::Lapsed,
            PauseEnd::Undone,
            PauseEnd::Replaced,
            PauseEnd::Gone,
        ]
        .into_iter()
        .find(|e| e.as_str() == s)
    }
}

/// A pause leasegate made, from the `PUT …/pause` Buildkite accepted until it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pause {
    /// Buildkite's id of the agent (a UUID).
    pub agent_id: String,
    pub agent_name: String,
    pub runner_id: RunnerId,
    /// The refusal it was made for, and the note it carried.
    pub code: String,
    pub note: String,
    pub paused_at: Millis,
    /// When Buildkite lifts it by itself (`paused_at` + its timeout).
    pub until: Millis,
    pub ended_at: Option<Millis>,
    pub end: Option<PauseEnd>,
}

impl Pause {
    /// In force at `now`: not ended, and its timeout not passed.
    pub fn live(&self, now: Millis) -> bool {
        self.ended_at.is_none() && now < self.until
    }

    /// The pause ended at `now` for `end`.
    pub fn ended(&self, end: PauseEnd, now: Millis) -> Pause {
        Pause {
            ended_at: Some(now),
            end: Some(end),
            ..self.clone()
        }
    }
}

/// What leasegate notes of one bound agent name besides its pauses: when it last listed it,
/// what an observing pool would have paused, whose pause it left alone, and its calls that
/// failed (shown on the runner, and waited out with a back-off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentWatch {
    pub agent_name: String,
    pub runner_id: RunnerId,
    /// The last time its agents were listed while its runner was refused.
    pub checked_at: Option<Millis>,
    /// In an observing pool: the refusal it would be paused for (counted once per code).
    pub observed_code: Option<String>,
    /// An agent of this name found paused by somebody else, left alone: who and why.
    pub left_alone: Option<String>,
    /// Failed calls in a row, the last one's error and when, and when to try again.
    pub failures: i64,
    pub error: Option<String>,
    pub error_at: Option<Millis>,
    pub next_try_at: Option<Millis>,
}

impl AgentWatch {
    pub fn new(agent_name: &str, runner_id: &RunnerId) -> Self {
        AgentWatch {
            agent_name: agent_name.to_string(),
            runner_id: runner_id.clone(),
            checked_at: None,
            observed_code: None,
            left_alone: None,
            failures: 0,
            error: None,
            error_at: None,
            next_try_at: None,
        }
    }

    /// A call failed at `now` with `error`: counted, and the next try put off by a back-off
    /// that doubles from 2 s up to `MAX_BACKOFF_S`.
    pub fn failed(&mut self, error: String, now: Millis) {
        self.failures += 1;
        let backoff = (2i64 << (self.failures - 1).clamp(0, 16)).min(MAX_BACKOFF_S);
        self.error = Some(error);
        self.error_at = Some(now);
        self.next_try_at = Some(now.plus_secs(backoff));
    }

    /// A call went through: the failures are over.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.error = None;
        self.error_at = None;
        self.next_try_at = None;
    }

    fn waiting(&self, now: Millis) -> bool {
        self.next_try_at.is_some_and(|at| now < at)
    }
}

/// The lease's verdict on a bound agent name's runner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admitted,
    /// Refused in a pool that only observes.
    Observed {
        code: String,
        detail: String,
    },
    Refused {
        code: String,
        detail: String,
    },
    /// No longer bound to a runner (a pause of leasegate's is then lifted).
    Unbound,
}

impl From<crate::domain::forge::Standing> for Verdict {
    fn from(standing: crate::domain::forge::Standing) -> Self {
        use crate::domain::forge::Standing;
        match standing {
            Standing::Admitted => Verdict::Admitted,
            Standing::Observed { code, detail } => Verdict::Observed { code, detail },
            Standing::Refused { code, detail } => Verdict::Refused { code, detail },
        }
    }
}

/// What to do for one agent name now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Wait,
    /// Note (log and count) what an observing pool would pause.
    Observe,
    /// List the agents of this name, then pause (`on_refused`) or resume (`on_admitted`).
    Look,
}

/// What to do for an agent name given the verdict, leasegate's live pauses on its agents and
/// its watch.
pub fn next_step(verdict: &Verdict, live: &[&Pause], watch: &AgentWatch, now: Millis) -> Step {
    if !live.is_empty() && !matches!(verdict, Verdict::Refused { .. }) {
        return if watch.waiting(now) {
            Step::Wait
        } else {
            Step::Look
        };
    }
    match verdict {
        Verdict::Admitted | Verdict::Unbound => Step::Wait,
        Verdict::Observed { code, .. } if watch.observed_code.as_deref() != Some(code) => {
            Step::Observe
        }
        Verdict::Observed { .. } => Step::Wait,
        Verdict::Refused { .. } => {
            let interval = if live.is_empty() {
                LOOK_INTERVAL_S
            } else {
                CHECK_INTERVAL_S
            };
            let due = watch
                .checked_at
                .is_none_or(|at| now.secs_since(at) >= interval);
            if due && !watch.waiting(now) {
                Step::Look
            } else {
                Step::Wait
            }
        }
    }
}

/// An agent as Buildkite lists it (`GET /v2/organizations/{org}/agents`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedAgent {
    pub id: String,
    pub name: String,
    pub paused: bool,
    pub paused_note: Option<String>,
    /// Who paused it, as Buildkite names them.
    pub paused_by: Option<String>,
}

/// What to do with one listed agent, or one of leasegate's pauses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Act {
    /// `PUT …/pause` the agent `id`.
    Pause { id: String },
    /// `PUT …/resume` the agent of this pause.
    Resume(Pause),
    /// Write down that this pause ended, without a call.
    End(Pause, PauseEnd),
    /// The agent is paused by somebody else: left alone, and noted.
    LeaveAlone { id: String, by: String },
}

/// The agents Buildkite listed for `name` that are exactly it (its `?name=` filter is not
/// exact).
pub fn exactly<'a>(listed: &'a [ListedAgent], name: &str) -> Vec<&'a ListedAgent> {
    listed.iter().filter(|a| a.name == name).collect()
}

/// While the runner is refused: what to do with each agent of the name (`agents`, exactly
/// it) and with leasegate's live pauses on them.
pub fn on_refused(agents: &[&ListedAgent], live: &[&Pause]) -> Vec<Act> {
    let mut acts = Vec::new();
    for p in live {
        match agents.iter().find(|a| a.id == p.agent_id) {
            None => acts.push(Act::End((*p).clone(), PauseEnd::Gone)),
            Some(a) if !a.paused => acts.push(Act::End((*p).clone(), PauseEnd::Undone)),
            Some(a) if !is_leasegates(a.paused_note.as_deref()) => {
                acts.push(Act::End((*p).clone(), PauseEnd::Replaced))
            }
            Some(_) => {}
        }
    }
    for a in agents {
        let ours = live.iter().any(|p| p.agent_id == a.id);
        if !a.paused {
            // Not paused, whatever leasegate remembered: paused (again).
            acts.push(Act::Pause { id: a.id.clone() });
        } else if ours || is_leasegates(a.paused_note.as_deref()) {
            // Leasegate's pause holds, or one that lapsed by leasegate's clock is about to be
            // lifted by Buildkite's: looked at again shortly.
        } else {
            let by = a.paused_by.as_deref().unwrap_or("somebody");
            let why = a.paused_note.as_deref().unwrap_or("no note");
            acts.push(Act::LeaveAlone {
                id: a.id.clone(),
                by: format!("paused by {by} ({why})"),
            });
        }
    }
    acts
}

/// Once the runner is admitted again (or unbound): each live pause of leasegate's resumed if
/// the agent still holds it, else noted as ended.
pub fn on_admitted(agents: &[&ListedAgent], live: &[&Pause]) -> Vec<Act> {
    live.iter()
        .map(|p| match agents.iter().find(|a| a.id == p.agent_id) {
            None => Act::End((*p).clone(), PauseEnd::Gone),
            Some(a) if !a.paused => Act::End((*p).clone(), PauseEnd::Undone),
            Some(a) if is_leasegates(a.paused_note.as_deref()) => Act::Resume((*p).clone()),
            Some(_) => Act::End((*p).clone(), PauseEnd::Replaced),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = Millis(1_800_000_000_000);

    fn pause(agent_id: &str, until: Millis) -> Pause {
        Pause {
            agent_id: agent_id.into(),
            agent_name: "ci-1".into(),
            runner_id: RunnerId("r1".into()),
            code: "probe_failed".into(),
            note: note("probe_failed", "crun not found"),
            paused_at: NOW.minus_secs(60),
            until,
            ended_at: None,
            end: None,
        }
    }

    fn agent(id: &str, paused: bool, note: Option<&str>) -> ListedAgent {
        ListedAgent {
            id: id.into(),
            name: "ci-1".into(),
            paused,
            paused_note: note.map(String::from),
            paused_by: paused.then(|| "Ada".into()),
        }
    }

    fn refused() -> Verdict {
        Verdict::Refused {
            code: "probe_failed".into(),
            detail: "crun not found".into(),
        }
    }

    #[test]
    fn notes_name_the_refusal_and_stay_short() {
        assert_eq!(note("probe_failed", "x"), "leasegate: probe_failed: x");
        let long = note("probe_failed", &"y".repeat(2000));
        assert_eq!(long.chars().count(), NOTE_MAX_CHARS);
        assert!(is_leasegates(Some(&long)));
        assert!(!is_leasegates(Some("maintenance")) && !is_leasegates(None));
    }

    #[test]
    fn a_refused_name_is_looked_at_soon_and_a_held_pause_checked_now_and_then() {
        let mut w = AgentWatch::new("ci-1", &RunnerId("r1".into()));
        assert_eq!(next_step(&refused(), &[], &w, NOW), Step::Look);
        w.checked_at = Some(NOW.minus_secs(2));
        assert_eq!(next_step(&refused(), &[], &w, NOW), Step::Wait);
        w.checked_at = Some(NOW.minus_secs(LOOK_INTERVAL_S));
        assert_eq!(next_step(&refused(), &[], &w, NOW), Step::Look);
        let p = pause("a1", NOW.plus_secs(600));
        assert_eq!(next_step(&refused(), &[&p], &w, NOW), Step::Wait);
        w.checked_at = Some(NOW.minus_secs(CHECK_INTERVAL_S));
        assert_eq!(next_step(&refused(), &[&p], &w, NOW), Step::Look);
        // Admitted: only a live pause of leasegate's calls for a look (to resume it).
        assert_eq!(next_step(&Verdict::Admitted, &[], &w, NOW), Step::Wait);
        assert_eq!(next_step(&Verdict::Admitted, &[&p], &w, NOW), Step::Look);
        assert_eq!(next_step(&Verdict::Unbound, &[&p], &w, NOW), Step::Look);
    }

    #[test]
    fn failures_back_off_and_an_observing_pool_is_noted_once_per_code() {
        let mut w = AgentWatch::new("ci-1", &RunnerId("r1".into()));
        w.failed("HTTP 500".into(), NOW);
        assert_eq!(w.next_try_at, Some(NOW.plus_secs(2)));
        assert_eq!(next_step(&refused(), &[], &w, NOW), Step::Wait);
        w.failed("HTTP 500".into(), NOW);
        assert_eq!(w.next_try_at, Some(NOW.plus_secs(4)));
        for _ in 0..20 {
            w.failed("HTTP 500".into(), NOW);
        }
        assert_eq!(w.next_try_at, Some(NOW.plus_secs(MAX_BACKOFF_S)));
        w.succeeded();
        assert_eq!((w.failures, w.error.as_deref()), (0, None));

        let observed = Verdict::Observed {
            code: "probe_failed".into(),
            detail: "x".into(),
        };
        assert_eq!(next_step(&observed, &[], &w, NOW), Step::Observe);
        w.observed_code = Some("probe_failed".into());
        assert_eq!(next_step(&observed, &[], &w, NOW), Step::Wait);
    }

    #[test]
    fn refused_agents_are_paused_unless_somebody_else_paused_them() {
        let free = agent("a1", false, None);
        let persons = agent("a2", true, Some("disk swap"));
        let ours = agent("a3", true, Some("leasegate: probe_failed: x"));
        let acts = on_refused(&[&free, &persons, &ours], &[]);
        assert_eq!(
            acts,
            vec![
                Act::Pause { id: "a1".into() },
                Act::LeaveAlone {
                    id: "a2".into(),
                    by: "paused by Ada (disk swap)".into()
                },
            ]
        );
        // A live pause whose agent is free again (resumed by hand, or lapsed early) is ended
        // and made again; one whose agent left is ended.
        let held = pause("a1", NOW.plus_secs(60));
        let gone = pause("a9", NOW.plus_secs(60));
        let acts = on_refused(&[&free], &[&held, &gone]);
        assert_eq!(
            acts,
            vec![
                Act::End(held.clone(), PauseEnd::Undone),
                Act::End(gone.clone(), PauseEnd::Gone),
                Act::Pause { id: "a1".into() },
            ]
        );
    }

    #[test]
    fn only_leasegates_own_pauses_are_resumed() {
        let p1 = pause("a1", NOW.plus_secs(60));
        let p2 = pause("a2", NOW.plus_secs(60));
        let p3 = pause("a3", NOW.plus_secs(60));
        let still = agent("a1", true, Some(&p1.note));
        let persons = agent("a2", true, Some("kernel upgrade"));
        let free = agent("a3", false, None);
        assert_eq!(
            on_admitted(&[&still, &persons, &free], &[&p1, &p2, &p3]),
            vec![
                Act::Resume(p1.clone()),
                Act::End(p2.clone(), PauseEnd::Replaced),
                Act::End(p3.clone(), PauseEnd::Undone),
            ]
        );
        assert!(p1.live(NOW) && !p1.live(NOW.plus_secs(60)));
        assert!(!p1.ended(PauseEnd::Resumed, NOW).live(NOW));
    }
}

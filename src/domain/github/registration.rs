//! A registration leasegate minted in GitHub for one runner, and what the watcher makes of it.
//!
//! A registration lives `minting` (reserved, GitHub not yet answered) → `minted` (GitHub
//! answered 201; the runner has its JIT config) → `online` (its listener is connected) →
//! `busy` (it took its job) → `done` (gone after its job). leasegate ends it early, `deleted`,
//! when it was never used (`unused`), when its listener went away (`offline`), or when its
//! runner stops being admitted (the refusal's code). A busy registration is never deleted.
//!
//! `watch` is the whole rule for one registration and one look at GitHub's list: a pure
//! function of the record, what GitHub lists, the lease's verdict on its runner and `now`.

use super::GithubScope;
use crate::domain::audit::{Action, Entry};
use crate::domain::ids::{RegistrationId, RunnerId};
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;

/// GitHub's limit on a runner's name.
pub const MAX_NAME_CHARS: usize = 64;
/// How long a reservation may wait for GitHub's answer before the watcher looks for what it
/// became (a replica that died between GitHub's 201 and its own write leaves one behind).
pub const MINTING_WINDOW_S: i64 = 120;

/// Where a registration is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    Minting,
    Minted,
    Online,
    Busy,
    Done,
    Deleted,
}

impl State {
    pub const ALL: [State; 6] = [
        State::Minting,
        State::Minted,
        State::Online,
        State::Busy,
        State::Done,
        State::Deleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Minting => "minting",
            State::Minted => "minted",
            State::Online => "online",
            State::Busy => "busy",
            State::Done => "done",
            State::Deleted => "deleted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Held against the runner's one outstanding registration: everything but an end.
    pub fn is_outstanding(self) -> bool {
        !matches!(self, State::Done | State::Deleted)
    }
}

/// One registration, as stored. Never its JIT config: that goes to the runner and nowhere else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub id: RegistrationId,
    pub runner_id: RunnerId,
    pub pool: PoolName,
    pub scope: GithubScope,
    /// The name it was (or is being) registered under.
    pub name: String,
    /// GitHub's id for the runner; `None` while `minting`.
    pub github_runner_id: Option<i64>,
    pub state: State,
    /// When it was reserved, then when GitHub minted it.
    pub minted_at: Millis,
    /// When it is withdrawn if it never comes online.
    pub expires_at: Millis,
    pub online_at: Option<Millis>,
    pub busy_at: Option<Millis>,
    /// The last time the watcher found it in GitHub's list.
    pub seen_at: Option<Millis>,
    pub ended_at: Option<Millis>,
    /// Why it ended: `done`, `unused`, `offline`, `gone`, or the refusal's code.
    pub end_reason: Option<String>,
    /// Minted in a pool that observes, for a runner the gate would have refused: the code.
    pub would_refuse: Option<String>,
    /// Kept in a pool that observes although the gate would have withdrawn it: the code.
    pub observed_code: Option<String>,
}

impl Registration {
    /// A step of its life as an entry of the audit trail: the service's own doing (`actor`
    /// `leasegate`), on its runner, from `client` (the runner's address when it asked).
    pub fn audit(&self, action: Action, at: Millis, client: &str, why: Option<&str>) -> Entry {
        let id = self
            .github_runner_id
            .map_or_else(|| "-".to_string(), |id| id.to_string());
        let mut detail = format!("github runner {id} {} in {}", self.name, self.scope);
        if let Some(why) = why {
            detail.push_str(": ");
            detail.push_str(why);
        }
        Entry {
            at,
            actor: "leasegate".into(),
            action,
            target: self.runner_id.to_string(),
            detail: Some(crate::domain::text::sanitize(&detail, 1024)),
            client: client.to_string(),
        }
    }
}

/// The name a registration of `runner_name` takes: the runner's name, cut so that the whole
/// fits GitHub's 64 characters, `-` and 8 hex digits of `suffix` (fresh each time: a name
/// GitHub already has is refused with 409). Characters GitHub's names do not take (anything
/// but letters, digits, `-`, `_`, `.`) become `-`.
pub fn registration_name(runner_name: &str, suffix: u32) -> String {
    let keep = MAX_NAME_CHARS - 9;
    let mut base: String = runner_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(keep)
        .collect();
    if base.trim_matches('-').is_empty() {
        base = "runner".into();
    }
    format!("{base}-{suffix:08x}")
}

/// What GitHub's list says of a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listed {
    /// Not in the list: it removed itself after its job, or someone removed it.
    Absent,
    Present {
        online: bool,
        busy: bool,
    },
}

/// The lease's verdict on the registration's runner now (rules 7–13 over its latest fresh
/// attestation, revocation included).
pub use crate::domain::forge::Standing as Verdict;

/// Why leasegate deletes a registration in GitHub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Withdrawal {
    /// `unused`, `offline`, `done`, or the refusal's code.
    pub reason: String,
    pub detail: String,
}

/// What one look at GitHub's list does to a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched {
    /// Its state after the look (it may be its state before).
    pub state: State,
    /// Delete it in GitHub now; once deleted (or found gone), it ends in `ends_as`.
    pub withdraw: Option<Withdrawal>,
    /// In a pool that observes: what would have withdrawn it (recorded once per code).
    pub observed: Option<Withdrawal>,
}

impl Watched {
    /// The state a withdrawal ends it in: `done` after its job, `deleted` otherwise.
    pub fn ends_as(&self) -> State {
        match &self.withdraw {
            Some(w) if w.reason == "done" => State::Done,
            _ => State::Deleted,
        }
    }
}

/// What to do with `reg` (minted, online or busy) now that GitHub lists it as `listed` and the
/// lease judges its runner `verdict`.
///
/// - Absent from the list: it is `done` (the ephemeral runner removed itself after its job).
/// - Busy: `busy`, and it is never withdrawn.
/// - Listed idle after it was busy: its job is over; withdrawn as `done`.
/// - Idle while its runner is refused: withdrawn at once with the refusal's code (in a pool
///   that observes, only noted).
/// - Offline after it was online: its listener went away; withdrawn as `offline`.
/// - Never online by `expires_at`: withdrawn as `unused`.
pub fn watch(reg: &Registration, listed: Listed, verdict: &Verdict, now: Millis) -> Watched {
    let keep = |state| Watched {
        state,
        withdraw: None,
        observed: None,
    };
    let withdraw = |state, reason: &str, detail: String| Watched {
        state,
        withdraw: Some(Withdrawal {
            reason: reason.to_string(),
            detail,
        }),
        observed: None,
    };
    let (online, busy) = match listed {
        Listed::Absent => return keep(State::Done),
        Listed::Present { online, busy } => (online, busy),
    };
    if busy {
        return keep(State::Busy);
    }
    if reg.state == State::Busy {
        return withdraw(
            State::Busy,
            "done",
            "its job is over and it is still registered".into(),
        );
    }
    let state = if online { State::Online } else { reg.state };
    match verdict {
        Verdict::Refused { code, detail } => return withdraw(state, code, detail.clone()),
        Verdict::Observed { code, detail } if reg.observed_code.as_ref() != Some(code) => {
            return Watched {
                state,
                withdraw: None,
                observed: Some(Withdrawal {
                    reason: code.clone(),
                    detail: detail.clone(),
                }),
            };
        }
        Verdict::Observed { .. } | Verdict::Admitted => {}
    }
    if online {
        return keep(state);
    }
    if reg.state == State::Online {
        return withdraw(
            state,
            "offline",
            "its listener went offline without taking a job".into(),
        );
    }
    if now >= reg.expires_at {
        return withdraw(
            state,
            "unused",
            format!(
                "not online {} s after it was minted",
                reg.expires_at.secs_since(reg.minted_at)
            ),
        );
    }
    keep(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: Millis = Millis(1_800_000_000_000);

    fn reg(state: State) -> Registration {
        Registration {
            id: RegistrationId("r".into()),
            runner_id: RunnerId("runner".into()),
            pool: PoolName::parse("linux").unwrap(),
            scope: GithubScope::parse("orgs/acme").unwrap(),
            name: "build-01-0000002a".into(),
            github_runner_id: Some(42),
            state,
            minted_at: NOW.minus_secs(10),
            expires_at: NOW.plus_secs(290),
            online_at: None,
            busy_at: None,
            seen_at: None,
            ended_at: None,
            end_reason: None,
            would_refuse: None,
            observed_code: None,
        }
    }

    fn refused() -> Verdict {
        Verdict::Refused {
            code: "probe_failed".into(),
            detail: "cannot run a container with podman: crun not found".into(),
        }
    }

    const IDLE_ONLINE: Listed = Listed::Present {
        online: true,
        busy: false,
    };
    const OFFLINE: Listed = Listed::Present {
        online: false,
        busy: false,
    };
    const BUSY: Listed = Listed::Present {
        online: true,
        busy: true,
    };

    #[test]
    fn a_registration_goes_minted_online_busy_done() {
        let ok = Verdict::Admitted;
        assert_eq!(
            watch(&reg(State::Minted), OFFLINE, &ok, NOW).state,
            State::Minted
        );
        let online = watch(&reg(State::Minted), IDLE_ONLINE, &ok, NOW);
        assert_eq!((online.state, online.withdraw), (State::Online, None));
        assert_eq!(
            watch(&reg(State::Online), BUSY, &ok, NOW).state,
            State::Busy
        );
        let gone = watch(&reg(State::Busy), Listed::Absent, &ok, NOW);
        assert_eq!((gone.state, gone.withdraw), (State::Done, None));
        let over = watch(&reg(State::Busy), OFFLINE, &ok, NOW);
        assert_eq!(over.withdraw.unwrap().reason, "done");
    }

    #[test]
    fn an_idle_registration_of_a_refused_runner_is_withdrawn_at_once_but_never_a_busy_one() {
        for state in [State::Minted, State::Online] {
            for listed in [IDLE_ONLINE, OFFLINE] {
                let w = watch(&reg(state), listed, &refused(), NOW);
                assert_eq!(
                    w.withdraw.unwrap().reason,
                    "probe_failed",
                    "{state:?} {listed:?}"
                );
            }
            let busy = watch(&reg(state), BUSY, &refused(), NOW);
            assert_eq!((busy.state, busy.withdraw), (State::Busy, None));
        }
    }

    #[test]
    fn an_observing_pool_notes_what_it_would_withdraw_once_and_withdraws_nothing() {
        let observed = Verdict::Observed {
            code: "image_drift".into(),
            detail: "runs another image".into(),
        };
        let first = watch(&reg(State::Online), IDLE_ONLINE, &observed, NOW);
        assert_eq!(first.withdraw, None);
        assert_eq!(first.observed.unwrap().reason, "image_drift");
        let mut noted = reg(State::Online);
        noted.observed_code = Some("image_drift".into());
        let again = watch(&noted, IDLE_ONLINE, &observed, NOW);
        assert_eq!((again.withdraw, again.observed), (None, None));
    }

    #[test]
    fn unused_registrations_are_withdrawn_after_their_expiry_and_vanished_listeners_at_once() {
        let ok = Verdict::Admitted;
        let mut old = reg(State::Minted);
        old.minted_at = NOW.minus_secs(300);
        old.expires_at = NOW;
        let w = watch(&old, OFFLINE, &ok, NOW).withdraw.unwrap();
        assert_eq!(w.reason, "unused");
        assert!(w.detail.contains("300 s"), "{}", w.detail);
        assert_eq!(watch(&old, IDLE_ONLINE, &ok, NOW).withdraw, None);
        let went = watch(&reg(State::Online), OFFLINE, &ok, NOW);
        assert_eq!(went.withdraw.unwrap().reason, "offline");
        assert_eq!(
            watch(&reg(State::Minted), Listed::Absent, &ok, NOW).state,
            State::Done
        );
    }

    #[test]
    fn names_fit_githubs_limit_and_keep_the_machines_name_in_front() {
        assert_eq!(registration_name("build-01", 0x2a), "build-01-0000002a");
        assert_eq!(registration_name("häus 7", 1), "h-us-7-00000001");
        assert_eq!(registration_name("///", 1), "runner-00000001");
    }

    proptest! {
        #[test]
        fn every_name_fits_in_64_characters_of_what_github_takes(name in "\\PC{0,200}", suffix: u32) {
            let n = registration_name(&name, suffix);
            prop_assert!(n.chars().count() <= MAX_NAME_CHARS);
            prop_assert!(n.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')));
            let expected_suffix = format!("-{suffix:08x}");
            prop_assert!(n.ends_with(&expected_suffix));
        }
    }
}

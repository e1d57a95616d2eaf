//! The lease state machine: what each lease call, expiry and revocation does to a lease and its
//! job, as pure functions.
//!
//! The store loads the lease and its job inside a transaction, asks `apply_call` or `end` what
//! to do, and writes the result fenced by the lease id and its prior state, so that a late call
//! from an expired lease can never complete or extend a job that moved on.

use super::ejection::{FailureReason, JobEnd};
use super::ids::{JobId, LeaseId, RunnerId};
use super::job::{EventKind, JobState};
use super::pool_name::PoolName;
use super::time::Millis;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Granted; the job has not started a step.
    Leased,
    /// Started: an attempt is used.
    Running,
    Completed,
    Abandoned,
    Expired,
    /// Ended because the job was cancelled by the forge.
    Cancelled,
    /// Ended because its runner was revoked.
    Revoked,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Leased => "leased",
            LeaseState::Running => "running",
            LeaseState::Completed => "completed",
            LeaseState::Abandoned => "abandoned",
            LeaseState::Expired => "expired",
            LeaseState::Cancelled => "cancelled",
            LeaseState::Revoked => "revoked",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            LeaseState::Leased,
            LeaseState::Running,
            LeaseState::Completed,
            LeaseState::Abandoned,
            LeaseState::Expired,
            LeaseState::Cancelled,
            LeaseState::Revoked,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    pub fn is_live(self) -> bool {
        matches!(self, LeaseState::Leased | LeaseState::Running)
    }
}

/// A lease as the lease calls answer it.
#[derive(Clone, Debug, PartialEq)]
pub struct Lease {
    pub id: LeaseId,
    pub job_id: JobId,
    pub runner_id: RunnerId,
    pub pool: PoolName,
    pub state: LeaseState,
    /// The attempt number this lease is (or will be, once started).
    pub attempt: i64,
    pub granted_at: Millis,
    pub started_at: Option<Millis>,
    pub expires_at: Millis,
    pub ended_at: Option<Millis>,
}

impl Lease {
    /// The lease a claim grants at `now` on a job that has used `attempts`: the attempt it will
    /// be once started (none is used until then), alive for `ttl_s` without an `extend`.
    pub fn granted(
        id: LeaseId,
        job_id: JobId,
        runner_id: RunnerId,
        pool: PoolName,
        attempts: i64,
        now: Millis,
        ttl_s: i64,
    ) -> Lease {
        Lease {
            id,
            job_id,
            runner_id,
            pool,
            state: LeaseState::Leased,
            attempt: attempts + 1,
            granted_at: now,
            started_at: None,
            expires_at: now.plus_secs(ttl_s),
            ended_at: None,
        }
    }
}

/// How a finished job ended, as the runner reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    /// An infrastructure failure after start: requeue while attempts remain.
    Errored,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Errored => "errored",
        }
    }
}

/// A runner's call on its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseCall {
    Start {
        ttl_s: i64,
    },
    Extend {
        ttl_s: i64,
    },
    Complete {
        outcome: Outcome,
        exit_code: Option<i64>,
        message: Option<String>,
    },
    Abandon {
        reason: Option<String>,
        message: Option<String>,
    },
}

impl LeaseCall {
    /// Whether the call's transition may quarantine the lease's runner (an abandon does), so
    /// that the store takes the runner's row lock first, in the one lock order.
    pub fn may_quarantine(&self) -> bool {
        matches!(self, LeaseCall::Abandon { .. })
    }

    /// What the call says of its runner's machine, if it ends the job there
    /// (`domain::ejection`): `errored` and an abandon are its failures; `succeeded` and
    /// `failed` mean it ran the job to its end.
    pub fn job_end(&self) -> Option<JobEnd> {
        match self {
            LeaseCall::Complete {
                outcome: Outcome::Errored,
                ..
            } => Some(JobEnd::Infrastructure(FailureReason::Errored)),
            LeaseCall::Complete { .. } => Some(JobEnd::RanToEnd),
            LeaseCall::Abandon { .. } => Some(JobEnd::Infrastructure(FailureReason::Abandoned)),
            LeaseCall::Start { .. } | LeaseCall::Extend { .. } => None,
        }
    }
}

/// The part of a lease and its job that the rules look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub lease_state: LeaseState,
    pub expires_at: Millis,
    pub attempts: i64,
    pub max_attempts: i64,
    pub returns: i64,
}

/// Why a lease call cannot proceed; each maps to one stable `code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseCallError {
    #[error("the lease has expired")]
    Expired,
    #[error("the lease is finished")]
    Finished,
    #[error("the lease has already started")]
    Started,
    #[error("the lease has not started; use abandon to give the job back")]
    NotStarted,
    #[error("the job was cancelled by the forge")]
    JobCancelled,
    #[error("the runner holding this lease was revoked")]
    RunnerRevoked,
}

impl LeaseCallError {
    pub fn code(self) -> &'static str {
        match self {
            LeaseCallError::Expired => "lease_expired",
            LeaseCallError::Finished => "lease_finished",
            LeaseCallError::Started => "lease_started",
            LeaseCallError::NotStarted => "lease_not_started",
            LeaseCallError::JobCancelled => "job_cancelled",
            LeaseCallError::RunnerRevoked => "runner_revoked",
        }
    }
}

/// Everything a transition writes: the new lease and job fields and one story event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub lease_state: LeaseState,
    pub expires_at: Millis,
    pub job_state: JobState,
    pub attempts: i64,
    pub returns: i64,
    /// `Some` replaces the job's last error.
    pub last_error: Option<String>,
    /// `None` for a call that tells no story (extend).
    pub event: Option<(EventKind, Option<String>, Option<String>)>,
    /// An abandon quarantines the runner until it posts a newer passing probe.
    pub quarantine_runner: bool,
    /// An abandoned job is held from the runner that gave it back for this long
    /// (`ABANDON_HOLD_S`); any other runner may take it at once.
    pub hold_from_runner_until: Option<Millis>,
}

/// How long a job a runner abandoned is not handed back to that runner: long enough that a
/// runner which gave it back for want of space (and cleared it) does not take the same job
/// again within the second, short enough that a one-runner pool loses little.
pub const ABANDON_HOLD_S: i64 = 60;

impl Transition {
    /// Whether the job leaves the lease (back to the queue or finished).
    pub fn releases_job(&self) -> bool {
        !self.lease_state.is_live()
    }
}

/// The rules for a call on a lease in state `s` at `now`.
pub fn apply_call(
    call: &LeaseCall,
    s: Snapshot,
    now: Millis,
) -> Result<Transition, LeaseCallError> {
    match s.lease_state {
        LeaseState::Expired => return Err(LeaseCallError::Expired),
        LeaseState::Revoked => return Err(LeaseCallError::RunnerRevoked),
        LeaseState::Cancelled => return Err(LeaseCallError::JobCancelled),
        LeaseState::Completed | LeaseState::Abandoned => return Err(LeaseCallError::Finished),
        LeaseState::Leased | LeaseState::Running => {}
    }
    // The sweeper may not have run yet: a lease past its expiry is expired all the same.
    if now >= s.expires_at {
        return Err(LeaseCallError::Expired);
    }
    let started = s.lease_state == LeaseState::Running;
    let keep = |lease_state, expires_at, job_state| Transition {
        lease_state,
        expires_at,
        job_state,
        attempts: s.attempts,
        returns: s.returns,
        last_error: None,
        event: None,
        quarantine_runner: false,
        hold_from_runner_until: None,
    };
    match call {
        LeaseCall::Start { ttl_s } => {
            if started {
                return Err(LeaseCallError::Started);
            }
            let mut t = keep(
                LeaseState::Running,
                now.plus_secs(*ttl_s),
                JobState::Running,
            );
            t.attempts = s.attempts + 1;
            t.event = Some((
                EventKind::Started,
                None,
                Some(format!("attempt {}", t.attempts)),
            ));
            Ok(t)
        }
        LeaseCall::Extend { ttl_s } => {
            let job_state = if started {
                JobState::Running
            } else {
                JobState::Leased
            };
            Ok(keep(s.lease_state, now.plus_secs(*ttl_s), job_state))
        }
        LeaseCall::Complete {
            outcome,
            exit_code,
            message,
        } => {
            if !started {
                return Err(LeaseCallError::NotStarted);
            }
            let detail = describe(message.as_deref(), *exit_code);
            let mut t = keep(LeaseState::Completed, now, JobState::Succeeded);
            match outcome {
                Outcome::Succeeded => {
                    t.event = Some((EventKind::Completed, Some("succeeded".into()), detail));
                }
                Outcome::Failed => {
                    t.job_state = JobState::Failed;
                    t.last_error = Some(detail.clone().unwrap_or_else(|| "failed".into()));
                    t.event = Some((EventKind::Completed, Some("failed".into()), detail));
                }
                Outcome::Errored => {
                    t.last_error = Some(detail.clone().unwrap_or_else(|| "errored".into()));
                    if s.attempts < s.max_attempts {
                        t.job_state = JobState::Queued;
                        t.event = Some((EventKind::Requeued, Some("errored".into()), detail));
                    } else {
                        t.job_state = JobState::Failed;
                        t.event = Some((EventKind::Failed, Some("errored".into()), detail));
                    }
                }
            }
            Ok(t)
        }
        LeaseCall::Abandon { reason, message } => {
            if started {
                return Err(LeaseCallError::Started);
            }
            let mut t = keep(LeaseState::Abandoned, now, JobState::Queued);
            t.returns = s.returns + 1;
            let why = reason.clone().unwrap_or_else(|| "abandoned".into());
            t.event = Some((
                EventKind::Returned,
                Some(format!("abandoned: {why}")),
                message.clone(),
            ));
            t.quarantine_runner = true;
            t.hold_from_runner_until = Some(now.plus_secs(ABANDON_HOLD_S));
            Ok(t)
        }
    }
}

/// Why a live lease ends without a call from its runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndCause {
    /// No `extend` in time.
    Expired,
    /// Its runner was revoked.
    RunnerRevoked,
}

/// A live lease ended by expiry or revocation: before start the job returns for free; after
/// start the attempt stays used and the job is requeued while attempts remain, else `failed`.
pub fn end(cause: EndCause, s: Snapshot, now: Millis) -> Transition {
    let (lease_state, reason) = match cause {
        EndCause::Expired => (LeaseState::Expired, "lease_expired"),
        EndCause::RunnerRevoked => (LeaseState::Revoked, "runner_revoked"),
    };
    let mut t = Transition {
        lease_state,
        expires_at: s.expires_at.min(now),
        job_state: JobState::Queued,
        attempts: s.attempts,
        returns: s.returns,
        last_error: None,
        event: None,
        quarantine_runner: false,
        hold_from_runner_until: None,
    };
    if s.lease_state == LeaseState::Leased {
        t.returns += 1;
        t.event = Some((EventKind::Returned, Some(reason.into()), None));
    } else {
        t.last_error = Some(reason.into());
        if s.attempts < s.max_attempts {
            t.event = Some((EventKind::Requeued, Some(reason.into()), None));
        } else {
            t.job_state = JobState::Failed;
            t.event = Some((EventKind::Failed, Some(reason.into()), None));
        }
    }
    t
}

fn describe(message: Option<&str>, exit_code: Option<i64>) -> Option<String> {
    match (message, exit_code) {
        (Some(m), Some(c)) => Some(format!("{m} (exit {c})")),
        (Some(m), None) => Some(m.to_string()),
        (None, Some(c)) => Some(format!("exit {c}")),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: Millis = Millis(1_800_000_000_000);

    fn snap(state: LeaseState, attempts: i64, max: i64) -> Snapshot {
        Snapshot {
            lease_state: state,
            expires_at: NOW.plus_secs(60),
            attempts,
            max_attempts: max,
            returns: 0,
        }
    }

    fn complete(outcome: Outcome) -> LeaseCall {
        LeaseCall::Complete {
            outcome,
            exit_code: Some(1),
            message: None,
        }
    }

    #[test]
    fn start_uses_an_attempt_and_renews_the_ttl() {
        let t = apply_call(
            &LeaseCall::Start { ttl_s: 300 },
            snap(LeaseState::Leased, 0, 3),
            NOW,
        )
        .unwrap();
        assert_eq!(
            (t.lease_state, t.job_state, t.attempts),
            (LeaseState::Running, JobState::Running, 1)
        );
        assert_eq!(t.expires_at, NOW.plus_secs(300));
        let again = apply_call(
            &LeaseCall::Start { ttl_s: 300 },
            snap(LeaseState::Running, 1, 3),
            NOW,
        );
        assert_eq!(again, Err(LeaseCallError::Started));
    }

    #[test]
    fn abandon_before_start_is_free_and_quarantines() {
        let call = LeaseCall::Abandon {
            reason: Some("no_space".into()),
            message: None,
        };
        let t = apply_call(&call, snap(LeaseState::Leased, 1, 3), NOW).unwrap();
        assert_eq!(
            (t.job_state, t.attempts, t.returns),
            (JobState::Queued, 1, 1)
        );
        assert!(t.quarantine_runner);
        assert_eq!(
            t.hold_from_runner_until,
            Some(NOW.plus_secs(ABANDON_HOLD_S))
        );
        assert_eq!(
            apply_call(&call, snap(LeaseState::Running, 1, 3), NOW),
            Err(LeaseCallError::Started)
        );
    }

    #[test]
    fn complete_needs_a_start() {
        assert_eq!(
            apply_call(
                &complete(Outcome::Succeeded),
                snap(LeaseState::Leased, 0, 3),
                NOW
            ),
            Err(LeaseCallError::NotStarted)
        );
        let t = apply_call(
            &complete(Outcome::Succeeded),
            snap(LeaseState::Running, 1, 3),
            NOW,
        )
        .unwrap();
        assert_eq!(t.job_state, JobState::Succeeded);
        let t = apply_call(
            &complete(Outcome::Failed),
            snap(LeaseState::Running, 1, 3),
            NOW,
        )
        .unwrap();
        assert_eq!(t.job_state, JobState::Failed);
        assert_eq!(t.last_error.as_deref(), Some("exit 1"));
    }

    #[test]
    fn errored_requeues_while_attempts_remain() {
        let t = apply_call(
            &complete(Outcome::Errored),
            snap(LeaseState::Running, 2, 3),
            NOW,
        )
        .unwrap();
        assert_eq!(
            (t.job_state, t.attempts, t.returns),
            (JobState::Queued, 2, 0)
        );
        let t = apply_call(
            &complete(Outcome::Errored),
            snap(LeaseState::Running, 3, 3),
            NOW,
        )
        .unwrap();
        assert_eq!(t.job_state, JobState::Failed);
    }

    #[test]
    fn finished_leases_answer_with_their_fate() {
        let extend = LeaseCall::Extend { ttl_s: 10 };
        let cases = [
            (LeaseState::Expired, LeaseCallError::Expired),
            (LeaseState::Revoked, LeaseCallError::RunnerRevoked),
            (LeaseState::Cancelled, LeaseCallError::JobCancelled),
            (LeaseState::Completed, LeaseCallError::Finished),
            (LeaseState::Abandoned, LeaseCallError::Finished),
        ];
        for (state, err) in cases {
            assert_eq!(apply_call(&extend, snap(state, 1, 3), NOW), Err(err));
        }
        let mut past = snap(LeaseState::Running, 1, 3);
        past.expires_at = NOW;
        assert_eq!(apply_call(&extend, past, NOW), Err(LeaseCallError::Expired));
    }

    #[test]
    fn expiry_before_start_is_free_after_start_keeps_the_attempt() {
        let t = end(EndCause::Expired, snap(LeaseState::Leased, 1, 3), NOW);
        assert_eq!(
            (t.job_state, t.attempts, t.returns),
            (JobState::Queued, 1, 1)
        );
        let t = end(EndCause::Expired, snap(LeaseState::Running, 1, 3), NOW);
        assert_eq!(
            (t.job_state, t.attempts, t.returns),
            (JobState::Queued, 1, 0)
        );
        assert_eq!(t.last_error.as_deref(), Some("lease_expired"));
        let t = end(EndCause::Expired, snap(LeaseState::Running, 3, 3), NOW);
        assert_eq!(t.job_state, JobState::Failed);
        let t = end(EndCause::RunnerRevoked, snap(LeaseState::Leased, 0, 3), NOW);
        assert_eq!(
            (t.lease_state, t.job_state, t.returns),
            (LeaseState::Revoked, JobState::Queued, 1)
        );
    }

    fn any_call() -> impl Strategy<Value = LeaseCall> {
        prop_oneof![
            (1i64..100).prop_map(|ttl_s| LeaseCall::Start { ttl_s }),
            (1i64..100).prop_map(|ttl_s| LeaseCall::Extend { ttl_s }),
            prop_oneof![
                Just(Outcome::Succeeded),
                Just(Outcome::Failed),
                Just(Outcome::Errored)
            ]
            .prop_map(|outcome| LeaseCall::Complete {
                outcome,
                exit_code: None,
                message: None
            }),
            Just(LeaseCall::Abandon {
                reason: None,
                message: None
            }),
        ]
    }

    proptest! {
        /// Over any sequence of calls, leases and expiries, attempts equal the starts that
        /// succeeded, never exceed max_attempts, and a job is final or queued exactly when no
        /// lease is live.
        #[test]
        fn attempts_equal_starts(steps in proptest::collection::vec((any_call(), any::<bool>()), 1..60), max in 1i64..5) {
            let mut job = JobState::Queued;
            let (mut attempts, mut returns, mut starts) = (0i64, 0i64, 0i64);
            let mut lease: Option<Snapshot> = None;
            for (call, expire) in steps {
                match lease {
                    None if job == JobState::Queued => {
                        lease = Some(Snapshot { lease_state: LeaseState::Leased, expires_at: NOW.plus_secs(60), attempts, max_attempts: max, returns });
                        job = JobState::Leased;
                    }
                    None => break,
                    Some(s) => {
                        let t = if expire { Ok(end(EndCause::Expired, s, NOW)) } else { apply_call(&call, s, NOW) };
                        if let Ok(t) = t {
                            // The store takes the runner's lock first only for such calls.
                            prop_assert!(!t.quarantine_runner || (!expire && call.may_quarantine()));
                            if matches!(call, LeaseCall::Start { .. }) && !expire { starts += 1; }
                            prop_assert!(t.attempts >= attempts && t.returns >= returns);
                            attempts = t.attempts;
                            returns = t.returns;
                            job = t.job_state;
                            lease = if t.releases_job() { None } else { Some(Snapshot { lease_state: t.lease_state, expires_at: t.expires_at, attempts, max_attempts: max, returns }) };
                            prop_assert_eq!(lease.is_none(), job == JobState::Queued || job.is_final());
                        }
                    }
                }
                prop_assert_eq!(attempts, starts);
                prop_assert!(attempts <= max);
            }
        }
    }
}

//! The heartbeat loop: probe, sign, post, on the service's schedule, until the service says to
//! recycle, revokes the runner, or the process is told to stop.
//!
//! Why re-probe every time: the point of a heartbeat is that a runner that loses its runtime
//! mid-life stops being leased to, so each beat must carry a probe as fresh as the beat. Why
//! back off with jitter: after an outage, a fleet that retried in lockstep would hammer the
//! service the moment it came back. Why a refusal for the clock is not an exit: the key is
//! fine and time sync will catch up, so the loop keeps the offset in the journal at WARN and
//! tries again when the service says to (`Retry-After`), or at the next beat.
//!
//! A failed probe (or a runner the service would not lease to) is logged at WARN, so that
//! `journalctl -p warning` shows it; the beat after it that passes says so at INFO. "Recycle"
//! ends the loop once per expected image set (`recycle`).
//!
//! Given the forge runners' files, every beat reads them anew and claims what they name
//! (`forge_runners`): the service rebinds the runner when that changed, so a renewed GitLab
//! token or a re-registered Forgejo runner is gated within one beat, with no operator.

use super::attestation;
use super::client::{AgentClient, ClientError, HeartbeatAnswer};
use super::clock;
use super::exit::Exit;
use super::forge_runners::ForgeFiles;
use super::keys::RunnerKey;
use super::probe::{self, ProbeReport, ProbeSpec};
use super::problem::Problem;
use super::recycle::Recycler;
use super::state::RunnerState;
use crate::domain::forge::ForgeRunner;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Exponential backoff with jitter: `base`, doubling, capped at `cap`, each delay ±`jitter`.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
    jitter: f64,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration, jitter: f64) -> Self {
        Backoff {
            base,
            cap,
            next: base,
            jitter,
        }
    }

    /// 1 s doubling to 60 s, ±20 %.
    pub fn standard() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(60), 0.2)
    }

    /// The next delay; `unit` is a uniform random number in [0, 1) (a parameter so that tests
    /// can pin it).
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.cap);
        d.mul_f64(1.0 + self.jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0))
    }

    pub fn reset(&mut self) {
        self.next = self.base;
    }
}

/// What the loop does after a failed post.
#[derive(Debug)]
enum AfterError<'a> {
    /// Again, after the backoff's next delay.
    Retry,
    /// Refused for this machine's clock: again after the service's `Retry-After` or the
    /// heartbeat interval, with the offset logged.
    Clock(&'a Problem),
    Stop(Exit),
}

fn judge_error(e: &ClientError, offset: Option<clock::ClockOffset>) -> AfterError<'_> {
    match e {
        ClientError::Unreachable { .. } => AfterError::Retry,
        ClientError::Problem(p) if p.code == "runner_revoked" => AfterError::Stop(Exit::Revoked),
        ClientError::Problem(p) if clock::is_clock_refusal(p, offset) => AfterError::Clock(p),
        ClientError::Problem(p) if p.is_server_side() => AfterError::Retry,
        // Both are about time, not identity: a clock being corrected, a retried request.
        ClientError::Problem(p)
            if p.code == "attestation_expired" || p.code == "attestation_replayed" =>
        {
            AfterError::Retry
        }
        ClientError::Unexpected { status, .. } if *status >= 500 => AfterError::Retry,
        // attestation_invalid (a key or state that does not match the service), bad_request:
        // retrying the same thing cannot succeed.
        _ => AfterError::Stop(Exit::Error),
    }
}

/// How long to wait after a refusal for the clock: the service's `Retry-After`, else the
/// heartbeat interval; never less than a second nor more than ten minutes.
fn clock_retry_delay(p: &Problem, interval_s: u64) -> Duration {
    Duration::from_secs(p.retry_after_s.unwrap_or(interval_s).clamp(1, 600))
}

/// The WARN line for a refusal for the clock: the offset (as measured, or as the service
/// words it) and what to fix.
pub fn log_clock_refusal(p: &Problem, offset: Option<clock::ClockOffset>, retry: Option<Duration>) {
    let measured = offset.map_or_else(
        || "off (no Date header to measure it by)".to_string(),
        |o| o.to_string(),
    );
    let then = retry.map_or_else(
        || "not retrying".to_string(),
        |d| format!("retrying in {} s", d.as_secs()),
    );
    tracing::warn!(
        code = %p.code,
        offset_s = offset.map(|o| o.runner_ahead_ms as f64 / 1000.0),
        retry_in_s = retry.map(|d| d.as_secs()),
        detail = %p.detail,
        "refused for this machine's clock: clock is {measured}; fix its time sync (NTP); {then}",
    );
}

/// Signs `report` and posts it as one heartbeat.
pub async fn post(
    client: &AgentClient,
    key: &RunnerKey,
    state: &RunnerState,
    report: &ProbeReport,
) -> Result<HeartbeatAnswer, ClientError> {
    client
        .heartbeat(&attestation::sign(key, state, report))
        .await
}

/// What the heartbeat loop works with.
pub struct Beat<'a> {
    pub client: &'a AgentClient,
    pub key: &'a RunnerKey,
    pub state: &'a RunnerState,
    pub spec: &'a ProbeSpec,
    /// The forge runners' files, read before every beat and claimed (none named: no claim).
    pub forge: &'a ForgeFiles,
}

/// The forge runners to claim in the next beat: read from their files now, so that a renewed
/// token or a new registration is bound within one beat. A file that cannot be read (a runner
/// being re-registered, a file being rewritten) means no claim this beat, which leaves the
/// bindings as they are: said at WARN when the trouble starts or changes, at INFO when it ends.
fn forge_claim(files: &ForgeFiles, trouble: &mut Option<String>) -> Option<Vec<ForgeRunner>> {
    if !files.any() {
        return None;
    }
    match files.read() {
        Ok(found) => {
            if trouble.take().is_some() {
                tracing::info!(
                    forge_runners = found.len(),
                    "the forge runners' files are readable again"
                );
            }
            Some(found)
        }
        Err(e) => {
            if trouble.as_deref() != Some(e.as_str()) {
                tracing::warn!(
                    error = %e,
                    "cannot read the forge runners' files: heartbeats claim no forge runners (the bindings stay as they are) until they can be read"
                );
                *trouble = Some(e);
            }
            None
        }
    }
}

/// The one line per accepted heartbeat: WARN when the probe failed or the service would not
/// lease to the runner (`status` other than `healthy`), INFO otherwise.
pub fn log_answer(report: &ProbeReport, answer: &HeartbeatAnswer) {
    macro_rules! line {
        ($level:expr) => {
            tracing::event!(
                $level,
                runner_id = %answer.runner_id,
                status = %answer.status,
                action = %answer.action.as_str(),
                image_current = %answer.image_current.map_or("unknown", |c| if c { "true" } else { "false" }),
                image_id = %report.image.as_ref().and_then(|i| i.id.as_deref()).unwrap_or("-"),
                next_heartbeat_s = answer.next_heartbeat_s,
                detail = %answer.detail.as_deref().unwrap_or("-"),
                "heartbeat: {}",
                report.summary(),
            )
        };
    }
    if report.ok() && answer.status == "healthy" {
        line!(tracing::Level::INFO);
    } else {
        line!(tracing::Level::WARN);
    }
}

/// Runs heartbeats until told to stop. With `once`, posts one and returns: `Ok` when accepted
/// with a passing probe, `Failed` when the probe failed (and was reported).
pub async fn run(
    beat: &Beat<'_>,
    recycler: &mut Recycler,
    once: bool,
    stop: CancellationToken,
) -> Exit {
    let Beat {
        client,
        key,
        state,
        spec,
        forge,
    } = *beat;
    let mut backoff = Backoff::standard();
    let mut interval_s = state.heartbeat_interval_s.max(1);
    let mut failing = false;
    let mut forge_trouble = None;
    loop {
        let report = tokio::select! {
            r = probe::run(spec) => r,
            () = stop.cancelled() => return Exit::Ok,
        };
        if report.ok() && failing {
            tracing::info!("the runtime works again: {}", report.summary());
        }
        failing = !report.ok();
        let claim = forge_claim(forge, &mut forge_trouble);
        let signed = attestation::sign_claiming(key, state, &report, claim.as_deref());
        let result = tokio::select! {
            r = client.heartbeat(&signed) => r,
            () = stop.cancelled() => return Exit::Ok,
        };
        let delay = match result {
            Ok(answer) => {
                backoff.reset();
                log_answer(&report, &answer);
                let running = report.image.as_ref().and_then(|i| i.id.as_deref());
                if let Some(exit) = recycler.after(&answer, running) {
                    return exit;
                }
                if once {
                    return if report.ok() { Exit::Ok } else { Exit::Failed };
                }
                interval_s = answer.next_heartbeat_s.max(1);
                // Early rather than late, so that jitter never makes a runner look stale.
                Duration::from_secs(interval_s).mul_f64(1.0 - 0.1 * rand::random::<f64>())
            }
            Err(e) => match judge_error(&e, client.clock_offset()) {
                AfterError::Stop(exit) => {
                    tracing::error!(error = %e, "heartbeat refused; exiting with status {}", exit as u8);
                    return exit;
                }
                AfterError::Clock(p) => {
                    if once {
                        log_clock_refusal(p, client.clock_offset(), None);
                        return Exit::Failed;
                    }
                    let d = clock_retry_delay(p, interval_s);
                    log_clock_refusal(p, client.clock_offset(), Some(d));
                    d
                }
                AfterError::Retry if once => {
                    tracing::error!(error = %e, "heartbeat not delivered");
                    return Exit::Error;
                }
                AfterError::Retry => {
                    let d = backoff.next_delay(rand::random());
                    tracing::warn!(error = %e, retry_in_ms = d.as_millis() as u64, "heartbeat not delivered; retrying");
                    d
                }
            },
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => return Exit::Ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problem(status: u16, code: &str, detail: &str, retry_after_s: Option<u64>) -> ClientError {
        ClientError::Problem(Problem {
            status,
            code: code.into(),
            detail: detail.into(),
            retry_after_s,
            raw: json!({"code": code, "detail": detail}),
        })
    }

    #[test]
    fn clock_refusals_are_retried_and_key_refusals_stop() {
        let far = Some(clock::ClockOffset {
            runner_ahead_ms: 612_000,
        });
        let judged = |e: &ClientError, o| match judge_error(e, o) {
            AfterError::Retry => "retry".to_string(),
            AfterError::Clock(p) => format!("clock {}", p.code),
            AfterError::Stop(exit) => format!("stop {}", exit as u8),
        };
        let skew = problem(
            401,
            "clock_skew",
            "the runner's clock is 612 s ahead",
            Some(7),
        );
        assert_eq!(judged(&skew, None), "clock clock_skew");
        let future = problem(
            401,
            "attestation_invalid",
            "probe.checked_at is in the future",
            None,
        );
        assert_eq!(judged(&future, far), "clock attestation_invalid");
        assert_eq!(
            judged(&future, None),
            "stop 5",
            "unmeasured, it may be the state file"
        );
        let key = problem(
            401,
            "attestation_invalid",
            "the attestation is not a valid EdDSA JWS from a registered runner",
            None,
        );
        assert_eq!(judged(&key, far), "stop 5");
        let expired = problem(
            401,
            "attestation_expired",
            "the attestation has expired",
            None,
        );
        assert_eq!(judged(&expired, None), "retry");
        assert_eq!(
            judged(&problem(403, "runner_revoked", "revoked", None), far),
            "stop 4"
        );

        let ClientError::Problem(p) = skew else {
            unreachable!()
        };
        assert_eq!(clock_retry_delay(&p, 15), Duration::from_secs(7));
        let none = Problem {
            retry_after_s: None,
            ..p.clone()
        };
        assert_eq!(clock_retry_delay(&none, 15), Duration::from_secs(15));
        let zero = Problem {
            retry_after_s: Some(0),
            ..p
        };
        assert_eq!(clock_retry_delay(&zero, 15), Duration::from_secs(1));
    }

    #[test]
    fn backoff_doubles_to_its_cap_with_bounded_jitter_and_resets() {
        let mut b = Backoff::standard();
        let mid: Vec<u64> = (0..9).map(|_| b.next_delay(0.5).as_secs()).collect();
        assert_eq!(mid, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        let low = b.next_delay(0.0);
        let high = b.next_delay(0.999_999);
        assert_eq!(low, Duration::from_secs(48));
        assert!(high > Duration::from_secs(71) && high <= Duration::from_secs(72));
        b.reset();
        assert_eq!(b.next_delay(0.5), Duration::from_secs(1));
    }
}

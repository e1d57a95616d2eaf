//! The heartbeat loop: probe, sign, post, on the service's schedule, until the service says to
//! recycle, revokes the runner, or the process is told to stop.
//!
//! Why re-probe every time: the point of a heartbeat is that a runner that loses its runtime
//! mid-life stops being leased to, so each beat must carry a probe as fresh as the beat. Why
//! back off with jitter: after an outage, a fleet that retried in lockstep would hammer the
//! service the moment it came back.
//!
//! A failed probe (or a runner the service would not lease to) is logged at WARN, so that
//! `journalctl -p warning` shows it; the beat after it that passes says so at INFO.

use super::attestation;
use super::client::{Action, AgentClient, ClientError, HeartbeatAnswer};
use super::exit::Exit;
use super::keys::RunnerKey;
use super::probe::{self, ProbeReport, ProbeSpec};
use super::state::RunnerState;
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
enum AfterError {
    Retry,
    Stop(Exit),
}

fn judge_error(e: &ClientError) -> AfterError {
    match e {
        ClientError::Unreachable { .. } => AfterError::Retry,
        ClientError::Problem(p) if p.code == "runner_revoked" => AfterError::Stop(Exit::Revoked),
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
    client: &AgentClient,
    key: &RunnerKey,
    state: &RunnerState,
    spec: &ProbeSpec,
    once: bool,
    stop: CancellationToken,
) -> Exit {
    let mut backoff = Backoff::standard();
    let mut failing = false;
    loop {
        let report = tokio::select! {
            r = probe::run(spec) => r,
            () = stop.cancelled() => return Exit::Ok,
        };
        if report.ok() && failing {
            tracing::info!("the runtime works again: {}", report.summary());
        }
        failing = !report.ok();
        let result = tokio::select! {
            r = post(client, key, state, &report) => r,
            () = stop.cancelled() => return Exit::Ok,
        };
        let delay = match result {
            Ok(answer) => {
                backoff.reset();
                log_answer(&report, &answer);
                if answer.action == Action::Recycle {
                    tracing::warn!(
                        runner_id = %answer.runner_id,
                        running = %report.image.as_ref().and_then(|i| i.id.as_deref()).unwrap_or("-"),
                        expected = %answer.expected_image_ids.join(" or "),
                        "the service asks to recycle this runner onto its pool's current image; exiting with status {}",
                        Exit::Recycle as u8
                    );
                    return Exit::Recycle;
                }
                if once {
                    return if report.ok() { Exit::Ok } else { Exit::Failed };
                }
                let interval = answer.next_heartbeat_s.max(1);
                // Early rather than late, so that jitter never makes a runner look stale.
                Duration::from_secs(interval).mul_f64(1.0 - 0.1 * rand::random::<f64>())
            }
            Err(e) => match judge_error(&e) {
                AfterError::Stop(exit) => {
                    tracing::error!(error = %e, "heartbeat refused; exiting with status {}", exit as u8);
                    return exit;
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

//! `leasegate runner github`: GitHub's runner, run one job at a time under the gate.
//!
//! The loop: probe and sign (the heartbeat's probe and image), ask leasegate for a single-use
//! GitHub registration, run `DIR/run.sh --jitconfig …` in the foreground until it exits (it
//! takes one job, then deregisters), and again. A refusal (`probe_failed`, `image_drift`, …)
//! is logged at WARN with the code and the runtime's own words, and asked again after the
//! service's `Retry-After`: the machine never registers while it is refused. While GitHub's
//! runner waits for its job, heartbeats go on, so that leasegate sees a machine that breaks
//! meanwhile and withdraws its idle registration.
//!
//! SIGTERM is handed to GitHub's runner (with `RUNNER_MANUALLY_TRAP_SIG=1`, its `run.sh`
//! passes it on to the listener, which ends its session), and the loop waits for it to exit,
//! then exits 0. A `recycle` (once per expected image set, remembered beside the state file as
//! the heartbeat remembers it, `recycle`) or a revocation heard while a job runs never stops
//! it: the loop exits (3, 4) once GitHub's runner has.

use super::attestation;
use super::client::{AgentClient, ClientError, GithubRegistration};
use super::clock;
use super::exit::Exit;
use super::heartbeat::{self, Backoff};
use super::keys::RunnerKey;
use super::probe::{self, ProbeSpec};
use super::problem::Problem;
use super::recycle::Recycler;
use super::state::RunnerState;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long to wait before asking again when the service says nothing (no `Retry-After`).
const DEFAULT_RETRY_S: u64 = 15;

/// Everything the loop runs with.
pub struct GithubRunner<'a> {
    pub client: &'a AgentClient,
    pub key: &'a RunnerKey,
    pub state: &'a RunnerState,
    pub spec: &'a ProbeSpec,
    /// GitHub's runner's directory, where `run.sh` is.
    pub runner_dir: PathBuf,
}

/// What to do after a request that got no registration.
#[derive(Debug, PartialEq, Eq)]
enum Then {
    /// Ask again after this long.
    Wait(Duration),
    /// Ask again after the backoff's next delay (the service could not be reached, or failed).
    Backoff,
    Stop(Exit),
}

/// The service's `Retry-After`, bounded to a second and ten minutes.
fn retry_after(p: &Problem) -> Duration {
    Duration::from_secs(p.retry_after_s.unwrap_or(DEFAULT_RETRY_S).clamp(1, 600))
}

/// What a failed request means for the loop, logged as an operator reading the journal needs.
fn judge(e: &ClientError, offset: Option<clock::ClockOffset>) -> Then {
    let p = match e {
        ClientError::Problem(p) => p,
        ClientError::Unexpected { status, .. } if *status >= 500 => {
            tracing::warn!(error = %e, "no GitHub registration: the service failed; retrying");
            return Then::Backoff;
        }
        ClientError::Unreachable { .. } => {
            tracing::warn!(error = %e, "no GitHub registration: the service cannot be reached; retrying");
            return Then::Backoff;
        }
        _ => {
            tracing::error!(error = %e, "no GitHub registration; exiting with status {}", Exit::Error as u8);
            return Then::Stop(Exit::Error);
        }
    };
    let wait = retry_after(p);
    match p.code.as_str() {
        "runner_revoked" => {
            tracing::error!(detail = %p.detail, "this runner is revoked; exiting with status {}", Exit::Revoked as u8);
            Then::Stop(Exit::Revoked)
        }
        "not_found" => {
            tracing::error!(detail = %p.detail, "the service mints no GitHub registrations; exiting with status {}", Exit::Error as u8);
            Then::Stop(Exit::Error)
        }
        "github_runner_outstanding" => {
            tracing::info!(detail = %p.detail, retry_in_s = wait.as_secs(), "the previous GitHub registration has not ended yet; asking again");
            Then::Wait(wait)
        }
        "github_unavailable" | "github_refused" | "pool_not_github" => {
            tracing::warn!(code = %p.code, detail = %p.detail, retry_in_s = wait.as_secs(), "no GitHub registration; asking again");
            Then::Wait(wait)
        }
        _ if clock::is_clock_refusal(p, offset) => {
            heartbeat::log_clock_refusal(p, offset, Some(wait));
            Then::Wait(wait)
        }
        "attestation_expired" | "attestation_replayed" => {
            tracing::warn!(code = %p.code, detail = %p.detail, "attestation not accepted; retrying");
            Then::Backoff
        }
        _ if p.status == 409 => {
            // Rules 7–13: the lease's refusal, with the runtime's own words for a failed probe.
            tracing::warn!(code = %p.code, detail = %p.detail, retry_in_s = wait.as_secs(), "refused: this machine gets no GitHub registration");
            Then::Wait(wait)
        }
        _ if p.is_server_side() => {
            tracing::warn!(code = %p.code, detail = %p.detail, "no GitHub registration: the service failed; retrying");
            Then::Backoff
        }
        _ => {
            tracing::error!(code = %p.code, detail = %p.detail, "no GitHub registration; exiting with status {}", Exit::Error as u8);
            Then::Stop(Exit::Error)
        }
    }
}

/// Sleeps `d`; `false` when told to stop meanwhile.
async fn pause(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = stop.cancelled() => false,
    }
}

impl GithubRunner<'_> {
    /// Runs the loop until told to stop (0), revoked (4), recycled (3, once per expected image
    /// set, as the heartbeat: `recycler`), or an error that asking again cannot mend (5).
    pub async fn run(&self, recycler: &mut Recycler, stop: CancellationToken) -> Exit {
        let run_sh = self.runner_dir.join("run.sh");
        if let Err(why) = runnable(&run_sh) {
            tracing::error!("{why}; exiting with status {}", Exit::Error as u8);
            return Exit::Error;
        }
        let mut backoff = Backoff::standard();
        loop {
            let report = tokio::select! {
                r = probe::run(self.spec) => r,
                () = stop.cancelled() => return Exit::Ok,
            };
            let attestation = attestation::sign(self.key, self.state, &report);
            let asked = tokio::select! {
                r = self.client.github_runner(&attestation) => r,
                () = stop.cancelled() => return Exit::Ok,
            };
            let wait = match asked {
                Ok(registration) => {
                    backoff.reset();
                    let after = self.run_once(&run_sh, &registration, recycler, &stop).await;
                    if stop.is_cancelled() {
                        return Exit::Ok;
                    }
                    if let Some(exit) = after {
                        return exit;
                    }
                    continue;
                }
                Err(e) => match judge(&e, self.client.clock_offset()) {
                    Then::Wait(d) => d,
                    Then::Backoff => backoff.next_delay(rand::random()),
                    Then::Stop(exit) => return exit,
                },
            };
            if !pause(wait, &stop).await {
                return Exit::Ok;
            }
        }
    }

    /// Runs GitHub's runner with `registration` until it exits, heartbeating meanwhile; what
    /// the heartbeats said to do once it has (recycle, revoked).
    async fn run_once(
        &self,
        run_sh: &Path,
        registration: &GithubRegistration,
        recycler: &mut Recycler,
        stop: &CancellationToken,
    ) -> Option<Exit> {
        tracing::info!(
            github_runner_id = registration.github_runner_id,
            name = %registration.name,
            expires_at = %registration.expires_at,
            "GitHub registration minted; starting GitHub's runner"
        );
        let mut command = tokio::process::Command::new(run_sh);
        command
            .arg("--jitconfig")
            .arg(registration.encoded_jit_config.expose())
            .current_dir(&self.runner_dir)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        // Without it, run.sh does not pass a signal on to the listener.
        if std::env::var_os("RUNNER_MANUALLY_TRAP_SIG").is_none() {
            command.env("RUNNER_MANUALLY_TRAP_SIG", "1");
        }
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(path = %run_sh.display(), error = %e, "cannot start GitHub's runner; exiting with status {}", Exit::Error as u8);
                return Some(Exit::Error);
            }
        };
        let mut after = None;
        let mut interval = Duration::from_secs(self.state.heartbeat_interval_s.max(1));
        let mut signalled = false;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                () = stop.cancelled(), if !signalled => {
                    signalled = true;
                    terminate(&child);
                }
                () = tokio::time::sleep(interval), if !signalled => {
                    let (next, heard) = self.beat(recycler).await;
                    interval = next;
                    after = after.or(heard);
                }
            }
        };
        log_exit(status, registration);
        after
    }

    /// One heartbeat while GitHub's runner waits or works: how long until the next, and what
    /// it said to do once the runner has exited.
    async fn beat(&self, recycler: &mut Recycler) -> (Duration, Option<Exit>) {
        let report = probe::run(self.spec).await;
        let interval = Duration::from_secs(self.state.heartbeat_interval_s.max(1));
        match heartbeat::post(self.client, self.key, self.state, &report).await {
            Ok(answer) => {
                heartbeat::log_answer(&report, &answer);
                let next = Duration::from_secs(answer.next_heartbeat_s.max(1));
                let running = report.image.as_ref().and_then(|i| i.id.as_deref());
                let heard = recycler.after(&answer, running);
                if heard.is_some() {
                    tracing::warn!(
                        "no more GitHub registrations once GitHub's runner exits: its job, if it has one, runs to its end"
                    );
                }
                (next, heard)
            }
            Err(e) if e.is_code("runner_revoked") => {
                tracing::error!(
                    "this runner is revoked: no more GitHub registrations once GitHub's runner exits (status {})",
                    Exit::Revoked as u8
                );
                (interval, Some(Exit::Revoked))
            }
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat not delivered while GitHub's runner runs; trying at the next");
                (interval, None)
            }
        }
    }
}

/// `run.sh` is there and may be run.
fn runnable(run_sh: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(run_sh).map_err(|e| {
        format!(
            "GitHub's runner is not at {}: {e} (--runner-dir names the directory where run.sh is)",
            run_sh.display()
        )
    })?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not an executable file", run_sh.display()));
    }
    Ok(())
}

/// Hands SIGTERM to GitHub's runner.
fn terminate(child: &tokio::process::Child) {
    use rustix::process::{Pid, Signal, kill_process};
    let Some(pid) = child.id().and_then(|id| Pid::from_raw(id as i32)) else {
        return;
    };
    tracing::info!(
        pid = child.id(),
        "SIGTERM: passed on to GitHub's runner; waiting for it"
    );
    if let Err(e) = kill_process(pid, Signal::TERM) {
        tracing::warn!(error = %e, "cannot signal GitHub's runner");
    }
}

fn log_exit(status: std::io::Result<ExitStatus>, registration: &GithubRegistration) {
    let id = registration.github_runner_id;
    match status {
        Ok(s) if s.success() => {
            tracing::info!(github_runner_id = id, "GitHub's runner exited")
        }
        Ok(s) => {
            tracing::warn!(github_runner_id = id, status = %s, "GitHub's runner exited with a failure")
        }
        Err(e) => {
            tracing::warn!(github_runner_id = id, error = %e, "cannot wait for GitHub's runner")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problem(status: u16, code: &str, retry_after_s: Option<u64>) -> ClientError {
        ClientError::Problem(Problem {
            status,
            code: code.into(),
            detail: "why".into(),
            retry_after_s,
            raw: json!({"code": code}),
        })
    }

    #[test]
    fn refusals_wait_as_told_and_what_cannot_mend_stops() {
        let wait = |s| Then::Wait(Duration::from_secs(s));
        assert_eq!(
            judge(&problem(409, "probe_failed", Some(15)), None),
            wait(15)
        );
        assert_eq!(
            judge(&problem(409, "github_runner_outstanding", Some(10)), None),
            wait(10)
        );
        assert_eq!(
            judge(&problem(503, "github_unavailable", Some(42)), None),
            wait(42)
        );
        assert_eq!(judge(&problem(502, "github_refused", None), None), wait(15));
        assert_eq!(
            judge(&problem(503, "unavailable", Some(5)), None),
            Then::Backoff
        );
        assert_eq!(
            judge(&problem(403, "runner_revoked", None), None),
            Then::Stop(Exit::Revoked)
        );
        assert_eq!(
            judge(&problem(404, "not_found", None), None),
            Then::Stop(Exit::Error)
        );
        assert_eq!(
            judge(&problem(401, "attestation_invalid", None), None),
            Then::Stop(Exit::Error)
        );
    }
}

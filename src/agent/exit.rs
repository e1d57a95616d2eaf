//! The exit statuses of `leasegate runner …`, one per thing a supervisor or a shell script
//! would do differently. docs/RUNNERS.md documents the same table.

/// How a `leasegate runner` command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Done: the probe passed, the call succeeded, the lease was granted.
    Ok = 0,
    /// The runtime cannot run a container, or the service refused the request (its problem
    /// JSON is on stderr), this machine's clock included. Under systemd this fails the unit,
    /// which is the point.
    Failed = 1,
    /// `lease`: no job came within `--wait-s`. Nothing is printed.
    NoJob = 2,
    /// `heartbeat`: the service says the runner is not on its pool's current image
    /// (`"action": "recycle"`); restart the runner on the expected image.
    Recycle = 3,
    /// The runner was revoked by an operator (403 `runner_revoked`); restarting will not help.
    Revoked = 4,
    /// The command could not do its job: bad key or state file (`preflight` only warns about
    /// those), the service unreachable, a key the service does not accept, an answer it did
    /// not understand. Retrying later may help. Never for a clock that is off: the heartbeat
    /// loop keeps retrying through that.
    Error = 5,
}

/// Usage errors (an unknown flag, a missing argument) exit with `EX_USAGE` instead of clap's
/// default 2, which `lease` uses for "no job".
pub const USAGE: u8 = 64;

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e as u8)
    }
}

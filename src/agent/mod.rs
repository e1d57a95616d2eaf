//! The runner side of the protocol: the reference runner agent behind `leasegate runner …`, and
//! a library for Rust runners that want the gate without writing a client.
//!
//! - [`probe`]: ask podman or docker whether it can run a container, and which images it runs
//!   ([`runner_images`]: those a forge runner's configuration names);
//!   [`disk`]: the free space and inodes it measures, and the thresholds that fail it.
//! - [`attestation`]: a probe report as signed claims.
//! - [`runtime_message`]: the line of a runtime's stderr that says why, unframed.
//! - [`client`]: `AgentClient`, the HTTP API with typed answers; [`net_error`]: why the service
//!   could not be reached; [`problem`]: the problem it answered with instead; [`clock`]: this
//!   machine's clock against the service's.
//! - [`heartbeat`]: the heartbeat loop and its backoff; [`recycle`]: asking for a recycle
//!   once per expected image set, remembered beside the state file.
//! - [`github_runner`]: GitHub's runner, one single-use registration (one job) at a time,
//!   only while the gate admits this machine.
//! - [`keys`], [`key_file`], [`state`]: the runner's key and what registration told it;
//!   [`file_access`]: why one of them may not be read, for the user the agent runs as.
//! - [`cli`], [`commands`], [`exit`]: the command line, what each command does, its statuses;
//!   [`journal`]: logging, with priorities journald files.

pub mod attestation;
pub mod cli;
pub mod client;
pub mod clock;
pub mod commands;
pub mod disk;
pub mod exit;
pub mod file_access;
pub mod forge_runners;
pub mod github_runner;
pub mod heartbeat;
pub mod journal;
pub mod key_file;
pub mod keys;
pub mod net_error;
pub mod probe;
pub mod problem;
pub mod recycle;
pub mod runner_images;
pub mod runtime_message;
pub mod state;

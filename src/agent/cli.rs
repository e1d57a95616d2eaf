//! The `leasegate runner …` command line (clap derive). Every flag is documented and, where a
//! systemd environment file would set it, readable from a `LEASEGATE_*` variable.
//!
//! Secrets (the registration token, the lease token) are better given through the environment
//! than as flags, which other users can see in `ps`.

use super::client::Outcome;
use super::disk::{Size, parse_percent};
use super::probe::{Depth, Runtime};
use crate::config::LogFormat;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct RunnerArgs {
    #[command(subcommand)]
    pub command: RunnerCommand,

    /// Log format on stderr.
    #[arg(long, env = "LEASEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,
}

#[derive(Subcommand, Debug)]
pub enum RunnerCommand {
    /// Make a new Ed25519 key (PKCS#8 PEM, mode 0600) and print its public JWK.
    Keygen(KeygenArgs),
    /// Register this runner's public key with a registration token from an operator.
    Register(RegisterArgs),
    /// Probe the container runtime; made for a systemd `ExecStartPre=`. Never pulls.
    Preflight(PreflightArgs),
    /// Probe and post signed heartbeats on the service's schedule.
    Heartbeat(HeartbeatArgs),
    /// Probe, then ask for a lease; print the lease JSON (exit 0), or exit 2 when no job came.
    Lease(LeaseArgs),
    /// Start a leased job: the job's attempt is used here.
    Start(LeaseCallArgs),
    /// Keep a lease alive.
    Extend(ExtendArgs),
    /// Report how a started job ended.
    Complete(CompleteArgs),
    /// Give a job back before it started, without using an attempt.
    Abandon(AbandonArgs),
    /// Run GitHub's runner under the gate: probe, get a single-use GitHub registration, run
    /// `DIR/run.sh --jitconfig …` until it exits (one job), and again; heartbeats meanwhile.
    Github(GithubArgs),
}

#[derive(Args, Debug, Clone)]
pub struct KeyArg {
    /// The runner's private key (PKCS#8 PEM). It must not be readable by group or others.
    #[arg(long, env = "LEASEGATE_RUNNER_KEY")]
    pub key: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct StateArg {
    /// The runner's state file (JSON), written by `register`.
    #[arg(long, env = "LEASEGATE_RUNNER_STATE")]
    pub state: PathBuf,
}

#[derive(Args, Debug)]
pub struct KeygenArgs {
    /// Where to write the new key. An existing file is never overwritten.
    #[arg(long, env = "LEASEGATE_RUNNER_KEY")]
    pub key: PathBuf,
}

#[derive(Args, Debug)]
pub struct RegisterArgs {
    /// The service's base URL, e.g. `https://leasegate.example`.
    #[arg(long, env = "LEASEGATE_SERVER")]
    pub server: String,

    /// The single-use registration token an operator created for the pool.
    #[arg(long, env = "LEASEGATE_REGISTRATION_TOKEN", hide_env_values = true)]
    pub registration_token: String,

    /// The runner's name, unique in its pool.
    #[arg(long, env = "LEASEGATE_RUNNER_NAME")]
    pub name: String,

    /// A label shown to operators, `key=value`; may be repeated.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,

    #[command(flatten)]
    pub forge: ForgeFileArgs,

    #[command(flatten)]
    pub key: KeyArg,

    /// Where to write the state file. An existing file is never overwritten, and the token
    /// is not spent when it exists.
    #[arg(long, env = "LEASEGATE_RUNNER_STATE")]
    pub state: PathBuf,
}

/// The forge runners' own files on this machine, for the forge gate: `register` binds what they
/// name, and `heartbeat` claims it on every beat, read anew.
#[derive(Args, Debug, Clone, Default)]
pub struct ForgeFileArgs {
    /// A Forgejo or Gitea runner's registration file (`.runner`), or forgejo-runner's
    /// `config.yaml` holding its registrations (`server.connections`, version 12 and later);
    /// may be repeated, or several joined with `:` in the variable.
    #[arg(
        long = "forgejo-runner-file",
        env = "LEASEGATE_FORGEJO_RUNNER_FILE",
        value_delimiter = ':'
    )]
    pub forgejo_runner_files: Vec<PathBuf>,

    /// gitlab-runner's `config.toml`: every `[[runners]]` in it, by the SHA-256 of its token
    /// (the token is never sent), on the machine its `.runner_system_id` names; may be
    /// repeated, or several joined with `:` in the variable.
    #[arg(
        long = "gitlab-config",
        env = "LEASEGATE_GITLAB_CONFIG",
        value_delimiter = ':'
    )]
    pub gitlab_configs: Vec<PathBuf>,

    /// A Buildkite agent's name on this machine (as Buildkite shows it, after its `%hostname`
    /// and `%spawn` are filled in): leasegate pauses it through Buildkite's API while this
    /// machine is refused; may be repeated, or several joined with `,` in the variable.
    #[arg(
        long = "buildkite-agent-name",
        env = "LEASEGATE_BUILDKITE_AGENT_NAME",
        value_delimiter = ','
    )]
    pub buildkite_agent_names: Vec<String>,

    /// A Woodpecker agent's config file (its `--agent-config`, JSON `{"agent_id": N}`, written
    /// when it registers with its server): the agent by that id; may be repeated, or several
    /// joined with `:` in the variable.
    #[arg(
        long = "woodpecker-agent-config",
        env = "LEASEGATE_WOODPECKER_AGENT_CONFIG",
        value_delimiter = ':'
    )]
    pub woodpecker_agent_configs: Vec<PathBuf>,
}

impl ForgeFileArgs {
    pub fn files(&self) -> super::forge_runners::ForgeFiles {
        super::forge_runners::ForgeFiles {
            forgejo: self.forgejo_runner_files.clone(),
            gitlab: self.gitlab_configs.clone(),
            buildkite_agents: self.buildkite_agent_names.clone(),
            woodpecker: self.woodpecker_agent_configs.clone(),
        }
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?}: expected key=value")),
    }
}

#[derive(Args, Debug, Clone)]
pub struct ProbeArgs {
    /// The container runtime: `podman`, `docker`, or a path to one. A file name containing
    /// `docker` is spoken to in docker's dialect, anything else in podman's.
    #[arg(long, env = "LEASEGATE_RUNTIME")]
    pub runtime: Runtime,

    /// An image reference the runner runs; its local image ID is reported. Never pulled. May
    /// be repeated: the first is the runner's own (`image`); every one is attested in
    /// `images`, and one not present locally is attested absent.
    #[arg(long = "image", env = "LEASEGATE_IMAGE", value_delimiter = ',')]
    pub images: Vec<String>,

    /// forgejo-runner's (or act_runner's) `config.yml`: each `runner.labels` entry
    /// `name:docker://ref` adds its image, labelled; may be repeated.
    #[arg(
        long = "forgejo-runner-config",
        env = "LEASEGATE_FORGEJO_RUNNER_CONFIG"
    )]
    pub forgejo_runner_configs: Vec<PathBuf>,

    /// gitlab-runner's `config.toml`: each `[runners.docker]` `image` and `services` adds its
    /// image; may be repeated.
    #[arg(long = "gitlab-images-config", env = "LEASEGATE_GITLAB_IMAGES_CONFIG")]
    pub gitlab_images_configs: Vec<PathBuf>,

    /// How far to probe: `info`, `create` (create and remove a container) or `run` (start one;
    /// the image must contain `true`). `create` and `run` need `--image`.
    #[arg(long, env = "LEASEGATE_PROBE_DEPTH", value_enum, default_value_t = Depth::Info)]
    pub depth: Depth,

    /// The bound on each runtime command, in seconds.
    #[arg(long, env = "LEASEGATE_PROBE_TIMEOUT_S", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub timeout_s: u64,

    /// The directory jobs run in: its disk is measured beside the runtime's storage.
    #[arg(long, env = "LEASEGATE_WORK_DIR")]
    pub work_dir: Option<PathBuf>,

    /// The probe fails when less than this is free to the runner's user on the runtime's
    /// storage or the work directory: `5GiB`, `500MB`, or a number of bytes; 0 never fails.
    #[arg(long, env = "LEASEGATE_MIN_FREE_DISK", default_value = "5GiB")]
    pub min_free_disk: Size,

    /// The probe fails when less than this percentage of either filesystem's inodes is free.
    #[arg(long, env = "LEASEGATE_MIN_FREE_INODES", default_value = "5", value_parser = parse_percent)]
    pub min_free_inodes: u8,
}

#[derive(Args, Debug)]
pub struct PreflightArgs {
    #[command(flatten)]
    pub probe: ProbeArgs,

    /// Also post the result as a signed heartbeat to this service (needs `--key` and
    /// `--state`). The exit status still reflects the probe alone: a key or state file that
    /// cannot be read, or a service that cannot be reached, is only a warning.
    #[arg(long, env = "LEASEGATE_SERVER")]
    pub server: Option<String>,

    /// The runner's private key, to sign the report.
    #[arg(long, env = "LEASEGATE_RUNNER_KEY")]
    pub key: Option<PathBuf>,

    /// The runner's state file, for its ID and audience.
    #[arg(long, env = "LEASEGATE_RUNNER_STATE")]
    pub state: Option<PathBuf>,
}

/// The runner's identity and where to reach the service.
#[derive(Args, Debug, Clone)]
pub struct ConnArgs {
    /// The service's base URL; by default the one in the state file.
    #[arg(long, env = "LEASEGATE_SERVER")]
    pub server: Option<String>,

    #[command(flatten)]
    pub key: KeyArg,

    #[command(flatten)]
    pub state: StateArg,
}

#[derive(Args, Debug)]
pub struct HeartbeatArgs {
    #[command(flatten)]
    pub probe: ProbeArgs,

    #[command(flatten)]
    pub conn: ConnArgs,

    #[command(flatten)]
    pub forge: ForgeFileArgs,

    /// Post one heartbeat and exit: 0 accepted, 1 the probe failed (or the service refused
    /// this machine's clock), 3 recycle, 4 revoked, 5 not delivered.
    #[arg(long)]
    pub once: bool,
}

#[derive(Args, Debug)]
pub struct LeaseArgs {
    #[command(flatten)]
    pub probe: ProbeArgs,

    #[command(flatten)]
    pub conn: ConnArgs,

    /// How long the service may hold the request waiting for a job (0–30 s).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=30))]
    pub wait_s: u64,
}

#[derive(Args, Debug, Clone)]
pub struct LeaseCallArgs {
    /// The service's base URL; by default the one in `--state`.
    #[arg(long, env = "LEASEGATE_SERVER")]
    pub server: Option<String>,

    /// The runner's state file, for the service's URL when `--server` is not given.
    #[arg(long, env = "LEASEGATE_RUNNER_STATE")]
    pub state: Option<PathBuf>,

    /// The lease's ID, from `lease`'s output.
    #[arg(long)]
    pub lease_id: String,

    /// The lease token, from `lease`'s output.
    #[arg(long, env = "LEASEGATE_LEASE_TOKEN", hide_env_values = true)]
    pub lease_token: String,
}

#[derive(Args, Debug)]
pub struct ExtendArgs {
    #[command(flatten)]
    pub lease: LeaseCallArgs,

    /// Keep the lease for this many seconds from now (1–3600); the service's lease TTL when
    /// omitted.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub ttl_s: Option<u64>,
}

#[derive(Args, Debug)]
pub struct CompleteArgs {
    #[command(flatten)]
    pub lease: LeaseCallArgs,

    /// `succeeded` and `failed` are final; `errored` (infrastructure failure) requeues the job
    /// while attempts remain.
    #[arg(long, value_enum)]
    pub outcome: Outcome,

    /// The job's exit status.
    #[arg(long, allow_negative_numbers = true)]
    pub exit_code: Option<i64>,

    /// A short message for the job's story.
    #[arg(long)]
    pub message: Option<String>,
}

#[derive(Args, Debug)]
pub struct AbandonArgs {
    #[command(flatten)]
    pub lease: LeaseCallArgs,

    /// Why the job is given back (a short word, e.g. `preflight_failed`).
    #[arg(long)]
    pub reason: Option<String>,

    /// A short message for the job's story.
    #[arg(long)]
    pub message: Option<String>,
}

#[derive(Args, Debug)]
pub struct GithubArgs {
    #[command(flatten)]
    pub probe: ProbeArgs,

    #[command(flatten)]
    pub conn: ConnArgs,

    /// The directory of GitHub's runner (actions/runner, unpacked; `run.sh` is in it). Not
    /// configured with `config.sh`: each registration comes from leasegate.
    #[arg(long, env = "LEASEGATE_GITHUB_RUNNER_DIR")]
    pub runner_dir: PathBuf,
}

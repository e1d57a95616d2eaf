//! Command-line and environment configuration of the service (`clap` derive; every variable
//! `LEASEGATE_*` except the conventional `DATABASE_URL`). Defaults are those of PROTOCOL.md.
//! The command line's commands are `main.rs`'s; this module knows none of them, so that the
//! service's settings depend on nothing of the agent or the bench.

use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// What the forge gate does with a fetch from a forge runner bound to no leasegate runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Default)]
pub enum ForgeUnbound {
    /// Answer "no work" (`unknown_runner`): only bound runners get jobs.
    #[default]
    Refuse,
    /// Forward it: for a fleet that adopts the gate runner by runner.
    Pass,
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to bind; the bound address is logged at start.
    #[arg(long, env = "LEASEGATE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// `sqlite://PATH` (created if missing) or `postgres://…`.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://leasegate.db")]
    pub database_url: String,

    /// The operator secret. Generated on first start when neither it nor its file is given.
    #[arg(long, env = "LEASEGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// A file holding the operator secret.
    #[arg(long, env = "LEASEGATE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// The forge secret. Generated on first start when neither it nor its file is given.
    #[arg(long, env = "LEASEGATE_FORGE_TOKEN", hide_env_values = true)]
    pub forge_token: Option<String>,

    /// A file holding the forge secret.
    #[arg(long, env = "LEASEGATE_FORGE_TOKEN_FILE")]
    pub forge_token_file: Option<PathBuf>,

    /// The admin secret being rotated out: accepted beside the current one until removed.
    #[arg(long, env = "LEASEGATE_ADMIN_TOKEN_PREVIOUS", hide_env_values = true)]
    pub admin_token_previous: Option<String>,

    /// A file holding the admin secret being rotated out.
    #[arg(long, env = "LEASEGATE_ADMIN_TOKEN_PREVIOUS_FILE")]
    pub admin_token_previous_file: Option<PathBuf>,

    /// The forge secret being rotated out: accepted beside the current one until removed.
    #[arg(long, env = "LEASEGATE_FORGE_TOKEN_PREVIOUS", hide_env_values = true)]
    pub forge_token_previous: Option<String>,

    /// A file holding the forge secret being rotated out.
    #[arg(long, env = "LEASEGATE_FORGE_TOKEN_PREVIOUS_FILE")]
    pub forge_token_previous_file: Option<PathBuf>,

    /// Days a finished job (with its events and leases) is kept.
    #[arg(long, env = "LEASEGATE_RETAIN_JOBS_DAYS", default_value_t = crate::domain::retention::DEFAULT_JOBS_DAYS)]
    pub retain_jobs_days: i64,

    /// Days refusals, attestation samples, status changes and the audit trail are kept.
    #[arg(long, env = "LEASEGATE_RETAIN_HISTORY_DAYS", default_value_t = crate::domain::retention::DEFAULT_HISTORY_DAYS)]
    pub retain_history_days: i64,

    /// The `aud` that attestations must carry.
    #[arg(long, env = "LEASEGATE_AUDIENCE", default_value = "leasegate")]
    pub audience: String,

    /// How old an attestation's `iat` may be, in seconds.
    #[arg(long, env = "LEASEGATE_ATTESTATION_MAX_AGE_S", default_value_t = 60)]
    pub attestation_max_age_s: i64,

    /// How old a probe's `checked_at` may be, in seconds.
    #[arg(long, env = "LEASEGATE_PROBE_MAX_AGE_S", default_value_t = 300)]
    pub probe_max_age_s: i64,

    /// Lease lifetime without `extend`, in seconds.
    #[arg(long, env = "LEASEGATE_LEASE_TTL_S", default_value_t = 300)]
    pub lease_ttl_s: i64,

    /// The heartbeat interval runners are told to use, in seconds.
    #[arg(long, env = "LEASEGATE_HEARTBEAT_INTERVAL_S", default_value_t = 15)]
    pub heartbeat_interval_s: i64,

    /// The cap on an attestation's `exp - iat`, in seconds.
    #[arg(
        long,
        env = "LEASEGATE_ATTESTATION_MAX_LIFETIME_S",
        default_value_t = 300
    )]
    pub attestation_max_lifetime_s: i64,

    /// Leeway for `exp`, `iat`, `nbf` and `checked_at`, in seconds.
    #[arg(long, env = "LEASEGATE_CLOCK_SKEW_S", default_value_t = 30)]
    pub clock_skew_s: i64,

    /// Request body limit, in bytes.
    #[arg(long, env = "LEASEGATE_MAX_BODY_BYTES", default_value_t = 65536)]
    pub max_body_bytes: usize,

    /// The longest a request's head (request line and headers) may take to arrive, in seconds,
    /// from its first byte (or from the connection's start).
    #[arg(long, env = "LEASEGATE_HEADER_TIMEOUT_S", default_value_t = 10)]
    pub header_timeout_s: u64,

    /// The longest a request body may pause, in seconds. After its first such span it must
    /// also average `LEASEGATE_BODY_MIN_RATE` bytes a second.
    #[arg(long, env = "LEASEGATE_BODY_TIMEOUT_S", default_value_t = 10)]
    pub body_timeout_s: u64,

    /// The slowest a request body may arrive on average, in bytes per second.
    #[arg(long, env = "LEASEGATE_BODY_MIN_RATE", default_value_t = 1024)]
    pub body_min_rate: u64,

    /// How long a kept-alive connection may wait for its next request, in seconds (and how
    /// long an answer may wait for a client that reads none of it). A waiting long poll is a
    /// request, never idle.
    #[arg(long, env = "LEASEGATE_IDLE_TIMEOUT_S", default_value_t = 75)]
    pub idle_timeout_s: u64,

    /// The most connections open at once; default: the process's file limit (raised to its
    /// hard limit at start) less room for the database and files (two thirds of that with a
    /// forge set: the rest is the forge's), at most 50000.
    #[arg(long, env = "LEASEGATE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,

    /// The most connections one peer address (an IPv6 /64) may hold; default a quarter of
    /// `LEASEGATE_MAX_CONNECTIONS`. Trusted proxies are held only to the overall cap.
    #[arg(long, env = "LEASEGATE_MAX_CONNECTIONS_PER_PEER")]
    pub max_connections_per_peer: Option<usize>,

    /// Proxies (addresses or CIDR networks, comma-separated) whose `X-Forwarded-For` and
    /// `X-Forwarded-Proto` are believed. Nobody else's are.
    #[arg(
        long,
        env = "LEASEGATE_TRUSTED_PROXIES",
        value_delimiter = ',',
        default_value = ""
    )]
    pub trusted_proxies: Vec<String>,

    /// Failed credential checks (admin, forge, page login, registration or lease tokens) one
    /// client may make in a burst before it is answered 429.
    #[arg(long, env = "LEASEGATE_AUTH_FAILURE_LIMIT", default_value_t = 20)]
    pub auth_failure_limit: u32,

    /// The span, in seconds, over which a client's failed credential checks are forgiven: one
    /// every `window / limit` seconds.
    #[arg(long, env = "LEASEGATE_AUTH_FAILURE_WINDOW_S", default_value_t = 60)]
    pub auth_failure_window_s: u64,

    /// A bearer token `/metrics` requires. Without it `/metrics` is open to anyone who can
    /// reach it.
    #[arg(long, env = "LEASEGATE_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

    /// A file holding the metrics token.
    #[arg(long, env = "LEASEGATE_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,

    /// An address of its own for `/metrics` (then not served on `LEASEGATE_LISTEN`).
    #[arg(long, env = "LEASEGATE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// A Forgejo or Gitea to gate runners in front of (`https://forge.example`): every request
    /// under `/api/actions/`, `/api/actions_pipeline/` and `/twirp/` is forwarded there, and
    /// `FetchTask` is gated.
    #[arg(long, env = "LEASEGATE_FORGEJO_UPSTREAM")]
    pub forgejo_upstream: Option<String>,

    /// A GitLab to gate runners in front of (`https://gitlab.example`): every request under
    /// `/api/v4/` is forwarded there, and `POST /api/v4/jobs/request` is gated.
    #[arg(long, env = "LEASEGATE_GITLAB_UPSTREAM")]
    pub gitlab_upstream: Option<String>,

    /// A Woodpecker server to gate agents in front of: `http://ci.example:9000` (its gRPC port,
    /// HTTP/2 cleartext) or `https://…` (HTTP/2 over TLS). Its agents connect to
    /// `LEASEGATE_WOODPECKER_LISTEN`; every call is forwarded there, and `Next` is gated.
    #[arg(long, env = "LEASEGATE_WOODPECKER_UPSTREAM")]
    pub woodpecker_upstream: Option<String>,

    /// The address Woodpecker's agents connect to (their `WOODPECKER_SERVER`): a listener of its
    /// own, HTTP/2 cleartext (gRPC); TLS belongs to a proxy in front, as for the API. Off
    /// unless set, and set exactly when `LEASEGATE_WOODPECKER_UPSTREAM` is.
    #[arg(long, env = "LEASEGATE_WOODPECKER_LISTEN")]
    pub woodpecker_listen: Option<SocketAddr>,

    /// A PEM file of CA certificates to trust for the forges, besides the system's.
    #[arg(long, env = "LEASEGATE_FORGE_CA_FILE")]
    pub forge_ca_file: Option<PathBuf>,

    /// The largest body forwarded to a forge, in bytes (artifacts run to hundreds of MB).
    #[arg(long, env = "LEASEGATE_FORGE_MAX_BODY_BYTES", default_value_t = 1 << 30)]
    pub forge_max_body_bytes: u64,

    /// What to do with a fetch from a forge runner bound to no leasegate runner.
    #[arg(long, env = "LEASEGATE_FORGE_UNBOUND", value_enum, default_value_t = ForgeUnbound::Refuse)]
    pub forge_unbound: ForgeUnbound,

    /// How long a refused GitLab runner's request is held before its "no job" (as GitLab holds
    /// it), in seconds; it is forwarded instead as soon as the runner may have work.
    #[arg(long, env = "LEASEGATE_FORGE_HOLD_S", default_value_t = 30)]
    pub forge_hold_s: u64,

    /// How long a forge may take to begin its answer once it has the request's body (and to
    /// read the body, and pause within its answer), in seconds; then 504. GitLab holds a
    /// runner's job request up to about 50 s.
    #[arg(long, env = "LEASEGATE_FORGE_TIMEOUT_S", default_value_t = 120)]
    pub forge_timeout_s: u64,

    /// GitHub's REST API: `https://api.github.com`, or GitHub Enterprise Server's
    /// `https://HOST/api/v3`.
    #[arg(
        long,
        env = "LEASEGATE_GITHUB_API_URL",
        default_value = "https://api.github.com"
    )]
    pub github_api_url: String,

    /// A GitHub App's id, to mint registrations for admitted runners with (with
    /// `LEASEGATE_GITHUB_APP_KEY_FILE` and `LEASEGATE_GITHUB_INSTALLATION_ID`).
    #[arg(long, env = "LEASEGATE_GITHUB_APP_ID")]
    pub github_app_id: Option<u64>,

    /// The GitHub App's private key (the PEM file GitHub downloads).
    #[arg(long, env = "LEASEGATE_GITHUB_APP_KEY_FILE")]
    pub github_app_key_file: Option<PathBuf>,

    /// The id of the App's installation on the organization, repository or enterprise.
    #[arg(long, env = "LEASEGATE_GITHUB_INSTALLATION_ID")]
    pub github_installation_id: Option<u64>,

    /// A GitHub token instead of an App (a fine-grained or classic personal access token).
    #[arg(long, env = "LEASEGATE_GITHUB_TOKEN", hide_env_values = true)]
    pub github_token: Option<String>,

    /// A file holding the GitHub token.
    #[arg(long, env = "LEASEGATE_GITHUB_TOKEN_FILE")]
    pub github_token_file: Option<PathBuf>,

    /// A PEM file of CA certificates to trust for GitHub's API, besides the built-in roots
    /// (GitHub Enterprise Server behind a private CA).
    #[arg(long, env = "LEASEGATE_GITHUB_CA_FILE")]
    pub github_ca_file: Option<PathBuf>,

    /// How often each scope's runners are listed to follow the registrations, in seconds.
    #[arg(long, env = "LEASEGATE_GITHUB_POLL_S", default_value_t = 10)]
    pub github_poll_s: u64,

    /// How long a registration that never comes online is kept before it is withdrawn, in
    /// seconds.
    #[arg(long, env = "LEASEGATE_GITHUB_UNUSED_TTL_S", default_value_t = 300)]
    pub github_unused_ttl_s: u64,

    /// A Buildkite API access token with the `write_agents` scope: bound Buildkite agents are
    /// paused while their runner is refused (with `LEASEGATE_BUILDKITE_ORG`).
    #[arg(long, env = "LEASEGATE_BUILDKITE_TOKEN", hide_env_values = true)]
    pub buildkite_token: Option<String>,

    /// A file holding the Buildkite API token.
    #[arg(long, env = "LEASEGATE_BUILDKITE_TOKEN_FILE")]
    pub buildkite_token_file: Option<PathBuf>,

    /// The Buildkite organization's slug (as in `https://buildkite.com/ORG`).
    #[arg(long, env = "LEASEGATE_BUILDKITE_ORG")]
    pub buildkite_org: Option<String>,

    /// Buildkite's REST API.
    #[arg(
        long,
        env = "LEASEGATE_BUILDKITE_API_URL",
        default_value = "https://api.buildkite.com"
    )]
    pub buildkite_api_url: String,

    /// How long each pause lasts unless leasegate resumes the agent first, in minutes (1 to
    /// 10080): if leasegate stops, its pauses lapse after this.
    #[arg(long, env = "LEASEGATE_BUILDKITE_PAUSE_MINUTES", default_value_t = 10)]
    pub buildkite_pause_minutes: u32,

    /// PostgreSQL: the most connections this replica opens.
    #[arg(long, env = "LEASEGATE_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,

    /// PostgreSQL: how long a request waits for a connection before answering 503, in ms.
    #[arg(long, env = "LEASEGATE_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 5000)]
    pub db_acquire_timeout_ms: u64,

    /// PostgreSQL: `statement_timeout` and `lock_timeout` of every connection, in ms.
    #[arg(
        long,
        env = "LEASEGATE_DB_STATEMENT_TIMEOUT_MS",
        default_value_t = 5000
    )]
    pub db_statement_timeout_ms: u64,

    /// The platform (`os/architecture[/variant]`) whose config digest is *the* image ID of a
    /// registry pool whose reference names a multi-platform index. Every platform's digests
    /// are accepted whatever this says.
    #[arg(
        long,
        env = "LEASEGATE_REGISTRY_PLATFORM",
        default_value = "linux/amd64"
    )]
    pub registry_platform: String,

    /// A containers auth file (podman's `auth.json`) with credentials for registries. Read
    /// afresh for every resolution.
    #[arg(long, env = "LEASEGATE_REGISTRY_AUTH_FILE")]
    pub registry_auth_file: Option<PathBuf>,

    /// The JSON of an auth file given directly (its entries win over the file's).
    #[arg(long, env = "LEASEGATE_REGISTRY_AUTH", hide_env_values = true)]
    pub registry_auth: Option<String>,

    /// Registries (`host:port`, comma-separated) reached over plain HTTP instead of TLS.
    #[arg(
        long,
        env = "LEASEGATE_INSECURE_REGISTRIES",
        value_delimiter = ',',
        default_value = ""
    )]
    pub insecure_registries: Vec<String>,

    /// Run the background resolver, which resolves every registry pool when it is due. When
    /// off, registry pools are resolved only on `POST …/resolve` and push notifications.
    #[arg(
        long,
        env = "LEASEGATE_REGISTRY_RESOLVER",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub registry_resolver: bool,

    /// The limit on each request to a registry, in seconds.
    #[arg(long, env = "LEASEGATE_REGISTRY_TIMEOUT_S", default_value_t = 30)]
    pub registry_timeout_s: u64,

    /// Consecutive failed resolutions after which a registry pool shows `resolver_failing`.
    #[arg(
        long,
        env = "LEASEGATE_RESOLVER_FAILURE_THRESHOLD",
        default_value_t = 3
    )]
    pub resolver_failure_threshold: i64,

    /// The share of a pool's live runners on a superseded image above which the pool reports
    /// `roll_stalled`.
    #[arg(long, env = "LEASEGATE_ROLL_STALLED_SHARE", default_value_t = 0.5)]
    pub roll_stalled_share: f64,

    /// SQLite: whether each commit waits for the disk.
    #[arg(long, env = "LEASEGATE_SQLITE_SYNCHRONOUS", value_enum, ignore_case = true,
        default_value_t = crate::store::sqlite::Synchronous::Normal)]
    pub sqlite_synchronous: crate::store::sqlite::Synchronous,

    /// Log format.
    #[arg(long, env = "LEASEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

impl ServeArgs {
    /// The PostgreSQL engine's connection settings.
    pub fn pg_settings(&self) -> crate::store::postgres::PgSettings {
        crate::store::postgres::PgSettings {
            max_connections: self.db_max_connections,
            acquire_timeout: std::time::Duration::from_millis(self.db_acquire_timeout_ms),
            statement_timeout: std::time::Duration::from_millis(self.db_statement_timeout_ms),
        }
    }

    /// The forge gate's settings; `None` when no forge is set. Names the variable at fault.
    pub fn forge_settings(&self) -> anyhow::Result<Option<crate::forge_gate::ForgeSettings>> {
        use crate::forge_gate::{ForgeSettings, ForwardCaps, Upstream};
        let parse = |name: &str, url: &Option<String>| -> anyhow::Result<Option<Upstream>> {
            match url.as_deref().map(str::trim).filter(|u| !u.is_empty()) {
                Some(u) => Upstream::parse(u)
                    .map(Some)
                    .map_err(|e| anyhow::anyhow!("{name}: {e}")),
                None => Ok(None),
            }
        };
        let forgejo = parse("LEASEGATE_FORGEJO_UPSTREAM", &self.forgejo_upstream)?;
        let gitlab = parse("LEASEGATE_GITLAB_UPSTREAM", &self.gitlab_upstream)?;
        let woodpecker = match self.woodpecker_upstream() {
            Some(u) => Some(
                Upstream::parse_grpc(u)
                    .map_err(|e| anyhow::anyhow!("LEASEGATE_WOODPECKER_UPSTREAM: {e}"))?,
            ),
            None => None,
        };
        match (&woodpecker, self.woodpecker_listen) {
            (Some(_), None) => anyhow::bail!(
                "LEASEGATE_WOODPECKER_UPSTREAM is set but LEASEGATE_WOODPECKER_LISTEN is not: \
                 Woodpecker's agents connect to a listener of their own (HTTP/2), say \
                 LEASEGATE_WOODPECKER_LISTEN=0.0.0.0:9000"
            ),
            (None, Some(_)) => anyhow::bail!(
                "LEASEGATE_WOODPECKER_LISTEN is set but LEASEGATE_WOODPECKER_UPSTREAM is not: \
                 name the Woodpecker server's gRPC address (http://ci.example:9000)"
            ),
            _ => {}
        }
        if forgejo.is_none() && gitlab.is_none() && woodpecker.is_none() {
            return Ok(None);
        }
        for (name, value) in [
            ("LEASEGATE_FORGE_HOLD_S", self.forge_hold_s),
            ("LEASEGATE_FORGE_TIMEOUT_S", self.forge_timeout_s),
            ("LEASEGATE_FORGE_MAX_BODY_BYTES", self.forge_max_body_bytes),
        ] {
            anyhow::ensure!(value > 0, "{name} must be positive, got {value}");
        }
        Ok(Some(ForgeSettings {
            forgejo,
            gitlab,
            woodpecker,
            woodpecker_listen: self.woodpecker_listen,
            ca_file: self.forge_ca_file.clone(),
            max_body_bytes: self.forge_max_body_bytes,
            pass_unbound: self.forge_unbound == ForgeUnbound::Pass,
            hold: std::time::Duration::from_secs(self.forge_hold_s),
            timeout: std::time::Duration::from_secs(self.forge_timeout_s),
            connections: ForwardCaps::of_sockets(forge_sockets(
                socket_budget(self.db_max_connections),
                self.listener_settings()?.caps.max_total,
            )),
        }))
    }

    /// Whether a forge is set: the forwarder then takes its share of the file limit.
    fn forge_is_set(&self) -> bool {
        [
            &self.forgejo_upstream,
            &self.gitlab_upstream,
            &self.woodpecker_upstream,
        ]
        .into_iter()
        .any(|u| u.as_deref().is_some_and(|u| !u.trim().is_empty()))
    }

    /// `LEASEGATE_WOODPECKER_UPSTREAM`, when set to something.
    fn woodpecker_upstream(&self) -> Option<&str> {
        self.woodpecker_upstream
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
    }

    /// What the listener allows its clients; names the variable at fault.
    pub fn listener_settings(&self) -> anyhow::Result<crate::listener::ListenerSettings> {
        use crate::listener::ListenerSettings;
        use crate::listener::body::BodyPace;
        use crate::listener::limits::ConnectionCaps;
        for (name, value) in [
            ("LEASEGATE_HEADER_TIMEOUT_S", self.header_timeout_s),
            ("LEASEGATE_BODY_TIMEOUT_S", self.body_timeout_s),
            ("LEASEGATE_BODY_MIN_RATE", self.body_min_rate),
            ("LEASEGATE_IDLE_TIMEOUT_S", self.idle_timeout_s),
        ] {
            anyhow::ensure!(value > 0, "{name} must be positive, got {value}");
        }
        let max_total = match self.max_connections {
            Some(n) => {
                anyhow::ensure!(n > 0, "LEASEGATE_MAX_CONNECTIONS must be positive");
                n
            }
            None => {
                default_max_connections(socket_budget(self.db_max_connections), self.forge_is_set())
            }
        };
        let max_per_peer = match self.max_connections_per_peer {
            Some(n) => {
                anyhow::ensure!(n > 0, "LEASEGATE_MAX_CONNECTIONS_PER_PEER must be positive");
                n
            }
            None => (max_total / 4).max(1),
        };
        Ok(ListenerSettings {
            caps: ConnectionCaps {
                max_total,
                max_per_peer,
            },
            trusted_proxies: self.trusted_proxy_networks()?,
            header_timeout: std::time::Duration::from_secs(self.header_timeout_s),
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_s),
            body: BodyPace {
                timeout: std::time::Duration::from_secs(self.body_timeout_s),
                min_rate: self.body_min_rate,
            },
        })
    }

    /// `LEASEGATE_TRUSTED_PROXIES` as networks (an address alone is a network of one).
    pub fn trusted_proxy_networks(&self) -> anyhow::Result<Vec<ipnet::IpNet>> {
        self.trusted_proxies
            .iter()
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse::<ipnet::IpNet>()
                    .or_else(|_| p.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "LEASEGATE_TRUSTED_PROXIES: `{p}` is not an address or a CIDR network"
                        )
                    })
            })
            .collect()
    }

    /// Rejects settings that would make the gate meaningless, with the variable's name.
    pub fn validate(&self) -> anyhow::Result<()> {
        let positive = [
            (
                "LEASEGATE_ATTESTATION_MAX_AGE_S",
                self.attestation_max_age_s,
            ),
            ("LEASEGATE_PROBE_MAX_AGE_S", self.probe_max_age_s),
            ("LEASEGATE_LEASE_TTL_S", self.lease_ttl_s),
            ("LEASEGATE_HEARTBEAT_INTERVAL_S", self.heartbeat_interval_s),
            ("LEASEGATE_RETAIN_JOBS_DAYS", self.retain_jobs_days),
            ("LEASEGATE_RETAIN_HISTORY_DAYS", self.retain_history_days),
            (
                "LEASEGATE_ATTESTATION_MAX_LIFETIME_S",
                self.attestation_max_lifetime_s,
            ),
        ];
        for (name, value) in positive {
            anyhow::ensure!(value > 0, "{name} must be positive, got {value}");
        }
        anyhow::ensure!(
            self.clock_skew_s >= 0,
            "LEASEGATE_CLOCK_SKEW_S must not be negative"
        );
        anyhow::ensure!(
            self.max_body_bytes >= 1024,
            "LEASEGATE_MAX_BODY_BYTES must be at least 1024"
        );
        anyhow::ensure!(
            !self.audience.is_empty(),
            "LEASEGATE_AUDIENCE must not be empty"
        );
        anyhow::ensure!(
            self.resolver_failure_threshold >= 1,
            "LEASEGATE_RESOLVER_FAILURE_THRESHOLD must be at least 1"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.roll_stalled_share),
            "LEASEGATE_ROLL_STALLED_SHARE must be from 0 to 1"
        );
        anyhow::ensure!(
            self.registry_timeout_s >= 1,
            "LEASEGATE_REGISTRY_TIMEOUT_S must be positive"
        );
        anyhow::ensure!(
            self.auth_failure_limit >= 1 && self.auth_failure_window_s >= 1,
            "LEASEGATE_AUTH_FAILURE_LIMIT and LEASEGATE_AUTH_FAILURE_WINDOW_S must be positive"
        );
        self.registry_settings()?;
        self.listener_settings()?;
        self.forge_settings()?;
        self.github_settings()?;
        self.buildkite_settings()?;
        Ok(())
    }

    /// How the service talks to registries; names the variable at fault.
    pub fn registry_settings(&self) -> anyhow::Result<crate::registry::RegistrySettings> {
        let platform = crate::registry::resolve::Platform::parse(&self.registry_platform)
            .map_err(|e| anyhow::anyhow!("LEASEGATE_REGISTRY_PLATFORM: {e}"))?;
        let insecure: Vec<String> = self
            .insecure_registries
            .iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect();
        for host in &insecure {
            anyhow::ensure!(
                !host.contains('/') && !host.contains(char::is_whitespace),
                "LEASEGATE_INSECURE_REGISTRIES: `{host}` is not host:port"
            );
        }
        Ok(crate::registry::RegistrySettings {
            platform,
            insecure,
            auth: crate::registry::auth::AuthSource {
                file: self.registry_auth_file.clone(),
                inline: self.registry_auth.clone().filter(|s| !s.is_empty()),
            },
            timeout: std::time::Duration::from_secs(self.registry_timeout_s),
        })
    }
}

/// The sockets the service may hold: the process's file limit less room for the database's
/// connections, its files and logs.
fn socket_budget(db_connections: u32) -> usize {
    let files = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
    let reserve = 64 + u64::from(db_connections);
    files
        .saturating_sub(reserve)
        .try_into()
        .unwrap_or(usize::MAX)
}

/// The connections the listener may hold when `LEASEGATE_MAX_CONNECTIONS` is not set: the
/// socket budget, less the forwarder's third when a forge is set (`forge_gate/connections.rs`
/// says why a third).
fn default_max_connections(budget: usize, forge: bool) -> usize {
    let forwarder = if forge { budget / 3 } else { 0 };
    (budget - forwarder).clamp(16, 50_000)
}

/// The sockets the forwarder may hold to the forges: a third of the budget, and no more than
/// the listener's cap (`listener`, which may have been set by hand) leaves of it.
fn forge_sockets(budget: usize, listener: usize) -> usize {
    (budget / 3)
        .min(budget.saturating_sub(listener))
        .min(25_000)
}

/// Raises the process's soft file limit to its hard limit, as servers that hold many
/// connections do; the caps are then computed from what it came to.
pub fn raise_file_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(files = n, "file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the file limit"),
    }
}

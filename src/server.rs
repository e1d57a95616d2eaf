//! Starting and stopping the service: configuration to settings, secrets, store, listener,
//! sweeper, registry resolver and GitHub watcher, and a graceful shutdown on SIGTERM or
//! Ctrl-C.
//!
//! `serve` checks and binds first (`startup`), and only then writes: the secrets, the store.
//! `prepare` and `run(listener, state)` take the listener and the shutdown signal from the
//! caller, so that tests, the bench and `demo` start the real service on port 0 and stop it
//! when they like.

use crate::app::{AppState, Secrets, Settings};
use crate::config::ServeArgs;
use crate::domain::attestation::AttestationRules;
use crate::registry::Registry;
use crate::store::{self, DatabaseUrl, DynStore};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

impl Settings {
    /// The settings of `args`, which `ServeArgs::validate` has checked.
    pub fn from_args(args: &ServeArgs) -> anyhow::Result<Settings> {
        Ok(Settings {
            rules: AttestationRules {
                audience: args.audience.clone(),
                max_age_s: args.attestation_max_age_s,
                max_lifetime_s: args.attestation_max_lifetime_s,
                clock_skew_s: args.clock_skew_s,
            },
            probe_max_age_s: args.probe_max_age_s,
            lease_ttl_s: args.lease_ttl_s,
            heartbeat_interval_s: args.heartbeat_interval_s,
            max_body_bytes: args.max_body_bytes,
            resolver_failure_threshold: args.resolver_failure_threshold,
            roll_stalled_share: args.roll_stalled_share,
            background_resolver: args.registry_resolver,
            listener: args.listener_settings()?,
            auth_failure_limit: args.auth_failure_limit,
            auth_failure_window_s: args.auth_failure_window_s,
            metrics_token: load_optional_secret(
                &args.metrics_token,
                &args.metrics_token_file,
                "metrics token",
            )?,
            metrics_listen: args.metrics_listen,
            retention: crate::domain::retention::Retention {
                jobs_days: args.retain_jobs_days,
                history_days: args.retain_history_days,
            },
            buildkite: args.buildkite_settings()?,
        })
    }
}

/// A secret that may be given, as a value or a file, or not at all.
fn load_optional_secret(
    value: &Option<String>,
    file: &Option<PathBuf>,
    what: &str,
) -> anyhow::Result<Option<String>> {
    if let Some(v) = value.as_ref().filter(|v| !v.is_empty()) {
        return Ok(Some(v.clone()));
    }
    let Some(path) = file else { return Ok(None) };
    let s = std::fs::read_to_string(path)
        .with_context(|| format!("reading the {what} from {}", path.display()))?;
    let s = s.trim().to_string();
    anyhow::ensure!(!s.is_empty(), "the {what} file {} is empty", path.display());
    Ok(Some(s))
}

/// The shortest admin or forge token an operator may give: a token shorter than this can be
/// guessed, throttle or not.
pub const MIN_SECRET_CHARS: usize = 32;

/// The secret `name` (`LEASEGATE_ADMIN_TOKEN`) given directly, read from its file
/// (`name_FILE`), or generated and kept (mode 0600). A given one must be strong enough.
fn load_secret(
    name: &str,
    value: &Option<String>,
    file: &Option<PathBuf>,
    generated: PathBuf,
    what: &str,
) -> anyhow::Result<String> {
    let strong = |source: String, secret: String| -> anyhow::Result<String> {
        let chars = secret.chars().count();
        anyhow::ensure!(
            chars >= MIN_SECRET_CHARS,
            "the {what} ({source}) is {chars} characters long; it must be at least \
             {MIN_SECRET_CHARS} (`openssl rand -hex 32` makes one)"
        );
        Ok(secret)
    };
    if let Some(v) = value.as_ref().filter(|v| !v.is_empty()) {
        return strong(name.to_string(), v.clone());
    }
    let read = |path: &Path| -> anyhow::Result<String> {
        let s = std::fs::read_to_string(path)
            .with_context(|| format!("reading the {what} from {}", path.display()))?;
        let s = s.trim().to_string();
        anyhow::ensure!(!s.is_empty(), "the {what} file {} is empty", path.display());
        Ok(s)
    };
    if let Some(path) = file {
        return strong(format!("{name}_FILE {}", path.display()), read(path)?);
    }
    if generated.exists() {
        tracing::info!(path = %generated.display(), "using the {what} kept from an earlier start");
        return read(&generated);
    }
    let secret = crate::secrets::generate_token("");
    write_private(&generated, &secret)
        .with_context(|| format!("writing the {what} to {}", generated.display()))?;
    tracing::info!(path = %generated.display(), "generated the {what}");
    Ok(secret)
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.write_all(b"\n")
}

/// Resolves both secrets as `serve` does.
pub fn load_secrets(args: &ServeArgs) -> anyhow::Result<Secrets> {
    // Replicas on one PostgreSQL must share their secrets: a token generated by one replica
    // would be refused by the next. Better to stop here and say so.
    let url = DatabaseUrl::parse(&args.database_url)?;
    for (name, value, file) in [
        (
            "LEASEGATE_ADMIN_TOKEN",
            &args.admin_token,
            &args.admin_token_file,
        ),
        (
            "LEASEGATE_FORGE_TOKEN",
            &args.forge_token,
            &args.forge_token_file,
        ),
    ] {
        let given = value.as_ref().is_some_and(|v| !v.is_empty()) || file.is_some();
        anyhow::ensure!(
            given || !url.is_shared(),
            "with PostgreSQL every replica must share the secrets: set {name} or {name}_FILE"
        );
    }
    // Beside the SQLite file (PostgreSQL needs them given, above).
    let dir = url.sqlite_dir().unwrap_or(Path::new("."));
    let admin = load_secret(
        "LEASEGATE_ADMIN_TOKEN",
        &args.admin_token,
        &args.admin_token_file,
        dir.join("leasegate-admin.token"),
        "admin token",
    )?;
    let forge = load_secret(
        "LEASEGATE_FORGE_TOKEN",
        &args.forge_token,
        &args.forge_token_file,
        dir.join("leasegate-forge.token"),
        "forge token",
    )?;
    anyhow::ensure!(admin != forge, "the admin and forge tokens must differ");
    let previous = |name: &str, value, file, what: &str, current: &str| {
        let secret = load_optional_secret(value, file, what)?;
        if let Some(s) = &secret {
            let chars = s.chars().count();
            anyhow::ensure!(
                chars >= MIN_SECRET_CHARS,
                "the {what} ({name}) is {chars} characters long; it must be at least \
                 {MIN_SECRET_CHARS}"
            );
            anyhow::ensure!(
                s != current,
                "{name} is the current token: rotation needs a new LEASEGATE_*_TOKEN"
            );
            tracing::info!("{name} is set: the {what} is accepted until it is removed");
        }
        Ok::<_, anyhow::Error>(secret)
    };
    let admin_previous = previous(
        "LEASEGATE_ADMIN_TOKEN_PREVIOUS",
        &args.admin_token_previous,
        &args.admin_token_previous_file,
        "previous admin token",
        &admin,
    )?;
    let forge_previous = previous(
        "LEASEGATE_FORGE_TOKEN_PREVIOUS",
        &args.forge_token_previous,
        &args.forge_token_previous_file,
        "previous forge token",
        &forge,
    )?;
    let admin_side = [Some(&admin), admin_previous.as_ref()];
    for f in [Some(&forge), forge_previous.as_ref()]
        .into_iter()
        .flatten()
    {
        anyhow::ensure!(
            !admin_side.contains(&Some(f)),
            "an admin token and a forge token (current or previous) must differ"
        );
    }
    Ok(Secrets {
        admin,
        admin_previous,
        forge,
        forge_previous,
    })
}

/// Checks the configuration, then loads the secrets and opens the store: everything `serve`
/// does before it listens, for callers (`demo`, tests, the bench) that bring their own
/// listener.
pub async fn prepare(args: &ServeArgs, shutdown: CancellationToken) -> anyhow::Result<AppState> {
    let database_url = crate::startup::check(args)?;
    open(args, &database_url, shutdown).await
}

/// What a start writes, once `startup::check` has passed: the secrets (generated if need be)
/// and the store (created and migrated if need be).
async fn open(
    args: &ServeArgs,
    database_url: &DatabaseUrl,
    shutdown: CancellationToken,
) -> anyhow::Result<AppState> {
    let registry = Registry::new(args.registry_settings()?).context(
        "setting up the registry client (LEASEGATE_REGISTRY_AUTH_FILE, LEASEGATE_REGISTRY_AUTH)",
    )?;
    let forge_gate = match args.forge_settings()? {
        Some(settings) => {
            let gate = crate::forge_gate::ForgeGate::new(settings)?;
            let s = gate.settings();
            tracing::info!(
                forgejo = s.forgejo.as_ref().map(|u| u.host()),
                gitlab = s.gitlab.as_ref().map(|u| u.host()),
                woodpecker = s.woodpecker.as_ref().map(|u| u.host()),
                forge_sockets = s.connections.sockets,
                forge_requests = s.connections.requests,
                forge_requests_per_peer = s.connections.requests_per_peer,
                "gating the forge's runners"
            );
            Some(Arc::new(gate))
        }
        None => None,
    };
    let github = match args.github_settings()? {
        Some(settings) => {
            let github = crate::github::Github::new(settings)?;
            let s = github.settings();
            tracing::info!(
                api = %s.api_url,
                credential = match s.credential {
                    crate::github::settings::CredentialSettings::App { .. } => "app",
                    crate::github::settings::CredentialSettings::Token(_) => "token",
                },
                "minting GitHub registrations for admitted runners"
            );
            Some(Arc::new(github))
        }
        None => None,
    };
    let settings = Settings::from_args(args)?;
    let secrets = load_secrets(args)?;
    let store: DynStore = store::open(database_url, &args.pg_settings(), args.sqlite_synchronous)
        .await
        .with_context(|| format!("opening the database {}", redact(&args.database_url)))?;
    tracing::info!(engine = store.engine(), "database ready");
    Ok(AppState::new(
        store,
        settings,
        secrets,
        Arc::new(registry),
        forge_gate,
        github,
        shutdown,
    ))
}

/// Serves `state` on `listener` until `shutdown` is cancelled, then drains and returns; binds
/// `LEASEGATE_METRICS_LISTEN` and `LEASEGATE_WOODPECKER_LISTEN` itself, if set.
pub async fn run(listener: TcpListener, state: AppState) -> anyhow::Result<()> {
    let metrics = match state.settings().metrics_listen {
        Some(addr) => Some(crate::startup::listen("LEASEGATE_METRICS_LISTEN", addr).await?),
        None => None,
    };
    let woodpecker = match state
        .forge_gate()
        .and_then(|g| g.settings().woodpecker_listen)
    {
        Some(addr) => Some(crate::startup::listen("LEASEGATE_WOODPECKER_LISTEN", addr).await?),
        None => None,
    };
    let listeners = crate::startup::Listeners {
        api: listener,
        metrics,
        woodpecker,
    };
    run_on(listeners, state).await
}

/// Serves `state` on listeners bound beforehand (`startup::bind`) until `shutdown` is
/// cancelled, then drains and returns.
pub async fn run_on(listeners: crate::startup::Listeners, state: AppState) -> anyhow::Result<()> {
    let shutdown = state.shutdown().clone();
    let settings = state.settings().listener.clone();
    let sweeper = tokio::spawn(crate::sweeper::run(
        state.store().clone(),
        state.metrics().clone(),
        shutdown.clone(),
    ));
    let pruner = tokio::spawn(crate::retention::run(
        state.store().clone(),
        state.metrics().clone(),
        state.settings().retention,
        shutdown.clone(),
    ));
    let sampler = tokio::spawn(crate::timeline::run(state.clone()));
    let github_watcher = state.github().map(|github| {
        tokio::spawn(crate::github::watcher::run(
            state.github_context(),
            github.clone(),
        ))
    });
    let buildkite_watcher = state.settings().buildkite.clone().map(|settings| {
        tokio::spawn(crate::buildkite::watcher::run(
            state.buildkite_context(),
            settings,
        ))
    });
    let resolver = state.settings().background_resolver.then(|| {
        tokio::spawn(crate::registry::resolver::run(
            state.store().clone(),
            state.registry().clone(),
            shutdown.clone(),
        ))
    });
    let metrics_server = match listeners.metrics {
        Some(listener) => {
            tracing::info!(addr = %listener.local_addr()?, "metrics listening");
            Some(tokio::spawn(crate::listener::serve(
                listener,
                crate::http::metrics_router(state.clone()),
                settings.clone(),
                state.metrics().clone(),
                shutdown.clone(),
            )))
        }
        None => None,
    };
    let woodpecker_server = listeners
        .woodpecker
        .zip(state.gate_state())
        .map(|(listener, gate)| {
            tokio::spawn(crate::forge_gate::serve_woodpecker(
                gate,
                settings.clone(),
                listener,
            ))
        });
    crate::listener::serve(
        listeners.api,
        crate::http::router(state.clone()),
        settings,
        state.metrics().clone(),
        shutdown,
    )
    .await;
    for task in [
        Some(sweeper),
        Some(pruner),
        Some(sampler),
        github_watcher,
        buildkite_watcher,
        resolver,
        metrics_server,
        woodpecker_server,
    ]
    .into_iter()
    .flatten()
    {
        task.await.ok();
    }
    Ok(())
}

/// `leasegate serve`: everything is checked and the listeners are bound before anything is
/// written, so that a start that cannot succeed leaves no token or database behind.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    crate::config::raise_file_limit();
    let database_url = crate::startup::check(&args)?;
    let listeners = crate::startup::bind(&args).await?;
    let shutdown = CancellationToken::new();
    let state = open(&args, &database_url, shutdown.clone()).await?;
    let addr = listeners.api.local_addr()?;
    let caps = &state.settings().listener.caps;
    tracing::info!(
        %addr,
        max_connections = caps.max_total,
        max_connections_per_peer = caps.max_per_peer,
        "listening"
    );
    tokio::spawn(cancel_on_signal(shutdown));
    run_on(listeners, state).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
pub async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: draining"),
    }
    shutdown.cancel();
}

/// A database URL without its password, for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

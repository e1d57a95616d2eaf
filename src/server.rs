//! Starting and stopping the service: configuration to settings, secrets, store, listener,
//! sweeper and registry resolver, and a graceful shutdown on SIGTERM or Ctrl-C.
//!
//! `run(listener, state, shutdown)` takes its listener and shutdown signal from the caller, so
//! that tests and `demo` start the real service on port 0 and stop it when they like.

use crate::app::{AppState, Secrets, Settings};
use crate::config::ServeArgs;
use crate::domain::attestation::AttestationRules;
use crate::registry::Registry;
use crate::store::{self, DynStore};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

impl Settings {
    pub fn from_args(args: &ServeArgs) -> Settings {
        Settings {
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
        }
    }
}

/// Where generated secrets are kept: beside the SQLite file, or in the working directory.
fn secrets_dir(database_url: &str) -> PathBuf {
    let path = database_url
        .strip_prefix("sqlite://")
        .or_else(|| database_url.strip_prefix("sqlite:"))
        .map(|p| p.split('?').next().unwrap_or(p));
    match path.map(Path::new).and_then(Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The secret given directly, read from its file, or generated and kept (mode 0600).
fn load_secret(
    value: &Option<String>,
    file: &Option<PathBuf>,
    generated: PathBuf,
    what: &str,
) -> anyhow::Result<String> {
    if let Some(v) = value.as_ref().filter(|v| !v.is_empty()) {
        return Ok(v.clone());
    }
    let read = |path: &Path| -> anyhow::Result<String> {
        let s = std::fs::read_to_string(path)
            .with_context(|| format!("reading the {what} from {}", path.display()))?;
        let s = s.trim().to_string();
        anyhow::ensure!(!s.is_empty(), "the {what} file {} is empty", path.display());
        Ok(s)
    };
    if let Some(path) = file {
        return read(path);
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
    let dir = secrets_dir(&args.database_url);
    let admin = load_secret(
        &args.admin_token,
        &args.admin_token_file,
        dir.join("leasegate-admin.token"),
        "admin token",
    )?;
    let forge = load_secret(
        &args.forge_token,
        &args.forge_token_file,
        dir.join("leasegate-forge.token"),
        "forge token",
    )?;
    anyhow::ensure!(admin != forge, "the admin and forge tokens must differ");
    Ok(Secrets { admin, forge })
}

/// Opens the store, builds the state: everything `serve` does before it listens.
pub async fn prepare(args: &ServeArgs, shutdown: CancellationToken) -> anyhow::Result<AppState> {
    args.validate()?;
    let secrets = load_secrets(args)?;
    let registry = Registry::new(args.registry_settings()?).context(
        "setting up the registry client (LEASEGATE_REGISTRY_AUTH_FILE, LEASEGATE_REGISTRY_AUTH)",
    )?;
    let store: DynStore = store::open(&args.database_url, &args.pg_settings())
        .await
        .with_context(|| format!("opening the database {}", redact(&args.database_url)))?;
    tracing::info!(engine = store.engine(), "database ready");
    Ok(AppState::new(
        store,
        Settings::from_args(args),
        secrets,
        Arc::new(registry),
        shutdown,
    ))
}

/// Serves `state` on `listener` until `shutdown` is cancelled, then drains and returns.
pub async fn run(listener: TcpListener, state: AppState) -> anyhow::Result<()> {
    let shutdown = state.shutdown().clone();
    let sweeper = tokio::spawn(crate::sweeper::run(
        state.store().clone(),
        state.metrics().clone(),
        shutdown.clone(),
    ));
    let resolver = state.settings().background_resolver.then(|| {
        tokio::spawn(crate::registry::resolver::run(
            state.store().clone(),
            state.registry().clone(),
            shutdown.clone(),
        ))
    });
    let app = crate::http::router(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    sweeper.await.ok();
    if let Some(resolver) = resolver {
        resolver.await.ok();
    }
    Ok(())
}

/// `leasegate serve`.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let state = prepare(&args, shutdown.clone()).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "listening");
    tokio::spawn(cancel_on_signal(shutdown));
    run(listener, state).await?;
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

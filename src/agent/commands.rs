//! What each `leasegate runner …` command does: thin wrappers over `probe`, `client` and the
//! key and state files, with the output and exit status shell scripts and systemd rely on.
//!
//! Conventions, so that a shell can pipe them: the server's JSON (or the probe's one line) on
//! stdout; a problem's JSON, or one `leasegate: …` line, on stderr; the exit status from
//! `exit::Exit`. Nothing here prints the private key or a lease token, except `lease`, whose
//! JSON answer is where the caller gets the token from.
//!
//! `preflight` runs in the runner unit's `ExecStartPre=`, where its exit status decides
//! whether the runner starts, so it is the runtime's verdict alone: trouble with the agent's
//! own files (a key this user may not read, a missing state file) or with the service is
//! logged at WARN and the report skipped, never a reason to keep a healthy runner down.

use super::cli::*;
use super::client::{AgentClient, ClientError, LeaseToken, LeaseView};
use super::disk::Thresholds;
use super::exit::Exit;
use super::journal::{self, Priority};
use super::keys::RunnerKey;
use super::probe::{self, Depth, ProbeSpec};
use super::runner_images::{self, WantedImage};
use super::state::RunnerState;
use super::{attestation, heartbeat, key_file};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Runs one `leasegate runner` command to its exit status.
pub async fn run(args: RunnerArgs) -> Exit {
    let result = match args.command {
        RunnerCommand::Keygen(a) => keygen(a),
        RunnerCommand::Register(a) => register(a).await,
        RunnerCommand::Preflight(a) => preflight(a).await,
        RunnerCommand::Heartbeat(a) => heartbeat(a).await,
        RunnerCommand::Lease(a) => lease(a).await,
        RunnerCommand::Start(a) => {
            lease_call(&a, |c, id, t| async move { c.start(&id, &t).await }).await
        }
        RunnerCommand::Extend(a) => {
            let ttl = a.ttl_s;
            lease_call(
                &a.lease,
                |c, id, t| async move { c.extend(&id, &t, ttl).await },
            )
            .await
        }
        RunnerCommand::Complete(a) => {
            let (outcome, code, message) = (a.outcome, a.exit_code, a.message);
            lease_call(&a.lease, |c, id, t| async move {
                c.complete(&id, &t, outcome, code, message.as_deref()).await
            })
            .await
        }
        RunnerCommand::Github(a) => github(a).await,
        RunnerCommand::Abandon(a) => {
            let (reason, message) = (a.reason, a.message);
            lease_call(&a.lease, |c, id, t| async move {
                c.abandon(&id, &t, reason.as_deref(), message.as_deref())
                    .await
            })
            .await
        }
    };
    result.unwrap_or_else(|message| {
        eprintln!("leasegate: {message}");
        Exit::Error
    })
}

/// A command either ends with an exit status or fails with a message for stderr (status 5).
type Outcome = Result<Exit, String>;

fn keygen(a: KeygenArgs) -> Outcome {
    let key = key_file::create(&a.key).map_err(|e| e.to_string())?;
    println!("{}", key.public_jwk());
    eprintln!(
        "leasegate: wrote a new Ed25519 key to {} (mode 0600); register its public JWK (above)",
        a.key.display()
    );
    Ok(Exit::Ok)
}

async fn register(a: RegisterArgs) -> Outcome {
    let key = key_file::load(&a.key.key).map_err(|e| e.to_string())?;
    // Before the token is spent: a taken state file would otherwise lose the new runner's ID.
    RunnerState::ensure_absent(&a.state).map_err(|e| e.to_string())?;
    let forge_runners = a.forge.files().read()?;
    let client = AgentClient::new(&a.server).map_err(|e| e.to_string())?;
    let labels: BTreeMap<String, String> = a.labels.into_iter().collect();
    let reg = match client
        .register(
            &a.registration_token,
            &a.name,
            &key.public_jwk(),
            &labels,
            &forge_runners,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => return Ok(report_error(&e, &client)),
    };
    let state = RunnerState {
        runner_id: reg.runner_id.clone(),
        name: a.name,
        pool: reg.pool.clone(),
        server: client.server().to_string(),
        audience: reg.audience.clone(),
        heartbeat_interval_s: reg.heartbeat_interval_s,
        attestation_max_age_s: reg.attestation_max_age_s,
        probe_max_age_s: reg.probe_max_age_s,
        registered_at: Some(crate::domain::time::Millis::now().rfc3339()),
    };
    state.create(&a.state).map_err(|e| {
        format!(
            "registered as runner {} in pool {}, but could not write the state file: {e}",
            reg.runner_id, reg.pool
        )
    })?;
    tracing::info!(runner_id = %reg.runner_id, pool = %reg.pool, state = %a.state.display(), "registered");
    println!("{}", reg.raw);
    Ok(Exit::Ok)
}

fn probe_spec(p: &ProbeArgs) -> Result<ProbeSpec, String> {
    let image = p.images.first().cloned();
    if p.depth != Depth::Info && image.is_none() {
        return Err(format!(
            "--depth {} needs --image (the image to create a container from)",
            match p.depth {
                Depth::Create => "create",
                _ => "run",
            }
        ));
    }
    Ok(ProbeSpec {
        runtime: p.runtime.clone(),
        images: wanted_images(p)?,
        image,
        depth: p.depth,
        timeout: Duration::from_secs(p.timeout_s),
        work_dir: p.work_dir.clone(),
        disk: Thresholds {
            min_free: p.min_free_disk.clone(),
            min_free_inodes_percent: p.min_free_inodes,
        },
    })
}

/// Every image the runner may run: the `--image`s, then what the forge runners' configuration
/// files name, one entry per reference with the labels that pick it. Empty when only one
/// `--image` and no file is given: such a runner attests its `image` alone, as it always did.
fn wanted_images(p: &ProbeArgs) -> Result<Vec<WantedImage>, String> {
    let mut wanted = Vec::new();
    for reference in &p.images {
        runner_images::add(&mut wanted, reference, None);
    }
    for path in &p.forgejo_runner_configs {
        for w in runner_images::from_forgejo_runner_config(path)? {
            for label in w
                .labels
                .iter()
                .map(Some)
                .chain(w.labels.is_empty().then_some(None))
            {
                runner_images::add(&mut wanted, &w.reference, label.map(String::as_str));
            }
        }
    }
    for path in &p.gitlab_images_configs {
        for w in runner_images::from_gitlab_config(path)? {
            runner_images::add(&mut wanted, &w.reference, None);
        }
    }
    let from_files = !p.forgejo_runner_configs.is_empty() || !p.gitlab_images_configs.is_empty();
    if wanted.len() <= 1 && !from_files {
        return Ok(Vec::new());
    }
    Ok(wanted)
}

/// The key, the state and a client for a command that talks to the service as this runner.
fn identity(c: &ConnArgs) -> Result<(RunnerKey, RunnerState, AgentClient), String> {
    let key = key_file::load(&c.key.key).map_err(|e| e.to_string())?;
    let state = RunnerState::load(&c.state.state).map_err(|e| e.to_string())?;
    let server = c.server.as_deref().unwrap_or(&state.server);
    let client = AgentClient::new(server).map_err(|e| e.to_string())?;
    Ok((key, state, client))
}

async fn preflight(a: PreflightArgs) -> Outcome {
    let spec = probe_spec(&a.probe)?;
    // Read the identity before probing, so that a bad key file is said before the probe's
    // (possibly long) work, not after.
    let reporting = match &a.server {
        None => None,
        Some(server) => {
            let (Some(key), Some(state)) = (&a.key, &a.state) else {
                return Err("--server needs --key and --state to sign the report".into());
            };
            let conn = ConnArgs {
                server: Some(server.clone()),
                key: KeyArg { key: key.clone() },
                state: StateArg {
                    state: state.clone(),
                },
            };
            match identity(&conn) {
                Ok(identity) => Some(identity),
                Err(why) => {
                    tracing::warn!(
                        "{why}. The probe runs anyway and decides the exit status; its result is not reported to the service"
                    );
                    None
                }
            }
        }
    };

    let report = probe::run(&spec).await;
    if report.ok() {
        println!("{}", report.summary());
    } else {
        journal::eprint_line(Priority::Warning, &report.summary());
    }

    if let Some((key, state, client)) = reporting {
        match heartbeat::post(&client, &key, &state, &report).await {
            Ok(answer) => heartbeat::log_answer(&report, &answer),
            Err(e) => {
                tracing::warn!(error = %e, "the probe's result was not reported to the service")
            }
        }
    }
    Ok(if report.ok() { Exit::Ok } else { Exit::Failed })
}

async fn heartbeat(a: HeartbeatArgs) -> Outcome {
    let spec = probe_spec(&a.probe)?;
    let (key, state, client) = identity(&a.conn)?;
    let stop = CancellationToken::new();
    tokio::spawn(cancel_on_signal(stop.clone()));
    let forge = a.forge.files();
    let mut recycler = super::recycle::Recycler::beside(&a.conn.state.state);
    let beat = heartbeat::Beat {
        client: &client,
        key: &key,
        state: &state,
        spec: &spec,
        forge: &forge,
    };
    Ok(heartbeat::run(&beat, &mut recycler, a.once, stop).await)
}

async fn github(a: GithubArgs) -> Outcome {
    let spec = probe_spec(&a.probe)?;
    let (key, state, client) = identity(&a.conn)?;
    let stop = CancellationToken::new();
    tokio::spawn(cancel_on_signal(stop.clone()));
    let runner = super::github_runner::GithubRunner {
        client: &client,
        key: &key,
        state: &state,
        spec: &spec,
        runner_dir: a.runner_dir,
    };
    let mut recycler = super::recycle::Recycler::beside(&a.conn.state.state);
    Ok(runner.run(&mut recycler, stop).await)
}

/// Cancels `stop` on SIGTERM or Ctrl-C, so that `systemctl stop` ends the loop cleanly.
async fn cancel_on_signal(stop: CancellationToken) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    stop.cancel();
}

async fn lease(a: LeaseArgs) -> Outcome {
    let spec = probe_spec(&a.probe)?;
    let (key, state, client) = identity(&a.conn)?;
    // A lease carries a fresh probe: the service must judge the runtime as it is now.
    let report = probe::run(&spec).await;
    let attestation = attestation::sign(&key, &state, &report);
    match client.lease(&attestation, a.wait_s).await {
        Ok(Some(lease)) => {
            tracing::info!(lease_id = %lease.lease_id, job_id = %lease.job.id, "lease granted");
            println!("{}", lease.raw);
            Ok(Exit::Ok)
        }
        Ok(None) => Ok(Exit::NoJob),
        Err(e) => Ok(report_error(&e, &client)),
    }
}

async fn lease_call<F, Fut>(a: &LeaseCallArgs, call: F) -> Outcome
where
    F: FnOnce(AgentClient, String, LeaseToken) -> Fut,
    Fut: std::future::Future<Output = Result<LeaseView, ClientError>>,
{
    let server = match (&a.server, &a.state) {
        (Some(s), _) => s.clone(),
        (None, Some(path)) => RunnerState::load(path).map_err(|e| e.to_string())?.server,
        (None, None) => return Err("give --server or --state (to read the server from)".into()),
    };
    let client = AgentClient::new(&server).map_err(|e| e.to_string())?;
    match call(
        client.clone(),
        a.lease_id.clone(),
        LeaseToken::new(&a.lease_token),
    )
    .await
    {
        Ok(view) => {
            println!("{}", view.raw);
            Ok(Exit::Ok)
        }
        Err(e) => Ok(report_error(&e, &client)),
    }
}

/// Prints a failed call for a shell: the problem JSON as the service sent it, or one line.
/// A refusal for this machine's clock also gets the measured offset, at WARN.
fn report_error(e: &ClientError, client: &AgentClient) -> Exit {
    match e.problem() {
        Some(p) => {
            if super::clock::is_clock_refusal(p, client.clock_offset()) {
                heartbeat::log_clock_refusal(p, client.clock_offset(), None);
            }
            eprintln!("{}", p.raw);
            if p.code == "runner_revoked" {
                Exit::Revoked
            } else if p.is_server_side() {
                Exit::Error
            } else {
                Exit::Failed
            }
        }
        None => {
            eprintln!("leasegate: {e}");
            Exit::Error
        }
    }
}

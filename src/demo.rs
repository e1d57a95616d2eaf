//! `leasegate demo`: the real service on a temporary SQLite database, plus simulated runners in
//! the same process and a trickle of jobs, so that a newcomer sees the whole story at once.
//!
//! The simulated runners sign real attestations with real keys and go through the same gate as
//! any runner; they are named `simulated-…` and labelled `simulated=true` wherever they appear.

use crate::agent::keys::RunnerKey;
use crate::app::AppState;
use crate::config::ServeArgs;
use crate::domain::audit::{Action, Entry};
use crate::domain::digest::ImageDigest;
use crate::domain::ids::{JobId, LeaseId, RunnerId};
use crate::domain::image_set::ImageSource;
use crate::domain::lease::{LeaseCall, Outcome};
use crate::domain::pool::{GateMode, ImagePolicy, PoolSpec};
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::gate::Purpose;
use crate::secrets::{generate_token, hash_token};
use crate::store::{Claim, NewJob, NewRunner};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const CURRENT_IMAGE: &str =
    "sha256:2f1c9b0e7d4a3c5b6e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d";
const SUPERSEDED_IMAGE: &str =
    "sha256:9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d";
/// The second pool's image: two pools, two images, each runner judged against its own.
const ARM_IMAGE: &str = "sha256:4a7c1e9d3b5f2a8c6e0d4b2f9a1c7e5d3b8f6a2c0e4d9b7f5a3c1e8d6b4f2a0c";
const LINUX_POOL: &str = "linux-x86_64";
const ARM_POOL: &str = "linux-arm64";
/// How far ahead the clock-ahead runner's clock is.
const CLOCK_AHEAD_S: i64 = 600;

/// How a simulated runner behaves.
#[derive(Clone, Copy)]
enum Behaviour {
    Healthy,
    MissingCrun,
    Superseded,
    /// Healthy for a while, then silent.
    GoesStale,
    /// Healthy, but its clock is ten minutes fast: every attestation is refused `clock_skew`.
    ClockAhead,
    /// Healthy in the second pool, on that pool's image.
    OtherPool,
}

struct SimRunner {
    id: RunnerId,
    name: String,
    key: RunnerKey,
    behaviour: Behaviour,
}

pub async fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    // As `serve`: every setting checked and the addresses taken before anything is written.
    args.validate().map_err(crate::usage::UsageError)?;
    let listeners = crate::startup::bind(&args).await?;
    let dir = tempfile_dir()?;
    args.database_url = format!("sqlite://{}", dir.join("demo.db").display());
    let shutdown = CancellationToken::new();
    let state = crate::server::prepare(&args, shutdown.clone()).await?;
    let addr = listeners.api.local_addr()?;
    let runners = seed(&state).await?;
    let admin = &state.secrets().admin;
    println!("leasegate demo: the runner-health page is at http://{addr}/admin");
    println!("log in with this link: http://{addr}/admin/login?token={admin}");
    println!("admin token: {admin}");
    println!("forge token: {}", state.secrets().forge);
    println!(
        "runners and jobs are simulated; the database in {} goes on exit",
        dir.display()
    );
    tracing::info!(%addr, "demo listening");

    for runner in runners {
        tokio::spawn(simulate(state.clone(), runner));
    }
    tokio::spawn(trickle_jobs(state.clone()));
    tokio::spawn(crate::server::cancel_on_signal(shutdown));
    crate::server::run_on(listeners, state).await?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("leasegate-demo-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn seed(state: &AppState) -> anyhow::Result<Vec<SimRunner>> {
    let now = Millis::now();
    let store = state.store();
    let pool = PoolName::parse(LINUX_POOL)?;
    let spec = PoolSpec {
        image_ref: Some("registry.example/ci/runner:stable".into()),
        expected_image_ids: vec![ImageDigest::parse(SUPERSEDED_IMAGE)?],
        image_policy: ImagePolicy::Enforce,
        image_source: ImageSource::Manual,
        gate_mode: GateMode::Enforce,
        drift_grace_s: 40,
        resolve_interval_s: 300,
        github: None,
        disk_warning: None,
        ejection: Default::default(),
        images: Vec::new(),
        undescribed_images: Default::default(),
    };
    // The demo's own changes are in the audit trail under its name, as an operator's would be.
    let audit = |action, target: &str| Entry {
        at: now,
        actor: "demo".into(),
        action,
        target: target.into(),
        detail: Some("seeded by leasegate demo".into()),
        client: "127.0.0.1".into(),
    };
    store
        .put_pool(
            &pool,
            spec.clone(),
            now,
            &audit(Action::PoolPut, pool.as_str()),
        )
        .await?;
    // The tag moved: the pool now expects the new image; the old one is accepted for 40 s.
    let rolled = PoolSpec {
        expected_image_ids: vec![ImageDigest::parse(CURRENT_IMAGE)?],
        ..spec
    };
    store
        .put_pool(&pool, rolled, now, &audit(Action::PoolPut, pool.as_str()))
        .await?;

    let arm = PoolName::parse(ARM_POOL)?;
    let arm_spec = PoolSpec {
        image_ref: Some("registry.example/ci/runner-arm64:stable".into()),
        expected_image_ids: vec![ImageDigest::parse(ARM_IMAGE)?],
        image_policy: ImagePolicy::Enforce,
        image_source: ImageSource::Manual,
        gate_mode: GateMode::Enforce,
        drift_grace_s: 900,
        resolve_interval_s: 300,
        github: None,
        disk_warning: None,
        ejection: Default::default(),
        images: Vec::new(),
        undescribed_images: Default::default(),
    };
    store
        .put_pool(&arm, arm_spec, now, &audit(Action::PoolPut, arm.as_str()))
        .await?;

    let mut runners = Vec::new();
    let plan = [
        ("simulated-healthy-1", Behaviour::Healthy),
        ("simulated-healthy-2", Behaviour::Healthy),
        ("simulated-no-crun", Behaviour::MissingCrun),
        ("simulated-superseded-image", Behaviour::Superseded),
        ("simulated-goes-stale", Behaviour::GoesStale),
        ("simulated-clock-ahead", Behaviour::ClockAhead),
        ("simulated-arm-1", Behaviour::OtherPool),
    ];
    for (name, behaviour) in plan {
        let pool = match behaviour {
            Behaviour::OtherPool => arm.clone(),
            _ => pool.clone(),
        };
        let token = generate_token("lgr_");
        let created = store
            .create_registration_token(
                &pool,
                &hash_token(&token),
                now.plus_secs(60),
                now,
                &audit(Action::RegistrationTokenCreate, pool.as_str()),
            )
            .await?;
        anyhow::ensure!(created, "the demo's pool {pool} is missing");
        let key = RunnerKey::generate();
        let labels = BTreeMap::from([("simulated".to_string(), "true".to_string())]);
        let new = NewRunner {
            forge_runners: vec![],
            id: RunnerId::generate(),
            name: name.into(),
            labels,
            public_key_x: key.public_x(),
        };
        let runner = store.register_runner(&hash_token(&token), new, now).await?;
        runners.push(SimRunner {
            id: runner.id,
            name: runner.name,
            key,
            behaviour,
        });
    }
    Ok(runners)
}

fn attestation(runner: &SimRunner, audience: &str) -> String {
    let mut now = Millis::now().0 / 1000;
    if matches!(runner.behaviour, Behaviour::ClockAhead) {
        now += CLOCK_AHEAD_S;
    }
    let (ok, error, image) = match runner.behaviour {
        Behaviour::Healthy | Behaviour::GoesStale | Behaviour::ClockAhead => {
            (true, None, CURRENT_IMAGE)
        }
        Behaviour::OtherPool => (true, None, ARM_IMAGE),
        Behaviour::MissingCrun => (
            false,
            Some("default OCI runtime \"crun\" not found: invalid argument"),
            CURRENT_IMAGE,
        ),
        Behaviour::Superseded => (true, None, SUPERSEDED_IMAGE),
    };
    let claims = serde_json::json!({
        "iss": runner.id, "sub": runner.id, "aud": audience,
        "iat": now, "exp": now + 60, "jti": uuid::Uuid::now_v7().to_string(),
        "probe": {"ok": ok, "runtime": "podman", "runtime_version": "4.3.1", "checked_at": now,
                  "error": error, "exit_code": if ok { None } else { Some(125) }},
        "image": {"id": image, "ref": "registry.example/ci/runner:stable"},
        "agent": {"name": "leasegate-demo", "version": env!("CARGO_PKG_VERSION")},
        "host": format!("{}.demo.invalid", runner.name),
    });
    runner.key.sign_attestation(runner.id.as_str(), &claims)
}

/// Heartbeats on the service's schedule (at most every 5 s, so the demo stays lively) and,
/// when healthy and idle, leases a job and runs it beside the heartbeats.
async fn simulate(state: AppState, runner: SimRunner) {
    let runner = Arc::new(runner);
    let busy = Arc::new(AtomicBool::new(false));
    let started = tokio::time::Instant::now();
    let audience = state.settings().rules.audience.clone();
    let every = Duration::from_secs(state.settings().heartbeat_interval_s.clamp(1, 5) as u64);
    loop {
        if state.shutdown().is_cancelled() {
            return;
        }
        if matches!(runner.behaviour, Behaviour::GoesStale)
            && started.elapsed() > Duration::from_secs(8)
        {
            return;
        }
        let token = attestation(&runner, &audience);
        let turn = state.gate().turn().await;
        let _ = state
            .gate()
            .admit(turn, &token, Purpose::Heartbeat, Millis::now())
            .await;
        if !busy.load(Ordering::SeqCst) {
            let lease_token = attestation(&runner, &audience);
            let turn = state.gate().turn().await;
            if let Ok(admitted) = state
                .gate()
                .admit(turn, &lease_token, Purpose::Lease, Millis::now())
                .await
                && admitted.verdict.is_ok()
            {
                busy.store(true, Ordering::SeqCst);
                let (state, runner, busy) = (state.clone(), runner.clone(), busy.clone());
                tokio::spawn(async move {
                    run_one_job(&state, &runner, admitted.pool.name).await;
                    busy.store(false, Ordering::SeqCst);
                });
            }
        }
        tokio::time::sleep(every).await;
    }
}

async fn run_one_job(state: &AppState, runner: &SimRunner, pool: PoolName) {
    let token = generate_token("lgl_");
    let claim = Claim {
        runner_id: runner.id.clone(),
        pool,
        lease_id: LeaseId::generate(),
        token_hash: hash_token(&token),
        ttl_s: state.settings().lease_ttl_s,
        now: Millis::now(),
    };
    let Ok(Some((lease, job))) = state.store().claim_job(&claim).await else {
        return;
    };
    // Counted and logged as the service's own lease path does.
    state.lease_granted(&lease, &job);
    let hash = hash_token(&token);
    let start = LeaseCall::Start {
        ttl_s: state.settings().lease_ttl_s,
    };
    if !call(state, &lease, &hash, start).await {
        return;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let done = LeaseCall::Complete {
        outcome: Outcome::Succeeded,
        exit_code: Some(0),
        message: None,
    };
    call(state, &lease, &hash, done).await;
}

/// A lease call, counted and logged as the service's own; whether it succeeded.
async fn call(state: &AppState, lease: &crate::store::Lease, hash: &str, call: LeaseCall) -> bool {
    match state
        .store()
        .lease_call(
            &lease.id,
            hash,
            &call,
            Millis::now(),
            state.settings().status_rules(),
        )
        .await
    {
        Ok(done) => {
            state.lease_called(&call, &done.lease, &done.job);
            state.job_ended(&done.lease.runner_id, &done.lease.pool, &done.ejection);
            true
        }
        Err(_) => false,
    }
}

async fn trickle_jobs(state: AppState) {
    let pools = [LINUX_POOL, ARM_POOL].map(|p| PoolName::parse(p).expect("valid pool name"));
    for n in 1.. {
        if state.shutdown().is_cancelled() {
            return;
        }
        let job = NewJob {
            id: JobId::generate(),
            pool: pools[n % pools.len()].clone(),
            payload: serde_json::json!({"simulated": true, "build": n}),
            max_attempts: 3,
            idempotency_key: None,
        };
        if let Err(e) = state.store().enqueue_job(job, Millis::now()).await {
            tracing::warn!(error = %e, "demo could not enqueue a job");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

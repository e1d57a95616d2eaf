//! The simulated fleet a bench run drives: a pool, healthy and broken runners with real keys
//! registered through the API, and a queue of jobs; one method per phase.

use super::BenchArgs;
use super::load::{self, Drive, OpReport, Outcome};
use super::wire::Wire;
use crate::agent::attestation;
use crate::agent::keys::RunnerKey;
use crate::agent::probe::{Depth, ImageFacts, ProbeFailure, ProbeReport};
use crate::agent::state::RunnerState;
use crate::domain::time::Millis;
use futures_util::{StreamExt, TryStreamExt, stream};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;

/// The image every healthy bench runner runs and the pool expects.
pub const IMAGE: &str = "sha256:0b5e7c1a2f3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7";

pub struct SimRunner {
    key: RunnerKey,
    state: RunnerState,
    healthy: bool,
}

impl SimRunner {
    pub fn runner_id(&self) -> &str {
        &self.state.runner_id
    }

    /// A fresh attestation, probe checked now.
    pub fn attest(&self) -> String {
        let report = ProbeReport {
            runtime: "podman".into(),
            runtime_version: Some("4.3.1".into()),
            checked_at_ms: Millis::now().0,
            outcome: if self.healthy {
                Ok(())
            } else {
                Err(ProbeFailure {
                    message: "default OCI runtime \"crun\" not found: invalid argument".into(),
                    exit_code: Some(125),
                })
            },
            image: Some(ImageFacts {
                reference: "bench/runner:stable".into(),
                id: Some(IMAGE.into()),
                digest: None,
            }),
            depth: Depth::Info,
            disk: Vec::new(),
            images: Vec::new(),
        };
        attestation::sign(&self.key, &self.state, &report)
    }
}

pub struct Fleet {
    pub base: String,
    pub forge: String,
    pub pool: String,
    pub healthy: Arc<Vec<SimRunner>>,
    pub broken: Arc<Vec<SimRunner>>,
}

async fn check(r: reqwest::Result<reqwest::Response>, what: &str) -> anyhow::Result<Value> {
    let r = r?;
    let status = r.status();
    let body = r.text().await?;
    anyhow::ensure!(status.is_success(), "{what}: {status} {body}");
    Ok(serde_json::from_str(&body).unwrap_or(Value::Null))
}

impl Fleet {
    /// A new pool named for this run, its runners, and `args.jobs` queued jobs.
    pub async fn create(
        client: &Client,
        base: &str,
        admin: &str,
        forge: &str,
        args: &BenchArgs,
    ) -> anyhow::Result<Fleet> {
        let pool = format!("bench-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
        let put = client
            .put(format!("{base}/api/v1/admin/pools/{pool}"))
            .bearer_auth(admin)
            .json(&json!({"expected_image_ids": [IMAGE], "image_ref": "bench/runner:stable"}))
            .send()
            .await;
        check(put, "create the bench pool").await?;
        let mut healthy = Vec::new();
        let mut broken = Vec::new();
        // Registered `concurrency` at a time, in order: a fleet of thousands registered one by
        // one took minutes before the first phase (two requests each, a token and the
        // registration).
        let pool_name = pool.as_str();
        let registered: Vec<SimRunner> =
            stream::iter(0..args.runners + args.broken)
                .map(|i| {
                    let name = format!("bench-{i}");
                    async move {
                        register(client, base, admin, pool_name, &name, i < args.runners).await
                    }
                })
                .buffered(args.concurrency.max(1))
                .try_collect()
                .await?;
        for runner in registered {
            if runner.healthy {
                healthy.push(runner)
            } else {
                broken.push(runner)
            }
        }
        let fleet = Fleet {
            base: base.into(),
            forge: forge.into(),
            pool,
            healthy: Arc::new(healthy),
            broken: Arc::new(broken),
        };
        fleet.enqueue(client, args.jobs, args.concurrency).await?;
        Ok(fleet)
    }

    /// Enqueues `n` jobs into the fleet's pool.
    pub async fn enqueue(
        &self,
        client: &Client,
        n: usize,
        concurrency: usize,
    ) -> anyhow::Result<()> {
        enqueue_jobs(client, &self.base, &self.forge, &self.pool, n, concurrency).await
    }

    /// A fresh attestation of the `i`-th healthy runner (in turn).
    pub fn attest(&self, i: usize) -> String {
        self.healthy[i % self.healthy.len()].attest()
    }

    /// A grant followed by an enqueue, so that the queue keeps its depth (as pgbench's claim
    /// and refill does): for grant throughput at a given queue depth.
    pub async fn refill_grants(&self, client: &Client, drive: Drive, progress: bool) -> OpReport {
        let presigned = Arc::new(Presigned::sign(&self.healthy, presign_count(drive) / 2).await);
        let (client, base, forge, pool, runners) = (
            client.clone(),
            self.base.clone(),
            self.forge.clone(),
            self.pool.clone(),
            self.healthy.clone(),
        );
        load::run("refill-grants", drive, progress, move |w, n| {
            let (client, base, forge, pool) =
                (client.clone(), base.clone(), forge.clone(), pool.clone());
            let body = presigned.body(&runners, w + n as usize * drive.concurrency);
            async move {
                let granted = client
                    .post(format!("{base}/api/v1/lease"))
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body)
                    .send()
                    .await;
                if !matches!(granted, Ok(r) if r.status() == StatusCode::OK) {
                    return false;
                }
                let refill = client
                    .post(format!("{base}/api/v1/jobs"))
                    .bearer_auth(&forge)
                    .json(&json!({"pool": pool, "payload": {}}))
                    .send()
                    .await;
                matches!(refill, Ok(r) if r.status().is_success())
            }
        })
        .await
    }

    pub fn sample_attestation(&self) -> (String, String) {
        let r = self
            .healthy
            .first()
            .or(self.broken.first())
            .expect("a bench runner");
        (r.attest(), r.key.public_x())
    }

    pub async fn grants(&self, drive: Drive, progress: bool) -> OpReport {
        self.attestations("grants", drive, progress).await
    }

    /// Lease, start and complete: one full cycle per operation.
    pub async fn cycles(&self, client: &Client, drive: Drive, progress: bool) -> OpReport {
        let (client, base, runners) = (client.clone(), self.base.clone(), self.healthy.clone());
        load::run("cycles", drive, progress, move |w, n| {
            let (client, base, runners) = (client.clone(), base.clone(), runners.clone());
            async move {
                let runner = &runners[(w + n as usize * drive.concurrency) % runners.len()];
                let body = json!({"attestation": runner.attest()});
                let Ok(r) = client
                    .post(format!("{base}/api/v1/lease"))
                    .json(&body)
                    .send()
                    .await
                else {
                    return Outcome::Failed;
                };
                match r.status() {
                    StatusCode::OK => {}
                    StatusCode::NO_CONTENT => return Outcome::RanDry,
                    _ => return Outcome::Failed,
                }
                let Ok(lease) = r.json::<Value>().await else {
                    return Outcome::Failed;
                };
                let (id, token) = (
                    lease["lease_id"].as_str().unwrap_or(""),
                    lease["lease_token"].as_str().unwrap_or(""),
                );
                for (call, body) in [
                    ("start", json!({})),
                    ("complete", json!({"outcome": "succeeded"})),
                ] {
                    let url = format!("{base}/api/v1/leases/{id}/{call}");
                    match client.post(url).bearer_auth(token).json(&body).send().await {
                        Ok(r) if r.status() == StatusCode::OK => {}
                        _ => return Outcome::Failed,
                    }
                }
                Outcome::Done
            }
        })
        .await
    }

    pub async fn heartbeats(&self, drive: Drive, progress: bool) -> OpReport {
        self.attestations("heartbeats", drive, progress).await
    }

    /// Leases from broken runners: each one must be refused (409).
    pub async fn refusals(&self, drive: Drive, progress: bool) -> OpReport {
        self.attestations("refusals", drive, progress).await
    }

    /// What an attestation phase sends, and what counts as ok: the path it posts to, whose
    /// attestations, the status expected.
    fn attestation_request(
        &self,
        phase: &str,
    ) -> Option<(&'static str, &Arc<Vec<SimRunner>>, StatusCode)> {
        match phase {
            "grants" => Some(("/api/v1/lease", &self.healthy, StatusCode::OK)),
            "heartbeats" => Some(("/api/v1/runners/heartbeat", &self.healthy, StatusCode::OK)),
            "refusals" => Some(("/api/v1/lease", &self.broken, StatusCode::CONFLICT)),
            _ => None,
        }
    }

    async fn attestations(&self, name: &str, drive: Drive, progress: bool) -> OpReport {
        let (path, runners, expect) = self
            .attestation_request(name)
            .expect("an attestation phase");
        attestation_phase(
            name,
            &self.base,
            path,
            runners.clone(),
            expect,
            drive,
            progress,
        )
        .await
    }

    /// An attestation phase's requests signed ahead as the phase signs them (as many, each
    /// `jti` once), for a load generator in another process: the path they are posted to and
    /// their bodies, in the order the phase would send them. `None` for any other phase.
    pub async fn presigned(
        &self,
        phase: &str,
        drive: Drive,
    ) -> Option<(&'static str, Vec<String>)> {
        let (path, runners, _) = self.attestation_request(phase)?;
        if runners.is_empty() {
            return Some((path, Vec::new()));
        }
        let signed = Presigned::sign(runners, presign_count(drive)).await;
        Some((path, signed.bodies))
    }
}

/// One request per operation: a fresh attestation of the next runner posted to `url`, which
/// succeeded when it answers `expect`.
///
/// The attestations are signed before the clock starts (`Presigned`): on a real fleet each
/// runner signs on its own machine, while here the load generator shares the service's cores,
/// and its signing would be counted against the service.
///
/// They go out through the lean client (`wire`), one kept-alive connection per worker, for the
/// same reason.
async fn attestation_phase(
    name: &str,
    base: &str,
    path: &'static str,
    runners: Arc<Vec<SimRunner>>,
    expect: StatusCode,
    drive: Drive,
    progress: bool,
) -> OpReport {
    let wire = match Wire::new(base, drive.concurrency).await {
        Ok(wire) => Arc::new(wire),
        Err(e) => {
            tracing::error!(error = %e, "the bench cannot reach the service");
            return load::run(name, drive, progress, |_, _| async { false }).await;
        }
    };
    if runners.is_empty() {
        return load::run(name, drive, progress, |_, _| async { false }).await;
    }
    let presigned = Arc::new(Presigned::sign(&runners, presign_count(drive)).await);
    let expect = expect.as_u16();
    load::run(name, drive, progress, move |w, n| {
        let wire = wire.clone();
        let body = presigned.body(&runners, w + n as usize * drive.concurrency);
        async move {
            match wire.post_json(w, path, &body).await {
                Ok(s) if s == expect => Outcome::Done,
                // A lease with no job left to give.
                Ok(204) => Outcome::RanDry,
                _ => Outcome::Failed,
            }
        }
    })
    .await
}

/// How many attestations to sign ahead for one phase: its rate, or, as fast as it goes, more
/// than the service can take (at best about 0.4 x the verifications of all cores: 26 000-32 000
/// a second on a two-core EPYC, where 25 000 a second signed ahead ran out before a phase's
/// end), for at most the phase's first 20 s.
/// Attestations live 60 s (the service's default `attestation_max_age_s`), so ones signed long
/// before their use would be refused as expired; a longer phase signs the rest as it goes.
fn presign_count(drive: Drive) -> usize {
    const AS_FAST_AS_POSSIBLE: f64 = 50_000.0;
    const HORIZON_S: f64 = 20.0;
    let rate = drive.rate.unwrap_or(AS_FAST_AS_POSSIBLE);
    (rate * drive.duration.as_secs_f64().min(HORIZON_S)) as usize + drive.concurrency
}

/// Request bodies signed before a phase, handed out in order, each once, while they are
/// young enough for the service to accept (attestations live 60 s by default).
struct Presigned {
    bodies: Vec<String>,
    next: std::sync::atomic::AtomicUsize,
    signed_at: std::time::Instant,
}

/// How long a presigned attestation is handed out after it was signed.
const PRESIGNED_FOR: std::time::Duration = std::time::Duration::from_secs(40);

impl Presigned {
    /// `count` bodies for `runners` in turn, signed on every core.
    async fn sign(runners: &Arc<Vec<SimRunner>>, count: usize) -> Self {
        let signed_at = std::time::Instant::now();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let mut parts = Vec::new();
        for t in 0..threads {
            let runners = runners.clone();
            parts.push(tokio::task::spawn_blocking(move || {
                (t..count)
                    .step_by(threads)
                    .map(|i| {
                        let runner = &runners[i % runners.len()];
                        json!({"attestation": runner.attest()}).to_string()
                    })
                    .collect::<Vec<_>>()
            }));
        }
        let mut signed = Vec::new();
        for p in parts {
            signed.push(p.await.expect("signing thread"));
        }
        // Interleave back into runner order.
        let mut bodies = Vec::with_capacity(count);
        let mut iters: Vec<_> = signed.into_iter().map(|v| v.into_iter()).collect();
        'out: loop {
            for it in iters.iter_mut() {
                match it.next() {
                    Some(b) => bodies.push(b),
                    None => break 'out,
                }
            }
        }
        Presigned {
            bodies,
            next: std::sync::atomic::AtomicUsize::new(0),
            signed_at,
        }
    }

    /// The next presigned body, or, once they are used up or too old, a fresh attestation of
    /// the `i`-th runner signed now.
    fn body(&self, runners: &[SimRunner], i: usize) -> String {
        self.take().unwrap_or_else(|| {
            json!({"attestation": runners[i % runners.len()].attest()}).to_string()
        })
    }

    fn take(&self) -> Option<String> {
        if self.signed_at.elapsed() > PRESIGNED_FOR {
            return None;
        }
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.bodies.get(i).cloned()
    }
}

/// Enqueues `n` jobs into `pool` through the forge API, `concurrency` at a time.
pub async fn enqueue_jobs(
    client: &Client,
    base: &str,
    forge: &str,
    pool: &str,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, next) = (client.clone(), next.clone());
        let (url, forge, pool) = (
            format!("{base}/api/v1/jobs"),
            forge.to_string(),
            pool.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let r = client
                    .post(&url)
                    .bearer_auth(&forge)
                    .json(&json!({"pool": pool, "payload": {}}))
                    .send()
                    .await;
                check(r, "enqueue").await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Registers one runner through the API with a fresh key and registration token.
pub async fn register(
    client: &Client,
    base: &str,
    admin: &str,
    pool: &str,
    name: &str,
    healthy: bool,
) -> anyhow::Result<SimRunner> {
    register_bound(client, base, admin, pool, name, healthy, json!([])).await
}

/// Registers one runner as `register` does, bound to `forge_runners` (the registration's
/// field of that name), for the forge gate's phase.
pub async fn register_bound(
    client: &Client,
    base: &str,
    admin: &str,
    pool: &str,
    name: &str,
    healthy: bool,
    forge_runners: Value,
) -> anyhow::Result<SimRunner> {
    let token = client
        .post(format!(
            "{base}/api/v1/admin/pools/{pool}/registration-tokens"
        ))
        .bearer_auth(admin)
        .json(&json!({}))
        .send()
        .await;
    let token = check(token, "create a registration token").await?;
    let key = RunnerKey::generate();
    let body = json!({"registration_token": token["token"], "name": name, "public_key": key.public_jwk(),
                      "labels": {"simulated": "true", "bench": "true"}, "forge_runners": forge_runners});
    let reg = check(
        client
            .post(format!("{base}/api/v1/runners"))
            .json(&body)
            .send()
            .await,
        "register",
    )
    .await?;
    let state = RunnerState {
        runner_id: reg["runner_id"].as_str().unwrap_or_default().into(),
        name: name.into(),
        pool: pool.into(),
        server: base.into(),
        audience: reg["audience"].as_str().unwrap_or("leasegate").into(),
        heartbeat_interval_s: 15,
        attestation_max_age_s: 60,
        probe_max_age_s: 300,
        registered_at: None,
    };
    Ok(SimRunner {
        key,
        state,
        healthy,
    })
}

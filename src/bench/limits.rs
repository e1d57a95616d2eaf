//! The limits a bench run compares the service with, measured in the same run on the same
//! machine, after its phases, while the service is idle: raw EdDSA verifications with the
//! very check the service makes, the claim transaction run directly on the engine, and, on
//! PostgreSQL, pgbench running the gate's claim. Each claim baseline has a pool and a runner
//! of its own, its queue as deep as the phases' (`--jobs`), and runs as many clients as the
//! phases for as long.

use super::fleet::{self, Fleet};
use super::pgbench::{self, Outcome};
use super::{BenchArgs, Limits, Target, baseline};
use crate::store::DatabaseUrl;
use std::time::{Duration, Instant};

/// Every limit of the run.
pub async fn measure(
    fleet: &Fleet,
    client: &reqwest::Client,
    target: &Target,
    args: &BenchArgs,
) -> anyhow::Result<Limits> {
    let (per_core, cores) = verifications_per_second(&fleet.sample_attestation());
    let (mut raw, mut pgbench_tps, mut pgbench_note) = (None, None, None);
    if let Some(url) = &target.database_url
        && args.measures_claims()
    {
        raw = Some(raw_claims(url, fleet, client, target, args).await?);
        if let DatabaseUrl::Postgres(pg) = url {
            match pgbench_claims(url, pg, fleet, client, target, args).await? {
                Outcome::Ran(tps) => pgbench_tps = Some(tps),
                Outcome::NotRun(why) => pgbench_note = Some(why),
            }
        }
    }
    Ok(Limits {
        cores,
        verifications_per_second_per_core: per_core,
        verifications_per_second_all_cores: per_core * cores as f64,
        raw_claims_per_second: raw,
        pgbench_claims_per_second: pgbench_tps,
        pgbench_note,
    })
}

/// Verifications per second on one core, and the number of cores: `ed25519-dalek`'s own
/// `verify`, the fastest check it offers, written out in the loop (taken as a closure, the
/// release build measured it a fifth slower: docs/BENCHMARKS.md).
pub fn verifications_per_second(sample: &(String, String)) -> (f64, usize) {
    let (token, x) = sample;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (signing_input, signature) = token.rsplit_once('.').expect("a compact JWS");
    let key = crate::verifier::runner_key(x).expect("a valid key");
    let signature = ed25519_dalek::Signature::from_bytes(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, signature)
            .expect("base64url")
            .try_into()
            .expect("64 bytes"),
    );
    let window = Duration::from_millis(1500);
    let counts: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cores)
            .map(|_| {
                s.spawn(|| {
                    let started = Instant::now();
                    let mut n = 0u64;
                    while started.elapsed() < window {
                        let ok = ed25519_dalek::Verifier::verify(
                            &key,
                            signing_input.as_bytes(),
                            &signature,
                        )
                        .is_ok();
                        assert!(ok);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
    });
    let total: u64 = counts.iter().sum();
    (total as f64 / window.as_secs_f64() / cores as f64, cores)
}

/// A pool of its own named `{fleet's pool}-{suffix}`, a runner in it, and `jobs` queued jobs
/// (straight through the engine: the forge API would take longer than the measurement).
async fn own_pool(
    url: &DatabaseUrl,
    fleet: &Fleet,
    client: &reqwest::Client,
    target: &Target,
    suffix: &str,
    jobs: u64,
) -> anyhow::Result<(String, fleet::SimRunner)> {
    let pool = format!("{}-{suffix}", fleet.pool);
    let put = client
        .put(format!("{}/api/v1/admin/pools/{pool}", target.base))
        .bearer_auth(&target.admin)
        .json(&serde_json::json!({"expected_image_ids": [fleet::IMAGE]}))
        .send()
        .await?;
    anyhow::ensure!(
        put.status().is_success(),
        "create the {suffix} pool: {}",
        put.status()
    );
    let runner = fleet::register(
        client,
        &target.base,
        &target.admin,
        &pool,
        &format!("{suffix}-claimer"),
        true,
    )
    .await?;
    baseline::preload(url, &pool, jobs).await?;
    Ok((pool, runner))
}

/// Raw claim transactions per second on the service's own engine.
async fn raw_claims(
    url: &DatabaseUrl,
    fleet: &Fleet,
    client: &reqwest::Client,
    target: &Target,
    args: &BenchArgs,
) -> anyhow::Result<f64> {
    let jobs = args.jobs as u64;
    let (pool, runner) = own_pool(url, fleet, client, target, "raw", jobs).await?;
    let limit = Duration::from_secs(args.duration_s.max(1));
    let claimed = baseline::raw_claims(
        url,
        &pool,
        runner.runner_id(),
        jobs,
        args.concurrency as u32,
        limit,
    )
    .await?;
    Ok(claimed.per_second())
}

/// pgbench's claims per second on the service's PostgreSQL (`pg`, the URL as given), its
/// queue kept at `--jobs` by the script's refill.
async fn pgbench_claims(
    url: &DatabaseUrl,
    pg: &str,
    fleet: &Fleet,
    client: &reqwest::Client,
    target: &Target,
    args: &BenchArgs,
) -> anyhow::Result<Outcome> {
    let (pool, runner) = own_pool(url, fleet, client, target, "pgbench", args.jobs as u64).await?;
    let duration = Duration::from_secs(args.duration_s.max(1));
    Ok(pgbench::claim(pg, &pool, runner.runner_id(), args.concurrency, duration).await)
}

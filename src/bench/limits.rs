//! The limits a bench run compares the service with, measured in the same run on the same
//! machine: raw EdDSA verifications with the very check the service makes, and the claim
//! transaction run directly on the engine.

use super::baseline;
use super::fleet::{self, Fleet};
use super::{BenchArgs, Target};
use crate::store::DatabaseUrl;
use std::time::{Duration, Instant};

/// Verifications per second on one core, and the number of cores.
pub fn verifications_per_second(sample: &(String, String)) -> (f64, usize) {
    let (token, x) = sample;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (signing_input, signature) = token.rsplit_once('.').expect("a compact JWS");
    let key = crate::verifier::runner_key(x).expect("a valid key");
    let window = Duration::from_millis(1500);
    let counts: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cores)
            .map(|_| {
                s.spawn(|| {
                    let started = Instant::now();
                    let mut n = 0u64;
                    while started.elapsed() < window {
                        let ok = crate::verifier::signature_valid(
                            &key,
                            signing_input.as_bytes(),
                            signature,
                        );
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

/// Raw claim transactions per second on the service's own engine, against a pool of its own
/// filled with `args.jobs` jobs, while the service is idle.
pub async fn raw_claims(
    url: &DatabaseUrl,
    fleet: &Fleet,
    client: &reqwest::Client,
    target: &Target,
    args: &BenchArgs,
) -> anyhow::Result<f64> {
    let pool = format!("{}-raw", fleet.pool);
    let put = client
        .put(format!("{}/api/v1/admin/pools/{pool}", target.base))
        .bearer_auth(&target.admin)
        .json(&serde_json::json!({"expected_image_ids": [fleet::IMAGE]}))
        .send()
        .await?;
    anyhow::ensure!(
        put.status().is_success(),
        "create the raw pool: {}",
        put.status()
    );
    let runner = fleet::register(
        client,
        &target.base,
        &target.admin,
        &pool,
        "raw-claimer",
        true,
    )
    .await?;
    fleet::enqueue_jobs(
        client,
        &target.base,
        &target.forge,
        &pool,
        args.jobs,
        args.concurrency,
    )
    .await?;
    let limit = Duration::from_secs(args.duration_s.max(1));
    let claimed = baseline::raw_claims(
        url,
        &pool,
        runner.runner_id(),
        args.jobs as u64,
        args.concurrency as u32,
        limit,
    )
    .await?;
    Ok(claimed.per_second())
}

//! The page at fleet size: every runner attests once (so the fleet looks as it would, most of
//! it healthy), then the fleet page is rendered a few times, its refresh asked for whole, again
//! with its `ETag` (nothing changed), and once more naming the pieces it shows after one runner
//! was cordoned (one row and one pool card changed), and the runner list of the admin API is
//! fetched, measuring each answer's time and bytes. `docs/BENCHMARKS.md` quotes the figures (`leasegate bench --phases page`).

use super::fleet::Fleet;
use reqwest::{Client, StatusCode};
use serde::Serialize;
use std::time::Instant;

/// How many times the page is rendered for its mean.
const RENDERS: usize = 10;

#[derive(Clone, Debug, Serialize)]
pub struct PageReport {
    pub runners: usize,
    /// `GET /admin`: the server's time to answer (mean of `RENDERS`), and its bytes.
    pub fleet_page_ms: f64,
    pub fleet_page_bytes: usize,
    /// The refresh (`GET /admin/fleet`): its bytes, and with its `ETag` when nothing changed.
    pub refresh_bytes: usize,
    pub refresh_unchanged_status: u16,
    pub refresh_unchanged_bytes: usize,
    /// The refresh naming the pieces it shows (`X-Fleet-Have`) after one runner changed.
    pub refresh_one_changed_bytes: usize,
    /// `GET /api/v1/admin/runners`: its time and bytes.
    pub runner_list_ms: f64,
    pub runner_list_bytes: usize,
}

/// Every runner attests once, `concurrency` at a time: quickly, so that none has turned
/// `stale` (three heartbeat intervals) before the page is measured. One at a time, 10,000 of
/// them took long enough on PostgreSQL that the first turned stale during the measurement, and
/// "nothing changed" was a real change.
async fn attest_all(fleet: &Fleet, client: &Client, concurrency: usize) -> anyhow::Result<()> {
    let url = format!("{}/api/v1/runners/heartbeat", fleet.base);
    let attestations: Vec<String> = fleet
        .healthy
        .iter()
        .chain(fleet.broken.iter())
        .map(|r| r.attest())
        .collect();
    let share = attestations.len().div_ceil(concurrency.max(1)).max(1);
    let mut senders = tokio::task::JoinSet::new();
    for chunk in attestations.chunks(share) {
        let (client, url, chunk) = (client.clone(), url.clone(), chunk.to_vec());
        senders.spawn(async move {
            for attestation in chunk {
                let r = client
                    .post(&url)
                    .json(&serde_json::json!({"attestation": attestation}))
                    .send()
                    .await?;
                anyhow::ensure!(r.status().is_success(), "heartbeat: {}", r.status());
            }
            anyhow::Ok(())
        });
    }
    while let Some(sent) = senders.join_next().await {
        sent??;
    }
    Ok(())
}

async fn timed(client: &Client, url: &str, admin: &str) -> anyhow::Result<(f64, usize)> {
    let started = Instant::now();
    let r = client.get(url).bearer_auth(admin).send().await?;
    anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
    let body = r.bytes().await?;
    Ok((started.elapsed().as_secs_f64() * 1000.0, body.len()))
}

pub async fn measure(
    fleet: &Fleet,
    client: &Client,
    admin: &str,
    concurrency: usize,
) -> anyhow::Result<PageReport> {
    let base = &fleet.base;
    attest_all(fleet, client, concurrency).await?;
    let page = format!("{base}/admin");
    let mut total_ms = 0.0;
    let mut page_bytes = 0;
    for _ in 0..RENDERS {
        let (ms, bytes) = timed(client, &page, admin).await?;
        total_ms += ms;
        page_bytes = bytes;
    }
    let refresh = format!("{base}/admin/fleet");
    let first = client.get(&refresh).bearer_auth(admin).send().await?;
    let etag = first
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let whole = first.text().await?;
    let refresh_bytes = whole.len();
    // The pieces' hashes, as the page's script names them.
    let have: Vec<&str> = whole
        .lines()
        .filter(|l| l.starts_with("<template"))
        .filter_map(|l| l.split(" data-hash=\"").nth(1))
        .filter_map(|rest| rest.get(..16))
        .collect();
    let again = client
        .get(&refresh)
        .bearer_auth(admin)
        .header("if-none-match", &etag)
        .send()
        .await?;
    let unchanged_status = again.status();
    let unchanged_bytes = again.bytes().await?.len();
    anyhow::ensure!(
        unchanged_status == StatusCode::NOT_MODIFIED || unchanged_status.is_success(),
        "refresh: {unchanged_status}"
    );
    if let Some(one) = fleet.broken.first() {
        let cordon = format!("{base}/api/v1/admin/runners/{}/cordon", one.runner_id());
        let r = client
            .post(cordon)
            .bearer_auth(admin)
            .json(&serde_json::json!({}))
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "cordon: {}", r.status());
    }
    let partial = client
        .get(&refresh)
        .bearer_auth(admin)
        .header("if-none-match", &etag)
        .header("x-fleet-have", have.join(" "))
        .send()
        .await?;
    anyhow::ensure!(
        partial.status().is_success(),
        "partial refresh: {}",
        partial.status()
    );
    let one_changed_bytes = partial.bytes().await?.len();
    let (list_ms, list_bytes) =
        timed(client, &format!("{base}/api/v1/admin/runners"), admin).await?;
    Ok(PageReport {
        runners: fleet.healthy.len() + fleet.broken.len(),
        fleet_page_ms: total_ms / RENDERS as f64,
        fleet_page_bytes: page_bytes,
        refresh_bytes,
        refresh_unchanged_status: unchanged_status.as_u16(),
        refresh_unchanged_bytes: unchanged_bytes,
        refresh_one_changed_bytes: one_changed_bytes,
        runner_list_ms: list_ms,
        runner_list_bytes: list_bytes,
    })
}

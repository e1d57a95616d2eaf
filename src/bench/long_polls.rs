//! Many waiting long polls: what each costs the service in memory, and how soon one wakes when
//! a job is enqueued.
//!
//! It opens `n` lease requests that wait (`wait_s` 30) on an empty queue, reads the service's
//! resident memory before and while they wait (once the service is idle, every poll admitted),
//! then enqueues jobs one at a time and times each from just before its enqueue request is
//! sent to the moment a waiter receives it. Memory is
//! read from `/proc/PID/status` (Linux): the in-process service's own, or `--server-pid`'s
//! when the service runs apart (each waiting poll holds a socket at both ends, and one process
//! may not hold enough of them for both).

use super::fleet::Fleet;
use hdrhistogram::Histogram;
use reqwest::{Client, StatusCode};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Serialize)]
pub struct LongPollReport {
    pub waiting: usize,
    pub rss_before_mb: Option<f64>,
    pub rss_waiting_mb: Option<f64>,
    /// Resident memory added per waiting poll, in KiB.
    pub kib_per_waiter: Option<f64>,
    pub wakeups: usize,
    pub wake_p50_ms: f64,
    pub wake_p99_ms: f64,
    pub wake_max_ms: f64,
}

/// Resident memory of `pid` (or of this process) in MiB.
fn rss_mb(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".into(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// CPU time used so far by `pid` (or this process), in clock ticks (Linux).
fn cpu_ticks(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".into(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // The fields after the command's name, which is in parentheses and may hold spaces:
    // utime and stime are the 12th and 13th of them.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// Returns once `pid` used under 5 % of a core for half a second (at most a minute).
async fn settle(pid: Option<u32>) {
    let step = Duration::from_millis(500);
    let deadline = Instant::now() + Duration::from_secs(60);
    let Some(mut before) = cpu_ticks(pid) else {
        return;
    };
    while Instant::now() < deadline {
        tokio::time::sleep(step).await;
        let Some(now) = cpu_ticks(pid) else { return };
        // Clock ticks are 10 ms on Linux: 2 ticks in 500 ms is 4 % of a core.
        if now - before <= 2 {
            return;
        }
        before = now;
    }
}

/// Opens `n` waiting polls on `fleet`'s empty pool, then enqueues `wakeups` jobs one by one.
pub async fn measure(
    fleet: &Fleet,
    n: usize,
    wakeups: usize,
    pid: Option<u32>,
) -> anyhow::Result<LongPollReport> {
    // One connection per waiting poll; nothing idle is kept.
    let client = Client::builder().pool_max_idle_per_host(0).build()?;
    let rss_before = rss_mb(pid);
    let received: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let url = format!("{}/api/v1/lease", fleet.base);
    let bodies: Vec<String> = (0..n)
        .map(|i| json!({"attestation": fleet.attest(i), "wait_s": 30}).to_string())
        .collect();
    let mut waiters = Vec::with_capacity(n);
    for body in bodies {
        let (client, url, received) = (client.clone(), url.clone(), received.clone());
        waiters.push(tokio::spawn(async move {
            let r = client
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await;
            if let Ok(r) = r
                && r.status() == StatusCode::OK
            {
                let at = Instant::now();
                if let Ok(v) = r.json::<Value>().await
                    && let Some(job) = v["job"]["id"].as_str()
                {
                    received.lock().expect("lock").insert(job.to_string(), at);
                }
            }
        }));
        // Opening ten thousand connections in one burst overflows the listen backlog.
        tokio::task::yield_now().await;
    }
    // Every request admitted and waiting: give the burst time to land, then wait until the
    // service is idle, since on a busy machine admitting ten thousand takes longer than any
    // fixed pause, and memory read earlier would miss the polls not yet admitted.
    tokio::time::sleep(Duration::from_secs(3) + Duration::from_micros(200 * n as u64)).await;
    settle(pid).await;
    let rss_waiting = rss_mb(pid);

    let mut sent = HashMap::new();
    let enqueue_client = Client::new();
    for _ in 0..wakeups {
        let t = Instant::now();
        let r = enqueue_client
            .post(format!("{}/api/v1/jobs", fleet.base))
            .bearer_auth(&fleet.forge)
            .json(&json!({"pool": fleet.pool, "payload": {}}))
            .send()
            .await?;
        let v: Value = r.json().await?;
        let id = v["id"].as_str().unwrap_or_default().to_string();
        sent.insert(id, t);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let got = received.lock().expect("lock").clone();
    for (job, t) in &sent {
        if let Some(at) = got.get(job) {
            hist.saturating_record(at.duration_since(*t).as_micros() as u64);
        }
    }
    for w in waiters {
        w.abort();
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(LongPollReport {
        waiting: n,
        rss_before_mb: rss_before,
        rss_waiting_mb: rss_waiting,
        kib_per_waiter: rss_before
            .zip(rss_waiting)
            .map(|(b, w)| (w - b) * 1024.0 / n.max(1) as f64),
        wakeups: hist.len() as usize,
        wake_p50_ms: ms(0.5),
        wake_p99_ms: ms(0.99),
        wake_max_ms: hist.max() as f64 / 1000.0,
    })
}

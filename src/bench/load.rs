//! Driving one kind of request at a set concurrency (or a fixed rate) for a set time, and
//! recording what came back: throughput, latency percentiles, errors.
//!
//! A phase that takes jobs stops when the queue runs dry, and its rate is counted over the
//! time until then: a phase that went on answering "no job" for the rest of its time would
//! report the queue's size over the phase's length, not what the service can do.

use super::cpu::{self, PhaseCpu};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// What one operation's run measured.
#[derive(Clone, Debug, Serialize)]
pub struct OpReport {
    pub op: String,
    pub ok: u64,
    pub errors: u64,
    pub seconds: f64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Bytes the service wrote to storage per successful request (SQLite: `bench::io`).
    pub bytes_written_per_op: Option<f64>,
    /// When the queue ran dry and the phase stopped early, seconds after its start.
    pub ran_dry_after_s: Option<f64>,
    /// Where the machine's CPU went while the phase ran (`cpu`; `None` where Linux does not
    /// say).
    pub cpu: Option<PhaseCpu>,
}

/// What one request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It did what was asked.
    Done,
    /// It failed, or was answered otherwise than asked.
    Failed,
    /// The service had no job left to give: the phase stops here.
    RanDry,
}

impl From<bool> for Outcome {
    fn from(done: bool) -> Self {
        if done { Outcome::Done } else { Outcome::Failed }
    }
}

/// How hard to push.
#[derive(Clone, Copy, Debug)]
pub struct Drive {
    pub concurrency: usize,
    pub duration: Duration,
    /// Requests per second across all workers; `None` for as fast as they go.
    pub rate: Option<f64>,
    /// The service's process when it is not this one (`--server-pid`): its threads count in
    /// the phase's CPU too.
    pub service_pid: Option<u32>,
}

/// Runs `op(worker, n)` from `drive.concurrency` workers until the time is up or `op` finds
/// the queue dry. `op` answers whether the request did what was asked (a `bool`, or an
/// [`Outcome`]); the latency of a done or failed request is recorded.
pub async fn run<F, Fut>(name: &str, drive: Drive, progress: bool, op: F) -> OpReport
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future + Send,
    Fut::Output: Into<Outcome>,
{
    let op = Arc::new(op);
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
    ));
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let dry_at = Arc::new(std::sync::OnceLock::<Duration>::new());
    let bar = progress.then(|| {
        let bar = ProgressBar::new(drive.duration.as_secs().max(1));
        bar.set_style(
            ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} s {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(name.to_string());
        bar
    });
    let cpu_before = cpu::Snapshot::take(drive.service_pid);
    let started = Instant::now();
    // With a fixed rate each worker paces itself to its share.
    let interval = drive
        .rate
        .map(|r| Duration::from_secs_f64(drive.concurrency as f64 / r.max(0.001)));
    let mut workers = Vec::new();
    for w in 0..drive.concurrency {
        let (op, hist, ok, errors, stop, dry_at) = (
            op.clone(),
            hist.clone(),
            ok.clone(),
            errors.clone(),
            stop.clone(),
            dry_at.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut local =
                Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
            let mut n = 0u64;
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Some(i) = interval {
                    tokio::time::sleep_until(next.into()).await;
                    next += i;
                }
                let t = Instant::now();
                let outcome = op(w, n).await.into();
                match outcome {
                    Outcome::Done => ok.fetch_add(1, Ordering::Relaxed),
                    Outcome::Failed => errors.fetch_add(1, Ordering::Relaxed),
                    Outcome::RanDry => {
                        dry_at.get_or_init(|| started.elapsed());
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                };
                local.saturating_record(t.elapsed().as_micros() as u64);
                n += 1;
            }
            hist.lock().await.add(&local).ok();
        }));
    }
    while started.elapsed() < drive.duration && !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if let Some(bar) = &bar {
            bar.set_position(started.elapsed().as_secs());
            let rate = ok.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
            bar.set_message(format!("{rate:.0}/s"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.ok();
    }
    let ran_dry_after_s = dry_at.get().map(Duration::as_secs_f64);
    let seconds = ran_dry_after_s.unwrap_or_else(|| started.elapsed().as_secs_f64());
    // After the clock stopped: reading /proc is not the phase's time.
    let cpu_after = cpu::Snapshot::take(drive.service_pid);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let h = hist.lock().await;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let ok = ok.load(Ordering::Relaxed);
    let cpu = cpu_before
        .zip(cpu_after)
        .map(|(before, after)| before.until(&after, ok));
    OpReport {
        op: name.to_string(),
        ok,
        errors: errors.load(Ordering::Relaxed),
        seconds,
        per_second: ok as f64 / seconds,
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        max_ms: h.max() as f64 / 1000.0,
        bytes_written_per_op: None,
        ran_dry_after_s,
        cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drive() -> Drive {
        Drive {
            concurrency: 4,
            duration: Duration::from_secs(30),
            rate: None,
            service_pid: None,
        }
    }

    #[tokio::test]
    async fn a_phase_stops_when_the_queue_runs_dry_and_counts_its_rate_until_then() {
        let queue = Arc::new(AtomicU64::new(0));
        let report = run("grants", drive(), false, move |_, _| {
            let queue = queue.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                if queue.fetch_add(1, Ordering::Relaxed) < 100 {
                    Outcome::Done
                } else {
                    Outcome::RanDry
                }
            }
        })
        .await;
        assert_eq!(report.ok, 100, "every job taken is counted once");
        assert_eq!(report.errors, 0, "an empty queue is not an error");
        let dry = report
            .ran_dry_after_s
            .expect("the report says the queue ran dry");
        assert!(dry < 30.0, "the phase stopped before its time was up");
        assert_eq!(
            report.seconds, dry,
            "the rate is counted over the time until then"
        );
        assert!((report.per_second - 100.0 / dry).abs() < 1e-6);
    }

    #[tokio::test]
    async fn a_phase_that_never_runs_dry_runs_its_time() {
        let d = Drive {
            duration: Duration::from_millis(200),
            ..drive()
        };
        let report = run("heartbeats", d, false, |_, n| async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            n % 2 == 0
        })
        .await;
        assert!(report.ran_dry_after_s.is_none());
        assert!(report.seconds >= 0.2);
        assert!(
            report.ok > 0 && report.errors > 0,
            "a bool still counts done and failed"
        );
    }
}

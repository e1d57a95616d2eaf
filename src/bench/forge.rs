//! The forge gate's phase (`forge`): the service in front of a stand-in forge, an HTTP server
//! of the bench's own on 127.0.0.1 that answers a Forgejo runner's `FetchTask` with no task
//! at once, swallows uploads and streams downloads, so that what is measured is the gate and
//! not a forge's work.
//!
//! It measures what the gate costs against what it stands beside: refused fetches (answered by
//! the gate, the forge never asked) against `/readyz`, the cheapest request of the API; a
//! forwarded fetch's median latency against the same fetch sent to the stand-in directly, one
//! client each; and a large body each way through the gate against the same body sent
//! directly, in wall time and in the CPU time of this process, which holds all three parties:
//! a forwarded byte crosses the kernel's loopback twice where a direct one crosses it once,
//! and where the cores are busy the ratio of rates follows the ratio of CPU.
//! The stand-in counts the fetches it gets, which tells a refusal that reached it from one that
//! did not. Where HAProxy is installed, the same bodies go through it too (`haproxy`): what a
//! proxy's own best costs on this machine, beside what the gate costs.

use super::fleet::{self, Fleet};
use super::haproxy::Haproxy;
use super::load::{self, Drive, OpReport};
use super::wire::Wire;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::routing::{get, post};
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Forgejo's fetch, the one call the gate judges.
pub const FETCH_TASK: &str = "/api/actions/runner.v1.RunnerService/FetchTask";
/// The body of a runner's fetch (it has seen no task yet); it carries no nonce, so one body
/// serves every fetch.
pub const FETCH_BODY: &str = r#"{"tasksVersion":"0"}"#;
/// Where the stand-in takes an upload (an artifact's path, forwarded as any other call).
const UPLOAD: &str = "/api/actions_pipeline/bench/upload";
/// Where it serves a download of `{bytes}` bytes.
const DOWNLOAD: &str = "/api/actions_pipeline/bench/download";
/// The stand-in's answer to a fetch: no task, as Forgejo answers when it has none.
const NO_TASK: &str = r#"{"tasksVersion":"1"}"#;
/// The size of the pieces a download is streamed in.
const CHUNK: usize = 256 * 1024;
/// How many times each transfer is timed, direct and through the gate alternating; the
/// median counts.
const TRANSFER_ROUNDS: usize = 3;

/// What the forge phase measured beside its request phases' reports.
#[derive(Clone, Debug, Serialize)]
pub struct ForgeReport {
    /// The size of each transfer, in bytes.
    pub body_bytes: u64,
    pub upload_gate_mb_per_s: f64,
    pub upload_direct_mb_per_s: f64,
    pub download_gate_mb_per_s: f64,
    pub download_direct_mb_per_s: f64,
    /// The process's CPU time for an upload through the gate ÷ for a direct one (medians;
    /// client, gate and stand-in all count, as they share this process): what the ratio of
    /// rates comes to when the machine's cores are the limit. `None` where Linux's
    /// `/proc/self/task/*/schedstat` does not say.
    pub upload_cpu_ratio: Option<f64>,
    /// The same for a download.
    pub download_cpu_ratio: Option<f64>,
    /// The same bodies through HAProxy with kernel splicing in the gate's place (`None` where
    /// it did not run: `haproxy_note` says why).
    pub upload_haproxy_mb_per_s: Option<f64>,
    pub download_haproxy_mb_per_s: Option<f64>,
    /// CPU time through HAProxy (this process's and HAProxy's) ÷ direct, as above.
    pub haproxy_upload_cpu_ratio: Option<f64>,
    pub haproxy_download_cpu_ratio: Option<f64>,
    pub haproxy_note: Option<String>,
    /// Fetches the stand-in got while refused runners fetched through the gate: 0 when every
    /// refusal was answered without it.
    pub upstream_fetches_while_refused: u64,
    /// Fetches the stand-in got while an admitted runner fetched through the gate.
    pub upstream_fetches_while_forwarded: u64,
    /// The forwarded fetch's p50 less the direct one's (1 client each), in milliseconds.
    pub forwarded_p50_added_ms: f64,
}

/// The stand-in forge, serving until dropped.
pub struct StandIn {
    pub base: String,
    addr: SocketAddr,
    fetches: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl StandIn {
    pub async fn start() -> anyhow::Result<StandIn> {
        let fetches = Arc::new(AtomicU64::new(0));
        let router = Router::new()
            .route(FETCH_TASK, post(fetch_task))
            .route(UPLOAD, post(take_upload))
            .route(&format!("{DOWNLOAD}/{{bytes}}"), get(serve_download))
            .with_state(fetches.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let base = format!("http://{addr}");
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let serve = axum::serve(listener, router)
                .with_graceful_shutdown(async move { stopped.cancelled().await });
            if let Err(e) = serve.await {
                eprintln!("bench: the stand-in forge stopped: {e}");
            }
        });
        Ok(StandIn {
            base,
            addr,
            fetches,
            stop,
        })
    }

    fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }
}

async fn fetch_task(State(fetches): State<Arc<AtomicU64>>) -> impl axum::response::IntoResponse {
    fetches.fetch_add(1, Ordering::Relaxed);
    ([("content-type", "application/json")], NO_TASK)
}

/// Reads the whole body and answers how many bytes it had.
async fn take_upload(body: Body) -> String {
    let mut stream = body.into_data_stream();
    let mut n = 0u64;
    while let Some(Ok(piece)) = stream.next().await {
        n += piece.len() as u64;
    }
    n.to_string()
}

/// Streams `bytes` bytes with their length said up front, as a forge serves an artifact (a
/// proxy can splice a body of known length; a chunked one it must read to find its end).
async fn serve_download(Path(bytes): Path<u64>) -> impl axum::response::IntoResponse {
    let piece = Bytes::from(vec![b'x'; CHUNK]);
    let pieces = (0..bytes.div_ceil(CHUNK as u64)).map(move |i| {
        let len = (bytes - i * CHUNK as u64).min(CHUNK as u64) as usize;
        Ok::<_, std::convert::Infallible>(piece.slice(..len))
    });
    (
        [(axum::http::header::CONTENT_LENGTH, bytes.to_string())],
        Body::from_stream(futures_util::stream::iter(pieces)),
    )
}

/// Runs the forge phase against the service at `fleet.base`, which forwards Forgejo's calls
/// to `stand_in`: its request phases' reports, and what the phase measured beside them.
pub async fn measure(
    fleet: &Fleet,
    client: &reqwest::Client,
    admin: &str,
    stand_in: &StandIn,
    drive: Drive,
    body_bytes: u64,
    progress: bool,
) -> anyhow::Result<(Vec<OpReport>, ForgeReport)> {
    let admitted = bound_runner(fleet, client, admin, "forge-admitted", true).await?;
    let refused = bound_runner(fleet, client, admin, "forge-refused", false).await?;

    let mut ops = vec![floor(&fleet.base, drive, progress).await?];

    let before = stand_in.fetches();
    let refusals = fetches("forge-refused", &fleet.base, &refused, drive, progress).await?;
    let upstream_fetches_while_refused = stand_in.fetches() - before;
    ops.push(refusals);

    let one = Drive {
        concurrency: 1,
        rate: None,
        ..drive
    };
    let before = stand_in.fetches();
    let forwarded = fetches("forge-forwarded", &fleet.base, &admitted, one, progress).await?;
    let upstream_fetches_while_forwarded = stand_in.fetches() - before;
    let direct = fetches("forge-direct", &stand_in.base, &admitted, one, progress).await?;
    let forwarded_p50_added_ms = forwarded.p50_ms - direct.p50_ms;
    ops.extend([forwarded, direct]);

    let (haproxy, haproxy_note) = match Haproxy::start(stand_in.addr).await {
        Ok(proxy) => (Some(proxy), None),
        Err(why) => (None, Some(why)),
    };
    let transfers = Transfers::measure(
        client,
        &fleet.base,
        &stand_in.base,
        haproxy.as_ref(),
        body_bytes,
    )
    .await?;
    drop(haproxy);
    let mb_per_s = |seconds: f64| body_bytes as f64 / 1e6 / seconds.max(1e-9);
    let report = ForgeReport {
        body_bytes,
        upload_gate_mb_per_s: mb_per_s(transfers.upload_gate),
        upload_direct_mb_per_s: mb_per_s(transfers.upload_direct),
        download_gate_mb_per_s: mb_per_s(transfers.download_gate),
        download_direct_mb_per_s: mb_per_s(transfers.download_direct),
        upload_cpu_ratio: transfers.upload_cpu_ratio,
        download_cpu_ratio: transfers.download_cpu_ratio,
        upload_haproxy_mb_per_s: transfers.upload_haproxy.map(mb_per_s),
        download_haproxy_mb_per_s: transfers.download_haproxy.map(mb_per_s),
        haproxy_upload_cpu_ratio: transfers.haproxy_upload_cpu_ratio,
        haproxy_download_cpu_ratio: transfers.haproxy_download_cpu_ratio,
        haproxy_note,
        upstream_fetches_while_refused,
        upstream_fetches_while_forwarded,
        forwarded_p50_added_ms,
    };
    Ok((ops, report))
}

/// A runner of the fleet's pool bound to a Forgejo runner of its own, which has attested once
/// (healthy or with a failed probe): its fetches are forwarded or refused.
pub async fn bound_runner(
    fleet: &Fleet,
    client: &reqwest::Client,
    admin: &str,
    name: &str,
    healthy: bool,
) -> anyhow::Result<ForgeRunner> {
    let uuid = uuid::Uuid::now_v7().to_string();
    let runner = fleet::register_bound(
        client,
        &fleet.base,
        admin,
        &fleet.pool,
        name,
        healthy,
        json!([{"kind": "forgejo", "uuid": uuid}]),
    )
    .await?;
    let heartbeat = client
        .post(format!("{}/api/v1/runners/heartbeat", fleet.base))
        .json(&json!({"attestation": runner.attest()}))
        .send()
        .await?;
    anyhow::ensure!(
        heartbeat.status().is_success(),
        "the forge phase's runner {name} could not attest: {}",
        heartbeat.status()
    );
    Ok(ForgeRunner {
        headers: format!(
            "content-type: application/json\r\nconnect-protocol-version: 1\r\n\
             x-runner-uuid: {uuid}\r\nx-runner-token: bench-forge-runner-token\r\n"
        ),
    })
}

/// How a bound Forgejo runner's fetch is sent.
pub struct ForgeRunner {
    /// The fetch's header lines, each ending in CRLF.
    pub headers: String,
}

/// `/readyz` at the phase's concurrency: the floor of what a request to the service costs.
async fn floor(base: &str, drive: Drive, progress: bool) -> anyhow::Result<OpReport> {
    let wire = Arc::new(Wire::new(base, drive.concurrency).await?);
    Ok(load::run("readyz", drive, progress, move |w, _| {
        let wire = wire.clone();
        async move { matches!(wire.send(w, "GET", "/readyz", "", "").await, Ok(200)) }
    })
    .await)
}

/// `runner`'s `FetchTask` to `base` (the gate, or the stand-in directly): ok when answered 200.
async fn fetches(
    name: &str,
    base: &str,
    runner: &ForgeRunner,
    drive: Drive,
    progress: bool,
) -> anyhow::Result<OpReport> {
    let wire = Arc::new(Wire::new(base, drive.concurrency).await?);
    let headers: Arc<str> = runner.headers.as_str().into();
    Ok(load::run(name, drive, progress, move |w, _| {
        let (wire, headers) = (wire.clone(), headers.clone());
        async move {
            let sent = wire.send(w, "POST", FETCH_TASK, &headers, FETCH_BODY).await;
            matches!(sent, Ok(200))
        }
    })
    .await)
}

/// Seconds each transfer took, the median of its rounds.
struct Transfers {
    upload_gate: f64,
    upload_direct: f64,
    download_gate: f64,
    download_direct: f64,
    upload_haproxy: Option<f64>,
    download_haproxy: Option<f64>,
    upload_cpu_ratio: Option<f64>,
    download_cpu_ratio: Option<f64>,
    haproxy_upload_cpu_ratio: Option<f64>,
    haproxy_download_cpu_ratio: Option<f64>,
}

/// The paths a body takes, in the order they are timed (HAProxy's only where it runs), and the
/// two ways: indices into `Transfers::measure`'s tables.
const DIRECT: usize = 0;
const GATE: usize = 1;
const HAPROXY: usize = 2;
const UP: usize = 0;
const DOWN: usize = 1;

/// One way a body goes to the stand-in: its base, and the process beside this one whose CPU
/// counts too (HAProxy's).
struct Through<'a> {
    base: &'a str,
    also: Option<u32>,
}

impl Transfers {
    async fn measure(
        client: &reqwest::Client,
        gate: &str,
        direct: &str,
        haproxy: Option<&Haproxy>,
        bytes: u64,
    ) -> anyhow::Result<Transfers> {
        let body = Bytes::from(vec![b'x'; bytes as usize]);
        // In the order DIRECT, GATE, HAPROXY.
        let mut paths = vec![
            Through {
                base: direct,
                also: None,
            },
            Through {
                base: gate,
                also: None,
            },
        ];
        if let Some(proxy) = haproxy {
            paths.push(Through {
                base: &proxy.base,
                also: proxy.pid(),
            });
        }
        // [path][way]: the rounds' seconds and CPU nanoseconds.
        let mut times = vec![[Vec::new(), Vec::new()]; paths.len()];
        let mut cpu = vec![[Vec::new(), Vec::new()]; paths.len()];
        for _ in 0..TRANSFER_ROUNDS {
            // Alternating, so that the machine's drift touches every path alike.
            for way in [UP, DOWN] {
                for (i, path) in paths.iter().enumerate() {
                    let before = cpu_ns(path.also);
                    let seconds = if way == UP {
                        upload(client, path.base, body.clone()).await?
                    } else {
                        download(client, path.base, bytes).await?
                    };
                    times[i][way].push(seconds);
                    let spent = cpu_ns(path.also)
                        .zip(before)
                        .map(|(a, b)| a.saturating_sub(b));
                    cpu[i][way].extend(spent);
                }
            }
        }
        let time = |i: usize, way: usize| median(times[i][way].clone());
        let haproxy_time = |way: usize| (times.len() > HAPROXY).then(|| time(HAPROXY, way));
        let cpu_ratio = |i: usize, way: usize| {
            let (through, direct) = (&cpu.get(i)?[way], &cpu[DIRECT][way]);
            let full = through.len() == TRANSFER_ROUNDS && direct.len() == TRANSFER_ROUNDS;
            let as_f64 = |v: &[u64]| v.iter().map(|n| *n as f64).collect::<Vec<_>>();
            full.then(|| median(as_f64(through)) / median(as_f64(direct)).max(1.0))
        };
        Ok(Transfers {
            upload_direct: time(DIRECT, UP),
            download_direct: time(DIRECT, DOWN),
            upload_gate: time(GATE, UP),
            download_gate: time(GATE, DOWN),
            upload_haproxy: haproxy_time(UP),
            download_haproxy: haproxy_time(DOWN),
            upload_cpu_ratio: cpu_ratio(GATE, UP),
            download_cpu_ratio: cpu_ratio(GATE, DOWN),
            haproxy_upload_cpu_ratio: cpu_ratio(HAPROXY, UP),
            haproxy_download_cpu_ratio: cpu_ratio(HAPROXY, DOWN),
        })
    }
}

/// The CPU time this process's threads have had, and `also`'s (another process), in
/// nanoseconds (Linux).
fn cpu_ns(also: Option<u32>) -> Option<u64> {
    let mut total = super::cpu::task_cpu_ns("/proc/self/task")?;
    if let Some(pid) = also {
        total += super::cpu::task_cpu_ns(&format!("/proc/{pid}/task"))?;
    }
    Some(total)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds to send `body` to `base`'s upload and have it all acknowledged.
async fn upload(client: &reqwest::Client, base: &str, body: Bytes) -> anyhow::Result<f64> {
    let expected = body.len();
    let started = Instant::now();
    let answer = client
        .post(format!("{base}{UPLOAD}"))
        .header("content-type", "application/octet-stream")
        .body(body)
        .timeout(Duration::from_secs(600))
        .send()
        .await?;
    let status = answer.status();
    let received = answer.text().await?;
    let elapsed = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        status.is_success() && received.trim() == expected.to_string(),
        "upload through {base}: {status}, the forge got {received:?} of {expected} bytes"
    );
    Ok(elapsed)
}

/// Seconds to read a download of `bytes` bytes from `base` to its end.
async fn download(client: &reqwest::Client, base: &str, bytes: u64) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut answer = client
        .get(format!("{base}{DOWNLOAD}/{bytes}"))
        .timeout(Duration::from_secs(600))
        .send()
        .await?;
    let status = answer.status();
    let mut received = 0u64;
    while let Some(piece) = answer.chunk().await? {
        received += piece.len() as u64;
    }
    let elapsed = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        status.is_success() && received == bytes,
        "download through {base}: {status}, {received} of {bytes} bytes"
    );
    Ok(elapsed)
}

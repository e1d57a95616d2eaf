//! `leasegate bench`: the load generator behind `docs/BENCHMARKS.md`.
//!
//! It starts the service in-process (or targets `--server`), registers real runners with real
//! keys, enqueues jobs, and drives one kind of request per phase: grants, full lease cycles,
//! heartbeats, refused leases, the forge gate's fetches and transfers. In the same run it
//! measures the limits the service is judged against: raw signature verifications per second
//! with the same crypto backend, the same claim transaction executed directly on the engine,
//! and, on PostgreSQL, pgbench running the gate's claim. Timings on a shared machine are noisy,
//! so it reports ratios measured in one run, each beside its goal (`goals`), rather than
//! absolute thresholds.

mod baseline;
mod cpu;
mod emit;
mod fleet;
mod forge;
mod goals;
mod haproxy;
mod io;
mod limits;
mod load;
mod long_polls;
mod page;
mod pgbench;
mod wire;

use crate::config::ServeArgs;
use crate::store::DatabaseUrl;
use clap::Args;
use clap::Parser;
use load::{Drive, OpReport};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Engine for the in-process service: `sqlite://PATH` (default: a temporary file) or
    /// `postgres://…` (a database the bench may fill).
    #[arg(long, env = "LEASEGATE_BENCH_DATABASE_URL")]
    pub database_url: Option<String>,

    /// Target a running service instead of starting one, at an `http://` address (needs the
    /// admin and forge tokens; the raw-claim limit is measured only when `--database-url`
    /// names its database).
    #[arg(long)]
    pub server: Option<String>,

    /// Admin token of `--server`.
    #[arg(long, env = "LEASEGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Forge token of `--server`.
    #[arg(long, env = "LEASEGATE_FORGE_TOKEN", hide_env_values = true)]
    pub forge_token: Option<String>,

    /// Healthy simulated runners.
    #[arg(long, default_value_t = 100)]
    pub runners: usize,

    /// Broken runners (their probe failed), whose leases are refused.
    #[arg(long, default_value_t = 10)]
    pub broken: usize,

    /// Jobs queued before the grant phases.
    #[arg(long, default_value_t = 20_000)]
    pub jobs: usize,

    /// Concurrent clients per phase.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,

    /// Seconds per phase.
    #[arg(long, default_value_t = 5)]
    pub duration_s: u64,

    /// A fixed request rate per phase (requests per second) instead of as fast as possible.
    #[arg(long)]
    pub rate: Option<f64>,

    /// Jobs queued straight through the engine before anything else (for a deep queue, which
    /// the forge API would take minutes to build; needs the database).
    #[arg(long, default_value_t = 0)]
    pub preload: u64,

    /// After `--preload`, this many of the oldest queued jobs are taken out of the queue
    /// straight through the engine, as that many claims and completions would (for "after 100k
    /// claims": the rows leave the queue's index and stay behind as dead entries until vacuum).
    #[arg(long, default_value_t = 0)]
    pub preclaim: u64,

    /// After the phases, hold this many long polls waiting on an empty pool, and measure the
    /// service's memory and how soon a waiter wakes on an enqueue.
    #[arg(long)]
    pub long_polls: Option<usize>,

    /// The process id of `--server`, to read its memory (Linux `/proc`).
    #[arg(long)]
    pub server_pid: Option<u32>,

    /// Phases to run, comma-separated: grants, refill-grants (a grant and an enqueue, so that
    /// the queue keeps its depth), cycles, heartbeats, refusals, forge (the forge gate in
    /// front of a stand-in forge: refused and forwarded fetches, `/readyz`, a large body each
    /// way; the in-process service only), page (every runner attests once, then the fleet
    /// page, its refresh and the runner list are timed and weighed).
    #[arg(
        long,
        default_value = "grants,cycles,heartbeats,refusals,forge",
        value_delimiter = ','
    )]
    pub phases: Vec<String>,

    /// The size of the forge phase's upload and download, in MB (10^6 bytes), each way.
    #[arg(long, default_value_t = 200)]
    pub forge_body_mb: u64,

    /// Write the phases' requests to files in this directory instead of sending them (the
    /// attestations signed ahead, the runners registered with `--server`), for a load
    /// generator in another process (`bench/outside.sh`); the limits are measured as usual.
    #[arg(long, requires = "server")]
    pub emit_requests: Option<PathBuf>,

    /// Write the report as JSON here too.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// No progress bars (for logs and tests).
    #[arg(long)]
    pub quiet: bool,
}

impl BenchArgs {
    /// Whether the claim baselines (the raw claim, pgbench) are measured: only the grant
    /// phases are compared with them (`grants` in the goals, `refill-grants` being pgbench's
    /// claim and refill), and on PostgreSQL they take seconds and as many connections as the
    /// phases' clients.
    pub fn measures_claims(&self) -> bool {
        self.phases
            .iter()
            .any(|p| p == "grants" || p == "refill-grants")
    }
}

/// The limits measured beside the service in the same run.
#[derive(Clone, Debug, Serialize)]
pub struct Limits {
    pub cores: usize,
    pub verifications_per_second_per_core: f64,
    pub verifications_per_second_all_cores: f64,
    /// `None` when the engine was not reachable for a raw run (`--server` alone).
    pub raw_claims_per_second: Option<f64>,
    /// pgbench running the gate's claim on the same PostgreSQL, as many clients, as long
    /// (`pgbench`); `None` on SQLite, or when it did not run (`pgbench_note` says why).
    pub pgbench_claims_per_second: Option<f64>,
    pub pgbench_note: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub engine: String,
    pub concurrency: usize,
    pub runners: usize,
    pub jobs: usize,
    pub ops: Vec<OpReport>,
    pub long_polls: Option<long_polls::LongPollReport>,
    /// The page at the fleet's size (phase `page`).
    pub page: Option<page::PageReport>,
    /// What the forge phase measured beside its request phases (phase `forge`).
    pub forge: Option<forge::ForgeReport>,
    pub limits: Limits,
    /// Every goal that applies to this run's engine, beside this run's figure.
    pub goals: Vec<goals::Goal>,
}

/// The service under test: started here, or somewhere else.
struct Target {
    base: String,
    admin: String,
    forge: String,
    database_url: Option<DatabaseUrl>,
    shutdown: Option<CancellationToken>,
    _dir: Option<TempDir>,
}

/// `ServeArgs` as `serve` would read them with no flags.
#[derive(clap::Parser)]
struct ServeDefaults {
    #[command(flatten)]
    serve: ServeArgs,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// On PostgreSQL, whether the server has room for what the bench may hold open at once: the
/// service's pool (`pool`), its rounds' lanes and its listener (4 more at most), and the raw
/// claim's and pgbench's clients (`concurrency`, when the claims are measured), which run while
/// the service's connections stay open. Without it a run at 64 clients against a server's
/// default of 100 failed midway on "pool timed out", the server refusing "too many clients".
async fn connection_room(
    url: &str,
    concurrency: usize,
    pool: u32,
    claims: bool,
) -> anyhow::Result<()> {
    let (max, used) = crate::store::connection_room(url).await?;
    let claim_clients = if claims { concurrency as i64 } else { 0 };
    let needed = i64::from(pool) + 4 + claim_clients;
    anyhow::ensure!(
        needed <= max - used,
        "--concurrency {concurrency} on PostgreSQL needs up to {needed} connections at once \
         (the service's pool of {pool}, its rounds and listener 4, the raw claim's \
         {claim_clients} clients), and the server has {} free (max_connections {max}, {used} \
         in use): lower --concurrency or raise max_connections",
        max - used
    );
    Ok(())
}

/// The service under test; an in-process one forwards Forgejo's calls to `forge` when given.
async fn start(args: &BenchArgs, forge: Option<&forge::StandIn>) -> anyhow::Result<Target> {
    if let Some(base) = &args.server {
        // The attestation phases' lean client (`wire`) speaks plain HTTP only.
        anyhow::ensure!(
            base.starts_with("http://"),
            "--server must be an http:// address (the bench's client speaks plain HTTP): {base}"
        );
        let admin = args
            .admin_token
            .clone()
            .ok_or_else(|| anyhow::anyhow!("--server needs --admin-token"))?;
        let forge = args
            .forge_token
            .clone()
            .ok_or_else(|| anyhow::anyhow!("--server needs --forge-token"))?;
        let base = base.trim_end_matches('/').to_string();
        return Ok(Target {
            base,
            admin,
            forge,
            database_url: args
                .database_url
                .as_deref()
                .map(DatabaseUrl::parse)
                .transpose()?,
            shutdown: None,
            _dir: None,
        });
    }
    let dir =
        TempDir(std::env::temp_dir().join(format!("leasegate-bench-{}", uuid::Uuid::now_v7())));
    std::fs::create_dir_all(&dir.0)?;
    let database_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", dir.0.join("bench.db").display()));
    // The service's own defaults (and LEASEGATE_* settings), with the bench's database,
    // tokens and listener.
    let mut serve = ServeDefaults::parse_from(["leasegate"]).serve;
    serve.listen = "127.0.0.1:0".parse()?;
    serve.database_url = database_url.clone();
    serve.admin_token = Some(crate::secrets::generate_token(""));
    serve.forge_token = Some(crate::secrets::generate_token(""));
    serve.db_max_connections = (args.concurrency as u32 + 4).max(8);
    if let Ok(DatabaseUrl::Postgres(url)) = DatabaseUrl::parse(&database_url) {
        connection_room(
            &url,
            args.concurrency,
            serve.db_max_connections,
            args.measures_claims(),
        )
        .await?;
    }
    serve.forgejo_upstream = forge.map(|f| f.base.clone());
    let shutdown = CancellationToken::new();
    let state = crate::server::prepare(&serve, shutdown.clone()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (admin, forge) = (state.secrets().admin.clone(), state.secrets().forge.clone());
    tokio::spawn(async move {
        if let Err(e) = crate::server::run(listener, state).await {
            eprintln!("bench: the service stopped: {e:#}");
        }
    });
    Ok(Target {
        base,
        admin,
        forge,
        database_url: Some(DatabaseUrl::parse(&database_url)?),
        shutdown: Some(shutdown),
        _dir: Some(dir),
    })
}

/// Runs the benchmark and prints (and optionally writes) its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<Report> {
    let wants_forge = args.phases.iter().any(|p| p == "forge");
    // The stand-in forge is configured into the in-process service as it starts; a service
    // elsewhere has its own forge, or none.
    let stand_in = match (wants_forge, &args.server) {
        (true, None) => Some(forge::StandIn::start().await?),
        _ => None,
    };
    let target = start(&args, stand_in.as_ref()).await?;
    let engine = target
        .database_url
        .as_ref()
        .map_or("unknown", DatabaseUrl::engine);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency * 2)
        .build()?;
    let fleet =
        fleet::Fleet::create(&client, &target.base, &target.admin, &target.forge, &args).await?;
    let drive = Drive {
        concurrency: args.concurrency,
        duration: Duration::from_secs(args.duration_s),
        rate: args.rate,
        // A service apart is a process of its own: its threads' CPU counts in each phase's too.
        service_pid: args.server.as_ref().and(args.server_pid),
    };
    if args.preload > 0 {
        let url = target
            .database_url
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("--preload needs --database-url"))?;
        baseline::preload(url, &fleet.pool, args.preload).await?;
        if args.preclaim > 0 {
            baseline::preclaim(url, &fleet.pool, args.preclaim).await?;
        }
    }
    let mut ops = Vec::new();
    // Each grant takes a job: the queue is topped up to `--jobs` before a phase that grants,
    // so that no phase runs dry because an earlier one was fast.
    let mut queued = args.jobs;
    // The service's own writes to storage: SQLite's, in this process or `--server-pid`'s.
    let mut meter = match (&target.database_url, &args.server, args.server_pid) {
        (Some(url @ DatabaseUrl::Sqlite(_)), None, _) => Some(io::Meter::open(url, None).await?),
        (Some(url @ DatabaseUrl::Sqlite(_)), Some(_), Some(pid)) => {
            Some(io::Meter::open(url, Some(pid)).await?)
        }
        _ => None,
    };
    let mut page_report = None;
    let mut forge_report = None;
    // Phases whose requests are written out are not driven from here.
    let phases: &[String] = match &args.emit_requests {
        Some(dir) => {
            let written =
                emit::write(&fleet, &client, &target.admin, &args.phases, drive, dir).await?;
            for line in written {
                println!("{}: {line}", dir.display());
            }
            &[]
        }
        None => &args.phases,
    };
    for phase in phases.iter().filter(|p| !p.is_empty()) {
        match phase.as_str() {
            "page" => {
                page_report =
                    Some(page::measure(&fleet, &client, &target.admin, args.concurrency).await?);
                continue;
            }
            "forge" => {
                match &stand_in {
                    Some(stand_in) => {
                        let body = args.forge_body_mb * 1_000_000;
                        let (reports, report) = forge::measure(
                            &fleet,
                            &client,
                            &target.admin,
                            stand_in,
                            drive,
                            body,
                            !args.quiet,
                        )
                        .await?;
                        ops.extend(reports);
                        forge_report = Some(report);
                    }
                    None => println!(
                        "forge: skipped (the phase stands its own forge in front of the \
                         in-process service; --server has its own)"
                    ),
                }
                continue;
            }
            _ => {}
        }
        if matches!(phase.as_str(), "grants" | "cycles") && queued < args.jobs {
            fleet
                .enqueue(&client, args.jobs - queued, args.concurrency)
                .await?;
            queued = args.jobs;
        }
        // The first phase after `--preclaim` meets what its claims left for vacuum, as it
        // would after that many claims.
        if let Some(url) = &target.database_url
            && (args.preload == 0 || args.preclaim == 0 || !ops.is_empty())
        {
            baseline::settle(url).await?;
        }
        let mark = match &mut meter {
            Some(m) => m.start().await,
            None => None,
        };
        let mut report = match phase.as_str() {
            "grants" => fleet.grants(drive, !args.quiet).await,
            "cycles" => fleet.cycles(&client, drive, !args.quiet).await,
            "refill-grants" => fleet.refill_grants(&client, drive, !args.quiet).await,
            "heartbeats" => fleet.heartbeats(drive, !args.quiet).await,
            "refusals" => fleet.refusals(drive, !args.quiet).await,
            other => {
                anyhow::bail!(
                    "unknown phase {other:?} (grants, refill-grants, cycles, heartbeats, refusals, forge, page)"
                )
            }
        };
        if let (Some(m), Some(mark)) = (&mut meter, mark)
            && let Some(written) = m.since(mark).await
            && report.ok > 0
        {
            report.bytes_written_per_op = Some(written as f64 / report.ok as f64);
        }
        if matches!(phase.as_str(), "grants" | "cycles") {
            queued = queued.saturating_sub(report.ok as usize);
        }
        ops.push(report);
    }
    drop(meter);

    let long_polls = match args.long_polls {
        Some(n) => {
            // The in-process service is this process; `--server` is `--server-pid`'s.
            let pid = if args.server.is_some() {
                args.server_pid
            } else {
                Some(std::process::id())
            };
            Some(long_polls::measure(&fleet, n, 200, pid).await?)
        }
        None => None,
    };

    // The baselines too measure their own work, not the phases' leftovers.
    if let Some(url) = &target.database_url {
        baseline::settle(url).await?;
    }
    let limits = limits::measure(&fleet, &client, &target, &args).await?;
    let mut report = Report {
        engine: engine.into(),
        concurrency: args.concurrency,
        runners: args.runners,
        jobs: args.jobs,
        ops,
        long_polls,
        page: page_report,
        forge: forge_report,
        limits,
        goals: Vec::new(),
    };
    report.goals = goals::of(&report);
    print(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    if let Some(s) = target.shutdown {
        s.cancel();
    }
    Ok(report)
}

fn print(r: &Report) {
    println!(
        "leasegate bench: engine {}, {} clients, {} runners",
        r.engine, r.concurrency, r.runners
    );
    println!(
        "{:<16} {:>9} {:>7} {:>10} {:>8} {:>8} {:>8} {:>8} {:>10}",
        "op", "ok", "errors", "per s", "p50 ms", "p90 ms", "p99 ms", "max ms", "written/op"
    );
    for o in &r.ops {
        let written = o
            .bytes_written_per_op
            .map_or("n/a".to_string(), |b| format!("{:.1} KB", b / 1000.0));
        println!(
            "{:<16} {:>9} {:>7} {:>10.0} {:>8.3} {:>8.3} {:>8.3} {:>8.2} {:>10}",
            o.op, o.ok, o.errors, o.per_second, o.p50_ms, o.p90_ms, o.p99_ms, o.max_ms, written
        );
    }
    for o in &r.ops {
        if let Some(c) = &o.cpu {
            let groups: Vec<String> = c
                .groups
                .iter()
                .take(6)
                .map(|g| format!("{} {:.2} ({:.0})", g.group, g.cores, g.us_per_request))
                .collect();
            println!(
                "cpu {}: {:.2} of {} cores, {:.2} idle, {:.0} µs a request; by thread, cores \
                 (µs a request): {}",
                o.op,
                c.used_cores,
                c.cores,
                c.idle_cores,
                c.us_per_request,
                groups.join(", ")
            );
        }
    }
    for (op, dry) in r
        .ops
        .iter()
        .filter_map(|o| Some((&o.op, o.ran_dry_after_s?)))
    {
        println!(
            "{op}: the queue ran dry after {dry:.2} s, its rate is counted over that time \
             (a larger --jobs keeps it going for the whole phase)"
        );
    }
    if let Some(f) = &r.forge {
        let ratio = |r: Option<f64>| r.map_or("n/a".to_string(), |r| format!("{r:.2}"));
        println!(
            "forge: {} MB each way, upload {:.0} MB/s through the gate, {:.0} MB/s direct; \
             download {:.0} MB/s through the gate, {:.0} MB/s direct; the forge got {} fetches \
             while refused runners fetched, {} while an admitted one did; the process's CPU \
             per transfer through the gate ÷ direct: upload {}, download {}",
            f.body_bytes / 1_000_000,
            f.upload_gate_mb_per_s,
            f.upload_direct_mb_per_s,
            f.download_gate_mb_per_s,
            f.download_direct_mb_per_s,
            f.upstream_fetches_while_refused,
            f.upstream_fetches_while_forwarded,
            ratio(f.upload_cpu_ratio),
            ratio(f.download_cpu_ratio)
        );
        match (f.upload_haproxy_mb_per_s, f.download_haproxy_mb_per_s) {
            (Some(up), Some(down)) => println!(
                "haproxy with kernel splicing in the gate's place: upload {up:.0} MB/s, download \
                 {down:.0} MB/s; CPU ÷ direct: upload {}, download {}; the gate ÷ haproxy: \
                 upload {:.2}, download {:.2}",
                ratio(f.haproxy_upload_cpu_ratio),
                ratio(f.haproxy_download_cpu_ratio),
                f.upload_gate_mb_per_s / up.max(1e-9),
                f.download_gate_mb_per_s / down.max(1e-9),
            ),
            _ => println!(
                "haproxy: not measured: {}",
                f.haproxy_note.as_deref().unwrap_or("it did not run")
            ),
        }
    }
    if let Some(lp) = &r.long_polls {
        let mb = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1} MiB"));
        println!(
            "long polls: {} waiting, service memory {} before, {} while waiting ({} KiB each); \
             {} wake-ups p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            lp.waiting,
            mb(lp.rss_before_mb),
            mb(lp.rss_waiting_mb),
            lp.kib_per_waiter
                .map_or("n/a".into(), |v| format!("{v:.1}")),
            lp.wakeups,
            lp.wake_p50_ms,
            lp.wake_p99_ms,
            lp.wake_max_ms
        );
    }
    if let Some(p) = &r.page {
        println!(
            "page at {} runners: /admin {:.1} ms, {:.1} KB; refresh {:.1} KB, unchanged {} with \
             {} bytes, one runner changed {:.1} KB; /api/v1/admin/runners {:.1} ms, {:.1} KB",
            p.runners,
            p.fleet_page_ms,
            p.fleet_page_bytes as f64 / 1000.0,
            p.refresh_bytes as f64 / 1000.0,
            p.refresh_unchanged_status,
            p.refresh_unchanged_bytes,
            p.refresh_one_changed_bytes as f64 / 1000.0,
            p.runner_list_ms,
            p.runner_list_bytes as f64 / 1000.0
        );
    }
    let l = &r.limits;
    let grants = r.ops.iter().find(|o| o.op == "grants");
    let raw = match (l.raw_claims_per_second, grants) {
        (Some(raw), Some(g)) if raw > 0.0 => {
            format!(
                "{raw:.0}/s (grants / raw claims {:.2}x)",
                g.per_second / raw
            )
        }
        (Some(raw), _) => format!("{raw:.0}/s"),
        (None, None) if !r.ops.iter().any(|o| o.op == "refill-grants") => {
            "not measured (no grants phase)".into()
        }
        (None, None) => "not measured".into(),
        (None, Some(_)) => "not measured".into(),
    };
    println!(
        "limits: {:.0} EdDSA verifications/s per core ({} cores: {:.0}/s); raw claim transactions: {raw}",
        l.verifications_per_second_per_core, l.cores, l.verifications_per_second_all_cores,
    );
    match (l.pgbench_claims_per_second, &l.pgbench_note) {
        (Some(tps), _) => println!(
            "pgbench, the gate's claim (bench/pgbench/claim.sql, -M prepared), {} clients: {tps:.0} tx/s",
            r.concurrency
        ),
        (None, Some(note)) => println!("pgbench: not measured: {note}"),
        (None, None) => {}
    }
    println!("goals:");
    for g in &r.goals {
        let measured = g.measured.map_or("not measured".to_string(), |m| {
            let m = if g.unit == "x" || g.unit == "ms" {
                format!("{m:.2}")
            } else {
                format!("{m:.1}")
            };
            format!("{m} {}", g.unit)
        });
        let met = match g.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "",
        };
        let goal = format!("{} {} {}", g.bound, g.goal, g.unit);
        println!("  {:<72} {measured:>14}   goal {goal:<10} {met}", g.what);
    }
}

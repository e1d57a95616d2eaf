//! A short run of `leasegate bench`: it works end to end and reports sane figures, the forge
//! gate's phase and the goals included. Never a timing threshold: the numbers live in
//! docs/BENCHMARKS.md.

use clap::Parser;
use leasegate::bench::BenchArgs;
use sqlx::Connection;

/// `leasegate bench`'s arguments, as the binary reads them.
#[derive(Parser)]
struct Bench {
    #[command(flatten)]
    args: BenchArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_bench_run_reports_every_phase_the_limits_and_the_goals() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let Bench { mut args } = Bench::parse_from([
        "bench",
        "--quiet",
        "--duration-s",
        "1",
        "--runners",
        "3",
        "--broken",
        "2",
        "--jobs",
        "1500",
        "--concurrency",
        "4",
        "--forge-body-mb",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    args.database_url = None; // always the embedded engine here, whatever the environment says
    let report = leasegate::bench::run(args).await.expect("the bench runs");

    let names: Vec<&str> = report.ops.iter().map(|o| o.op.as_str()).collect();
    assert_eq!(
        names,
        [
            "grants",
            "cycles",
            "heartbeats",
            "refusals",
            "readyz",
            "forge-refused",
            "forge-forwarded",
            "forge-direct"
        ]
    );
    for op in &report.ops {
        assert!(op.ok > 0, "{op:?}");
        assert!(
            op.p50_ms > 0.0 && op.p50_ms <= op.p99_ms && op.p99_ms <= op.max_ms,
            "{op:?}"
        );
    }
    for op in report
        .ops
        .iter()
        .filter(|o| o.op != "grants" && o.op != "cycles")
    {
        assert_eq!(op.errors, 0, "{op:?}");
    }
    // SQLite's writes are counted for every attestation phase, and a heartbeat writes something.
    for op in report.ops.iter().take(4) {
        assert!(op.bytes_written_per_op.is_some(), "{op:?}");
    }
    assert!(report.ops[2].bytes_written_per_op.unwrap() > 0.0);
    // Linux says where each phase's CPU went: the runtime's workers (clients and handlers)
    // and SQLite's writer among the groups, each a share of the machine's cores.
    for op in &report.ops {
        let cpu = op.cpu.as_ref().unwrap_or_else(|| panic!("{op:?}"));
        assert!(cpu.used_cores > 0.0 && cpu.us_per_request > 0.0, "{op:?}");
        assert!(
            (cpu.used_cores + cpu.idle_cores - cpu.cores as f64).abs() < 1e-6
                || cpu.idle_cores == 0.0,
            "{op:?}"
        );
        let sum: f64 = cpu.groups.iter().map(|g| g.us_per_request).sum();
        assert!((sum - cpu.us_per_request).abs() < 1e-6, "{op:?}");
        assert!(
            cpu.groups.iter().any(|g| g.group == "tokio-rt-worker"),
            "{op:?}"
        );
    }
    let heartbeats = report.ops[2].cpu.as_ref().unwrap();
    assert!(
        heartbeats.groups.iter().any(|g| g.group == "sqlite-writer"),
        "{heartbeats:?}"
    );

    let forge = report.forge.as_ref().expect("the forge phase's report");
    let op = |name: &str| report.ops.iter().find(|o| o.op == name).unwrap();
    assert_eq!(
        forge.upstream_fetches_while_refused, 0,
        "a refused fetch never reaches the forge"
    );
    // Every forwarded fetch reached the forge (and one more may have been cut off by the
    // phase's end after the forge answered).
    let forwarded = op("forge-forwarded").ok;
    assert!(
        (forwarded..=forwarded + 1).contains(&forge.upstream_fetches_while_forwarded),
        "{forwarded} forwarded, the forge got {}",
        forge.upstream_fetches_while_forwarded
    );
    assert_eq!(forge.body_bytes, 2_000_000);
    for rate in [
        forge.upload_gate_mb_per_s,
        forge.upload_direct_mb_per_s,
        forge.download_gate_mb_per_s,
        forge.download_direct_mb_per_s,
    ] {
        assert!(rate.is_finite() && rate > 0.0, "{forge:?}");
    }
    // Linux says how much CPU each transfer took.
    for ratio in [forge.upload_cpu_ratio, forge.download_cpu_ratio] {
        assert!(ratio.is_some_and(|r| r.is_finite() && r > 0.0), "{forge:?}");
    }
    assert_eq!(
        forge.forwarded_p50_added_ms,
        op("forge-forwarded").p50_ms - op("forge-direct").p50_ms
    );
    // HAProxy, where it is installed, carried the same bodies in the gate's place.
    let haproxy = crate::common::skip::deploy_tool(
        "haproxy",
        "the bench's forge phase measures HAProxy's transfers beside the gate's",
    );
    if haproxy.is_some() {
        for rate in [
            forge.upload_haproxy_mb_per_s,
            forge.download_haproxy_mb_per_s,
            forge.haproxy_upload_cpu_ratio,
            forge.haproxy_download_cpu_ratio,
        ] {
            assert!(rate.is_some_and(|r| r.is_finite() && r > 0.0), "{forge:?}");
        }
        assert_eq!(forge.haproxy_note, None);
    } else {
        assert_eq!(forge.upload_haproxy_mb_per_s, None);
        let note = forge.haproxy_note.as_deref().unwrap_or_default();
        assert!(note.contains("haproxy is not installed"), "{note}");
    }

    assert!(report.limits.verifications_per_second_per_core > 100.0);
    assert!(report.limits.raw_claims_per_second.unwrap() > 10.0);
    assert_eq!(report.limits.pgbench_claims_per_second, None, "SQLite");

    // Every goal of SQLite's run and of the forge gate, each measured, the long polls' only
    // when they ran.
    let goals: Vec<&str> = report.goals.iter().map(|g| g.name).collect();
    assert_eq!(
        goals,
        [
            "sqlite_heartbeats_vs_verifications",
            "sqlite_refusals_vs_verifications",
            "sqlite_grants_vs_raw_claims",
            "sqlite_written_per_heartbeat",
            "sqlite_written_per_refusal",
            "forge_refused_vs_readyz",
            "forge_forwarded_p50_added",
            "forge_upload_vs_direct",
            "forge_download_vs_direct",
        ]
    );
    for g in &report.goals {
        let m = g.measured.unwrap_or_else(|| panic!("{g:?} not measured"));
        assert!(m.is_finite(), "{g:?}");
        assert!(g.met.is_some(), "{g:?}");
        if g.unit == "x" {
            assert!(m > 0.0, "{g:?}");
        }
    }

    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(written["engine"], "sqlite");
    assert_eq!(written["ops"].as_array().unwrap().len(), 8);
    assert_eq!(written["goals"].as_array().unwrap().len(), 9);
    assert!(written["goals"][0]["goal"].as_f64().unwrap() > 0.0);
    assert!(written["forge"]["upload_gate_mb_per_s"].as_f64().unwrap() > 0.0);
}

/// On PostgreSQL the bench says up front when the server has no room for the connections its
/// concurrency needs (the service's pool beside the raw claim's clients), naming the numbers
/// and what to change, instead of failing midway on "pool timed out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_the_postgresql_server_cannot_hold_is_refused_before_anything_runs() {
    let Some(db) = crate::common::pg::TestDatabase::create().await else {
        return;
    };
    // As many clients as the server allows connections: with the service's pool beside them,
    // more than it can hold, whatever the server's setting.
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (max,): (String,) = sqlx::query_as("SHOW max_connections")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.ok();
    let Bench { mut args } = Bench::parse_from(["bench", "--quiet", "--concurrency", &max]);
    args.database_url = Some(db.url.clone());
    let started = std::time::Instant::now();
    let refused = leasegate::bench::run(args)
        .await
        .map(|_| ())
        .expect_err("that many clients need more connections than the server allows");
    let said = format!("{refused:#}");
    let needed = 2 * max.parse::<u32>().unwrap() + 8;
    assert!(
        said.contains(&format!(
            "--concurrency {max} on PostgreSQL needs up to {needed} connections"
        )) && said.contains("max_connections")
            && said.contains("lower --concurrency or raise max_connections"),
        "{said}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "refused before the fleet was made"
    );

    // Without the grants phase the claim baselines do not run, and their clients are not
    // counted.
    let Bench { mut args } = Bench::parse_from([
        "bench",
        "--quiet",
        "--concurrency",
        &max,
        "--phases",
        "heartbeats",
    ]);
    args.database_url = Some(db.url.clone());
    let refused = leasegate::bench::run(args)
        .await
        .map(|_| ())
        .expect_err("the service's pool alone needs more connections than the server allows");
    let said = format!("{refused:#}");
    let needed = max.parse::<u32>().unwrap() + 8;
    assert!(
        said.contains(&format!(
            "--concurrency {max} on PostgreSQL needs up to {needed} connections"
        )) && said.contains("the raw claim's 0 clients"),
        "{said}"
    );
}

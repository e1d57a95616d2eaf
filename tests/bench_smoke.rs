//! A short run of `leasegate bench`: it works end to end and reports sane figures. Never a
//! timing threshold: the numbers live in docs/BENCHMARKS.md.

use clap::Parser;
use leasegate::bench::BenchArgs;

/// `leasegate bench`'s arguments, as the binary reads them.
#[derive(Parser)]
struct Bench {
    #[command(flatten)]
    args: BenchArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_bench_run_reports_every_phase_and_the_limits() {
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
        "--json",
        json.to_str().unwrap(),
    ]);
    args.database_url = None; // always the embedded engine here, whatever the environment says
    let report = leasegate::bench::run(args).await.expect("the bench runs");

    let names: Vec<&str> = report.ops.iter().map(|o| o.op.as_str()).collect();
    assert_eq!(names, ["grants", "cycles", "heartbeats", "refusals"]);
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
        .filter(|o| o.op == "heartbeats" || o.op == "refusals")
    {
        assert_eq!(op.errors, 0, "{op:?}");
    }
    assert!(report.limits.verifications_per_second_per_core > 100.0);
    assert!(report.limits.raw_claims_per_second.unwrap() > 10.0);
    assert!(report.ratios.grants_vs_raw_claims.unwrap() > 0.0);
    assert!(report.ratios.heartbeats_vs_verifications.unwrap() > 0.0);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(written["engine"], "sqlite");
    assert_eq!(written["ops"].as_array().unwrap().len(), 4);
}

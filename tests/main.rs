//! The integration tests, as one test crate: each file beside this one is a module of it, and
//! `common/` is the harness they share. One crate, not one per file, so that the harness is
//! compiled once and the tests link once (`cargo test --test integration forge_gate::` runs one
//! file's tests).
//!
//! `Cargo.toml` turns off the discovery of test targets (`autotests = false`), so a file added
//! here must be named below; `every_test_file_is_part_of_the_test_crate` fails until it is.

mod common;

mod abandoned_requests;
mod agent_clock;
mod agent_e2e;
mod agent_github;
mod agent_podman;
mod agent_probe;
mod api_errors;
mod attestation_attacks;
mod bench_emit;
mod bench_smoke;
mod buildkite;
mod cache_rounds;
mod concurrency;
mod connections;
mod demo_binary;
mod deploy_files;
mod disk;
mod ejection;
mod forge_clients;
mod forge_gate;
mod forge_gate_blame;
mod forge_gate_bodies;
mod forge_gate_cache;
mod forge_gate_paths;
mod forge_job_ends;
mod forge_machines;
mod gate_turns;
mod github;
mod history;
mod http1_wire;
mod images;
mod images_forge_gate;
mod lease_flow;
mod metrics;
mod migration_parity;
mod module_graph;
mod openapi;
mod operators;
mod outage_sqlite;
mod page;
mod page_browser;
mod page_sessions;
mod pg_rounds;
mod pg_sockets;
mod pool_patch;
mod query_plans;
mod races;
mod registry;
mod release_demo;
mod replay_window;
mod replica_kill;
mod replicas;
mod retention;
mod serve_binary;
mod startup_binary;
mod text_inputs;
mod throttle;
mod upgrade;
mod woodpecker;
mod write_rows;

/// A file under `tests/` that no `mod` line names is compiled by nobody, and its tests would
/// silently never run.
#[test]
fn every_test_file_is_part_of_the_test_crate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(dir.join("main.rs")).expect("tests/main.rs");
    let declared: std::collections::BTreeSet<&str> = main
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/") {
        let path = entry.expect("an entry of tests/").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let is_module = if path.is_dir() {
            path.join("mod.rs").exists()
        } else {
            path.extension().is_some_and(|e| e == "rs") && stem != "main"
        };
        if is_module && !declared.contains(stem) {
            missing.push(stem.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "tests/main.rs does not name these files, so their tests never run: {missing:?}"
    );
}

//! A SQLite database of the previous version upgrades with its data: the migration that frees
//! revoked runners' names rebuilds the runners table, which others refer to, so the test fills
//! a database at the previous schema (every migration but the newest, recorded as the service
//! records them), starts the service on it, and finds every row, every reference intact, and
//! a revoked runner's name free.

use crate::common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const REVOKED: &str = "0193a5b0-0000-7000-8000-000000000001";
const LIVE: &str = "0193a5b0-0000-7000-8000-000000000002";
const JOB: &str = "0193a5b0-0000-7000-8000-0000000000a1";
const LEASE: &str = "0193a5b0-0000-7000-8000-0000000000b1";

/// A database at the schema before the newest migration, with a pool, a revoked and a live
/// runner, a finished job with its lease and events, and the revoked runner's history.
fn previous_version(path: &std::path::Path) {
    let migrations: Vec<_> = leasegate::store::migrations::sqlite()
        .iter()
        .cloned()
        .collect();
    let newest = migrations.iter().map(|m| m.version).max().unwrap();
    let mut conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL,
         installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL,
         checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)",
    )
    .unwrap();
    for m in migrations.iter().filter(|m| m.version < newest) {
        let tx = conn.transaction().unwrap();
        tx.execute_batch(m.sql.as_str()).unwrap();
        tx.execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (?1, ?2, TRUE, ?3, 0)",
            rusqlite::params![m.version, m.description.as_ref(), m.checksum.as_ref()],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    let now = leasegate::domain::time::Millis::now().0;
    conn.execute_batch(&format!(
        "PRAGMA foreign_keys = ON;
         INSERT INTO pools (name, image_policy, image_source, expected_image_ids,
            previous_image_ids, drift_grace_s, resolve_interval_s, created_at, updated_at)
            VALUES ('linux', 'enforce', 'manual', '[\"{IMAGE_A}\"]', '[]', 3600, 300, {now}, {now});
         INSERT INTO runners (id, name, pool, labels, public_key_x, revoked_at, registered_at,
            attested_at, probe_ok, probe_runtime, probe_checked_at, last_status)
            VALUES ('{REVOKED}', 'build-1', 'linux', '{{}}', 'x1', {now}, {now}, {now}, 1,
            'podman', {now}, 'revoked');
         INSERT INTO runners (id, name, pool, labels, public_key_x, registered_at)
            VALUES ('{LIVE}', 'build-2', 'linux', '{{}}', 'x2', {now});
         INSERT INTO attestation_history (runner_id, slot, seq, received_at, probe_ok,
            probe_runtime, probe_checked_at, status)
            VALUES ('{REVOKED}', 1, 1, {now}, 1, 'podman', {now}, 'healthy');
         INSERT INTO status_changes (runner_id, at, from_status, to_status)
            VALUES ('{REVOKED}', {now}, NULL, 'healthy');
         INSERT INTO jobs (id, pool, payload, state, attempts, max_attempts, created_at, updated_at)
            VALUES ('{JOB}', 'linux', '{{}}', 'succeeded', 1, 3, {now}, {now});
         INSERT INTO leases (id, job_id, runner_id, pool, token_hash, state, attempt, granted_at,
            expires_at) VALUES ('{LEASE}', '{JOB}', '{REVOKED}', 'linux', 'h', 'completed', 1,
            {now}, {now});
         INSERT INTO job_events (job_id, at, kind, runner_id, lease_id)
            VALUES ('{JOB}', {now}, 'completed', '{REVOKED}', '{LEASE}');"
    ))
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_versions_sqlite_database_upgrades_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("previous.db");
    previous_version(&path);
    let url = format!("sqlite://{}", path.display());
    let app = spawn_app_with(|a| a.database_url = url).await;

    let revoked = app.runner(REVOKED).await;
    assert_eq!(revoked["status"], "revoked", "{revoked}");
    assert_eq!(revoked["name"], "build-1");
    assert_eq!(
        revoked["attestations"].as_array().unwrap().len(),
        1,
        "{revoked}"
    );
    assert_eq!(
        revoked["status_changes"].as_array().unwrap().len(),
        1,
        "{revoked}"
    );
    assert_eq!(revoked["leases"][0]["lease_id"], LEASE, "{revoked}");
    let job = app.job(JOB).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["events"].as_array().unwrap().len(), 1, "{job}");

    // The revoked runner's name is free; the live one's is not.
    app.register("linux", "build-1").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": app.registration_token("linux").await,
                   "name": "build-2", "public_key": key.public_jwk()}),
        )
        .await;
    expect_problem(r, "live name", StatusCode::CONFLICT, "runner_exists").await;

    // Foreign keys hold on the rebuilt table: a pool with runners cannot lose them unseen.
    let path = dir.path().join("previous.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let broken: i64 = conn
        .query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(broken, 0);
    let listed: Value = app
        .admin_get("/api/v1/admin/runners?pool=linux")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["runners"].as_array().unwrap().len(), 3, "{listed}");
}

//! Retention under steady load, on both engines: an injected clock drives 60 simulated days of
//! a small fleet (runners attesting hourly, failing now and then, 20 jobs per runner per day,
//! operators cordoning, registration tokens made and left to expire) through the store, with
//! the pruner's turn at the end of each day. The row counts level off once the horizons are
//! reached, the SQLite file stops growing (its free pages are reused), a queued and a running
//! job as old as the run stay, and what was pruned is counted in `/metrics`. The test prints
//! rows and bytes per day scaled to 1,000 runners (OPERATIONS.md quotes them). On PostgreSQL
//! the test vacuums after each day, as autovacuum would within the minute.

use crate::common;

use common::*;
use leasegate::domain::attestation::{Probe, RunningImage};
use leasegate::domain::audit::{Action, Entry};
use leasegate::domain::ids::{JobId, LeaseId, RunnerId};
use leasegate::domain::lease::{LeaseCall, Outcome};
use leasegate::domain::pool_name::PoolName;
use leasegate::domain::retention::Retention;
use leasegate::domain::status::RunnerStatus;
use leasegate::domain::time::Millis;
use leasegate::domain::verdict::AttestedState;
use leasegate::store::{AttestationRecord, Claim, DynStore, NewJob, NewRunner, RoundItem};

/// The status rules the store judges a pool by when a job's end may eject (the defaults).
const RULES: leasegate::domain::runner::StatusRules = leasegate::domain::runner::StatusRules {
    probe_max_age_s: 300,
    heartbeat_interval_s: 15,
};
use std::collections::BTreeMap;

const RUNNERS: usize = 5;
const JOBS_PER_RUNNER_PER_DAY: usize = 20;
const DAYS: i64 = 60;
const DAY_MS: i64 = 86_400_000;

const TABLES: [&str; 9] = [
    "jobs",
    "job_events",
    "leases",
    "refusals",
    "attestation_history",
    "status_changes",
    "audit",
    "registration_tokens",
    "runners",
];

fn audit(action: Action, target: &str, at: Millis) -> Entry {
    Entry {
        at,
        actor: "retention-test".into(),
        action,
        target: target.into(),
        detail: None,
        client: "127.0.0.1".into(),
    }
}

fn attestation(runner: &RunnerId, at: Millis, ok: bool) -> AttestationRecord {
    AttestationRecord {
        runner_id: runner.clone(),
        jti: uuid::Uuid::now_v7().to_string(),
        replay_until: at.plus_secs(60),
        received_at: at,
        state: AttestedState {
            probe: Probe {
                ok,
                runtime: "podman".into(),
                runtime_version: Some("5.4.2".into()),
                checked_at: at,
                error: (!ok).then(|| "default OCI runtime \"crun\" not found".into()),
                exit_code: (!ok).then_some(125),
                disk: Vec::new(),
            },
            image: RunningImage::default(),
            images: Vec::new(),
        },
        agent: None,
        status: if ok {
            RunnerStatus::Healthy
        } else {
            RunnerStatus::ProbeFailed
        },
        refusal: (!ok).then(|| ("probe_failed".into(), "crun not found".into())),
        judged_gate: Default::default(),
    }
}

/// One job's whole life at `at`: enqueued, leased by `runner`, started, completed.
async fn run_job(store: &DynStore, pool: &PoolName, runner: &RunnerId, at: Millis) {
    let job = NewJob {
        id: JobId::generate(),
        pool: pool.clone(),
        payload: serde_json::json!({"step": "build"}),
        max_attempts: 3,
        idempotency_key: None,
    };
    store.enqueue_job(job, at).await.unwrap();
    let hash = leasegate::secrets::hash_token(&format!("lgl_{}", uuid::Uuid::now_v7()));
    let claim = Claim {
        runner_id: runner.clone(),
        pool: pool.clone(),
        lease_id: LeaseId::generate(),
        token_hash: hash.clone(),
        ttl_s: 300,
        now: at,
    };
    let (lease, _) = store
        .claim_job(&claim)
        .await
        .unwrap()
        .expect("a job to claim");
    let start = LeaseCall::Start { ttl_s: 300 };
    store
        .lease_call(&lease.id, &hash, &start, at, RULES)
        .await
        .unwrap();
    let done = LeaseCall::Complete {
        outcome: Outcome::Succeeded,
        exit_code: Some(0),
        message: None,
    };
    let later = Millis(at.0 + 60_000);
    store
        .lease_call(&lease.id, &hash, &done, later, RULES)
        .await
        .unwrap();
}

async fn row_counts(app: &TestApp) -> BTreeMap<&'static str, i64> {
    let mut out = BTreeMap::new();
    match app.engine {
        Engine::Sqlite => {
            let path = app.database_url.trim_start_matches("sqlite://");
            let conn = rusqlite::Connection::open(path).unwrap();
            for t in TABLES {
                let n: i64 = conn
                    .query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get(0))
                    .unwrap();
                out.insert(t, n);
            }
        }
        Engine::Postgres => {
            let pool = sqlx::PgPool::connect(&app.database_url).await.unwrap();
            for t in TABLES {
                let n: i64 =
                    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {t}")))
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                out.insert(t, n);
            }
            pool.close().await;
        }
    }
    out
}

/// The bytes the database takes: (the whole, the part in use). SQLite's file after a
/// checkpoint, and its pages less the free ones; PostgreSQL's tables with their indexes.
async fn bytes(app: &TestApp) -> (i64, i64) {
    match app.engine {
        Engine::Sqlite => {
            let path = app.database_url.trim_start_matches("sqlite://");
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                .unwrap();
            let pragma = |p: &str| -> i64 {
                conn.query_row(&format!("PRAGMA {p}"), [], |r| r.get(0))
                    .unwrap()
            };
            let (pages, free, size) = (
                pragma("page_count"),
                pragma("freelist_count"),
                pragma("page_size"),
            );
            let file = std::fs::metadata(path).unwrap().len() as i64;
            (file, (pages - free) * size)
        }
        Engine::Postgres => {
            let pool = sqlx::PgPool::connect(&app.database_url).await.unwrap();
            let mut total = 0i64;
            for t in TABLES {
                let n: i64 =
                    sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)::BIGINT")
                        .bind(t)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                total += n;
            }
            pool.close().await;
            (total, total)
        }
    }
}

/// What PostgreSQL's autovacuum does on its own within a minute of a day's deletes (a day
/// here passes in well under a second): make the dead rows' space reusable.
async fn vacuum(app: &TestApp) {
    let pool = sqlx::PgPool::connect(&app.database_url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM {}", TABLES.join(", "))))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

each_engine!(
    one_replica_at_a_time_prunes,
    sixty_simulated_days_of_steady_load_keep_the_store_bounded,
);

async fn one_replica_at_a_time_prunes(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let store = app.state.store().clone();
    let metrics = app.state.metrics().clone();
    // Ahead of the real clock, so that the service's own pruner does not hold the task.
    let now = Millis::now().plus_secs(86_400);
    assert!(
        store
            .claim_task("prune", now, now.plus_secs(300))
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_task("prune", now, now.plus_secs(300))
            .await
            .unwrap(),
        "held"
    );
    let turn = leasegate::retention::prune_once(&store, &metrics, Retention::default(), now);
    assert_eq!(
        turn.await.unwrap(),
        None,
        "another replica's turn is not taken"
    );
    // A claim its replica never released lapses.
    let later = now.plus_secs(301);
    let turn = leasegate::retention::prune_once(&store, &metrics, Retention::default(), later);
    assert!(turn.await.unwrap().is_some());
    // A turn lets go when it is done.
    assert!(
        store
            .claim_task("prune", later, later.plus_secs(300))
            .await
            .unwrap()
    );
    // A replica whose claim lapsed while it worked does not let go of the next one's.
    let next = later.plus_secs(301);
    assert!(
        store
            .claim_task("prune", next, next.plus_secs(300))
            .await
            .unwrap()
    );
    store
        .release_task("prune", later.plus_secs(300), next)
        .await
        .unwrap();
    assert!(
        !store
            .claim_task("prune", next, next.plus_secs(300))
            .await
            .unwrap(),
        "still held"
    );
}

async fn sixty_simulated_days_of_steady_load_keep_the_store_bounded(engine: common::Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let store = app.state.store().clone();
    let metrics = app.state.metrics().clone();
    // The run starts now and goes 60 days ahead: the service's own pruner, on the real clock,
    // finds nothing old enough to take meanwhile.
    let base = Millis::now();
    let pool = PoolName::parse("linux").unwrap();
    app.pool("linux", &[IMAGE_A]).await;
    let mut runners = Vec::new();
    for i in 0..RUNNERS {
        let hash = leasegate::secrets::hash_token(&format!("lgr_{i}"));
        assert!(
            store
                .create_registration_token(
                    &pool,
                    &hash,
                    base.plus_secs(3600),
                    base,
                    &audit(Action::RegistrationTokenCreate, "linux", base)
                )
                .await
                .unwrap()
        );
        let runner = NewRunner {
            id: RunnerId::generate(),
            name: format!("runner-{i}"),
            labels: BTreeMap::new(),
            public_key_x: format!("key-{i}"),
            forge_runners: vec![],
        };
        runners.push(store.register_runner(&hash, runner, base).await.unwrap().id);
    }
    // A job left running and one left queued (in a pool nobody takes from) from the first
    // day: never old enough to prune.
    app.pool("idle", &[IMAGE_A]).await;
    let still_queued = JobId::generate();
    store
        .enqueue_job(
            NewJob {
                id: still_queued.clone(),
                pool: PoolName::parse("idle").unwrap(),
                payload: serde_json::json!({}),
                max_attempts: 3,
                idempotency_key: None,
            },
            base,
        )
        .await
        .unwrap();
    let still_running = JobId::generate();
    store
        .enqueue_job(
            NewJob {
                id: still_running.clone(),
                pool: pool.clone(),
                payload: serde_json::json!({}),
                max_attempts: 3,
                idempotency_key: None,
            },
            base,
        )
        .await
        .unwrap();
    let hash = leasegate::secrets::hash_token("lgl_held");
    let claim = Claim {
        runner_id: runners[0].clone(),
        pool: pool.clone(),
        lease_id: LeaseId::generate(),
        token_hash: hash.clone(),
        ttl_s: 300,
        now: base,
    };
    let (held, job) = store.claim_job(&claim).await.unwrap().unwrap();
    assert_eq!(job.id, still_running);
    // Alive past the run's real end, however slow the machine: the service's own sweeper, on
    // the real clock, would otherwise give the job back and a simulated day would run it.
    let alive = LeaseCall::Start {
        ttl_s: 100 * 86_400,
    };
    store
        .lease_call(&held.id, &hash, &alive, base, RULES)
        .await
        .unwrap();

    let mut at_day = BTreeMap::new();
    let mut pruned_total = 0u64;
    for day in 0..DAYS {
        let t0 = Millis(base.0 + day * DAY_MS);
        // Hourly attestations; each runner's probe fails for an hour twice a day.
        for hour in 0..24 {
            let at = Millis(t0.0 + hour * 3_600_000 + 1);
            for (i, runner) in runners.iter().enumerate() {
                let ok = hour != (3 + i as i64) && hour != (15 + i as i64);
                let item = RoundItem {
                    attestation: Some(attestation(runner, at, ok)),
                    claim: None,
                };
                store.submit(item).await.unwrap();
            }
        }
        // An operator cordons and uncordons a runner; a registration token is made and expires.
        let who = &runners[day as usize % RUNNERS];
        store
            .set_cordoned(who, true, &audit(Action::RunnerCordon, who.as_str(), t0))
            .await
            .unwrap();
        store
            .set_cordoned(who, false, &audit(Action::RunnerUncordon, who.as_str(), t0))
            .await
            .unwrap();
        let hash = leasegate::secrets::hash_token(&format!("lgr_day_{day}"));
        assert!(
            store
                .create_registration_token(
                    &pool,
                    &hash,
                    t0.plus_secs(3600),
                    t0,
                    &audit(Action::RegistrationTokenCreate, "linux", t0)
                )
                .await
                .unwrap()
        );
        for j in 0..RUNNERS * JOBS_PER_RUNNER_PER_DAY {
            let at = Millis(t0.0 + 600_000 + j as i64 * 700_000);
            run_job(&store, &pool, &runners[j % RUNNERS], at).await;
        }
        let end = Millis(t0.0 + DAY_MS - 1);
        // The service's own pruner may hold the task for a moment: the turn waits for it.
        let report = loop {
            match leasegate::retention::prune_once(&store, &metrics, Retention::default(), end)
                .await
                .unwrap()
            {
                Some(r) => break r,
                None => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        };
        pruned_total += report.total();
        if app.engine == Engine::Postgres {
            vacuum(&app).await;
        }
        if [13, 29, 44, 59].contains(&day) {
            at_day.insert(day + 1, (row_counts(&app).await, bytes(&app).await));
        }
    }

    let (c14, b14) = &at_day[&14];
    let (c45, b45) = &at_day[&45];
    let (c60, b60) = &at_day[&60];
    let jobs_per_day = (RUNNERS * JOBS_PER_RUNNER_PER_DAY) as i64;
    // Finished jobs are kept 30 days (and a day's batch at most): the rest went.
    assert!(c60["jobs"] <= 31 * jobs_per_day + 2, "{c60:?}");
    assert!(c60["jobs"] >= 29 * jobs_per_day, "{c60:?}");
    for t in TABLES {
        let (mid, last) = (c45[t], c60[t]);
        assert!(
            last as f64 <= mid as f64 * 1.05 + 5.0,
            "{t} kept growing: {mid} at day 45, {last} at day 60"
        );
    }
    // Three entries a day: the cordon, the uncordon and the registration token.
    assert!(c60["audit"] <= 15 * 3, "audit is kept 14 days: {c60:?}");
    assert!(c60["registration_tokens"] <= 3, "{c60:?}");
    assert_eq!(c60["runners"], RUNNERS as i64);
    // Nothing unfinished was touched.
    let (job, _) = store
        .get_job(&still_queued)
        .await
        .unwrap()
        .expect("the queued job stays");
    assert_eq!(job.state.as_str(), "queued");
    let (job, events) = store
        .get_job(&still_running)
        .await
        .unwrap()
        .expect("the running job stays");
    assert_eq!(job.state.as_str(), "running");
    assert!(!events.is_empty(), "its events stay with it");
    // The store levels off in bytes too; SQLite's file reuses the pages pruning freed.
    assert!(
        b60.0 as f64 <= b45.0 as f64 * 1.15,
        "{} bytes at day 45, {} at day 60",
        b45.0,
        b60.0
    );
    let metrics_text = app.metrics_text().await;
    assert!(
        metrics_text.contains("leasegate_pruned_rows_total{kind=\"jobs\"}"),
        "{metrics_text}"
    );
    assert!(pruned_total > 0);

    // Per day per 1,000 runners: what the first 14 days (nothing pruned yet) wrote, scaled.
    let scale = 1000.0 / RUNNERS as f64;
    let per_day = |n: i64| n as f64 / 14.0 * scale;
    println!(
        "retention on {:?}: rows and bytes per day per 1,000 runners (20 jobs per runner per day, hourly attestations):",
        app.engine
    );
    // Runners and registration tokens come with the fleet's changes, not with its load.
    for t in &TABLES[..7] {
        println!(
            "  {t:>20}: {:>9.0} rows/day (kept at day 60: {})",
            per_day(c14[t]),
            c60[t]
        );
    }
    println!(
        "  {:>20}: {:>9.0} bytes/day; whole store at day 14 {} B, day 45 {} B, day 60 {} B (in use {} B)",
        "bytes",
        per_day(b14.1),
        b14.0,
        b45.0,
        b60.0,
        b60.1
    );
}

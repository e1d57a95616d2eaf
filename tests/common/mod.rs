//! The test harness: `spawn_app()` starts the real service on 127.0.0.1:0 with a fresh
//! database and returns a `TestApp` with typed helpers, so that tests read as arrange / act /
//! assert against a real listener.
#![allow(dead_code, unused_macros, unused_imports)]

pub mod agent;
pub mod binary;
pub mod forges;
pub mod github;
pub mod log;
pub mod oci;
pub mod pg;
pub mod pg_cluster;
pub mod proxy;
pub mod records;
pub mod skip;

use leasegate::agent::keys::RunnerKey;
use leasegate::app::AppState;
use leasegate::config::{LogFormat, ServeArgs};
use leasegate::domain::time::Millis;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// An address on 127.0.0.1 that refuses connections for as long as the returned socket lives:
/// bound and never listening, so the kernel answers a connect with a reset, and no other test's
/// server can be given its port meanwhile. (A port merely closed can be: a test that expects
/// "refused" then reaches whatever another test started there.)
pub fn refusing_address() -> (tokio::net::TcpSocket, std::net::SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// A port on 127.0.0.1 for a server the test starts in another process (which must bind it
/// itself): free when chosen, below the kernel's ephemeral range (so no `bind(0)` of another
/// test's server and no outgoing connection is given it meanwhile, as a port of a socket just
/// closed may be), and never chosen twice in this run.
pub fn free_port() -> u16 {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static CHOSEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    const LOWEST: u32 = 20_000;
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .clamp(LOWEST + 1_000, 65_536);
    let span = ephemeral_from - LOWEST;
    // Where each run starts differs, so that runs side by side seldom try the same ports.
    let start = (std::process::id() as u32).wrapping_mul(7_919) % span;
    let mut chosen = CHOSEN.lock().unwrap();
    for step in 0..span {
        let port = (LOWEST + (start + step) % span) as u16;
        if !chosen.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            chosen.insert(port);
            return port;
        }
    }
    panic!("no free port below {ephemeral_from} on 127.0.0.1");
}

pub const IMAGE_A: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const IMAGE_B: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
pub const ADMIN: &str = "test-admin-token-0123456789abcdef0123";
pub const FORGE: &str = "test-forge-token-0123456789abcdef0123";

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub state: AppState,
    pub shutdown: CancellationToken,
    pub server: tokio::task::JoinHandle<()>,
    /// `http://addr` of the metrics' own listener, when `metrics_listen` is set (give it
    /// `127.0.0.1:0`: the harness binds it before the service starts and says where here).
    pub metrics_base: Option<String>,
    pub engine: Engine,
    /// The database URL this app runs on (another replica may share it).
    pub database_url: String,
    _dir: tempfile::TempDir,
    _db: Option<pg::TestDatabase>,
}

/// The engines the suite runs every case on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// The one way a case runs on both engines: `each_engine!(case, …)` makes a test of each
/// `async fn case(engine: Engine)` on SQLite and on PostgreSQL. The case gets its app from
/// `spawn_app_on_with(engine, adjust)` (`None`, and the case returns: no PostgreSQL is
/// configured, which is printed; with `LEASEGATE_REQUIRE_POSTGRES=1` it fails instead), after
/// starting whatever the app points at. The cases are plain functions, so rustfmt formats them.
macro_rules! each_engine {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::common::Engine::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::common::Engine::Postgres).await
                }
            )*
        }
    };
}
pub(crate) use each_engine;

/// The configuration a test app runs with; tests adjust it before spawning.
pub fn test_args(dir: &std::path::Path) -> ServeArgs {
    ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: format!("sqlite://{}", dir.join("test.db").display()),
        admin_token: Some(ADMIN.into()),
        admin_token_file: None,
        forge_token: Some(FORGE.into()),
        forge_token_file: None,
        admin_token_previous: None,
        admin_token_previous_file: None,
        forge_token_previous: None,
        forge_token_previous_file: None,
        retain_jobs_days: 30,
        retain_history_days: 14,
        audience: "leasegate".into(),
        attestation_max_age_s: 60,
        probe_max_age_s: 300,
        lease_ttl_s: 300,
        heartbeat_interval_s: 15,
        attestation_max_lifetime_s: 300,
        clock_skew_s: 30,
        max_body_bytes: 65536,
        header_timeout_s: 10,
        body_timeout_s: 10,
        body_min_rate: 1024,
        idle_timeout_s: 75,
        max_connections: None,
        max_connections_per_peer: None,
        trusted_proxies: vec![],
        // The suite makes many failed calls on purpose from one address; the throttle's own
        // tests set the default back.
        auth_failure_limit: 10_000,
        auth_failure_window_s: 60,
        metrics_token: None,
        metrics_token_file: None,
        metrics_listen: None,
        forgejo_upstream: None,
        gitlab_upstream: None,
        woodpecker_upstream: None,
        woodpecker_listen: None,
        forge_ca_file: None,
        forge_max_body_bytes: 1 << 30,
        forge_unbound: leasegate::config::ForgeUnbound::Refuse,
        forge_hold_s: 30,
        forge_timeout_s: 120,
        github_api_url: "https://api.github.com".into(),
        github_app_id: None,
        github_app_key_file: None,
        github_installation_id: None,
        github_token: None,
        github_token_file: None,
        github_ca_file: None,
        github_poll_s: 10,
        github_unused_ttl_s: 300,
        buildkite_token: None,
        buildkite_token_file: None,
        buildkite_org: None,
        buildkite_api_url: "https://api.buildkite.com".into(),
        buildkite_pause_minutes: 10,
        db_max_connections: 8,
        db_acquire_timeout_ms: 3000,
        db_statement_timeout_ms: 5000,
        registry_platform: "linux/amd64".into(),
        registry_auth_file: None,
        registry_auth: None,
        insecure_registries: vec![],
        // Off unless a test asks for it: a registry pool's reference is never resolved behind
        // a test's back (a reference without a host is on Docker Hub, off this machine).
        registry_resolver: false,
        registry_timeout_s: 10,
        resolver_failure_threshold: 3,
        roll_stalled_share: 0.5,
        sqlite_synchronous: leasegate::store::sqlite::Synchronous::Normal,
        log_format: LogFormat::Human,
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(adjust: impl FnOnce(&mut ServeArgs)) -> TestApp {
    spawn_app_on_with(Engine::Sqlite, adjust)
        .await
        .expect("sqlite app")
}

/// A fresh app on `engine`; `None` when the engine is not available here (the reason printed).
pub async fn spawn_app_on(engine: Engine) -> Option<TestApp> {
    spawn_app_on_with(engine, |_| {}).await
}

pub async fn spawn_app_on_with(
    engine: Engine,
    adjust: impl FnOnce(&mut ServeArgs),
) -> Option<TestApp> {
    let dir = tempfile::tempdir().unwrap();
    let mut args = test_args(dir.path());
    let db = match engine {
        Engine::Sqlite => None,
        Engine::Postgres => {
            let db = pg::TestDatabase::create().await?;
            args.database_url = db.url.clone();
            Some(db)
        }
    };
    adjust(&mut args);
    Some(start_replica(args, dir, db, engine).await)
}

/// Another replica on the database `of` runs on (PostgreSQL only makes sense here).
pub async fn spawn_replica(of: &TestApp) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let mut args = test_args(dir.path());
    args.database_url = of.database_url.clone();
    start_replica(args, dir, None, of.engine).await
}

/// Another replica on the database `of` runs on, with its configuration adjusted.
pub async fn spawn_replica_with(of: &TestApp, adjust: impl FnOnce(&mut ServeArgs)) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let mut args = test_args(dir.path());
    args.database_url = of.database_url.clone();
    adjust(&mut args);
    start_replica(args, dir, None, of.engine).await
}

impl TestApp {
    /// Runs `sql` (`$1`: `id`) on this app's database, as a change nothing in the service
    /// hears of (another replica's write whose announcement was lost, an operator's `UPDATE`).
    pub async fn behind_the_service(&self, sql: &str, id: &str) {
        match self.engine {
            Engine::Sqlite => {
                let path = self.database_url.trim_start_matches("sqlite://");
                let conn = rusqlite::Connection::open(path).expect("the database file");
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                conn.execute(&sql.replace("$1", "?1"), [id])
                    .expect("the update");
            }
            Engine::Postgres => {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(&self.database_url)
                    .await
                    .unwrap();
                sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                    .bind(id)
                    .execute(&mut conn)
                    .await
                    .expect("the update");
            }
        }
    }

    /// Stops this service and serves its database again with `adjust`ed settings, as after a
    /// restart (on SQLite one process at a time may serve the file).
    pub async fn restart_with(self, adjust: impl FnOnce(&mut ServeArgs)) -> TestApp {
        let TestApp {
            state,
            shutdown,
            server,
            engine,
            database_url,
            _dir,
            _db,
            ..
        } = self;
        shutdown.cancel();
        let _ = server.await;
        drop(state);
        let mut args = test_args(_dir.path());
        args.database_url = database_url;
        adjust(&mut args);
        // The stopped service lets go of the database as its tasks wind down.
        let started = std::time::Instant::now();
        loop {
            let shutdown = CancellationToken::new();
            match leasegate::server::prepare(&args, shutdown.clone()).await {
                Ok(state) => return serve(state, args, shutdown, _dir, _db, engine).await,
                Err(e)
                    if format!("{e:#}").contains("another leasegate process")
                        && started.elapsed() < std::time::Duration::from_secs(10) =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => panic!("the service restarts: {e:#}"),
            }
        }
    }
}

async fn start_replica(
    args: ServeArgs,
    dir: tempfile::TempDir,
    db: Option<pg::TestDatabase>,
    engine: Engine,
) -> TestApp {
    let shutdown = CancellationToken::new();
    let state = leasegate::server::prepare(&args, shutdown.clone())
        .await
        .expect("service prepares");
    serve(state, args, shutdown, dir, db, engine).await
}

async fn serve(
    state: AppState,
    args: ServeArgs,
    shutdown: CancellationToken,
    dir: tempfile::TempDir,
    db: Option<pg::TestDatabase>,
    engine: Engine,
) -> TestApp {
    // Every listener is bound here, before the service starts, as `serve` binds them (the
    // API's at `127.0.0.1:0`, `test_args`): a port picked beforehand and bound later could be
    // given to another test's server meanwhile.
    let listeners = leasegate::startup::bind(&args)
        .await
        .expect("the service's listeners bind");
    let base = format!("http://{}", listeners.api.local_addr().unwrap());
    let metrics_base = listeners
        .metrics
        .as_ref()
        .map(|l| format!("http://{}", l.local_addr().unwrap()));
    let server_state = state.clone();
    let server = tokio::spawn(async move {
        leasegate::server::run_on(listeners, server_state)
            .await
            .expect("server runs");
    });
    TestApp {
        base,
        client: reqwest::Client::new(),
        state,
        shutdown,
        server,
        metrics_base,
        engine,
        database_url: args.database_url,
        _dir: dir,
        _db: db,
    }
}

/// A registered runner with its key, able to sign attestations.
pub struct TestRunner {
    pub id: String,
    pub pool: String,
    pub key: RunnerKey,
}

pub fn now_s() -> i64 {
    Millis::now().0 / 1000
}

/// Merges `patch` into `base`: objects recursively, `null` removes a key.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

impl TestRunner {
    /// Healthy claims on IMAGE_A, fresh, unique jti.
    pub fn claims(&self) -> Value {
        let now = now_s();
        json!({
            "iss": self.id, "sub": self.id, "aud": "leasegate",
            "iat": now, "exp": now + 60, "jti": uuid::Uuid::now_v7().to_string(),
            "probe": {"ok": true, "runtime": "podman", "runtime_version": "4.3.1", "checked_at": now},
            "image": {"id": IMAGE_A},
        })
    }

    /// A signed attestation: the healthy claims with `patch` merged in.
    pub fn attest(&self, patch: Value) -> String {
        let mut claims = self.claims();
        merge(&mut claims, &patch);
        self.key.sign_attestation(&self.id, &claims)
    }

    pub fn healthy(&self) -> String {
        self.attest(json!({}))
    }

    pub fn failing(&self, error: &str) -> String {
        self.attest(json!({"probe": {"ok": false, "error": error, "exit_code": 125}}))
    }
}

/// A granted lease.
pub struct Granted {
    pub lease_id: String,
    pub token: String,
    pub job_id: String,
    pub body: Value,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// What `GET /metrics` answers, as text.
    pub async fn metrics_text(&self) -> String {
        let r = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "GET /metrics");
        r.text().await.unwrap()
    }

    /// A page of the operators' site, as an admin who logged in through the form sees it.
    pub async fn page_text(&self, path: &str) -> String {
        let login = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .post(self.url("/admin/login"))
            .form(&[("token", ADMIN)])
            .send()
            .await
            .unwrap();
        let cookie = login.headers()[reqwest::header::SET_COOKIE]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string();
        let r = self
            .client
            .get(self.url(path))
            .header(reqwest::header::COOKIE, cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "GET {path}");
        r.text().await.unwrap()
    }

    pub async fn admin_put(&self, path: &str, body: Value) -> Response {
        self.client
            .put(self.url(path))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// `PATCH` with a JSON merge patch (`application/merge-patch+json`).
    pub async fn admin_patch(&self, path: &str, patch: Value) -> Response {
        self.client
            .patch(self.url(path))
            .bearer_auth(ADMIN)
            .header("content-type", "application/merge-patch+json")
            .body(patch.to_string())
            .send()
            .await
            .unwrap()
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn admin_get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
    }

    pub async fn forge_post(&self, path: &str, body: Value) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(FORGE)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn forge_get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(FORGE)
            .send()
            .await
            .unwrap()
    }

    pub async fn post(&self, path: &str, body: Value) -> Response {
        self.client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// An `enforce` pool expecting `images`.
    pub async fn pool(&self, name: &str, images: &[&str]) -> Value {
        let r = self
            .admin_put(
                &format!("/api/v1/admin/pools/{name}"),
                json!({"expected_image_ids": images}),
            )
            .await;
        assert!(r.status().is_success(), "pool {name}: {}", r.status());
        r.json().await.unwrap()
    }

    pub async fn registration_token(&self, pool: &str) -> String {
        let r = self
            .admin_post(
                &format!("/api/v1/admin/pools/{pool}/registration-tokens"),
                json!({}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        r.json::<Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// The pool `linux` (on `IMAGE_A`) and its runner `r0`, registered and heartbeating.
    pub async fn one_healthy_runner(&self) -> TestRunner {
        self.pool("linux", &[IMAGE_A]).await;
        let runner = self.register("linux", "r0").await;
        assert_eq!(
            self.heartbeat(&runner.healthy()).await.status(),
            StatusCode::OK
        );
        runner
    }

    pub async fn register(&self, pool: &str, name: &str) -> TestRunner {
        let token = self.registration_token(pool).await;
        let key = RunnerKey::generate();
        let r = self
            .post(
                "/api/v1/runners",
                json!({"registration_token": token, "name": name, "public_key": key.public_jwk(), "labels": {"os": "linux"}}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let body: Value = r.json().await.unwrap();
        TestRunner {
            id: body["runner_id"].as_str().unwrap().to_string(),
            pool: pool.into(),
            key,
        }
    }

    pub async fn heartbeat(&self, attestation: &str) -> Response {
        self.post(
            "/api/v1/runners/heartbeat",
            json!({"attestation": attestation}),
        )
        .await
    }

    pub async fn lease(&self, attestation: &str) -> Response {
        self.post("/api/v1/lease", json!({"attestation": attestation}))
            .await
    }

    pub async fn lease_wait(&self, attestation: &str, wait_s: u64) -> Response {
        self.post(
            "/api/v1/lease",
            json!({"attestation": attestation, "wait_s": wait_s}),
        )
        .await
    }

    /// A long poll sent from a task of its own (`lease_wait`), for a test that acts while it
    /// waits and reads its answer after.
    pub fn spawn_lease_wait(
        &self,
        attestation: String,
        wait_s: u64,
    ) -> tokio::task::JoinHandle<Response> {
        let client = self.client.clone();
        let url = self.url("/api/v1/lease");
        tokio::spawn(async move {
            client
                .post(url)
                .json(&json!({"attestation": attestation, "wait_s": wait_s}))
                .send()
                .await
                .unwrap()
        })
    }

    /// Leases a job for `runner`, asserting that one is granted.
    pub async fn grant(&self, runner: &TestRunner) -> Granted {
        let r = self.lease(&runner.healthy()).await;
        assert_eq!(r.status(), StatusCode::OK, "lease was not granted");
        let body: Value = r.json().await.unwrap();
        Granted {
            lease_id: body["lease_id"].as_str().unwrap().into(),
            token: body["lease_token"].as_str().unwrap().into(),
            job_id: body["job"]["id"].as_str().unwrap().into(),
            body,
        }
    }

    pub async fn enqueue(&self, pool: &str) -> String {
        self.enqueue_with(json!({"pool": pool, "payload": {"script": "make test"}}))
            .await
    }

    pub async fn enqueue_with(&self, body: Value) -> String {
        let r = self.forge_post("/api/v1/jobs", body).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        r.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub async fn job(&self, id: &str) -> Value {
        let r = self.forge_get(&format!("/api/v1/jobs/{id}")).await;
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// `start`, `extend`, `complete` or `abandon` on a lease with its token.
    pub async fn call(&self, lease: &Granted, action: &str, body: Option<Value>) -> Response {
        self.call_with(&lease.lease_id, &lease.token, action, body)
            .await
    }

    pub async fn call_with(
        &self,
        lease_id: &str,
        token: &str,
        action: &str,
        body: Option<Value>,
    ) -> Response {
        let mut req = self
            .client
            .post(self.url(&format!("/api/v1/leases/{lease_id}/{action}")))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.unwrap()
    }

    pub async fn runner(&self, id: &str) -> Value {
        let r = self.admin_get(&format!("/api/v1/admin/runners/{id}")).await;
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// Runs the sweeper once as if it were `secs_ahead` seconds from now.
    pub async fn sweep_ahead(&self, secs_ahead: i64) {
        let (store, metrics) = (self.state.store(), self.state.metrics());
        leasegate::sweeper::sweep_once(store, metrics, Millis::now().plus_secs(secs_ahead))
            .await
            .unwrap();
    }
}

/// Asserts that `r` is a problem with `status` and `code`; returns its body. `case` names the
/// case in a table-driven test.
pub async fn expect_problem(r: Response, case: &str, status: StatusCode, code: &str) -> Value {
    assert_eq!(r.status(), status, "{case}: status");
    let content_type = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(
        content_type.as_deref(),
        Some("application/problem+json"),
        "{case}: content type"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], code, "{case}: {body}");
    assert_eq!(body["status"], status.as_u16(), "{case}: {body}");
    for field in ["type", "title", "detail"] {
        assert!(body.get(field).is_some(), "{case}: problem without {field}");
    }
    body
}

/// The problem's `code`, asserting the problem+json shape and the status.
pub async fn problem(r: Response, status: StatusCode) -> Value {
    assert_eq!(r.status(), status, "unexpected status");
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(ct.as_deref(), Some("application/problem+json"));
    let body: Value = r.json().await.unwrap();
    for field in ["type", "title", "status", "detail", "code"] {
        assert!(body.get(field).is_some(), "problem without {field}: {body}");
    }
    assert_eq!(body["status"], status.as_u16());
    body
}

pub async fn code_of(r: Response, status: StatusCode) -> String {
    problem(r, status).await["code"]
        .as_str()
        .unwrap()
        .to_string()
}

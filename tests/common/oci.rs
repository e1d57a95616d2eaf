//! OCI registries for tests: Debian's `docker-registry` (the reference distribution registry)
//! started on 127.0.0.1 with a configuration and a storage directory of the test's own, images
//! built and pushed with podman, and a tiny axum registry that demands basic or bearer
//! authentication.
//!
//! Tests that need `docker-registry` or podman call `tools()` first: without them the test is
//! skipped with a printed reason, unless `LEASEGATE_REQUIRE_REGISTRY=1` (set by `.ci/run`),
//! in which case it fails.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::process::{Child, Command};

pub use super::free_port;

pub const REQUIRE_VAR: &str = "LEASEGATE_REQUIRE_REGISTRY";
pub const REGISTRY_BIN: &str = "docker-registry";

fn required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1")
}

async fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// Whether `docker-registry` and podman are here. `false` (the reason printed) skips the
/// test; with `LEASEGATE_REQUIRE_REGISTRY=1` a missing tool fails it instead.
pub async fn tools() -> bool {
    let mut missing = Vec::new();
    if !runs(REGISTRY_BIN, "--version").await {
        missing.push("docker-registry (Debian package docker-registry)");
    }
    if !runs("podman", "--version").await {
        missing.push("podman");
    }
    if missing.is_empty() {
        return true;
    }
    let reason = format!("{} not installed", missing.join(" and "));
    if required() {
        panic!("{REQUIRE_VAR}=1 but {reason}");
    }
    super::skip::skipped(format!(
        "registry case ({reason}; set {REQUIRE_VAR}=1 to fail instead)"
    ));
    false
}

/// Where a registry sends push notifications.
pub struct Notify {
    pub url: String,
    pub bearer: String,
}

/// A `docker-registry` process on 127.0.0.1:`port`, storing in a temporary directory.
pub struct TestRegistry {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    notify: Option<(String, String)>,
}

impl TestRegistry {
    pub async fn start() -> TestRegistry {
        Self::start_on(free_port(), None).await
    }

    /// Starts on `port`, notifying `notify` of pushes when given.
    pub async fn start_on(port: u16, notify: Option<Notify>) -> TestRegistry {
        let mut registry = TestRegistry {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
            notify: notify.map(|n| (n.url, n.bearer)),
        };
        registry.spawn().await;
        registry
    }

    /// `127.0.0.1:port`, as `LEASEGATE_INSECURE_REGISTRIES` and image refs name it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:port/<repository>:<tag>`.
    pub fn image_ref(&self, repository_tag: &str) -> String {
        format!("{}/{repository_tag}", self.host())
    }

    async fn spawn(&mut self) {
        let storage = self.dir.path().join("storage");
        std::fs::create_dir_all(&storage).unwrap();
        // Never the package's default configuration: it listens on every interface.
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{}\n",
            storage.display(),
            self.port
        );
        if let Some((url, bearer)) = &self.notify {
            config.push_str(&format!(
                "notifications:\n  endpoints:\n    - name: leasegate\n      url: {url}\n      headers:\n        Authorization: [\"Bearer {bearer}\"]\n      timeout: 2s\n      threshold: 10\n      backoff: 1s\n"
            ));
        }
        let config_path = self.dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(self.dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("docker-registry starts");
        self.child = Some(child);
        let client = reqwest::Client::new();
        let url = format!("http://{}/v2/", self.host());
        for _ in 0..100 {
            if let Ok(r) = client.get(&url).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("docker-registry did not answer on {url}: {}", self.log());
    }

    /// Kills the process (SIGKILL), as a crash or an outage would end it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.ok();
        }
    }

    /// Starts the registry again on the same port, with the same storage.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

async fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("podman runs");
    assert!(
        out.status.success(),
        "podman {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A local podman image built `FROM scratch`, removed when dropped.
pub struct LocalImage {
    /// `localhost/leasegate-test-<uuid>`, unique to the test.
    pub name: String,
    /// `sha256:<podman's image ID>`: the config digest, what a runner reports as `image.id`.
    pub id: String,
}

impl LocalImage {
    /// Builds an image whose one file holds `content` (and a unique nonce), for `platform`.
    pub async fn build(content: &str, platform: Option<&str>) -> LocalImage {
        let dir = tempfile::tempdir().unwrap();
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        std::fs::write(dir.path().join("somefile"), format!("{content} {nonce}\n")).unwrap();
        std::fs::write(
            dir.path().join("Containerfile"),
            "FROM scratch\nCOPY somefile /somefile\n",
        )
        .unwrap();
        let name = format!("localhost/leasegate-test-{nonce}");
        let context = dir.path().to_str().unwrap();
        let mut args = vec!["build", "-q", "-t", &name];
        if let Some(p) = platform {
            args.extend(["--platform", p]);
        }
        args.push(context);
        podman(&args).await;
        let id = podman(&["image", "inspect", "--format", "{{.Id}}", &name]).await;
        LocalImage {
            id: format!("sha256:{id}"),
            name,
        }
    }

    /// `podman push --tls-verify=false` to `destination` (`127.0.0.1:port/repo:tag`).
    pub async fn push(&self, destination: &str) {
        podman(&[
            "push",
            "--tls-verify=false",
            &self.name,
            &format!("docker://{destination}"),
        ])
        .await;
    }
}

impl Drop for LocalImage {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman")
            .args(["rmi", "-f", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A podman manifest list of `images`, pushed with `--all`; removed when dropped.
pub struct LocalIndex {
    pub name: String,
}

impl LocalIndex {
    pub async fn create(images: &[&LocalImage]) -> LocalIndex {
        let name = format!(
            "localhost/leasegate-test-index-{}",
            uuid::Uuid::now_v7().simple()
        );
        podman(&["manifest", "create", &name]).await;
        for image in images {
            podman(&[
                "manifest",
                "add",
                &name,
                &format!("containers-storage:{}", image.name),
            ])
            .await;
        }
        LocalIndex { name }
    }

    pub async fn push(&self, destination: &str) {
        podman(&[
            "manifest",
            "push",
            "--all",
            "--tls-verify=false",
            &self.name,
            &format!("docker://{destination}"),
        ])
        .await;
    }
}

impl Drop for LocalIndex {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman")
            .args(["manifest", "rm", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

// ---------------------------------------------------------------------------------------------
// A registry that demands authentication
// ---------------------------------------------------------------------------------------------

pub const USER: &str = "ci";
pub const PASSWORD: &str = "s3cret-pa55";
pub const TOKEN: &str = "tok-1234567890";
pub const CONFIG_DIGEST: &str =
    "sha256:0fe3c799a0f15af08aae8de219301ea0d02ec887bd9ff650cda30239a4aa6982";

/// How the fake registry wants to be spoken to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeAuth {
    Basic,
    Bearer,
}

struct FakeState {
    auth: FakeAuth,
    port: u16,
    manifest: Vec<u8>,
    token_requests: AtomicUsize,
    manifest_requests: AtomicUsize,
    /// When set, every manifest request answers this status.
    fail_with: Mutex<Option<u16>>,
}

/// A tiny registry on 127.0.0.1 that serves one manifest, `ci/runner:stable`, behind basic
/// auth or the bearer-token challenge (with its own `/token` endpoint).
pub struct FakeRegistry {
    pub port: u16,
    state: Arc<FakeState>,
    server: tokio::task::JoinHandle<()>,
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

async fn fake_manifest(
    State(state): State<Arc<FakeState>>,
    Path(reference): Path<String>,
    headers: HeaderMap,
) -> Response {
    state.manifest_requests.fetch_add(1, Ordering::SeqCst);
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let (wanted, challenge) = match state.auth {
        FakeAuth::Basic => (basic(USER, PASSWORD), r#"Basic realm="fake""#.to_string()),
        FakeAuth::Bearer => (
            format!("Bearer {TOKEN}"),
            format!(
                r#"Bearer realm="http://127.0.0.1:{}/token",service="test",scope="repository:ci/runner:pull""#,
                state.port
            ),
        ),
    };
    if presented != wanted {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
        )
            .into_response();
    }
    if let Some(status) = *state.fail_with.lock().unwrap() {
        return (
            StatusCode::from_u16(status).unwrap(),
            r#"{"errors":[{"code":"UNKNOWN","message":"the fake registry is failing"}]}"#,
        )
            .into_response();
    }
    let digest = sha256(&state.manifest);
    if reference != "stable" && reference != digest {
        return (
            StatusCode::NOT_FOUND,
            r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
        )
            .into_response();
    }
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                "application/vnd.oci.image.manifest.v1+json".to_string(),
            ),
            (
                header::HeaderName::from_static("docker-content-digest"),
                digest,
            ),
        ],
        state.manifest.clone(),
    )
        .into_response()
}

async fn fake_token(
    State(state): State<Arc<FakeState>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    state.token_requests.fetch_add(1, Ordering::SeqCst);
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let right_request = query.get("service").map(String::as_str) == Some("test")
        && query.get("scope").map(String::as_str) == Some("repository:ci/runner:pull");
    if presented != basic(USER, PASSWORD) || !right_request {
        return (StatusCode::UNAUTHORIZED, "{}").into_response();
    }
    axum::Json(serde_json::json!({"token": TOKEN, "expires_in": 300})).into_response()
}

impl FakeRegistry {
    pub async fn start(auth: FakeAuth) -> FakeRegistry {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{CONFIG_DIGEST}","size":2}},"layers":[]}}"#
        )
        .into_bytes();
        let state = Arc::new(FakeState {
            auth,
            port,
            manifest,
            token_requests: AtomicUsize::new(0),
            manifest_requests: AtomicUsize::new(0),
            fail_with: Mutex::new(None),
        });
        let app = Router::new()
            .route("/v2/ci/runner/manifests/{reference}", get(fake_manifest))
            .route("/token", get(fake_token))
            .with_state(state.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeRegistry {
            port,
            state,
            server,
        }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn image_ref(&self) -> String {
        format!("{}/ci/runner:stable", self.host())
    }

    /// The digest of the one manifest it serves.
    pub fn manifest_digest(&self) -> String {
        sha256(&self.state.manifest)
    }

    pub fn token_requests(&self) -> usize {
        self.state.token_requests.load(Ordering::SeqCst)
    }

    pub fn manifest_requests(&self) -> usize {
        self.state.manifest_requests.load(Ordering::SeqCst)
    }

    /// Makes every manifest request answer `status` (or serve again, with `None`).
    pub fn fail_with(&self, status: Option<u16>) {
        *self.state.fail_with.lock().unwrap() = status;
    }

    /// An auth file (podman's format) for this registry with `password`.
    pub fn auth_file(&self, dir: &std::path::Path, password: &str) -> PathBuf {
        let path = dir.join("auth.json");
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"));
        std::fs::write(
            &path,
            serde_json::json!({"auths": {self.host(): {"auth": auth}}}).to_string(),
        )
        .unwrap();
        path
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.server.abort();
    }
}

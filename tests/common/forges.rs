//! Test forges: small servers on 127.0.0.1 that implement what Forgejo/Gitea and GitLab do for
//! their runners, as far as the forge gate is concerned, and record every call they get.
//!
//! `FakeForgejo` speaks the Connect protocol of `runner.v1.RunnerService` in both codecs, with
//! the messages as the published definitions give them (field numbers and all, through
//! prost): `FetchTask` claims the oldest queued task for the runner that asks (its
//! `x-runner-uuid` and `x-runner-token` checked), or answers no task with the forge's tasks
//! version. `FakeGitlab` answers `POST /api/v4/jobs/request` with `201` and a job or `204` and
//! `X-GitLab-Last-Update`, holding a request that names the current `last_update` as GitLab's
//! long poll does. Both serve the other calls a runner makes (updates, logs, traces,
//! artifacts): a streamed upload is counted and hashed, a download is gzipped, `/blob/{n}`
//! streams `n` bytes of `blob_byte`, and `/slow/{s}` answers after `s` seconds.
//!
//! Both route like the most lenient forge there is (`lenient`): they decode the path (again and
//! again, as a proxy and a forge each might), read a backslash as a slash, drop empty and dot
//! segments, ignore the case of the calls that hand out work, stop a segment at a NUL, and the
//! GitLab drops a format suffix (`request.json`) as Grape does. Its job request reads the token
//! where Grape reads params (JSON body, form body, query, the `RUNNER-TOKEN` header). So any
//! spelling of a fetch the gate lets through is served, and counted.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// `runner.v1` messages, as published (`FetchTaskRequest { int64 tasks_version = 1; }`, …).
pub mod runner_v1 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FetchTaskRequest {
        #[prost(int64, tag = "1")]
        pub tasks_version: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FetchTaskResponse {
        #[prost(message, optional, tag = "1")]
        pub task: Option<Task>,
        #[prost(int64, tag = "2")]
        pub tasks_version: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Task {
        #[prost(int64, tag = "1")]
        pub id: i64,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub workflow_payload: Option<Vec<u8>>,
        #[prost(map = "string, string", tag = "4")]
        pub secrets: std::collections::HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateLogRequest {
        #[prost(int64, tag = "1")]
        pub task_id: i64,
        #[prost(int64, tag = "2")]
        pub index: i64,
        #[prost(bool, tag = "4")]
        pub no_more: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateTaskRequest {
        #[prost(message, optional, tag = "1")]
        pub state: Option<TaskState>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TaskState {
        #[prost(int64, tag = "1")]
        pub id: i64,
        /// `Result`: 0 unspecified, 1 success, 2 failure, 3 cancelled, 4 skipped.
        #[prost(int32, tag = "2")]
        pub result: i32,
        #[prost(message, optional, tag = "3")]
        pub started_at: Option<Timestamp>,
        #[prost(message, optional, tag = "4")]
        pub stopped_at: Option<Timestamp>,
        #[prost(message, repeated, tag = "5")]
        pub steps: Vec<StepState>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StepState {
        #[prost(int64, tag = "1")]
        pub id: i64,
        #[prost(int32, tag = "2")]
        pub result: i32,
        #[prost(message, optional, tag = "3")]
        pub started_at: Option<Timestamp>,
        #[prost(message, optional, tag = "4")]
        pub stopped_at: Option<Timestamp>,
    }

    /// `google.protobuf.Timestamp`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Timestamp {
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateLogResponse {
        #[prost(int64, tag = "1")]
        pub ack_index: i64,
    }
}

/// One call a test forge got.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    /// The path as the forge routed it.
    pub path: String,
    /// The path as it came on the request line.
    pub raw_path: String,
    pub headers: HeaderMap,
    pub body_len: usize,
}

#[derive(Default)]
struct Shared {
    calls: Vec<Call>,
    /// Queued jobs: an id each.
    queue: VecDeque<i64>,
    /// Jobs handed out, and to whom.
    claimed: Vec<(i64, String)>,
    /// Runner credentials the forge knows: uuid → token (Forgejo), tokens (GitLab).
    runners: Vec<(String, String)>,
    version: i64,
    /// The last answer to a fetch, as sent (status, headers, body).
    last_answer: Option<(u16, HeaderMap, Bytes)>,
    /// Whether job reports (GitLab's `PUT /jobs/{id}`, Forgejo's `UpdateTask`) are checked as
    /// the forge checks them (`check_reports`); otherwise they are echoed like any other call.
    check_reports: bool,
}

/// A running test forge.
#[derive(Clone)]
pub struct TestForge {
    pub base: String,
    shared: Arc<Mutex<Shared>>,
}

impl TestForge {
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().unwrap().calls.clone()
    }

    pub fn calls_to(&self, path: &str) -> usize {
        self.calls().iter().filter(|c| c.path == path).count()
    }

    /// Queues a job; its id.
    pub fn enqueue(&self) -> i64 {
        let mut s = self.shared.lock().unwrap();
        s.version += 1;
        let id = 100 + s.queue.len() as i64 + s.claimed.len() as i64;
        s.queue.push_back(id);
        id
    }

    pub fn queued(&self) -> Vec<i64> {
        self.shared.lock().unwrap().queue.iter().copied().collect()
    }

    pub fn claimed(&self) -> Vec<(i64, String)> {
        self.shared.lock().unwrap().claimed.clone()
    }

    /// Lets a runner with these credentials in (uuid and token; for GitLab, the token twice).
    pub fn add_runner(&self, id: &str, token: &str) {
        self.shared
            .lock()
            .unwrap()
            .runners
            .push((id.to_string(), token.to_string()));
    }

    pub fn last_answer(&self) -> Option<(u16, HeaderMap, Bytes)> {
        self.shared.lock().unwrap().last_answer.clone()
    }

    fn claim(&self, who: &str) -> Option<i64> {
        let mut s = self.shared.lock().unwrap();
        let id = s.queue.pop_front()?;
        s.claimed.push((id, who.to_string()));
        s.version += 1;
        Some(id)
    }

    /// From now on, job reports are checked as the forge checks them: GitLab's `PUT
    /// /api/v4/jobs/{id}` needs the job's token (`job-token-{id}`) of a job it handed out, and
    /// Forgejo's `UpdateTask` a known runner's uuid and token; a report that passes is `200`,
    /// one that does not `403` (GitLab) or `401` (Forgejo).
    pub fn check_reports(&self) {
        self.shared.lock().unwrap().check_reports = true;
    }

    fn checks_reports(&self) -> bool {
        self.shared.lock().unwrap().check_reports
    }

    fn handed_out(&self, id: i64) -> bool {
        self.shared
            .lock()
            .unwrap()
            .claimed
            .iter()
            .any(|(j, _)| *j == id)
    }

    fn knows(&self, id: &str, token: &str) -> bool {
        self.shared
            .lock()
            .unwrap()
            .runners
            .iter()
            .any(|(i, t)| i == id && t == token)
    }

    fn version(&self) -> i64 {
        self.shared.lock().unwrap().version
    }

    fn answered(&self, r: &Response, body: &Bytes) {
        self.shared.lock().unwrap().last_answer =
            Some((r.status().as_u16(), r.headers().clone(), body.clone()));
    }
}

/// The path as it came, kept beside the one the forge routes.
#[derive(Clone)]
struct RawPath(String);

/// `router` on 127.0.0.1, routing each path as `lenient` reads it.
async fn serve(router: Router, gitlab: bool) -> SocketAddr {
    use axum::ServiceExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = tower::ServiceBuilder::new()
        .map_request(move |mut req: Request| {
            let raw = req.uri().path().to_string();
            let routed = lenient(&raw, gitlab);
            let pq = match req.uri().query() {
                Some(q) => format!("{routed}?{q}"),
                None => routed,
            };
            *req.uri_mut() = pq.parse().unwrap();
            req.extensions_mut().insert(RawPath(raw));
            req
        })
        .service(router);
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service()).await.ok();
    });
    addr
}

/// A path as the most lenient of Gitea, Forgejo, GitLab and a normalizing proxy would route it
/// (see the module's header), written back as a valid path.
pub fn lenient(path: &str, gitlab: bool) -> String {
    use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
    const WRITE: &AsciiSet = &CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'<')
        .add(b'>')
        .add(b'?')
        .add(b'`')
        .add(b'{')
        .add(b'}');
    let mut decoded = path.to_string();
    loop {
        let again = percent_decode_str(&decoded)
            .decode_utf8_lossy()
            .into_owned();
        if again == decoded {
            break;
        }
        decoded = again;
    }
    let decoded = decoded.replace('\\', "/");
    let mut segments: Vec<String> = Vec::new();
    for segment in decoded.split('/') {
        let segment = segment.split('\0').next().unwrap_or("");
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s.to_string()),
        }
    }
    if gitlab
        && let Some(last) = segments.last_mut()
        && let Some((stem, _)) = last.split_once('.')
    {
        *last = stem.to_string();
    }
    let routed = format!("/{}", segments.join("/"));
    for call in [FETCH_TASK, JOBS_REQUEST, ROUTER_DISCOVERY] {
        if routed.eq_ignore_ascii_case(call) {
            return call.to_string();
        }
    }
    utf8_percent_encode(&routed, WRITE).to_string()
}

/// Records every call (method, path, headers, body length), then passes the request on with
/// its body read.
async fn record(
    State(forge): State<TestForge>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    // Streaming endpoints read the body themselves.
    let streamed = parts.uri.path().contains("/upload");
    let (body, len) = if streamed {
        (body, 0)
    } else {
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let len = bytes.len();
        (Body::from(bytes), len)
    };
    let raw_path = parts
        .extensions
        .get::<RawPath>()
        .map_or_else(|| parts.uri.path().to_string(), |r| r.0.clone());
    forge.shared.lock().unwrap().calls.push(Call {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        raw_path,
        headers: parts.headers.clone(),
        body_len: len,
    });
    next.run(Request::from_parts(parts, body)).await
}

/// The artifact-like routes both forges have: a streamed upload, a gzipped download, a
/// streamed blob, a slow answer, and an echo.
fn common_routes(prefix: &str) -> Router<TestForge> {
    Router::new()
        .route(&format!("{prefix}/upload"), post(upload))
        .route(&format!("{prefix}/download"), any(download))
        .route(&format!("{prefix}/blob/{{bytes}}"), any(blob))
        .route(&format!("{prefix}/slow/{{secs}}"), any(slow))
        .route(&format!("{prefix}/{{*rest}}"), any(echo))
}

async fn upload(body: Body) -> Response {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut hasher = Sha256::new();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            n += data.len() as u64;
            hasher.update(&data);
        }
    }
    axum::Json(json!({"bytes": n, "sha256": hex::encode(hasher.finalize())})).into_response()
}

/// A body the forge gzipped itself, with a header of its own.
pub fn gzipped_payload() -> Vec<u8> {
    // A fixed, valid gzip stream ("hello from the forge\n"): the gate must relay these bytes.
    vec![
        0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xff, 0xcb, 0x48, 0xcd, 0xc9, 0xc9,
        0x57, 0x48, 0x2b, 0xca, 0xcf, 0x55, 0x28, 0xc9, 0x48, 0x55, 0x48, 0xcb, 0x2f, 0x4a, 0x4f,
        0xe5, 0x02, 0x00, 0x5a, 0xf5, 0xc8, 0x5d, 0x15, 0x00, 0x00, 0x00,
    ]
}

async fn download() -> Response {
    let mut r = Response::new(Body::from(gzipped_payload()));
    let h = r.headers_mut();
    h.insert("content-encoding", "gzip".parse().unwrap());
    h.insert("content-type", "application/octet-stream".parse().unwrap());
    h.insert("x-forge-own", "kept".parse().unwrap());
    r
}

/// The byte at `offset` of every blob: a pattern that shows a byte lost, doubled or moved.
pub fn blob_byte(offset: usize) -> u8 {
    (offset % 251) as u8
}

/// `bytes` bytes of `blob_byte`, streamed in frames of 1 MiB.
async fn blob(Path(bytes): Path<usize>) -> Response {
    const FRAME: usize = 1 << 20;
    let frames = (0..bytes.div_ceil(FRAME)).map(move |i| {
        let start = i * FRAME;
        let data: Vec<u8> = (start..bytes.min(start + FRAME)).map(blob_byte).collect();
        Ok::<_, std::io::Error>(Bytes::from(data))
    });
    Body::from_stream(futures_util::stream::iter(frames)).into_response()
}

async fn slow(Path(secs): Path<u64>) -> Response {
    tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    (StatusCode::OK, "held and answered").into_response()
}

async fn echo(req: Request) -> Response {
    let path = req.uri().path().to_string();
    let method = req.method().to_string();
    let headers: serde_json::Map<String, Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
        .collect();
    let body = axum::body::to_bytes(req.into_body(), usize::MAX)
        .await
        .unwrap();
    let mut r = axum::Json(
        json!({"method": method, "path": path, "headers": headers, "body_len": body.len()}),
    )
    .into_response();
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}

// ---- Forgejo / Gitea -------------------------------------------------------------------------

pub const FETCH_TASK: &str = "/api/actions/runner.v1.RunnerService/FetchTask";

/// A Forgejo serving its runners' API on 127.0.0.1.
pub async fn forgejo() -> TestForge {
    let forge = TestForge {
        base: String::new(),
        shared: Arc::default(),
    };
    let router = Router::new()
        .route(FETCH_TASK, post(fetch_task))
        .route(
            "/api/actions/runner.v1.RunnerService/UpdateLog",
            post(update_log),
        )
        .route(
            "/api/actions/runner.v1.RunnerService/UpdateTask",
            post(update_task),
        )
        .merge(common_routes("/api/actions_pipeline"))
        .merge(common_routes("/twirp"))
        .merge(common_routes("/api/actions"))
        .layer(axum::middleware::from_fn_with_state(forge.clone(), record))
        .with_state(forge.clone());
    let addr = serve(router, false).await;
    TestForge {
        base: format!("http://{addr}"),
        ..forge
    }
}

/// `UpdateTask`: checked (`check_reports`), a known runner's report answered with an empty
/// `UpdateTaskResponse`.
async fn update_task(State(forge): State<TestForge>, req: Request) -> Response {
    if !forge.checks_reports() {
        return echo(req).await;
    }
    let header = |k: &str| {
        req.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    if !forge.knows(&header("x-runner-uuid"), &header("x-runner-token")) {
        return connect_error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "unregistered runner",
        );
    }
    let mut r = Response::new(Body::empty());
    r.headers_mut()
        .insert("content-type", "application/proto".parse().unwrap());
    r
}

fn connect_error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut r = (
        status,
        json!({"code": code, "message": message}).to_string(),
    )
        .into_response();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

async fn fetch_task(State(forge): State<TestForge>, headers: HeaderMap, body: Bytes) -> Response {
    use prost::Message;
    let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !forge.knows(header("x-runner-uuid"), header("x-runner-token")) {
        return connect_error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "unregistered runner",
        );
    }
    let json = header("content-type").starts_with("application/json");
    let asked = if json {
        let v: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
        let tv = &v["tasksVersion"];
        tv.as_str()
            .and_then(|s| s.parse().ok())
            .or(tv.as_i64())
            .unwrap_or(0)
    } else {
        match runner_v1::FetchTaskRequest::decode(body.as_ref()) {
            Ok(m) => m.tasks_version,
            Err(_) => {
                return connect_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    "not a FetchTaskRequest",
                );
            }
        }
    };
    let latest = forge.version().max(1);
    let task = if asked != latest {
        forge
            .claim(header("x-runner-uuid"))
            .map(|id| runner_v1::Task {
                id,
                workflow_payload: Some(b"jobs: {build: {runs-on: linux}}".to_vec()),
                secrets: [("GITHUB_TOKEN".to_string(), "s3cret".to_string())].into(),
            })
    } else {
        None
    };
    let answer = runner_v1::FetchTaskResponse {
        task,
        tasks_version: latest,
    };
    let (content_type, bytes) = if json {
        let mut v = json!({"tasksVersion": latest.to_string()});
        if let Some(t) = &answer.task {
            v["task"] = json!({"id": t.id.to_string(), "workflowPayload": base64_std(t.workflow_payload.as_deref().unwrap_or_default())});
        }
        ("application/json", Bytes::from(v.to_string()))
    } else {
        ("application/proto", Bytes::from(answer.encode_to_vec()))
    };
    let mut r = Response::new(Body::from(bytes.clone()));
    r.headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    r.headers_mut()
        .insert("x-forge-answer", "fetch".parse().unwrap());
    forge.answered(&r, &bytes);
    r
}

fn base64_std(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

async fn update_log(body: Bytes) -> Response {
    use prost::Message;
    let req = runner_v1::UpdateLogRequest::decode(body.as_ref()).unwrap_or_default();
    let answer = runner_v1::UpdateLogResponse {
        ack_index: req.index + 1,
    };
    let mut r = Response::new(Body::from(answer.encode_to_vec()));
    r.headers_mut()
        .insert("content-type", "application/proto".parse().unwrap());
    r
}

// ---- GitLab ----------------------------------------------------------------------------------

pub const JOBS_REQUEST: &str = "/api/v4/jobs/request";
pub const ROUTER_DISCOVERY: &str = "/api/v4/runners/router/discovery";

/// A GitLab serving its runners' API on 127.0.0.1; a job request naming the current
/// `last_update` is held up to `long_poll_s`.
pub async fn gitlab(long_poll_s: u64) -> TestForge {
    let forge = TestForge {
        base: String::new(),
        shared: Arc::default(),
    };
    let router = Router::new()
        .route(
            JOBS_REQUEST,
            any(move |s, r| jobs_request(s, r, long_poll_s)),
        )
        .route("/api/v4/runners/verify", post(verify))
        .route("/api/v4/jobs/{id}", any(update_job))
        .route(ROUTER_DISCOVERY, any(discovery))
        .merge(common_routes("/api/v4"))
        .layer(axum::middleware::from_fn_with_state(forge.clone(), record))
        .with_state(forge.clone());
    let addr = serve(router, true).await;
    TestForge {
        base: format!("http://{addr}"),
        ..forge
    }
}

/// `PUT /api/v4/jobs/{id}`: checked (`check_reports`), the job's token of a job handed out.
async fn update_job(
    State(forge): State<TestForge>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    if req.method() != axum::http::Method::PUT || !forge.checks_reports() {
        return echo(req).await;
    }
    let (_, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    let Ok(id) = id.parse::<i64>() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if !forge.handed_out(id) || token_of(&v) != format!("job-token-{id}") {
        return StatusCode::FORBIDDEN.into_response();
    }
    (StatusCode::OK, axum::Json(json!({}))).into_response()
}

fn token_of(body: &Value) -> &str {
    body["token"].as_str().unwrap_or("")
}

async fn verify(State(forge): State<TestForge>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    let token = token_of(&v);
    if forge.knows(token, token) {
        (StatusCode::OK, "200").into_response()
    } else {
        StatusCode::FORBIDDEN.into_response()
    }
}

/// A GitLab with a Job Router: a runner that asks is sent past the gate.
async fn discovery() -> Response {
    axum::Json(json!({"server_url": "grpc://router.gitlab.test:8080"})).into_response()
}

/// A job request's params as Grape merges them: the JSON or form body over the query (each
/// the last of a name, as Rack keeps it), and the `RUNNER-TOKEN` header when no param names
/// the token.
fn grape_params(req_headers: &HeaderMap, query: Option<&str>, body: &Bytes) -> Value {
    let mut params = serde_json::Map::new();
    let form = |s: &[u8], params: &mut serde_json::Map<String, Value>| {
        for part in s.split(|b| *b == b';') {
            for (k, v) in form_urlencoded::parse(part) {
                params.insert(k.into_owned(), json!(v.into_owned()));
            }
        }
    };
    if let Some(q) = query {
        form(q.as_bytes(), &mut params);
    }
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let content_type = req_headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.starts_with("application/x-www-form-urlencoded") {
        form(body, &mut params);
    } else if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(body) {
        params.extend(o);
    }
    if !params.contains_key("token")
        && let Some(t) = req_headers
            .get("runner-token")
            .and_then(|v| v.to_str().ok())
    {
        params.insert("token".into(), json!(t));
    }
    Value::Object(params)
}

async fn jobs_request(State(forge): State<TestForge>, req: Request, long_poll_s: u64) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let v = grape_params(&parts.headers, parts.uri.query(), &body);
    let token = token_of(&v).to_string();
    if !forge.knows(&token, &token) {
        return StatusCode::FORBIDDEN.into_response();
    }
    // GitLab's long poll: nothing new since the runner's last_update, so wait for a change.
    let current = forge.version().to_string();
    if v["last_update"].as_str() == Some(current.as_str()) {
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(long_poll_s);
        while tokio::time::Instant::now() < until && forge.version().to_string() == current {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let r = match forge.claim(&token) {
        Some(id) => {
            let job = json!({
                "id": id, "token": format!("job-token-{id}"),
                "variables": [
                    {"key": "CI_PROJECT_PATH", "value": "group/project", "public": true, "masked": false},
                    {"key": "CI_JOB_URL", "value": format!("http://gitlab.test/job/{id}"), "public": true, "masked": false}
                ],
            });
            (StatusCode::CREATED, axum::Json(job)).into_response()
        }
        None => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            r.headers_mut().insert(
                "x-gitlab-last-update",
                forge.version().to_string().parse().unwrap(),
            );
            r
        }
    };
    forge.answered(&r, &Bytes::new());
    r
}

/// The uuid and token of the Forgejo runner `gated` registers with its test Forgejo.
pub const UUID: &str = "0b9a7e3c-55a1-4d4a-9c9d-1e2f3a4b5c6d";
pub const FORGEJO_TOKEN: &str = "forgejo-runner-token";

/// The service in front of a test Forgejo and a test GitLab.
pub struct Gated {
    pub app: super::TestApp,
    pub forgejo: TestForge,
    pub gitlab: TestForge,
}

/// The service on `engine` in front of a test Forgejo (its runner `UUID`, `FORGEJO_TOKEN`) and
/// a test GitLab (its long poll 1 s, its runner `gitlab_token`), holding refused fetches
/// `hold_s`, with `adjust` on top; `None` when the engine is not available here.
pub async fn gated(
    engine: super::Engine,
    gitlab_token: &str,
    hold_s: u64,
    adjust: impl FnOnce(&mut leasegate::config::ServeArgs),
) -> Option<Gated> {
    let forgejo = forgejo().await;
    let gitlab = gitlab(1).await;
    forgejo.add_runner(UUID, FORGEJO_TOKEN);
    gitlab.add_runner(gitlab_token, gitlab_token);
    let (f, g) = (forgejo.base.clone(), gitlab.base.clone());
    let app = super::spawn_app_on_with(engine, move |a| {
        a.forgejo_upstream = Some(f);
        a.gitlab_upstream = Some(g);
        a.forge_hold_s = hold_s;
        adjust(a);
    })
    .await?;
    Some(Gated {
        app,
        forgejo,
        gitlab,
    })
}

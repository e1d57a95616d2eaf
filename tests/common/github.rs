//! A test double of GitHub's REST API, as far as leasegate uses it: a small server on
//! 127.0.0.1 that checks every request against `tests/github_rest.json` (the operations'
//! paths, methods, query parameters and bodies, transcribed from GitHub's published
//! description) and the headers GitHub asks for (`Accept`, `X-GitHub-Api-Version`, a
//! `User-Agent`, an `Authorization` GitHub would take: the App's RS256 JWT for its installation
//! token, that token or the configured token for the rest), answers with bodies of the
//! described shapes (checked too), and records every call. A test can make the next call of an
//! operation fail (`fail_next`), move the runners GitHub knows (`set_runner`, `remove_runner`)
//! and revoke the tokens it issued.
//!
//! Anything a request does that GitHub would not take is a *violation*, answered as GitHub
//! would answer it and kept for `assert_clean`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

/// The description the double holds requests and answers to.
pub fn description() -> &'static Value {
    static DESCRIPTION: OnceLock<Value> = OnceLock::new();
    DESCRIPTION.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/github_rest.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the description")
    })
}

/// A GitHub App's key pair for the tests, made once per test binary.
pub struct AppKeys {
    pub private_pem: String,
    pub public_der: Vec<u8>,
}

pub fn app_keys() -> &'static AppKeys {
    static KEYS: OnceLock<AppKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        use rsa::pkcs1::{EncodeRsaPrivateKey, EncodeRsaPublicKey};
        let key = rsa::RsaPrivateKey::new(&mut rand::rngs::OsRng, 2048).expect("an RSA key");
        AppKeys {
            private_pem: key
                .to_pkcs1_pem(rsa::pkcs1::LineEnding::LF)
                .unwrap()
                .to_string(),
            public_der: key.to_public_key().to_pkcs1_der().unwrap().into_vec(),
        }
    })
}

/// One call the double got.
#[derive(Clone, Debug)]
pub struct Call {
    /// `access_tokens`, `generate-jitconfig`, `list`, `get`, `delete`, or `unknown`.
    pub op: String,
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Value,
}

/// An answer to force on the next call of an operation.
#[derive(Clone, Debug)]
pub struct Failure {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub message: String,
}

impl Failure {
    pub fn status(status: u16, message: &str) -> Self {
        Failure {
            status,
            headers: vec![],
            message: message.into(),
        }
    }

    pub fn header(mut self, name: &'static str, value: impl ToString) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }
}

/// A runner GitHub knows.
#[derive(Clone, Debug)]
pub struct FakeRunner {
    pub id: i64,
    pub scope: String,
    pub name: String,
    pub labels: Vec<String>,
    pub runner_group_id: i64,
    pub work_folder: String,
    pub online: bool,
    pub busy: bool,
}

/// How the double authenticates leasegate.
#[derive(Clone)]
pub enum Auth {
    App { app_id: u64, installation_id: u64 },
    Token(String),
}

struct Shared {
    auth: Auth,
    calls: Vec<Call>,
    violations: Vec<String>,
    failures: VecDeque<(String, Failure)>,
    runners: BTreeMap<i64, FakeRunner>,
    next_id: i64,
    /// Installation tokens issued and still good.
    tokens: Vec<String>,
    issued: usize,
    token_lifetime_s: i64,
    /// Runners per page of a list.
    page_size: usize,
    /// The next call of an operation held before it is answered (`hold_next`).
    hold: Option<(String, Hold)>,
}

/// A call the double holds: told when it arrived, answered once released.
#[derive(Clone, Default)]
pub struct Hold {
    pub arrived: Arc<tokio::sync::Notify>,
    pub release: Arc<tokio::sync::Notify>,
}

#[derive(Clone)]
pub struct FakeGithub {
    pub url: String,
    shared: Arc<Mutex<Shared>>,
}

impl FakeGithub {
    pub async fn start(auth: Auth) -> FakeGithub {
        let shared = Arc::new(Mutex::new(Shared {
            auth,
            calls: vec![],
            violations: vec![],
            failures: VecDeque::new(),
            runners: BTreeMap::new(),
            next_id: 100,
            tokens: vec![],
            issued: 0,
            token_lifetime_s: 3600,
            page_size: 100,
            hold: None,
        }));
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        FakeGithub {
            url: format!("http://{addr}"),
            shared,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> T {
        f(&mut self.shared.lock().unwrap())
    }

    pub fn calls(&self) -> Vec<Call> {
        self.with(|s| s.calls.clone())
    }

    /// The calls of one operation.
    pub fn calls_to(&self, op: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.op == op).collect()
    }

    /// Holds the next call of `op` before it is answered, until `release` is notified (a
    /// GitHub that takes its time).
    pub fn hold_next(&self, op: &str) -> Hold {
        let hold = Hold::default();
        self.with(|s| s.hold = Some((op.to_string(), hold.clone())));
        hold
    }

    pub fn fail_next(&self, op: &str, failure: Failure) {
        self.with(|s| s.failures.push_back((op.to_string(), failure)));
    }

    pub fn runners(&self) -> Vec<FakeRunner> {
        self.with(|s| s.runners.values().cloned().collect())
    }

    pub fn runner(&self, id: i64) -> Option<FakeRunner> {
        self.with(|s| s.runners.get(&id).cloned())
    }

    /// Its listener connected (`online`) or not, with a job (`busy`) or not.
    pub fn set_runner(&self, id: i64, online: bool, busy: bool) {
        self.with(|s| {
            let r = s.runners.get_mut(&id).expect("a runner the double minted");
            r.online = online;
            r.busy = busy;
        });
    }

    /// Gone, as an ephemeral runner is after its job.
    pub fn remove_runner(&self, id: i64) {
        self.with(|s| s.runners.remove(&id));
    }

    /// A runner someone else registered (never leasegate's to touch).
    pub fn add_foreign_runner(&self, scope: &str, name: &str, online: bool) -> i64 {
        self.with(|s| {
            let id = s.next_id;
            s.next_id += 1;
            s.runners.insert(
                id,
                FakeRunner {
                    id,
                    scope: scope.into(),
                    name: name.into(),
                    labels: vec!["self-hosted".into()],
                    runner_group_id: 1,
                    work_folder: "_work".into(),
                    online,
                    busy: false,
                },
            );
            id
        })
    }

    /// Installation tokens issued so far.
    pub fn tokens_issued(&self) -> usize {
        self.with(|s| s.issued)
    }

    /// Every installation token issued so far stops working (GitHub answers 401).
    pub fn revoke_tokens(&self) {
        self.with(|s| s.tokens.clear());
    }

    pub fn set_token_lifetime(&self, secs: i64) {
        self.with(|s| s.token_lifetime_s = secs);
    }

    pub fn set_page_size(&self, n: usize) {
        self.with(|s| s.page_size = n);
    }

    /// Fails the test when a request was not one GitHub would take.
    pub fn assert_clean(&self) {
        let v = self.with(|s| s.violations.clone());
        assert!(v.is_empty(), "requests GitHub would not take: {v:#?}");
    }
}

/// The operation of `method path` in the description, with its path parameters.
fn operation(method: &Method, path: &str) -> Option<(&'static Value, BTreeMap<String, String>)> {
    let paths = description()["paths"].as_object().unwrap();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for (template, item) in paths {
        let t: Vec<&str> = template.trim_start_matches('/').split('/').collect();
        if t.len() != parts.len() {
            continue;
        }
        let mut params = BTreeMap::new();
        let fits = t.iter().zip(&parts).all(|(t, p)| {
            match t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                Some(name) => {
                    params.insert(name.to_string(), p.to_string());
                    !p.is_empty()
                }
                None => t == p,
            }
        });
        if fits && let Some(op) = item.get(method.as_str().to_lowercase()) {
            return Some((op, params));
        }
    }
    None
}

/// `value` against `schema` (its `$ref`s into the description's components); the errors.
fn check(schema: &Value, value: &Value) -> Vec<String> {
    let root = json!({"components": description()["components"], "allOf": [schema]});
    let validator = jsonschema::validator_for(&root).expect("the description's schemas compile");
    validator
        .iter_errors(value)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// A parameter's value as its schema types it (path and query values are text).
fn typed(raw: &str, schema: &Value) -> Value {
    match schema["type"].as_str() {
        Some("integer") => raw
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or(Value::String(raw.into())),
        _ => Value::String(raw.into()),
    }
}

/// An answer of the double, before it is checked against the description and sent.
struct Answer {
    status: StatusCode,
    body: Option<Value>,
    headers: Vec<(&'static str, String)>,
}

impl Answer {
    fn json(status: StatusCode, body: Value) -> Self {
        Answer {
            status,
            body: Some(body),
            headers: vec![],
        }
    }
}

fn github_error(status: StatusCode, message: &str) -> Answer {
    let body = if status == StatusCode::UNPROCESSABLE_ENTITY {
        json!({"message": message, "documentation_url": "https://docs.github.com/rest", "errors": []})
    } else {
        json!({"message": message, "documentation_url": "https://docs.github.com/rest", "status": status.as_u16().to_string()})
    };
    Answer::json(status, body)
}

/// Statuses GitHub may answer to any call (credentials, permissions, rate limits, outages),
/// which the description leaves out of each operation.
fn answered_anywhere(status: StatusCode) -> bool {
    matches!(status.as_u16(), 401 | 403 | 429) || status.is_server_error()
}

async fn handle(State(shared): State<Arc<Mutex<Shared>>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let body: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(Value::String("<not JSON>".into()))
    };
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().map(str::to_string);
    let host = parts
        .headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string();
    let found = operation(&parts.method, &path);
    let op = found
        .as_ref()
        .map(|(o, _)| o["x-leasegate-op"].as_str().unwrap().to_string())
        .unwrap_or_else(|| "unknown".into());
    let held = shared
        .lock()
        .unwrap()
        .hold
        .take_if(|(o, _)| *o == op)
        .map(|(_, hold)| hold);
    if let Some(hold) = held {
        hold.arrived.notify_one();
        hold.release.notified().await;
    }
    let mut s = shared.lock().unwrap();
    s.calls.push(Call {
        op: op.clone(),
        method: parts.method.to_string(),
        path: path.clone(),
        query: query.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    let Some((operation, params)) = found else {
        s.violations
            .push(format!("{} {path}: no such operation", parts.method));
        return send(github_error(StatusCode::NOT_FOUND, "Not Found"));
    };
    if let Err((status, why)) = check_request(
        &s,
        operation,
        &params,
        &parts.headers,
        query.as_deref(),
        &body,
    ) {
        // A credential GitHub refuses is a test's business (a revoked token); the rest are
        // requests GitHub would not take at all.
        if why != "Bad credentials" {
            s.violations.push(format!("{} {path}: {why}", parts.method));
        }
        return send(github_error(status, &why));
    }
    let answer = if let Some(i) = s.failures.iter().position(|(o, _)| *o == op) {
        let (_, f) = s.failures.remove(i).unwrap();
        let mut answer = github_error(StatusCode::from_u16(f.status).unwrap(), &f.message);
        answer.headers = f.headers;
        answer
    } else {
        match op.as_str() {
            "access_tokens" => {
                s.issued += 1;
                let token = format!("ghs_test{}_{}", s.issued, uuid::Uuid::now_v7().simple());
                s.tokens.push(token.clone());
                let expires = leasegate::domain::time::Millis::now().plus_secs(s.token_lifetime_s);
                Answer::json(
                    StatusCode::CREATED,
                    json!({"token": token, "expires_at": expires.rfc3339(), "permissions": {"organization_self_hosted_runners": "write"}, "repository_selection": "all"}),
                )
            }
            "generate-jitconfig" => generate(&mut s, &path, &body),
            "list" => list(&s, &host, &path, query.as_deref()),
            "get" => match params
                .get("runner_id")
                .and_then(|id| id.parse::<i64>().ok())
                .and_then(|id| s.runners.get(&id))
            {
                Some(r) => Answer::json(StatusCode::OK, runner_json(r)),
                None => github_error(StatusCode::NOT_FOUND, "Not Found"),
            },
            "delete" => {
                let id: i64 = params["runner_id"].parse().unwrap();
                match s.runners.get(&id) {
                    None => github_error(StatusCode::NOT_FOUND, "Not Found"),
                    Some(r) if r.busy => github_error(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Bad request - Runner is still running a job",
                    ),
                    Some(_) => {
                        s.runners.remove(&id);
                        Answer {
                            status: StatusCode::NO_CONTENT,
                            body: None,
                            headers: vec![],
                        }
                    }
                }
            }
            _ => github_error(StatusCode::NOT_FOUND, "Not Found"),
        }
    };
    let described = &operation["responses"][answer.status.as_str()];
    if described.is_null()
        && !answered_anywhere(answer.status)
        && answer.status != StatusCode::NOT_FOUND
    {
        s.violations.push(format!(
            "the double answered {} to {op}, which the description does not give",
            answer.status
        ));
    }
    if let (Some(schema), Some(body)) = (described.get("schema"), &answer.body) {
        let errors = check(schema, body);
        assert!(
            errors.is_empty(),
            "the double's own answer to {op}: {errors:?}"
        );
    }
    send(answer)
}

fn send(answer: Answer) -> Response {
    let mut response = match answer.body {
        Some(body) => (answer.status, axum::Json(body)).into_response(),
        None => answer.status.into_response(),
    };
    for (name, value) in answer.headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

/// The scope of an operation's path: `orgs/acme`, `repos/acme/web`, `enterprises/acme`.
fn scope_of(path: &str) -> String {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let n = if parts[0] == "repos" { 3 } else { 2 };
    parts[..n].join("/")
}

fn runner_json(r: &FakeRunner) -> Value {
    let mut labels = vec![
        json!({"id": 1, "name": "self-hosted", "type": "read-only"}),
        json!({"id": 2, "name": "Linux", "type": "read-only"}),
    ];
    for (i, l) in r.labels.iter().enumerate() {
        labels.push(json!({"id": 10 + i, "name": l, "type": "custom"}));
    }
    json!({
        "id": r.id, "runner_group_id": r.runner_group_id, "name": r.name, "os": "Linux",
        "status": if r.online { "online" } else { "offline" }, "busy": r.busy,
        "labels": labels, "ephemeral": true,
    })
}

fn generate(s: &mut Shared, path: &str, body: &Value) -> Answer {
    let name = body["name"].as_str().unwrap().to_string();
    let scope = scope_of(path);
    if s.runners
        .values()
        .any(|r| r.scope == scope && r.name == name)
    {
        return github_error(
            StatusCode::CONFLICT,
            "Already exists - A runner with the name already exists.",
        );
    }
    let id = s.next_id;
    s.next_id += 1;
    let runner = FakeRunner {
        id,
        scope,
        name: name.clone(),
        labels: body["labels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap().to_string())
            .collect(),
        runner_group_id: body["runner_group_id"].as_i64().unwrap(),
        work_folder: body["work_folder"].as_str().unwrap_or("_work").to_string(),
        online: false,
        busy: false,
    };
    let answer = json!({
        "runner": runner_json(&runner),
        "encoded_jit_config": jit_config_for(id, &name),
    });
    s.runners.insert(id, runner);
    Answer::json(StatusCode::CREATED, answer)
}

/// What the double mints as runner `id`'s JIT config (base64 of something that names it).
pub fn jit_config_for(id: i64, name: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!(
        "{{\".runner\": {{\"AgentId\": {id}, \"AgentName\": \"{name}\", \"Ephemeral\": true}}}}"
    ))
}

fn list(s: &Shared, host: &str, path: &str, query: Option<&str>) -> Answer {
    let scope = scope_of(path);
    let pairs: BTreeMap<String, String> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let per_page: usize = pairs
        .get("per_page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(30);
    let per_page = per_page.min(s.page_size);
    let page: usize = pairs.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
    let all: Vec<&FakeRunner> = s.runners.values().filter(|r| r.scope == scope).collect();
    let shown: Vec<Value> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|r| runner_json(r))
        .collect();
    let mut answer = Answer::json(
        StatusCode::OK,
        json!({"total_count": all.len(), "runners": shown}),
    );
    if page * per_page < all.len() {
        // As GitHub links its pages: absolute URLs, the next one and the last.
        let last = all.len().div_ceil(per_page);
        answer.headers.push((
            "link",
            format!(
                "<http://{host}{path}?per_page={per_page}&page={}>; rel=\"next\", \
                 <http://{host}{path}?per_page={per_page}&page={last}>; rel=\"last\"",
                page + 1
            ),
        ));
    }
    answer
}

/// Checks a request as GitHub would: the headers, the credential, the parameters and the
/// body. `Err((status GitHub answers, why))`.
fn check_request(
    s: &Shared,
    operation: &Value,
    params: &BTreeMap<String, String>,
    headers: &HeaderMap,
    query: Option<&str>,
    body: &Value,
) -> Result<(), (StatusCode, String)> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    for (name, value) in description()["x-headers"].as_object().unwrap() {
        if header(name) != value.as_str() {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("{name}: {:?}, not {value}", header(name)),
            ));
        }
    }
    if header("user-agent").is_none_or(str::is_empty) {
        return Err((
            StatusCode::FORBIDDEN,
            "Request forbidden by administrative rules. Please make sure your request has a User-Agent header".into(),
        ));
    }
    let Some(bearer) = header("authorization").and_then(|a| a.strip_prefix("Bearer ")) else {
        return Err((StatusCode::UNAUTHORIZED, "Requires authentication".into()));
    };
    let app_jwt = operation["x-auth"].as_str() == Some("app-jwt");
    match (&s.auth, app_jwt) {
        (
            Auth::App {
                app_id,
                installation_id,
            },
            true,
        ) => {
            check_app_jwt(bearer, *app_id)?;
            if params.get("installation_id") != Some(&installation_id.to_string()) {
                return Err((StatusCode::NOT_FOUND, "Not Found".into()));
            }
        }
        (Auth::App { .. }, false) => {
            if !s.tokens.iter().any(|t| t == bearer) {
                return Err((StatusCode::UNAUTHORIZED, "Bad credentials".into()));
            }
        }
        (Auth::Token(token), false) if bearer == token => {}
        _ => return Err((StatusCode::UNAUTHORIZED, "Bad credentials".into())),
    }
    let pairs: BTreeMap<String, String> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    for p in operation["parameters"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let raw = match p["in"].as_str().unwrap() {
            "path" => params.get(name),
            _ => pairs.get(name),
        };
        if let Some(raw) = raw {
            let errors = check(&p["schema"], &typed(raw, &p["schema"]));
            if !errors.is_empty() {
                return Err((
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("{name}: {errors:?}"),
                ));
            }
        } else if p["required"] == true {
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("{name} is required"),
            ));
        }
    }
    for name in pairs.keys() {
        let known = operation["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == name.as_str() && p["in"] == "query");
        if !known {
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("query {name}: no such parameter"),
            ));
        }
    }
    match (&operation["requestBody"], body) {
        (Value::Null, Value::Null) => {}
        (Value::Null, _) => {
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                "a body to an operation that takes none".into(),
            ));
        }
        (rb, Value::Null) if rb["required"] == true => {
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                "the body is required".into(),
            ));
        }
        (_, Value::Null) => {}
        (rb, body) => {
            if headers.get("content-type").and_then(|v| v.to_str().ok()) != Some("application/json")
            {
                return Err((
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "a JSON body without content-type: application/json".into(),
                ));
            }
            let errors = check(&rb["schema"], body);
            if !errors.is_empty() {
                return Err((
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("body: {errors:?}"),
                ));
            }
        }
    }
    Ok(())
}

/// The App's JWT, as GitHub takes it: RS256 by the App's key, `iss` the App's id, issued
/// no later than now, expiring at most 10 minutes ahead.
fn check_app_jwt(token: &str, app_id: u64) -> Result<(), (StatusCode, String)> {
    let key = jsonwebtoken::DecodingKey::from_rsa_der(&app_keys().public_der);
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_required_spec_claims(&["exp", "iat", "iss"]);
    validation.leeway = 0;
    validation.validate_aud = false;
    let data = jsonwebtoken::decode::<Value>(token, &key, &validation).map_err(|e| {
        (
            StatusCode::UNAUTHORIZED,
            format!("A JSON web token could not be decoded: {e}"),
        )
    })?;
    let now = leasegate::domain::time::Millis::now().0 / 1000;
    let claims = data.claims;
    let iss = claims["iss"]
        .as_str()
        .map(str::to_string)
        .or_else(|| claims["iss"].as_u64().map(|n| n.to_string()));
    if iss != Some(app_id.to_string()) {
        return Err((
            StatusCode::UNAUTHORIZED,
            format!(
                "'Issuer' claim ('iss') must be the app's id: {:?}",
                claims["iss"]
            ),
        ));
    }
    let (iat, exp) = (
        claims["iat"].as_i64().unwrap_or(i64::MAX),
        claims["exp"].as_i64().unwrap_or(0),
    );
    if iat > now {
        return Err((
            StatusCode::UNAUTHORIZED,
            "'Issued at' claim ('iat') must be an Integer representing a time in the past.".into(),
        ));
    }
    if exp - now > 600 {
        return Err((
            StatusCode::UNAUTHORIZED,
            "'Expiration time' claim ('exp') is too far in the future".into(),
        ));
    }
    Ok(())
}

//! `AgentClient`: the runner's side of the HTTP API (register, heartbeat, lease and the lease
//! calls, GitHub registrations) with typed answers, for the `leasegate runner` commands and for Rust runners that
//! embed the gate.
//!
//! Every answer keeps the server's JSON as it came (`raw`), because the shell commands print it
//! unchanged; the typed fields are what Rust callers branch on. Errors separate "the server
//! could not be reached" (with the cause, `net_error`) from "the server answered with a
//! problem", since a runner retries the first and acts on the second's `code`. Every answer's
//! `Date` is compared with the local clock (`clock`), because a runner whose clock is off is
//! refused for it.

use super::clock::{self, ClockOffset, ClockWatch};
use super::net_error::{self, Cause, Timeouts};
use super::problem::Problem;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

/// How long a call may take, beyond any long poll it asks for.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of one leasegate service.
#[derive(Clone, Debug)]
pub struct AgentClient {
    http: reqwest::Client,
    base: String,
    timeouts: Timeouts,
    clock: ClockWatch,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A request that cannot be sent: a bad server URL, a lease ID that is not an ID.
    #[error("{0}")]
    Invalid(String),
    /// No answer came: `cause` says why (refused, DNS, TLS, timeout, …).
    #[error("cannot reach {url}: {cause}")]
    Unreachable {
        /// The service's base URL.
        url: String,
        cause: Cause,
        #[source]
        source: reqwest::Error,
    },
    #[error("{} {}: {}", .0.status, .0.code, .0.detail)]
    Problem(Problem),
    #[error("unexpected answer from {url}: HTTP {status}: {body}")]
    Unexpected {
        url: String,
        status: u16,
        body: String,
    },
}

impl ClientError {
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            ClientError::Problem(p) => Some(p),
            _ => None,
        }
    }

    /// The service answered `code`.
    pub fn is_code(&self, code: &str) -> bool {
        self.problem().is_some_and(|p| p.code == code)
    }
}

/// A secret that must not end up in logs: `Debug` and `Display` redact it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct LeaseToken(String);

impl LeaseToken {
    pub fn new(token: impl Into<String>) -> Self {
        LeaseToken(token.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(<redacted>)")
    }
}

/// `POST /api/v1/runners` answer.
#[derive(Clone, Debug, Deserialize)]
pub struct Registration {
    pub runner_id: String,
    pub pool: String,
    pub audience: String,
    pub heartbeat_interval_s: u64,
    pub attestation_max_age_s: u64,
    pub probe_max_age_s: u64,
    #[serde(skip)]
    pub raw: Value,
}

/// What the service asks of a runner after a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    None,
    /// The running image is not the pool's current one: restart on the expected image.
    Recycle,
    /// An action this client does not know (a newer service); treated as `none`.
    #[serde(other)]
    Unknown,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::None => "none",
            Action::Recycle => "recycle",
            Action::Unknown => "unknown",
        }
    }
}

/// `POST /api/v1/runners/heartbeat` answer.
#[derive(Clone, Debug, Deserialize)]
pub struct HeartbeatAnswer {
    pub runner_id: String,
    /// `healthy`, `probe_failed`, `probe_stale`, `drifted`, … (PROTOCOL.md).
    pub status: String,
    pub code: Option<String>,
    pub detail: Option<String>,
    #[serde(default)]
    pub expected_image_ids: Vec<String>,
    pub image_current: Option<bool>,
    pub next_heartbeat_s: u64,
    pub action: Action,
    /// The refs of the runner's several images a recycle must pull (older services: none).
    #[serde(default)]
    pub pull: Vec<String>,
    /// The current set of each of those.
    #[serde(default)]
    pub expected_images: Vec<ExpectedImage>,
    #[serde(skip)]
    pub raw: Value,
}

/// One image's current set, by ref, as the heartbeat answers it and the recycle memory keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedImage {
    #[serde(rename = "ref")]
    pub image_ref: String,
    pub expected_image_ids: Vec<String>,
}

/// A job as the lease answers show it.
#[derive(Clone, Debug, Deserialize)]
pub struct LeasedJob {
    pub id: String,
    pub pool: String,
    pub state: String,
    #[serde(default)]
    pub payload: Value,
    pub attempt: i64,
    pub max_attempts: i64,
}

/// A granted lease.
#[derive(Clone, Debug, Deserialize)]
pub struct Lease {
    pub lease_id: String,
    pub lease_token: LeaseToken,
    pub expires_at: String,
    pub job: LeasedJob,
    #[serde(skip)]
    pub raw: Value,
}

/// The answer of `start`, `extend`, `complete` and `abandon`.
#[derive(Clone, Debug, Deserialize)]
pub struct LeaseView {
    pub lease_id: String,
    /// `leased`, `running`, `completed`, `abandoned`, …
    pub state: String,
    pub expires_at: String,
    pub job: LeasedJob,
    #[serde(skip)]
    pub raw: Value,
}

/// A GitHub runner's just-in-time configuration: it registers the runner, so `Debug` shows
/// none of it and nothing here logs it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct JitConfig(String);

impl JitConfig {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for JitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JitConfig(<redacted>)")
    }
}

/// `POST /api/v1/github/runners` answer: a single-use GitHub registration. Its JSON is not
/// kept (it holds the JIT config).
#[derive(Clone, Debug, Deserialize)]
pub struct GithubRegistration {
    pub github_runner_id: i64,
    pub name: String,
    pub encoded_jit_config: JitConfig,
    pub expires_at: String,
}

/// How a started job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Outcome {
    Succeeded,
    Failed,
    /// An infrastructure failure after start: requeued while attempts remain.
    Errored,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Errored => "errored",
        }
    }
}

/// Gives a typed answer its `raw` JSON.
trait WithRaw: DeserializeOwned {
    fn set_raw(&mut self, raw: Value);
}

macro_rules! with_raw {
    ($($t:ty),*) => {$(
        impl WithRaw for $t {
            fn set_raw(&mut self, raw: Value) {
                self.raw = raw;
            }
        }
    )*};
}
with_raw!(Registration, HeartbeatAnswer, Lease, LeaseView);

impl WithRaw for GithubRegistration {
    /// Not kept: the JSON carries the JIT config.
    fn set_raw(&mut self, _raw: Value) {}
}

impl AgentClient {
    /// A client of the service at `server` (`http://` or `https://`, no path needed).
    pub fn new(server: &str) -> Result<Self, ClientError> {
        Self::with_timeouts(
            server,
            Timeouts {
                connect: CONNECT_TIMEOUT,
                request: REQUEST_TIMEOUT,
            },
        )
    }

    /// The same, with other bounds on connecting and on each call (a long poll adds its wait).
    pub fn with_timeouts(server: &str, timeouts: Timeouts) -> Result<Self, ClientError> {
        let url = reqwest::Url::parse(server)
            .map_err(|e| ClientError::Invalid(format!("server URL {server:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ClientError::Invalid(format!(
                "server URL {server:?}: must be http:// or https://"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .user_agent(concat!("leasegate-runner/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Invalid(format!("HTTP client: {e}")))?;
        Ok(AgentClient {
            http,
            base: server.trim_end_matches('/').to_string(),
            timeouts,
            clock: ClockWatch::default(),
        })
    }

    pub fn server(&self) -> &str {
        &self.base
    }

    /// How far this machine's clock was from the service's at the latest answer, by its
    /// `Date` header; `None` before any answer.
    pub fn clock_offset(&self) -> Option<ClockOffset> {
        self.clock.last()
    }

    fn unreachable(&self, url: &str, source: reqwest::Error) -> ClientError {
        let cause = match reqwest::Url::parse(url) {
            Ok(u) => net_error::cause(&source, &u, self.timeouts),
            Err(_) => Cause::Other(source.to_string()),
        };
        ClientError::Unreachable {
            url: self.base.clone(),
            cause,
            source,
        }
    }

    /// Registers `public_jwk` with a single-use registration token.
    pub async fn register(
        &self,
        registration_token: &str,
        name: &str,
        public_jwk: &Value,
        labels: &BTreeMap<String, String>,
        forge_runners: &[crate::domain::forge::ForgeRunner],
    ) -> Result<Registration, ClientError> {
        let forge_runners: Vec<Value> = forge_runners
            .iter()
            .map(crate::domain::forge::ForgeRunner::to_json)
            .collect();
        let body = json!({
            "registration_token": registration_token,
            "name": name,
            "public_key": public_jwk,
            "labels": labels,
            "forge_runners": forge_runners,
        });
        let r = self.post("/api/v1/runners", None, Some(body), None).await?;
        self.typed(r).await
    }

    /// Posts a signed attestation as a heartbeat.
    pub async fn heartbeat(&self, attestation: &str) -> Result<HeartbeatAnswer, ClientError> {
        let body = json!({"attestation": attestation});
        let r = self
            .post("/api/v1/runners/heartbeat", None, Some(body), None)
            .await?;
        self.typed(r).await
    }

    /// Asks for a lease, waiting up to `wait_s` (0–30) for a job. `None`: no job came.
    pub async fn lease(
        &self,
        attestation: &str,
        wait_s: u64,
    ) -> Result<Option<Lease>, ClientError> {
        let body = json!({"attestation": attestation, "wait_s": wait_s});
        let timeout = self.timeouts.request + Duration::from_secs(wait_s);
        let r = self
            .post("/api/v1/lease", None, Some(body), Some(timeout))
            .await?;
        if r.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        self.typed(r).await.map(Some)
    }

    /// Asks for a single-use GitHub registration with a signed attestation.
    pub async fn github_runner(
        &self,
        attestation: &str,
    ) -> Result<GithubRegistration, ClientError> {
        let body = json!({"attestation": attestation});
        let r = self
            .post("/api/v1/github/runners", None, Some(body), None)
            .await?;
        self.typed(r).await
    }

    /// The first step is about to run: this is where the job's attempt is used.
    pub async fn start(
        &self,
        lease_id: &str,
        token: &LeaseToken,
    ) -> Result<LeaseView, ClientError> {
        self.lease_call(lease_id, token, "start", None).await
    }

    /// Keeps the lease alive for `ttl_s` more seconds (the service's lease TTL when `None`).
    pub async fn extend(
        &self,
        lease_id: &str,
        token: &LeaseToken,
        ttl_s: Option<u64>,
    ) -> Result<LeaseView, ClientError> {
        let body = ttl_s.map(|t| json!({"ttl_s": t})).unwrap_or(json!({}));
        self.lease_call(lease_id, token, "extend", Some(body)).await
    }

    pub async fn complete(
        &self,
        lease_id: &str,
        token: &LeaseToken,
        outcome: Outcome,
        exit_code: Option<i64>,
        message: Option<&str>,
    ) -> Result<LeaseView, ClientError> {
        let body = json!({"outcome": outcome.as_str(), "exit_code": exit_code, "message": message});
        self.lease_call(lease_id, token, "complete", Some(body))
            .await
    }

    /// Gives the job back before `start`, without using an attempt.
    pub async fn abandon(
        &self,
        lease_id: &str,
        token: &LeaseToken,
        reason: Option<&str>,
        message: Option<&str>,
    ) -> Result<LeaseView, ClientError> {
        let body = json!({"reason": reason, "message": message});
        self.lease_call(lease_id, token, "abandon", Some(body))
            .await
    }

    async fn lease_call(
        &self,
        lease_id: &str,
        token: &LeaseToken,
        action: &str,
        body: Option<Value>,
    ) -> Result<LeaseView, ClientError> {
        // The ID goes into a path: anything but a plain ID is refused here rather than sent.
        if lease_id.is_empty()
            || !lease_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ClientError::Invalid(format!(
                "lease ID {lease_id:?}: letters, digits, '-' and '_' only"
            )));
        }
        let path = format!("/api/v1/leases/{lease_id}/{action}");
        let r = self.post(&path, Some(token), body, None).await?;
        self.typed(r).await
    }

    async fn post(
        &self,
        path: &str,
        bearer: Option<&LeaseToken>,
        body: Option<Value>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .post(&url)
            .timeout(timeout.unwrap_or(self.timeouts.request));
        if let Some(t) = bearer {
            req = req.bearer_auth(t.expose());
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let sent = SystemTime::now();
        let response = req
            .send()
            .await
            .map_err(|source| self.unreachable(&url, source))?;
        let date = response.headers().get(reqwest::header::DATE);
        if let Some(offset) = date
            .and_then(|d| d.to_str().ok())
            .and_then(|d| clock::measure(d, sent, SystemTime::now()))
        {
            self.clock.observe(offset);
        }
        Ok(response)
    }

    /// A 2xx answer as `T` (with its raw JSON), anything else as a problem.
    async fn typed<T: WithRaw>(&self, r: reqwest::Response) -> Result<T, ClientError> {
        let status = r.status();
        let url = r.url().to_string();
        let retry_after_s = r
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let text = r
            .text()
            .await
            .map_err(|source| self.unreachable(&url, source))?;
        let unexpected = |text: &str| ClientError::Unexpected {
            url: url.clone(),
            status: status.as_u16(),
            body: shown_body(status, text),
        };
        let raw: Value = serde_json::from_str(&text).map_err(|_| unexpected(&text))?;
        if status.is_success() {
            let mut typed: T =
                serde_json::from_value(raw.clone()).map_err(|_| unexpected(&text))?;
            typed.set_raw(raw);
            return Ok(typed);
        }
        match raw.get("code").and_then(Value::as_str) {
            Some(code) => Err(ClientError::Problem(Problem {
                status: status.as_u16(),
                code: code.to_string(),
                detail: raw
                    .get("detail")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                retry_after_s,
                raw,
            })),
            None => Err(unexpected(&text)),
        }
    }
}

/// What an error may quote of an answer that is not what was expected. A success is never
/// quoted: it may carry a credential (a GitHub JIT config, a registration's token) even when
/// it does not parse, and the error reaches the journal. A failure is quoted in part: it is
/// a proxy's page or a problem, which says what went wrong.
fn shown_body(status: reqwest::StatusCode, text: &str) -> String {
    if status.is_success() {
        format!(
            "a {}-byte body that is not the expected JSON (not shown: a success may carry a credential)",
            text.len()
        )
    } else {
        text.chars().take(512).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_tokens_do_not_leak_through_debug() {
        let t = LeaseToken::new("lgl_secret");
        assert!(!format!("{t:?}").contains("secret"));
        assert_eq!(t.expose(), "lgl_secret");
    }

    #[test]
    fn server_urls_must_be_http() {
        assert!(AgentClient::new("ftp://x").is_err());
        assert!(AgentClient::new("not a url").is_err());
        assert_eq!(
            AgentClient::new("http://127.0.0.1:8080/").unwrap().server(),
            "http://127.0.0.1:8080"
        );
    }

    #[test]
    fn unknown_actions_read_as_unknown() {
        let a: Action = serde_json::from_value(json!("drain")).unwrap();
        assert_eq!(a, Action::Unknown);
        let a: Action = serde_json::from_value(json!("recycle")).unwrap();
        assert_eq!(a, Action::Recycle);
    }

    #[test]
    fn a_success_that_does_not_parse_is_not_quoted() {
        let jit = r#"{"encoded_jit_config": "c2VjcmV0", "github_runner_id": "not a number"}"#;
        let shown = shown_body(reqwest::StatusCode::CREATED, jit);
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        assert!(shown.contains(&jit.len().to_string()), "{shown}");
        let page = "<html>502 Bad Gateway</html>";
        assert_eq!(shown_body(reqwest::StatusCode::BAD_GATEWAY, page), page);
    }
}

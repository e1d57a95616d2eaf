//! Buildkite's agents REST API, the three calls leasegate makes: list an organization's
//! connected agents by name, pause one with a note and a timeout, resume one. Every call
//! carries the token as `Authorization: Bearer`; an answer's meaning is read here into what
//! the watcher acts on (`Paused`, `Resumed`) or an error it logs, shows and retries.

use super::settings::BuildkiteSettings;
use crate::domain::buildkite::ListedAgent;
use anyhow::Context;
use reqwest::{Method, StatusCode};
use std::time::Duration;

pub const USER_AGENT: &str = concat!("leasegate/", env!("CARGO_PKG_VERSION"));
/// The longest one call may take: the watcher waits for it, and every other agent with it.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (a page of 100 agents is some 200 KiB).
const MAX_BODY_BYTES: usize = 4 << 20;
/// Agents per page (Buildkite's most).
const PER_PAGE: usize = 100;
/// The most pages read for one name: more agents than that of one name is a misconfiguration.
const MAX_PAGES: usize = 10;

/// A call that did not do what it was for.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Buildkite answered with this status (and the message of its JSON body, if any).
    #[error("Buildkite answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("Buildkite cannot be reached: {0}")]
    Unreachable(String),
    #[error("Buildkite's answer is not what its API documents: {0}")]
    Malformed(String),
}

/// What a pause came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paused {
    Paused,
    /// `422`: the agent is already paused (somebody else's pause, or leasegate's not lifted
    /// yet), or is not connected.
    Refused,
    /// `404`: no such agent any more.
    Gone,
}

/// What a resume came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resumed {
    Resumed,
    /// `422`: the agent is not paused (any more).
    NotPaused,
    Gone,
}

pub struct AgentsApi {
    http: reqwest::Client,
    /// `{api}/v2/organizations/{org}/agents`.
    agents: String,
    token: crate::github::settings::Secret,
}

/// An agent as Buildkite writes it; members leasegate does not read are ignored.
#[derive(serde::Deserialize)]
struct AgentJson {
    id: String,
    name: String,
    #[serde(default)]
    paused: Option<bool>,
    #[serde(default)]
    paused_note: Option<String>,
    #[serde(default)]
    paused_by: Option<UserJson>,
}

#[derive(serde::Deserialize)]
struct UserJson {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    email: Option<String>,
}

impl AgentsApi {
    pub fn new(settings: &BuildkiteSettings) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .timeout(TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            // A redirect would carry the token somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("the Buildkite client")?;
        Ok(AgentsApi {
            http,
            agents: format!(
                "{}/v2/organizations/{}/agents",
                settings.api_url, settings.org
            ),
            token: settings.token.clone(),
        })
    }

    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(StatusCode, Vec<u8>), ApiError> {
        let mut req = self
            .http
            .request(method, url)
            .bearer_auth(self.token.expose())
            .header("accept", "application/json");
        if let Some(body) = body {
            req = req.json(&body);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| ApiError::Unreachable(e.to_string()))?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| ApiError::Unreachable(e.to_string()))?
        {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ApiError::Malformed(format!(
                    "an answer over {MAX_BODY_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    }

    /// The connected agents whose name Buildkite matches to `name` (not necessarily exactly:
    /// the caller compares).
    pub async fn list(&self, name: &str) -> Result<Vec<ListedAgent>, ApiError> {
        let mut out = Vec::new();
        for page in 1..=MAX_PAGES {
            let url = reqwest::Url::parse_with_params(
                &self.agents,
                &[
                    ("name", name),
                    ("per_page", &PER_PAGE.to_string()),
                    ("page", &page.to_string()),
                ],
            )
            .map_err(|e| ApiError::Malformed(e.to_string()))?;
            let (status, body) = self.call(Method::GET, url.as_str(), None).await?;
            if !status.is_success() {
                return Err(status_error(status, &body));
            }
            let agents: Vec<AgentJson> = serde_json::from_slice(&body)
                .map_err(|e| ApiError::Malformed(format!("the agents list: {e}")))?;
            let full = agents.len() >= PER_PAGE;
            out.extend(agents.into_iter().map(|a| ListedAgent {
                paused: a.paused.unwrap_or(false),
                paused_by: a.paused_by.and_then(|u| u.name.or(u.email)),
                id: a.id,
                name: a.name,
                paused_note: a.paused_note,
            }));
            if !full {
                break;
            }
        }
        Ok(out)
    }

    /// `PUT …/agents/{id}/pause` with `note` and `timeout_in_minutes`.
    pub async fn pause(&self, id: &str, note: &str, minutes: u32) -> Result<Paused, ApiError> {
        let body = serde_json::json!({"note": note, "timeout_in_minutes": minutes});
        let (status, body) = self
            .call(Method::PUT, &self.agent_url(id, "pause")?, Some(body))
            .await?;
        match status {
            s if s.is_success() => Ok(Paused::Paused),
            StatusCode::UNPROCESSABLE_ENTITY => Ok(Paused::Refused),
            StatusCode::NOT_FOUND => Ok(Paused::Gone),
            s => Err(status_error(s, &body)),
        }
    }

    /// `PUT …/agents/{id}/resume`.
    pub async fn resume(&self, id: &str) -> Result<Resumed, ApiError> {
        let (status, body) = self
            .call(
                Method::PUT,
                &self.agent_url(id, "resume")?,
                Some(serde_json::json!({})),
            )
            .await?;
        match status {
            s if s.is_success() => Ok(Resumed::Resumed),
            StatusCode::UNPROCESSABLE_ENTITY => Ok(Resumed::NotPaused),
            StatusCode::NOT_FOUND => Ok(Resumed::Gone),
            s => Err(status_error(s, &body)),
        }
    }

    /// The URL of an agent's action; its id goes in as one path segment, whatever it holds.
    fn agent_url(&self, id: &str, action: &str) -> Result<String, ApiError> {
        let mut url =
            reqwest::Url::parse(&self.agents).map_err(|e| ApiError::Malformed(e.to_string()))?;
        url.path_segments_mut()
            .map_err(|_| ApiError::Malformed("the API URL cannot take a path".into()))?
            .push(id)
            .push(action);
        Ok(url.into())
    }
}

/// An unexpected status, with Buildkite's `message` when its body has one.
fn status_error(status: StatusCode, body: &[u8]) -> ApiError {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message")?.as_str().map(String::from))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    ApiError::Status {
        status: status.as_u16(),
        message,
    }
}

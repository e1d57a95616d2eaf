//! The transport to GitHub's REST API: every call carries the headers GitHub asks for
//! (`Accept: application/vnd.github+json`, `X-GitHub-Api-Version`, a `User-Agent`, without
//! which GitHub answers 403) and the credential, over TLS with the built-in roots and an
//! optional CA file (GitHub Enterprise Server behind a private CA). What an answer means is
//! the callers'; here it is only sent and read.

use super::error::{GithubError, unreachable};
use super::settings::{GithubSettings, Secret};
use anyhow::Context;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use std::time::Duration;

/// The REST API version leasegate is written against.
pub const API_VERSION: &str = "2022-11-28";
pub const ACCEPT: &str = "application/vnd.github+json";
pub const USER_AGENT: &str = concat!("leasegate/", env!("CARGO_PKG_VERSION"));
/// The longest one call may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read (a page of 100 runners is some 50 KiB).
const MAX_BODY_BYTES: usize = 4 << 20;

/// An answer as it came.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    /// The URL of the next page (`Link: <…>; rel="next"`), if it is on the same API.
    pub fn next_page(&self, api: &str) -> Option<String> {
        let link = self.headers.get("link")?.to_str().ok()?;
        link.split(',').find_map(|part| {
            let (target, params) = part.split_once(';')?;
            let is_next = params
                .split(';')
                .any(|p| p.trim().replace(' ', "") == "rel=\"next\"");
            let url = target.trim().strip_prefix('<')?.strip_suffix('>')?;
            // The credential goes only where the API is.
            (is_next && url.starts_with(&format!("{api}/"))).then(|| url.to_string())
        })
    }
}

pub struct Rest {
    http: reqwest::Client,
    api: String,
}

impl Rest {
    pub fn new(settings: &GithubSettings) -> anyhow::Result<Self> {
        let mut builder = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .timeout(TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            // A redirect would carry the credential somewhere else.
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = &settings.ca_file {
            let pem = std::fs::read(path)
                .with_context(|| format!("LEASEGATE_GITHUB_CA_FILE {}", path.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("LEASEGATE_GITHUB_CA_FILE {}", path.display()))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(Rest {
            http: builder.build().context("the GitHub client")?,
            api: settings.api_url.clone(),
        })
    }

    /// The API's root, without a trailing slash.
    pub fn api(&self) -> &str {
        &self.api
    }

    /// `path` (`/orgs/acme/actions/runners`) under the API's root.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api)
    }

    /// Sends one call to `url` with `authorization` (`Bearer …`); `Err` only when no answer
    /// came.
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        authorization: &Secret,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, GithubError> {
        let mut request = self
            .http
            .request(method, url)
            .header("accept", ACCEPT)
            .header("x-github-api-version", API_VERSION)
            .header(
                "authorization",
                format!("Bearer {}", authorization.expose()),
            );
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| unreachable(&e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let mut body = Vec::new();
        let mut response = response;
        while let Some(chunk) = response.chunk().await.map_err(|e| unreachable(&e))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(GithubError::Unexpected(format!(
                    "an answer over {MAX_BODY_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn with_link(link: &str) -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert("link", HeaderValue::from_str(link).unwrap());
        Answer {
            status: StatusCode::OK,
            headers,
            body: vec![],
        }
    }

    #[test]
    fn the_next_page_is_followed_only_on_the_same_api() {
        let api = "https://api.github.com";
        let a = with_link(
            "<https://api.github.com/organizations/1/actions/runners?per_page=100&page=2>; rel=\"next\", \
             <https://api.github.com/organizations/1/actions/runners?per_page=100&page=5>; rel=\"last\"",
        );
        assert_eq!(
            a.next_page(api).as_deref(),
            Some("https://api.github.com/organizations/1/actions/runners?per_page=100&page=2")
        );
        let last = with_link("<https://api.github.com/x?page=1>; rel=\"prev\"");
        assert_eq!(last.next_page(api), None);
        let elsewhere = with_link("<https://evil.example/x?page=2>; rel=\"next\"");
        assert_eq!(elsewhere.next_page(api), None);
        let lookalike = with_link("<https://api.github.com.evil.example/x>; rel=\"next\"");
        assert_eq!(lookalike.next_page(api), None);
    }
}

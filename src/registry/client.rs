//! Fetching manifests over the OCI distribution API: `HEAD`/`GET
//! /v2/<name>/manifests/<reference>` with the OCI and Docker manifest media types in `Accept`.
//!
//! The registry is reached over TLS, or over plain HTTP when its `host:port` is listed in
//! `LEASEGATE_INSECURE_REGISTRIES`. A 401 is answered once with the credentials its challenge
//! asks for (see `auth`); tokens are kept per repository until they expire, so that a
//! resolution does not fetch one per request. Every manifest's digest is checked against its
//! bytes: a registry that serves content under the wrong digest fails the resolution.

use super::auth::{AuthConfig, Challenge, Credentials, TokenAnswer, parse_challenge};
use super::reference::ImageRef;
use crate::domain::digest::ImageDigest;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Every manifest type leasegate understands, for `Accept`.
pub const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// The distribution spec's limit on a manifest's size.
const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;

/// Why talking to a registry failed. The messages are for operators: they name the registry
/// and the reference, and never carry credentials or tokens.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RegistryError {
    #[error("{0}")]
    BadReference(String),
    #[error("cannot reach the registry {registry}: {reason}")]
    Unreachable { registry: String, reason: String },
    #[error("{what} was not found on {registry} ({reason})")]
    NotFound {
        registry: String,
        what: String,
        reason: String,
    },
    #[error("the registry {registry} refused access to {repository}: {reason}")]
    Unauthorized {
        registry: String,
        repository: String,
        reason: String,
    },
    #[error("the registry {registry} answered {status} for {what}{detail}")]
    Status {
        registry: String,
        what: String,
        status: u16,
        detail: String,
    },
    #[error("{0}")]
    BadManifest(String),
    #[error("{0}")]
    Credentials(String),
}

/// A manifest as fetched: its verified digest, its media type and its bytes.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub digest: ImageDigest,
    pub media_type: Option<String>,
    pub body: Vec<u8>,
}

/// The sha256 digest of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> ImageDigest {
    ImageDigest::parse(&format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
        .expect("a sha256 digest is a digest")
}

struct CachedAuth {
    header: String,
    until: Option<Instant>,
}

/// A client for OCI distribution registries; one per service, shared by every resolution.
pub struct RegistryClient {
    http: reqwest::Client,
    insecure: Vec<String>,
    /// `registry/repository` → the `Authorization` value that worked last.
    cache: Mutex<HashMap<String, CachedAuth>>,
}

impl RegistryClient {
    pub fn new(insecure: Vec<String>, timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("leasegate/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(RegistryClient {
            http,
            insecure,
            cache: Mutex::new(HashMap::new()),
        })
    }

    fn is_insecure(&self, host: &str) -> bool {
        self.insecure.iter().any(|h| h == host)
    }

    fn base(&self, image: &ImageRef) -> String {
        let host = image.api_host();
        let scheme = if self.is_insecure(host) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{host}")
    }

    /// Whether credentials may travel to `url`: over TLS, or to a listed insecure host.
    fn may_send_credentials(&self, url: &reqwest::Url) -> bool {
        if url.scheme() == "https" {
            return true;
        }
        let host = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            _ => return false,
        };
        self.is_insecure(&host)
    }

    fn cache_key(image: &ImageRef) -> String {
        format!("{}/{}", image.registry, image.repository)
    }

    fn cached(&self, key: &str) -> Option<String> {
        let cache = self.cache.lock().expect("auth cache lock");
        cache
            .get(key)
            .filter(|c| c.until.is_none_or(|u| Instant::now() < u))
            .map(|c| c.header.clone())
    }

    fn remember(&self, key: String, header: String, until: Option<Instant>) {
        self.cache
            .lock()
            .expect("auth cache lock")
            .insert(key, CachedAuth { header, until });
    }

    fn forget(&self, key: &str) {
        self.cache.lock().expect("auth cache lock").remove(key);
    }

    fn unreachable(&self, image: &ImageRef, e: &reqwest::Error) -> RegistryError {
        RegistryError::Unreachable {
            registry: image.registry.clone(),
            reason: describe(e),
        }
    }

    /// `HEAD` of a manifest: the digest the registry names for `reference`, when it names one.
    /// `Ok(None)` when the answer is not a usable 200 (let the `GET` say why).
    pub async fn head_manifest(
        &self,
        image: &ImageRef,
        reference: &str,
        auth: &AuthConfig,
    ) -> Result<Option<ImageDigest>, RegistryError> {
        let response = self.send(Method::HEAD, image, reference, auth).await?;
        if response.status() != StatusCode::OK {
            return Ok(None);
        }
        Ok(response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| ImageDigest::parse(v).ok()))
    }

    /// `GET` of a manifest by tag or digest, its digest checked against its bytes (and against
    /// `reference` when that is a digest).
    pub async fn get_manifest(
        &self,
        image: &ImageRef,
        reference: &str,
        auth: &AuthConfig,
    ) -> Result<Fetched, RegistryError> {
        let what = format!("{}/{}:{reference}", image.registry, image.repository)
            .replace(":sha256:", "@sha256:");
        let mut response = self.send(Method::GET, image, reference, auth).await?;
        let status = response.status();
        if !status.is_success() {
            let body = read_capped(&mut response, 16 * 1024)
                .await
                .unwrap_or_default();
            return Err(status_error(image, &what, status, &body));
        }
        let media_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string());
        let named = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_capped(&mut response, MAX_MANIFEST_BYTES)
            .await
            .map_err(|e| match e {
                ReadError::TooLarge => RegistryError::BadManifest(format!(
                    "the manifest of {what} is larger than {MAX_MANIFEST_BYTES} bytes"
                )),
                ReadError::Transport(e) => self.unreachable(image, &e),
            })?;
        let digest = sha256_digest(&body);
        let claimed = named.as_deref().filter(|d| d.starts_with("sha256:"));
        let requested = reference.starts_with("sha256:").then_some(reference);
        for expected in [claimed, requested].into_iter().flatten() {
            if expected != digest.as_str() {
                return Err(RegistryError::BadManifest(format!(
                    "the manifest of {what} does not match its digest {expected} (its bytes hash to {digest})"
                )));
            }
        }
        Ok(Fetched {
            digest,
            media_type,
            body,
        })
    }

    /// Sends a manifest request, answering one 401 challenge.
    async fn send(
        &self,
        method: Method,
        image: &ImageRef,
        reference: &str,
        auth: &AuthConfig,
    ) -> Result<reqwest::Response, RegistryError> {
        let url = format!(
            "{}/v2/{}/manifests/{reference}",
            self.base(image),
            image.repository
        );
        let key = Self::cache_key(image);
        let request = |authorization: Option<&str>| {
            let mut r = self
                .http
                .request(method.clone(), &url)
                .header(ACCEPT, ACCEPT_MANIFESTS);
            if let Some(a) = authorization {
                r = r.header(AUTHORIZATION, a);
            }
            r
        };
        let cached = self.cached(&key);
        let response = request(cached.as_deref())
            .send()
            .await
            .map_err(|e| self.unreachable(image, &e))?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        if cached.is_some() {
            self.forget(&key);
        }
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge);
        let creds = auth.lookup(&image.registry, &image.repository);
        let unauthorized = |reason: &str| RegistryError::Unauthorized {
            registry: image.registry.clone(),
            repository: image.repository.clone(),
            reason: reason.to_string(),
        };
        let (header, until) = match challenge {
            None => return Err(unauthorized("401 without a Basic or Bearer challenge")),
            Some(Challenge::Basic) => {
                let Some(creds) = creds else {
                    return Err(unauthorized(
                        "it asks for basic credentials and none are configured for it",
                    ));
                };
                let target = reqwest::Url::parse(&url).map_err(|e| {
                    RegistryError::BadReference(format!("cannot form a URL for {image}: {e}"))
                })?;
                if !self.may_send_credentials(&target) {
                    return Err(unauthorized(
                        "it asks for basic credentials over plain HTTP",
                    ));
                }
                (creds.basic_header(), None)
            }
            Some(Challenge::Bearer { realm, service, .. }) => {
                self.fetch_token(image, &realm, service.as_deref(), creds)
                    .await?
            }
        };
        let retried = request(Some(&header))
            .send()
            .await
            .map_err(|e| self.unreachable(image, &e))?;
        if retried.status() == StatusCode::UNAUTHORIZED {
            return Err(unauthorized(if creds.is_some() {
                "the configured credentials were refused"
            } else {
                "anonymous access was refused and no credentials are configured for it"
            }));
        }
        self.remember(key, header, until);
        Ok(retried)
    }

    /// The bearer token dance: `realm?service=…&scope=repository:<name>:pull`.
    async fn fetch_token(
        &self,
        image: &ImageRef,
        realm: &str,
        service: Option<&str>,
        creds: Option<&Credentials>,
    ) -> Result<(String, Option<Instant>), RegistryError> {
        let unauthorized = |reason: String| RegistryError::Unauthorized {
            registry: image.registry.clone(),
            repository: image.repository.clone(),
            reason,
        };
        let mut url = reqwest::Url::parse(realm)
            .map_err(|_| unauthorized("its token realm is not a URL".into()))?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(unauthorized("its token realm is not http(s)".into()));
        }
        {
            let mut query = url.query_pairs_mut();
            if let Some(s) = service {
                query.append_pair("service", s);
            }
            query.append_pair("scope", &format!("repository:{}:pull", image.repository));
        }
        let mut request = self.http.get(url.clone());
        if let Some(c) = creds {
            if !self.may_send_credentials(&url) {
                return Err(unauthorized(
                    "its token realm is plain HTTP on a host not listed in LEASEGATE_INSECURE_REGISTRIES; credentials were not sent"
                        .into(),
                ));
            }
            request = request.header(AUTHORIZATION, c.basic_header());
        }
        let started = Instant::now();
        let response = request
            .send()
            .await
            .map_err(|e| unauthorized(format!("cannot reach its token realm: {}", describe(&e))))?;
        let status = response.status();
        if !status.is_success() {
            return Err(unauthorized(format!(
                "its token realm answered {}{}",
                status.as_u16(),
                if creds.is_some() {
                    " to the configured credentials"
                } else {
                    " (no credentials are configured for it)"
                }
            )));
        }
        let answer: TokenAnswer = response
            .json()
            .await
            .map_err(|_| unauthorized("its token realm did not answer a token JSON".into()))?;
        let expires_in = answer.expires_in.unwrap_or(60).max(1);
        let token = answer
            .into_token()
            .ok_or_else(|| unauthorized("its token realm answered no token".into()))?;
        // Renew a little before the registry would refuse it.
        let until = started + Duration::from_secs(expires_in).mul_f64(0.9);
        Ok((format!("Bearer {token}"), Some(until)))
    }
}

enum ReadError {
    TooLarge,
    Transport(reqwest::Error),
}

async fn read_capped(response: &mut reqwest::Response, cap: usize) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadError::Transport)? {
        if body.len() + chunk.len() > cap {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A transport error with its causes ("connection refused"), without the request's headers.
fn describe(e: &reqwest::Error) -> String {
    let mut out = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    let mut last = String::new();
    while let Some(s) = source {
        let text = s.to_string();
        if text != last && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        last = text;
        source = s.source();
    }
    out
}

/// The distribution API's error body: `{"errors": [{"code", "message"}]}`.
fn registry_codes(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<ErrorEntry>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorEntry {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let parsed: Errors = serde_json::from_slice(body).ok()?;
    let text: Vec<String> = parsed
        .errors
        .iter()
        .map(|e| {
            let mut s = format!("{} {}", e.code, e.message);
            s.truncate(200);
            s.trim().to_string()
        })
        .filter(|s| !s.is_empty())
        .collect();
    (!text.is_empty()).then(|| text.join("; "))
}

fn status_error(image: &ImageRef, what: &str, status: StatusCode, body: &[u8]) -> RegistryError {
    let codes = registry_codes(body);
    if status == StatusCode::NOT_FOUND {
        return RegistryError::NotFound {
            registry: image.registry.clone(),
            what: what.to_string(),
            reason: codes.unwrap_or_else(|| "404".into()),
        };
    }
    if status == StatusCode::FORBIDDEN {
        return RegistryError::Unauthorized {
            registry: image.registry.clone(),
            repository: image.repository.clone(),
            reason: format!("403{}", codes.map(|c| format!(" {c}")).unwrap_or_default()),
        };
    }
    RegistryError::Status {
        registry: image.registry.clone(),
        what: what.to_string(),
        status: status.as_u16(),
        detail: codes.map(|c| format!(": {c}")).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_of_the_bytes() {
        assert_eq!(
            sha256_digest(b"").as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn registry_error_bodies_are_summarised() {
        let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{"Tag":"x"}}]}"#;
        assert_eq!(
            registry_codes(body).as_deref(),
            Some("MANIFEST_UNKNOWN manifest unknown")
        );
        assert_eq!(registry_codes(b"<html>"), None);
    }

    #[test]
    fn credentials_travel_over_tls_or_to_listed_hosts_only() {
        let client =
            RegistryClient::new(vec!["127.0.0.1:5000".into()], Duration::from_secs(5)).unwrap();
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(client.may_send_credentials(&url("https://auth.example.com/token")));
        assert!(client.may_send_credentials(&url("http://127.0.0.1:5000/token")));
        assert!(!client.may_send_credentials(&url("http://127.0.0.1:5001/token")));
        assert!(!client.may_send_credentials(&url("http://auth.example.com/token")));
        let local = ImageRef::parse("127.0.0.1:5000/ci/runner:stable").unwrap();
        assert_eq!(client.base(&local), "http://127.0.0.1:5000");
        let hub = ImageRef::parse("alpine").unwrap();
        assert_eq!(client.base(&hub), "https://registry-1.docker.io");
    }
}

//! Registry credentials and the authentication challenge, the way registries do it.
//!
//! Credentials come from a containers auth file (podman's `auth.json`:
//! `{"auths": {"host:port": {"auth": base64("user:pass")}}}`, named by
//! `LEASEGATE_REGISTRY_AUTH_FILE`) and/or the same JSON in `LEASEGATE_REGISTRY_AUTH`; both are
//! read afresh for every resolution, so a `podman login` that rewrites the file needs no
//! restart. A registry that wants credentials answers 401 with `WWW-Authenticate`:
//!
//! - `Basic realm=…`: the request is repeated with the basic credentials;
//! - `Bearer realm=…,service=…,scope=…`: a token is fetched from
//!   `realm?service=…&scope=repository:<name>:pull` (with the basic credentials when there are
//!   some, anonymously otherwise), and the request is repeated with `Authorization: Bearer`.
//!
//! Credentials and tokens are never logged and never appear in an error message
//! (`Credentials`' `Debug` is redacted), and they are only ever sent over TLS or to a host
//! listed in `LEASEGATE_INSECURE_REGISTRIES`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(***)")
    }
}

impl Credentials {
    /// The value of an `Authorization: Basic` header.
    pub fn basic_header(&self) -> String {
        format!(
            "Basic {}",
            STANDARD.encode(format!("{}:{}", self.username, self.password))
        )
    }
}

/// Why credentials could not be read. Never quotes the file's contents.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthFileError {
    #[error("cannot read the registry auth file {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("the registry auth {source_name} is not an auths JSON object: {reason}")]
    Malformed { source_name: String, reason: String },
}

#[derive(Deserialize)]
struct AuthJson {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The `auths` of an auth file, keyed by normalized `host[:port][/path]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthConfig {
    entries: BTreeMap<String, Credentials>,
}

/// `https://index.docker.io/v1/` → `docker.io`; `quay.io/org/` → `quay.io/org`.
fn normalize_key(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key)
        .trim_end_matches('/');
    let key = key
        .strip_suffix("/v1")
        .or_else(|| key.strip_suffix("/v2"))
        .unwrap_or(key);
    let (host, path) = match key.split_once('/') {
        Some((h, p)) => (h, Some(p)),
        None => (key, None),
    };
    let host = match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        h => h,
    };
    match path {
        Some(p) => format!("{host}/{p}"),
        None => host.to_string(),
    }
}

impl AuthConfig {
    /// Parses the JSON of an auth file; `source_name` names it in errors.
    pub fn from_json(json: &str, source_name: &str) -> Result<AuthConfig, AuthFileError> {
        let malformed = |reason: String| AuthFileError::Malformed {
            source_name: source_name.to_string(),
            reason,
        };
        // serde_json's messages name positions, never the text: safe to repeat.
        let parsed: AuthJson = serde_json::from_str(json).map_err(|e| malformed(e.to_string()))?;
        let mut entries = BTreeMap::new();
        for (key, entry) in parsed.auths {
            let creds = match (entry.auth, entry.username, entry.password) {
                (Some(auth), _, _) if !auth.is_empty() => {
                    let decoded = STANDARD
                        .decode(auth.trim())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .ok_or_else(|| malformed(format!("the auth of {key} is not base64")))?;
                    let (user, pass) = decoded
                        .split_once(':')
                        .ok_or_else(|| malformed(format!("the auth of {key} is not user:pass")))?;
                    Credentials {
                        username: user.to_string(),
                        password: pass.to_string(),
                    }
                }
                (_, Some(username), Some(password)) => Credentials { username, password },
                // Entries with only an identity token (OAuth refresh) are not supported.
                _ => continue,
            };
            entries.insert(normalize_key(&key), creds);
        }
        Ok(AuthConfig { entries })
    }

    /// The credentials for `repository` on `registry`: the most specific entry, from
    /// `registry/repository` up to `registry` itself (as podman looks them up).
    pub fn lookup(&self, registry: &str, repository: &str) -> Option<&Credentials> {
        let mut key = format!("{registry}/{repository}");
        loop {
            if let Some(c) = self.entries.get(&key) {
                return Some(c);
            }
            match key.rfind('/') {
                Some(i) => key.truncate(i),
                None => return None,
            }
        }
    }

    fn merge(&mut self, other: AuthConfig) {
        self.entries.extend(other.entries);
    }
}

/// Where credentials come from: the auth file, and/or the same JSON given directly.
#[derive(Clone, Default)]
pub struct AuthSource {
    pub file: Option<PathBuf>,
    pub inline: Option<String>,
}

impl fmt::Debug for AuthSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthSource")
            .field("file", &self.file)
            .field("inline", &self.inline.as_ref().map(|_| "***"))
            .finish()
    }
}

impl AuthSource {
    /// Reads the credentials now (the file, then the inline JSON, whose entries win).
    pub fn load(&self) -> Result<AuthConfig, AuthFileError> {
        let mut config = AuthConfig::default();
        if let Some(path) = &self.file {
            let text = std::fs::read_to_string(path).map_err(|e| AuthFileError::Unreadable {
                path: path.display().to_string(),
                reason: e.kind().to_string(),
            })?;
            config.merge(AuthConfig::from_json(&text, &path.display().to_string())?);
        }
        if let Some(json) = &self.inline {
            config.merge(AuthConfig::from_json(json, "LEASEGATE_REGISTRY_AUTH")?);
        }
        Ok(config)
    }
}

/// What a 401's `WWW-Authenticate` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses `Basic realm="…"` or `Bearer realm="…",service="…",scope="…"` (RFC 7235
/// auth-params: quoted strings may hold commas and escaped quotes).
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let params = parse_params(rest);
    let get = |k: &str| {
        params
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.clone())
    };
    Some(Challenge::Bearer {
        realm: get("realm")?,
        service: get("service"),
        scope: get("scope"),
    })
}

fn parse_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            name.push(c);
            chars.next();
        }
        if name.is_empty() {
            return out;
        }
        if chars.next() != Some('=') {
            continue;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        if let Some(n) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((name.trim().to_string(), value.trim().to_string()));
    }
}

/// A token endpoint's answer: `token`, or OAuth2's `access_token`.
#[derive(Deserialize)]
pub struct TokenAnswer {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub access_token: Option<String>,
    /// Seconds; registries default to 60 when absent.
    #[serde(default)]
    pub expires_in: Option<u64>,
}

impl fmt::Debug for TokenAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenAnswer(***)")
    }
}

impl TokenAnswer {
    pub fn into_token(self) -> Option<String> {
        self.token
            .filter(|t| !t.is_empty())
            .or(self.access_token.filter(|t| !t.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_auth_files_are_read_and_looked_up_most_specific_first() {
        let json = format!(
            r#"{{"auths": {{
                "127.0.0.1:5000": {{"auth": "{}"}},
                "quay.io/team": {{"auth": "{}"}},
                "https://index.docker.io/v1/": {{"username": "hub", "password": "p:w"}},
                "token-only.example.com": {{"identitytoken": "x"}}
            }}}}"#,
            STANDARD.encode("ci:s3cret"),
            STANDARD.encode("team:pw")
        );
        let config = AuthConfig::from_json(&json, "test").unwrap();
        let local = config.lookup("127.0.0.1:5000", "ci/runner").unwrap();
        assert_eq!(
            (local.username.as_str(), local.password.as_str()),
            ("ci", "s3cret")
        );
        assert_eq!(
            config.lookup("quay.io", "team/runner").unwrap().username,
            "team"
        );
        assert_eq!(config.lookup("quay.io", "other/runner"), None);
        let hub = config.lookup("docker.io", "library/alpine").unwrap();
        assert_eq!(hub.password, "p:w");
        assert_eq!(config.lookup("token-only.example.com", "a/b"), None);
        assert_eq!(config.lookup("127.0.0.2:5000", "ci/runner"), None);
        assert_eq!(
            local.basic_header(),
            format!("Basic {}", STANDARD.encode("ci:s3cret"))
        );
    }

    #[test]
    fn credentials_never_show_in_debug_or_errors() {
        let creds = Credentials {
            username: "ci".into(),
            password: "s3cret".into(),
        };
        assert!(!format!("{creds:?}").contains("s3cret"));
        let source = AuthSource {
            file: None,
            inline: Some(r#"{"auths": {"h": {"auth": "bad!"}}}"#.into()),
        };
        assert!(!format!("{source:?}").contains("auths"));
        let err = source.load().unwrap_err().to_string();
        assert!(err.contains("LEASEGATE_REGISTRY_AUTH"), "{err}");
        assert!(!err.contains("bad!"), "{err}");
        let not_json = AuthConfig::from_json("{\"auths\": s3cret}", "f").unwrap_err();
        assert!(!not_json.to_string().contains("s3cret"));
        let missing = AuthSource {
            file: Some("/nonexistent/auth.json".into()),
            inline: None,
        };
        assert!(matches!(
            missing.load(),
            Err(AuthFileError::Unreadable { .. })
        ));
    }

    #[test]
    fn challenges_are_parsed_as_registries_send_them() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/alpine:pull".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"bearer realm="http://h/token", scope="repository:a/b:pull,push""#),
            Some(Challenge::Bearer {
                realm: "http://h/token".into(),
                service: None,
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Bearer service=\"x\""), None);
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(
            parse_challenge(r#"Bearer realm=http://h/t,service="a\"b""#),
            Some(Challenge::Bearer {
                realm: "http://h/t".into(),
                service: Some("a\"b".into()),
                scope: None,
            })
        );
    }

    #[test]
    fn token_answers_take_token_or_access_token() {
        let a: TokenAnswer = serde_json::from_str(r#"{"token": "t1", "expires_in": 300}"#).unwrap();
        assert_eq!(a.into_token().as_deref(), Some("t1"));
        let b: TokenAnswer = serde_json::from_str(r#"{"access_token": "t2"}"#).unwrap();
        assert_eq!(b.into_token().as_deref(), Some("t2"));
        let c: TokenAnswer = serde_json::from_str(r#"{"token": ""}"#).unwrap();
        assert_eq!(c.into_token(), None);
    }
}

//! The GitHub settings (`LEASEGATE_GITHUB_*`), read and checked at start: the API's address,
//! the one credential (a GitHub App's id, private key and installation, or a token), the
//! watcher's interval and how long an unused registration is kept.
//!
//! None of the credential's settings given: the feature is off. Anything else that is not
//! whole is refused before anything is written, with the setting named: a key that cannot be
//! read or is not RSA, an App missing a part, an App and a token at once.

use crate::config::ServeArgs;
use anyhow::{Context, anyhow, bail, ensure};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A secret that must not reach a log: `Debug` and `Display` show none of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A GitHub App's private key, ready to sign RS256 (boxed: an RSA key holds its numbers
/// inline, several hundred bytes).
#[derive(Clone)]
pub struct AppKey(pub(super) Box<crate::jwt::Rs256Key>);

impl fmt::Debug for AppKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AppKey(<redacted>)")
    }
}

/// The one credential leasegate holds for GitHub.
#[derive(Clone, Debug)]
pub enum CredentialSettings {
    App {
        app_id: u64,
        installation_id: u64,
        key: AppKey,
    },
    Token(Secret),
}

/// Everything the GitHub side runs with.
#[derive(Clone, Debug)]
pub struct GithubSettings {
    /// `https://api.github.com`, or GitHub Enterprise Server's `https://HOST/api/v3`; no
    /// trailing slash.
    pub api_url: String,
    pub credential: CredentialSettings,
    /// PEM certificates to trust for the API besides the built-in roots (a private CA).
    pub ca_file: Option<PathBuf>,
    /// How often the watcher lists each scope's runners.
    pub poll: Duration,
    /// How long a registration that never comes online is kept.
    pub unused_ttl_s: i64,
}

impl GithubSettings {
    pub fn poll_s(&self) -> i64 {
        self.poll.as_secs() as i64
    }
}

/// Reads an RSA private key (PKCS#1, as GitHub hands it out, or PKCS#8) from PEM.
fn read_app_key(path: &Path) -> anyhow::Result<AppKey> {
    use rsa::pkcs1::DecodeRsaPrivateKey;
    use rsa::pkcs8::DecodePrivateKey;
    let name = "LEASEGATE_GITHUB_APP_KEY_FILE";
    let pem = std::fs::read_to_string(path)
        .map_err(|e| anyhow!("{name} {}: cannot read it: {e}", path.display()))?;
    let key = rsa::RsaPrivateKey::from_pkcs1_pem(pem.trim())
        .or_else(|_| rsa::RsaPrivateKey::from_pkcs8_pem(pem.trim()))
        .map_err(|_| {
            anyhow!(
                "{name} {}: not an RSA private key in PEM (a GitHub App's key, as GitHub \
                 downloads it, begins with -----BEGIN RSA PRIVATE KEY-----)",
                path.display()
            )
        })?;
    let key = AppKey(Box::new(crate::jwt::Rs256Key::new(key)));
    // Signed once here, so that a key the signer cannot use stops the start, not a runner.
    crate::jwt::rs256(&key.0, &serde_json::json!({"iss": "0"}))
        .map_err(|e| anyhow!("{name} {}: the key cannot sign RS256: {e}", path.display()))?;
    Ok(key)
}

/// The token, from its value or its file.
fn read_token(value: &Option<String>, file: &Option<PathBuf>) -> anyhow::Result<Option<Secret>> {
    if let Some(v) = value.as_ref().map(|v| v.trim()).filter(|v| !v.is_empty()) {
        return Ok(Some(Secret::new(v)));
    }
    let Some(path) = file else { return Ok(None) };
    let token = std::fs::read_to_string(path).with_context(|| {
        format!(
            "LEASEGATE_GITHUB_TOKEN_FILE {}: cannot read it",
            path.display()
        )
    })?;
    let token = token.trim();
    ensure!(
        !token.is_empty(),
        "LEASEGATE_GITHUB_TOKEN_FILE {} is empty",
        path.display()
    );
    Ok(Some(Secret::new(token)))
}

/// An API's URL (`name`: the setting, `LEASEGATE_GITHUB_API_URL`), checked: https (plain
/// http only to this machine, for a test server), no query, no trailing slash.
pub(crate) fn api_url(name: &str, given: &str) -> anyhow::Result<String> {
    let url = reqwest::Url::parse(given.trim())
        .map_err(|e| anyhow!("{name}: `{given}` is not a URL: {e}"))?;
    let host = url.host_str().unwrap_or_default();
    let local = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match url.scheme() {
        "https" => {}
        "http" if local => {}
        _ => bail!(
            "{name}: `{given}` must be an https:// URL (http:// only to this machine): the \
             credential travels with every call"
        ),
    }
    ensure!(
        url.query().is_none() && url.fragment().is_none() && url.username().is_empty(),
        "{name}: `{given}` takes no query, fragment or user"
    );
    Ok(url.as_str().trim_end_matches('/').to_string())
}

impl ServeArgs {
    /// The GitHub settings; `None` when no credential is given (the feature is off). Names the
    /// setting at fault.
    pub fn github_settings(&self) -> anyhow::Result<Option<GithubSettings>> {
        let app_parts = [
            ("LEASEGATE_GITHUB_APP_ID", self.github_app_id.is_some()),
            (
                "LEASEGATE_GITHUB_APP_KEY_FILE",
                self.github_app_key_file.is_some(),
            ),
            (
                "LEASEGATE_GITHUB_INSTALLATION_ID",
                self.github_installation_id.is_some(),
            ),
        ];
        let token_given = self.github_token.as_ref().is_some_and(|t| !t.is_empty())
            || self.github_token_file.is_some();
        let app_given = app_parts.iter().any(|(_, set)| *set);
        if app_given && token_given {
            bail!(
                "LEASEGATE_GITHUB_APP_ID (a GitHub App) and LEASEGATE_GITHUB_TOKEN (a token) are \
                 both set: leasegate holds one GitHub credential; unset one of them"
            );
        }
        let credential = if app_given {
            let missing: Vec<&str> = app_parts
                .iter()
                .filter(|(_, set)| !set)
                .map(|(name, _)| *name)
                .collect();
            ensure!(
                missing.is_empty(),
                "{} not set: a GitHub App needs LEASEGATE_GITHUB_APP_ID, \
                 LEASEGATE_GITHUB_APP_KEY_FILE and LEASEGATE_GITHUB_INSTALLATION_ID",
                missing.join(" and ")
            );
            let (Some(app_id), Some(key_file), Some(installation_id)) = (
                self.github_app_id,
                &self.github_app_key_file,
                self.github_installation_id,
            ) else {
                unreachable!("every part is set");
            };
            CredentialSettings::App {
                app_id,
                installation_id,
                key: read_app_key(key_file)?,
            }
        } else {
            match read_token(&self.github_token, &self.github_token_file)? {
                Some(token) => CredentialSettings::Token(token),
                None => return Ok(None),
            }
        };
        ensure!(
            self.github_poll_s >= 1,
            "LEASEGATE_GITHUB_POLL_S must be positive, got {}",
            self.github_poll_s
        );
        ensure!(
            self.github_unused_ttl_s >= self.github_poll_s,
            "LEASEGATE_GITHUB_UNUSED_TTL_S ({}) must be at least LEASEGATE_GITHUB_POLL_S ({}): \
             a registration is only seen online at a poll",
            self.github_unused_ttl_s,
            self.github_poll_s
        );
        if let Some(ca) = &self.github_ca_file {
            std::fs::read(ca).map_err(|e| {
                anyhow!(
                    "LEASEGATE_GITHUB_CA_FILE {}: cannot read it: {e}",
                    ca.display()
                )
            })?;
        }
        Ok(Some(GithubSettings {
            api_url: api_url("LEASEGATE_GITHUB_API_URL", &self.github_api_url)?,
            credential,
            ca_file: self.github_ca_file.clone(),
            poll: Duration::from_secs(self.github_poll_s),
            unused_ttl_s: self.github_unused_ttl_s as i64,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "LEASEGATE_GITHUB_API_URL";

    #[test]
    fn the_api_is_https_or_this_machine() {
        assert_eq!(
            api_url(NAME, "https://api.github.com/").unwrap(),
            "https://api.github.com"
        );
        assert_eq!(
            api_url(NAME, "https://ghe.example/api/v3").unwrap(),
            "https://ghe.example/api/v3"
        );
        assert_eq!(
            api_url(NAME, "http://127.0.0.1:9999").unwrap(),
            "http://127.0.0.1:9999"
        );
        for bad in [
            "http://api.github.com",
            "ftp://x",
            "api.github.com",
            "https://x/?a=1",
        ] {
            let e = api_url(NAME, bad).unwrap_err().to_string();
            assert!(e.starts_with("LEASEGATE_GITHUB_API_URL: "), "{bad}: {e}");
        }
    }

    #[test]
    fn secrets_do_not_show_in_debug() {
        assert_eq!(format!("{:?}", Secret::new("ghp_x")), "Secret(<redacted>)");
    }
}

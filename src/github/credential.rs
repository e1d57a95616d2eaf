//! The credential every GitHub call carries: a token as given, or a GitHub App's installation
//! token, fetched with a JWT the App's key signs and kept until shortly before it expires.
//!
//! The App's JWT (RS256) has `iss` = the App's id, `iat` 60 s in the past (GitHub's advice,
//! against clock drift) and `exp` 9 minutes ahead (GitHub takes at most 10). It is exchanged
//! at `POST /app/installations/{id}/access_tokens` for an installation token valid an hour.
//! One token serves every call until `RENEW_BEFORE_S` before its end; callers that need one
//! meanwhile wait for the one fetch under way rather than each fetching their own. A `401`
//! with a token in hand forgets it (`forget`), so that the next call fetches another.

use super::error::{GithubError, classify};
use super::rest::Rest;
use super::settings::{AppKey, CredentialSettings, Secret};
use crate::domain::time::Millis;
use reqwest::Method;

/// How long before its end an installation token is renewed.
pub const RENEW_BEFORE_S: i64 = 300;
/// How far in the past the App's JWT is issued, and how far ahead it expires.
const JWT_BACKDATE_S: i64 = 60;
const JWT_LIFETIME_S: i64 = 540;

pub enum Credential {
    Token(Secret),
    App(App),
}

pub struct App {
    app_id: u64,
    installation_id: u64,
    key: AppKey,
    /// The installation token in use; the lock is also the one fetch under way.
    current: tokio::sync::Mutex<Option<Installation>>,
}

struct Installation {
    token: Secret,
    expires_at: Millis,
}

#[derive(serde::Serialize)]
struct AppClaims {
    iat: i64,
    exp: i64,
    iss: String,
}

#[derive(serde::Deserialize)]
struct InstallationToken {
    token: String,
    expires_at: String,
}

impl Credential {
    pub fn new(settings: &CredentialSettings) -> Self {
        match settings {
            CredentialSettings::Token(t) => Credential::Token(t.clone()),
            CredentialSettings::App {
                app_id,
                installation_id,
                key,
            } => Credential::App(App {
                app_id: *app_id,
                installation_id: *installation_id,
                key: key.clone(),
                current: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// What the next call is authorized with.
    pub async fn authorization(&self, rest: &Rest, now: Millis) -> Result<Secret, GithubError> {
        match self {
            Credential::Token(t) => Ok(t.clone()),
            Credential::App(app) => app.token(rest, now).await,
        }
    }

    /// GitHub answered `401` to a call made with `used`: whether another try may do better
    /// (an App's token is forgotten and fetched afresh; a given token is what it is).
    pub async fn forget(&self, used: &Secret) -> bool {
        match self {
            Credential::Token(_) => false,
            Credential::App(app) => {
                let mut current = app.current.lock().await;
                if current.as_ref().is_some_and(|c| &c.token == used) {
                    *current = None;
                }
                true
            }
        }
    }
}

impl App {
    fn jwt(&self, now: Millis) -> Result<Secret, GithubError> {
        let now_s = now.0.div_euclid(1000);
        let claims = AppClaims {
            iat: now_s - JWT_BACKDATE_S,
            exp: now_s + JWT_LIFETIME_S,
            iss: self.app_id.to_string(),
        };
        crate::jwt::rs256(&self.key.0, &claims)
            .map(Secret::new)
            .map_err(|e| GithubError::Unexpected(format!("signing the App's JWT: {e}")))
    }

    async fn token(&self, rest: &Rest, now: Millis) -> Result<Secret, GithubError> {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_ref()
            && c.expires_at.secs_since(now) > RENEW_BEFORE_S
        {
            return Ok(c.token.clone());
        }
        let url = rest.url(&format!(
            "/app/installations/{}/access_tokens",
            self.installation_id
        ));
        let answer = rest.call(Method::POST, &url, &self.jwt(now)?, None).await?;
        if !answer.status.is_success() {
            let e = classify(answer.status, &answer.headers, &answer.body, now.0 / 1000);
            return Err(match e {
                GithubError::Refused { status, message } => GithubError::Refused {
                    status,
                    message: format!(
                        "the App's installation token was refused ({message}): check \
                         LEASEGATE_GITHUB_APP_ID, LEASEGATE_GITHUB_APP_KEY_FILE, \
                         LEASEGATE_GITHUB_INSTALLATION_ID and this machine's clock"
                    ),
                },
                other => other,
            });
        }
        let fresh: InstallationToken = serde_json::from_slice(&answer.body).map_err(|e| {
            GithubError::Unexpected(format!("an installation token without its fields: {e}"))
        })?;
        let expires_at = Millis::parse_rfc3339(&fresh.expires_at).ok_or_else(|| {
            GithubError::Unexpected(format!(
                "an installation token expiring at {:?}",
                fresh.expires_at
            ))
        })?;
        let token = Secret::new(fresh.token);
        tracing::info!(
            installation_id = self.installation_id,
            expires_at = %expires_at.rfc3339(),
            "GitHub App installation token fetched"
        );
        *current = Some(Installation {
            token: token.clone(),
            expires_at,
        });
        Ok(token)
    }
}

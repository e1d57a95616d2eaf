//! GitHub Actions: a runner asks for a single-use GitHub registration with its signed
//! attestation (`POST /api/v1/github/runners`), judged by the lease's rules; see
//! `crate::github::mint`. Without a GitHub credential the route answers 404.

use super::problem::Problem;
use super::views::GithubRegistrationGrant;
use crate::app::AppState;
use crate::client::Client;
use crate::github::error::GithubError;
use crate::github::mint::{MintError, mint};
use crate::problem::ApiError;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/v1/github/runners", post(register))
}

/// How soon a runner whose pool has no `github` object, or whose registration GitHub refused,
/// asks again: an operator has something to fix first.
const FIX_FIRST_RETRY_S: i64 = 60;

#[derive(Deserialize, utoipa::ToSchema)]
struct GithubRunnerBody {
    /// The signed attestation (a JWT), as for a lease.
    attestation: String,
}

#[utoipa::path(post, path = "/api/v1/github/runners", tag = "runners",
    request_body = GithubRunnerBody,
    responses(
        (status = 201, description = "Minted: run GitHub's runner with `./run.sh --jitconfig <encoded_jit_config>`; it takes one job.", body = GithubRegistrationGrant),
        (status = 400, description = "`bad_request`: a malformed body or a bad digest.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Rules 1-5: `attestation_invalid`, `attestation_expired`, `attestation_replayed`, `clock_skew`.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`runner_revoked`.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: this service has no GitHub credential.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "No call to GitHub was made (`Retry-After`): refused by rules 7-13 with a lease's code; `pool_not_github` (the pool has no `github` object); `github_runner_outstanding` (the runner holds a registration that has not ended; its `github_runner_id` in the problem).", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "`github_refused`: GitHub refused to mint (its message, and the permission leasegate's credential needs).", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`github_unavailable`: GitHub is unreachable, failing or rate-limiting (`Retry-After`, from GitHub's headers when it sent them); or `unavailable`.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn register(
    State(state): State<AppState>,
    client: Client,
    body: Bytes,
) -> Result<Response, ApiError> {
    // Before the body: without a credential the route is as good as absent.
    let Some(github) = state.github().cloned() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "GitHub Actions is not set up on this service (LEASEGATE_GITHUB_APP_ID or \
             LEASEGATE_GITHUB_TOKEN)",
        ));
    };
    let body: GithubRunnerBody = super::json::parse(&body)?;
    let minted = mint(
        &state.github_context(),
        &github,
        &body.attestation,
        &client.ip.to_string(),
    )
    .await
    .map_err(|e| problem(&state, e))?;
    let reg = &minted.registration;
    let grant = GithubRegistrationGrant {
        github_runner_id: reg.github_runner_id.unwrap_or_default(),
        name: reg.name.clone(),
        encoded_jit_config: minted.encoded_jit_config.expose().to_string(),
        expires_at: reg.expires_at.rfc3339(),
    };
    let mut response = (StatusCode::CREATED, Json(grant)).into_response();
    if let Some(code) = minted.would_refuse {
        response.headers_mut().insert(
            crate::forge_gate::WOULD_REFUSE_HEADER,
            axum::http::HeaderValue::from_static(code),
        );
    }
    Ok(response)
}

/// The answer to a request that minted nothing.
fn problem(state: &AppState, e: MintError) -> ApiError {
    let detail = e.to_string();
    match e {
        MintError::Admit(a) => a.into(),
        MintError::Store(s) => s.into(),
        MintError::Refused(r) => ApiError::conflict(r.code(), detail)
            .retry_after(r.retry_after_s(state.settings().heartbeat_interval_s)),
        MintError::PoolNotGithub(_) => {
            ApiError::conflict("pool_not_github", detail).retry_after(FIX_FIRST_RETRY_S)
        }
        MintError::Outstanding(held) => {
            let poll_s = state.github().map_or(10, |g| g.settings().poll_s());
            let problem =
                ApiError::conflict("github_runner_outstanding", detail).retry_after(poll_s);
            match held.github_runner_id {
                Some(id) => problem.with("github_runner_id", id),
                None => problem,
            }
        }
        MintError::Github {
            error: GithubError::Unavailable { retry_after_s, .. },
            ..
        } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "github_unavailable",
            detail,
        )
        .retry_after(retry_after_s),
        MintError::Github { error, scope } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "github_refused",
            format!(
                "GitHub refused to register a runner in {scope}: {error}. leasegate's credential \
                 needs {}",
                scope.kind().permission_needed()
            ),
        )
        .retry_after(FIX_FIRST_RETRY_S),
    }
}

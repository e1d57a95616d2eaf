//! Registration tokens: `POST /api/v1/admin/pools/{name}/registration-tokens` makes a
//! single-use token with which a runner registers into the pool.

use super::pools::pool_name;
use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::time::Millis;
use crate::http::auth::AsOperator;
use crate::http::problem::Problem;
use crate::http::views::RegistrationToken;
use crate::problem::ApiError;
use crate::secrets::{generate_token, hash_token};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

#[derive(Deserialize, Default, utoipa::ToSchema)]
// Named apart from the operators' `TokenBody`: one document has one schema per name.
#[schema(as = RegistrationTokenBody)]
pub(super) struct TokenBody {
    /// 1 to 2592000 seconds, default 3600.
    #[serde(default, deserialize_with = "crate::http::json::whole_number")]
    #[schema(minimum = 1, maximum = 2592000)]
    ttl_s: Option<i64>,
}

#[utoipa::path(post, path = "/api/v1/admin/pools/{name}/registration-tokens", tag = "admin",
    security(("admin_token" = ["write"])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    request_body(content = Option<TokenBody>, description = "Optional: an empty body counts as `{}`."),
    responses(
        (status = 201, description = "A single-use registration token.", body = RegistrationToken),
        (status = 400, description = "`bad_request`: a bad pool name or `ttl_s`.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn create_registration_token(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
    crate::http::json::OptionalJson(body): crate::http::json::OptionalJson<TokenBody>,
) -> Result<(StatusCode, Json<RegistrationToken>), ApiError> {
    let name = pool_name(&name)?;
    let ttl_s = body.ttl_s.unwrap_or(3600);
    if !(1..=30 * 86_400).contains(&ttl_s) {
        return Err(ApiError::bad_request("ttl_s: must be from 1 to 2592000"));
    }
    let now = Millis::now();
    let token = generate_token("lgr_");
    let expires_at = now.plus_secs(ttl_s);
    let created = state
        .store()
        .create_registration_token(
            &name,
            &hash_token(&token),
            expires_at,
            now,
            &caller
                .audit(Action::RegistrationTokenCreate, name.as_str(), now)
                .detail(format!("ttl_s {ttl_s}")),
        )
        .await?;
    if !created {
        return Err(ApiError::not_found("pool"));
    }
    tracing::info!(pool = %name, ttl_s, "registration token created");
    Ok((
        StatusCode::CREATED,
        Json(RegistrationToken {
            token,
            pool: name,
            expires_at,
        }),
    ))
}

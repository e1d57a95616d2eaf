//! Operators' named tokens (created, listed, revoked by an admin) and the audit trail (read
//! by anyone with an operator's token).
//!
//! A named token is shown once, when created, and kept only as its hash; revoking it ends the
//! page sessions opened with it, and since every request looks its token up (`auth.rs`), it is
//! refused at once on every replica.

use super::auth::{AsAdmin, AsViewer};
use super::json::JsonBody;
use super::problem::Problem;
use super::views::{self, AuditPage, CreatedOperatorToken, OperatorTokenList, OperatorTokenView};
use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::operator::{BOOTSTRAP, Operator, OperatorName, Role};
use crate::domain::time::Millis;
use crate::problem::ApiError;
use crate::secrets::{generate_token, hash_token};
use crate::store::{AuditFilter, OperatorToken};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Deserialize;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/admin/tokens", get(list_tokens).post(create_token))
        .route("/api/v1/admin/tokens/{name}", delete(delete_token))
        .route("/api/v1/admin/audit", get(audit_trail))
}

/// The most entries one page of the audit trail holds, and how many it holds by default.
pub const AUDIT_PAGE_MAX: i64 = 500;
pub const AUDIT_PAGE_DEFAULT: i64 = 100;

fn operator_name(name: &str) -> Result<OperatorName, ApiError> {
    let name =
        OperatorName::parse(name).map_err(|e| ApiError::bad_request(format!("name: {e}")))?;
    if name.as_str() == BOOTSTRAP {
        return Err(ApiError::bad_request(
            "name: `bootstrap` is the configured admin token's; choose another",
        ));
    }
    Ok(name)
}

fn token_view(t: &OperatorToken) -> OperatorTokenView {
    OperatorTokenView {
        name: t.operator.name.to_string(),
        role: t.operator.role.as_str().to_string(),
        created_at: t.created_at.rfc3339(),
        created_by: t.created_by.clone(),
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct TokenBody {
    /// 1-63 characters of `a-z 0-9 - _ . @`, starting with a letter or digit; not
    /// `bootstrap`.
    #[schema(pattern = "^[a-z0-9][a-z0-9._@-]{0,62}$")]
    name: String,
    /// `viewer`, `operator` or `admin`.
    #[schema(pattern = "^(viewer|operator|admin)$")]
    role: String,
}

#[utoipa::path(post, path = "/api/v1/admin/tokens", tag = "admin",
    security(("admin_token" = ["admin"])),
    request_body = TokenBody,
    responses(
        (status = 201, description = "The named token, shown this once.", body = CreatedOperatorToken),
        (status = 400, description = "`bad_request`: a bad name or role.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`token_name_taken`: an operator of that name exists.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn create_token(
    caller: AsAdmin,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TokenBody>,
) -> Result<(StatusCode, Json<CreatedOperatorToken>), ApiError> {
    let name = operator_name(&body.name)?;
    let role = Role::parse(&body.role)
        .ok_or_else(|| ApiError::bad_request("role: must be `viewer`, `operator` or `admin`"))?;
    let operator = Operator { name, role };
    let token = generate_token("lgo_");
    let audit = caller
        .audit(
            Action::OperatorTokenCreate,
            operator.name.as_str(),
            Millis::now(),
        )
        .detail(format!("role {role}"));
    let created = state
        .store()
        .create_operator_token(&operator, &hash_token(&token), &audit)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedOperatorToken {
            operator: token_view(&created),
            token,
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/admin/tokens", tag = "admin",
    security(("admin_token" = ["admin"])),
    responses(
        (status = 200, description = "Every named token, by name (never the tokens themselves).", body = OperatorTokenList),
    ))]
async fn list_tokens(
    _: AsAdmin,
    State(state): State<AppState>,
) -> Result<Json<OperatorTokenList>, ApiError> {
    let tokens = state.store().list_operator_tokens().await?;
    Ok(Json(OperatorTokenList {
        tokens: tokens.iter().map(token_view).collect(),
    }))
}

#[utoipa::path(delete, path = "/api/v1/admin/tokens/{name}", tag = "admin",
    security(("admin_token" = ["admin"])),
    params(("name" = String, Path, description = "The operator's name: 1-63 characters of `a-z 0-9 . _ - @`, starting with a letter or digit; not `bootstrap`.", pattern = "^[a-z0-9][a-z0-9._@-]{0,62}$")),
    responses(
        (status = 204, description = "Revoked: refused from now on by every replica, and its page sessions ended."),
        (status = 400, description = "`bad_request`: not a valid operator name.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no token of that name.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn delete_token(
    caller: AsAdmin,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = operator_name(&name)?;
    let audit = caller.audit(Action::OperatorTokenRevoke, name.as_str(), Millis::now());
    if !state.store().delete_operator_token(&name, &audit).await? {
        return Err(ApiError::not_found("operator token"));
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Only entries on this target (a runner id, pool name or operator name).
    #[serde(default)]
    #[param(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    target: Option<String>,
    /// Only entries by this operator.
    #[serde(default)]
    #[param(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    actor: Option<String>,
    /// Only entries at or after this RFC 3339 instant.
    #[serde(default)]
    #[param(format = DateTime)]
    since: Option<String>,
    /// Only entries before this RFC 3339 instant.
    #[serde(default)]
    #[param(format = DateTime)]
    until: Option<String>,
    /// Entries per page: 1 to 500, default 100.
    #[serde(default)]
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// The `next_cursor` of the page before.
    #[serde(default)]
    #[param(value_type = Option<i64>, minimum = 1)]
    cursor: Option<String>,
}

fn instant(field: &str, value: Option<&str>) -> Result<Option<Millis>, ApiError> {
    value
        .map(|v| {
            Millis::parse_rfc3339(v).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{field}: not an RFC 3339 instant (as 2026-12-01T09:00:00Z)"
                ))
            })
        })
        .transpose()
}

fn plain(field: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    value
        .map(|v| {
            crate::domain::text::without_controls("target", &v)?;
            // Counted in characters, as JSON Schema's `maxLength` counts them.
            if v.chars().count() > 200 {
                return Err(ApiError::bad_request(format!(
                    "{field}: at most 200 characters"
                )));
            }
            Ok(v)
        })
        .transpose()
}

#[utoipa::path(get, path = "/api/v1/admin/audit", tag = "admin",
    security(("admin_token" = ["read"])),
    params(AuditQuery),
    responses(
        (status = 200, description = "Operators' changes, newest first, one page.", body = AuditPage),
        (status = 400, description = "`bad_request`: a bad instant, limit or cursor.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn audit_trail(
    _: AsViewer,
    State(state): State<AppState>,
    Query(q): Query<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = q.limit.unwrap_or(AUDIT_PAGE_DEFAULT);
    if !(1..=AUDIT_PAGE_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: must be from 1 to {AUDIT_PAGE_MAX}"
        )));
    }
    let before = q
        .cursor
        .as_deref()
        .map(|c| {
            c.parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| ApiError::bad_request("cursor: not a cursor this service gave"))
        })
        .transpose()?;
    let filter = AuditFilter {
        target: plain("target", q.target)?,
        actor: plain("actor", q.actor)?,
        since: instant("since", q.since.as_deref())?,
        until: instant("until", q.until.as_deref())?,
        before,
        limit: limit + 1,
    };
    let mut found = state.store().audit_trail(&filter).await?;
    let more = found.len() as i64 > limit;
    found.truncate(limit as usize);
    let next_cursor = more
        .then(|| found.last().map(|r| r.seq.to_string()))
        .flatten();
    Ok(Json(AuditPage {
        entries: found.iter().map(views::audit_entry).collect(),
        next_cursor,
    }))
}

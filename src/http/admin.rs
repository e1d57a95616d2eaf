//! The operator's API: pools and their image policy (and resolving a registry pool now),
//! registration tokens, runners (list, detail, cordon, uncordon, revoke) and the drift report
//! a fleet roller polls, with each pool's roll health. Reads need a viewer's token, writes an
//! operator's; every write is recorded in the audit trail with its author.

use super::auth::{AsOperator, AsViewer};
use super::json::JsonBody;
use super::problem::Problem;
use super::views::{self, PoolStanding};
use super::views::{
    DriftReport, DriftedRunner, PoolList, PoolView, RegistrationToken, RollHealthView,
    RunnerDetail, RunnerList, RunnerView, SkippedRunner,
};
use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::digest::ImageDigest;
use crate::domain::disk::DiskWarning;
use crate::domain::ejection::EjectionPolicy;
use crate::domain::fleet::{self, Filter};
use crate::domain::github::{DEFAULT_RUNNER_GROUP_ID, GithubPool};
use crate::domain::ids::RunnerId;
use crate::domain::image_set::ImageSource;
use crate::domain::images::{ImageSpec, Undescribed};
use crate::domain::json_object::ObjectOnly;
use crate::domain::pool::{
    DEFAULT_DRIFT_GRACE_S, DEFAULT_RESOLVE_INTERVAL_S, GateMode, ImagePolicy, Pool, PoolSpec,
    PoolSpecError,
};
use crate::domain::pool_name::PoolName;
use crate::domain::roll::roll_health;
use crate::domain::runner::{DriftEntry, RunnerSummary, drift_entry};
use crate::domain::time::Millis;
use crate::problem::ApiError;
use crate::registry::reference::ImageRef;
use crate::registry::resolver::{self, ResolvePoolError};
use crate::secrets::{generate_token, hash_token};
use crate::store::AuditFilter;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/admin/pools", get(list_pools))
        .route(
            "/api/v1/admin/pools/{name}",
            get(get_pool)
                .put(put_pool)
                .patch(patch_pool)
                .delete(delete_pool),
        )
        .route(
            "/api/v1/admin/pools/{name}/registration-tokens",
            post(create_registration_token),
        )
        .route("/api/v1/admin/runners", get(list_runners))
        .route("/api/v1/admin/runners/{id}", get(get_runner))
        .route("/api/v1/admin/runners/{id}/cordon", post(cordon))
        .route("/api/v1/admin/runners/{id}/uncordon", post(uncordon))
        .route("/api/v1/admin/runners/{id}/reinstate", post(reinstate))
        .route("/api/v1/admin/runners/{id}/revoke", post(revoke))
        .route(
            "/api/v1/admin/runners/{id}/forge-runners",
            axum::routing::put(put_forge_runners),
        )
        .route("/api/v1/admin/pools/{name}/resolve", post(resolve))
        .route("/api/v1/admin/drift", get(drift))
}

fn pool_name(name: &str) -> Result<PoolName, ApiError> {
    PoolName::parse(name).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Its schema is `constraints::pool_body`, which says `PoolSpec::validate`'s rules too.
/// A field added here must be written by `put_body` too, or `PATCH` resets it.
#[derive(Deserialize)]
struct PoolBody {
    #[serde(default)]
    image_ref: Option<String>,
    /// Image ids (`sha256:` and 64 lowercase hex, or the bare 64 hex podman's `{{.Id}}`
    /// prints); for `manual` pools.
    #[serde(default)]
    expected_image_ids: Vec<String>,
    #[serde(default)]
    image_policy: ImagePolicy,
    #[serde(default)]
    image_source: ImageSource,
    /// `enforce` (default): refusals refuse. `observe`: refusals are recorded and marked, and
    /// the runner gets its work all the same.
    #[serde(default)]
    gate_mode: GateMode,
    /// 0 to 2592000 seconds, default 900.
    #[serde(default, deserialize_with = "super::json::whole_number")]
    drift_grace_s: Option<i64>,
    /// 10 to 86400 seconds, default 300 (registry pools).
    #[serde(default, deserialize_with = "super::json::whole_number")]
    resolve_interval_s: Option<i64>,
    /// Where the pool's runners register with GitHub Actions; null or omitted: they do not.
    #[serde(default)]
    github: Option<ObjectOnly<GithubBody>>,
    /// Below what disk figures its runners are warned of; null or omitted: never.
    #[serde(default)]
    disk_warning: Option<ObjectOnly<DiskWarning>>,
    /// When the pool's runners are ejected; null or omitted: the defaults.
    #[serde(default)]
    ejection: Option<ObjectOnly<EjectionBody>>,
    /// The images its runners may run, each judged on its own (`domain::images`).
    #[serde(default)]
    images: Vec<ObjectOnly<ImageBody>>,
    /// `refuse` (default) or `ignore` an attested image the pool does not describe.
    #[serde(default)]
    undescribed_images: Undescribed,
}

/// A pool's `ejection` object; a field left out (or null) takes its default, and unknown
/// fields are refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EjectionBody {
    #[serde(default, deserialize_with = "super::json::whole_number")]
    consecutive_failures: Option<i64>,
    #[serde(default, deserialize_with = "super::json::whole_number")]
    base_s: Option<i64>,
    #[serde(default)]
    max_share: Option<f64>,
}

impl EjectionBody {
    fn policy(self) -> EjectionPolicy {
        let d = EjectionPolicy::default();
        EjectionPolicy {
            consecutive_failures: self.consecutive_failures.unwrap_or(d.consecutive_failures),
            base_s: self.base_s.unwrap_or(d.base_s),
            max_share: self.max_share.unwrap_or(d.max_share),
        }
    }
}

/// One of a pool's `images`; unknown fields are refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageBody {
    #[serde(rename = "ref")]
    image_ref: String,
    /// `manual` (default): `expected_image_ids` is the set. `registry`: the set is what the
    /// ref resolves to; ids named here stand until the next resolution.
    #[serde(default)]
    image_source: ImageSource,
    #[serde(default)]
    expected_image_ids: Vec<String>,
    /// 0 to 2592000 seconds, default 900.
    #[serde(default, deserialize_with = "super::json::whole_number")]
    drift_grace_s: Option<i64>,
    #[serde(default)]
    absent_ok: bool,
}

/// The pool's images; a ref named twice is the later entry, as a JSON object's key would be.
fn image_specs(bodies: Vec<ObjectOnly<ImageBody>>) -> Result<Vec<ImageSpec>, ApiError> {
    let mut specs: Vec<ImageSpec> = Vec::with_capacity(bodies.len());
    for (i, body) in bodies.into_iter().enumerate() {
        let spec = body.0.checked(i)?;
        match specs.iter_mut().find(|s| s.image_ref == spec.image_ref) {
            Some(earlier) => *earlier = spec,
            None => specs.push(spec),
        }
    }
    Ok(specs)
}

impl ImageBody {
    fn checked(self, i: usize) -> Result<ImageSpec, ApiError> {
        crate::domain::text::without_controls("images[].ref", &self.image_ref)?;
        if self.image_source == ImageSource::Registry {
            ImageRef::parse(&self.image_ref)
                .map_err(|e| ApiError::bad_request(format!("images[{i}].ref: {e}")))?;
        }
        Ok(ImageSpec {
            image_source: self.image_source,
            expected_image_ids: self
                .expected_image_ids
                .iter()
                .enumerate()
                .map(|(j, id)| {
                    ImageDigest::parse_image_id(id).map_err(|e| {
                        ApiError::bad_request(format!("images[{i}].expected_image_ids[{j}]: {e}"))
                    })
                })
                .collect::<Result<_, _>>()?,
            image_ref: self.image_ref,
            drift_grace_s: self.drift_grace_s.unwrap_or(DEFAULT_DRIFT_GRACE_S),
            absent_ok: self.absent_ok,
        })
    }
}

/// A pool's `github` object (`domain::github::GithubPool`); unknown fields are refused, so that
/// a misspelt one is not silently its default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GithubBody {
    scope: String,
    #[serde(default, deserialize_with = "super::json::whole_number")]
    runner_group_id: Option<i64>,
    labels: Vec<String>,
    #[serde(default)]
    work_folder: Option<String>,
}

impl GithubBody {
    fn checked(self) -> Result<GithubPool, ApiError> {
        GithubPool::new(
            &self.scope,
            self.runner_group_id.unwrap_or(DEFAULT_RUNNER_GROUP_ID),
            self.labels,
            self.work_folder,
        )
        .map_err(|e| ApiError::bad_request(e.to_string()))
    }
}

impl utoipa::PartialSchema for PoolBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        super::constraints::placeholder()
    }
}

impl utoipa::ToSchema for PoolBody {
    fn name() -> std::borrow::Cow<'static, str> {
        "PoolBody".into()
    }
}

/// A JSON merge patch of a `PoolBody`; its schema is `constraints::pool_patch`.
struct PoolPatch;

impl utoipa::PartialSchema for PoolPatch {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        super::constraints::placeholder()
    }
}

impl utoipa::ToSchema for PoolPatch {
    fn name() -> std::borrow::Cow<'static, str> {
        "PoolPatch".into()
    }
}

/// The spec a PUT body asks for, or the problem a PUT answers it with.
fn spec_of(body: PoolBody) -> Result<PoolSpec, ApiError> {
    if let Some(r) = &body.image_ref {
        crate::domain::text::without_controls("image_ref", r)?;
    }
    let spec = PoolSpec {
        image_ref: body.image_ref.filter(|r| !r.is_empty()),
        expected_image_ids: image_ids(&body.expected_image_ids)?,
        image_policy: body.image_policy,
        image_source: body.image_source,
        gate_mode: body.gate_mode,
        drift_grace_s: body.drift_grace_s.unwrap_or(DEFAULT_DRIFT_GRACE_S),
        resolve_interval_s: body
            .resolve_interval_s
            .unwrap_or(DEFAULT_RESOLVE_INTERVAL_S),
        // Nested objects only from JSON objects (`ObjectOnly`): serde would read a struct
        // from an array too, which the document does not allow.
        github: body.github.map(|g| g.0.checked()).transpose()?,
        disk_warning: body.disk_warning.map(|w| w.0),
        ejection: body
            .ejection
            .map_or_else(EjectionPolicy::default, |e| e.0.policy()),
        images: image_specs(body.images)?,
        undescribed_images: body.undescribed_images,
    };
    if spec.image_source == ImageSource::Registry
        && let Some(r) = &spec.image_ref
    {
        ImageRef::parse(r).map_err(|e| ApiError::bad_request(format!("image_ref: {e}")))?;
    }
    spec.validate().map_err(|e| match e {
        PoolSpecError::EnforceWithoutImages => {
            ApiError::unprocessable("pool_image_unresolved", e.to_string())
        }
        PoolSpecError::OutOfRange(m) => ApiError::bad_request(m),
    })?;
    Ok(spec)
}

/// `pool` as the PUT body that would make it again, every field written out: what `PATCH`
/// merges its patch into before reading the result exactly as a PUT body.
///
/// This is the one place `PATCH` learns of a pool's fields: a field `PoolBody` gains must be
/// written here, or a `PATCH` that does not name it resets it to its default. `Pool` is taken
/// apart without `..`, so that a field added to it does not compile until it is said here
/// whether the body carries it (`_` for what the service keeps itself).
fn put_body(pool: &Pool) -> Value {
    let Pool {
        name: _,
        image_ref,
        image_policy,
        image_source,
        gate_mode,
        expected_image_ids,
        previous_image_ids: _,
        previous_valid_until: _,
        drift_grace_s,
        resolve_interval_s,
        last_resolution: _,
        resolution_failures: _,
        resolved_digest,
        resolved_image_id: _,
        next_resolve_at: _,
        github,
        disk_warning,
        ejection,
        images,
        undescribed_images,
        created_at: _,
        updated_at: _,
    } = pool;
    let mut body = json!({
        "image_policy": image_policy,
        "image_source": image_source,
        "gate_mode": gate_mode,
        "drift_grace_s": drift_grace_s,
        "resolve_interval_s": resolve_interval_s,
        "ejection": {
            "consecutive_failures": ejection.consecutive_failures,
            "base_s": ejection.base_s,
            "max_share": ejection.max_share,
        },
    });
    if let Some(r) = image_ref {
        body["image_ref"] = json!(r);
    }
    if let Some(g) = github {
        body["github"] = json!({
            "scope": g.scope.as_str(),
            "runner_group_id": g.runner_group_id,
            "labels": g.labels,
            "work_folder": g.work_folder,
        });
    }
    if let Some(w) = disk_warning {
        body["disk_warning"] = json!(w);
    }
    if !images.is_empty() {
        let images: Vec<Value> = images
            .iter()
            .map(|i| {
                let mut entry = json!({"ref": i.image_ref, "image_source": i.image_source,
                       "drift_grace_s": i.drift_grace_s, "absent_ok": i.absent_ok});
                // As for the pool's own set: a resolved set is the registry's, not the body's.
                if !(i.is_registry() && i.resolved_digest.is_some()) {
                    let ids: Vec<&str> = i.expected_image_ids.iter().map(|d| d.as_str()).collect();
                    entry["expected_image_ids"] = json!(ids);
                }
                entry
            })
            .collect();
        body["images"] = json!(images);
    }
    body["undescribed_images"] = json!(undescribed_images);
    // A registry pool's resolved set is the registry's, not part of its body: named in a PUT,
    // it would stand as the operator's own set until the next resolution.
    let resolved = *image_source == ImageSource::Registry && resolved_digest.is_some();
    if !resolved {
        let ids: Vec<String> = expected_image_ids.iter().map(|d| d.to_string()).collect();
        body["expected_image_ids"] = json!(ids);
    }
    body
}

/// The audit detail of a pool write: its policy, in short.
fn spec_detail(spec: &PoolSpec) -> String {
    format!(
        "image_source {} image_policy {} gate_mode {} image_ref {} github {}",
        spec.image_source.as_str(),
        spec.image_policy.as_str(),
        spec.gate_mode.as_str(),
        spec.image_ref.as_deref().unwrap_or("-"),
        spec.github.as_ref().map_or("-", |g| g.scope.as_str()),
    )
}

/// The pool's image ids, each in its full form; the first that is none names itself.
fn image_ids(given: &[String]) -> Result<Vec<ImageDigest>, ApiError> {
    given
        .iter()
        .enumerate()
        .map(|(i, id)| {
            ImageDigest::parse_image_id(id)
                .map_err(|e| ApiError::bad_request(format!("expected_image_ids[{i}]: {e}")))
        })
        .collect()
}

/// The pool as the API shows it, with its runners counted by status and its queue depth.
async fn pool_view(state: &AppState, pool: &Pool, now: Millis) -> Result<PoolView, ApiError> {
    let runners = state
        .store()
        .runner_summaries(Some(&pool.name), false)
        .await?;
    let depth = state
        .store()
        .queue_depths()
        .await?
        .remove(&pool.name)
        .unwrap_or_default();
    Ok(views::pool(
        pool,
        &standing(state, &runners, pool, now),
        depth,
    ))
}

/// The pool's runners by status, its roll health and its resolver status at `now`.
fn standing(state: &AppState, runners: &[RunnerSummary], pool: &Pool, now: Millis) -> PoolStanding {
    let settings = state.settings();
    let mut counts = BTreeMap::new();
    let mut disk_warned = 0;
    for r in runners.iter().filter(|r| r.pool == pool.name) {
        let observed = r.observe(pool, now, settings.status_rules());
        *counts.entry(observed.status.as_str()).or_insert(0) += 1;
        disk_warned += i64::from(observed.disk_warning.is_some());
    }
    PoolStanding {
        runners_by_status: counts,
        disk_warned,
        roll: roll_health(
            pool,
            runners,
            now,
            settings.status_rules(),
            settings.roll_stalled_share,
        ),
        resolver_status: pool.resolver_status(settings.resolver_failure_threshold),
    }
}

#[utoipa::path(put, path = "/api/v1/admin/pools/{name}", tag = "admin",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    request_body = PoolBody,
    responses(
        (status = 201, description = "Created.", body = PoolView),
        (status = 200, description = "Replaced.", body = PoolView),
        (status = 400, description = "`bad_request`: a bad name, digest, reference or number, or a bad `github` object.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`pool_image_unresolved`: a `manual` pool with `enforce` and no image ids.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn put_pool(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<PoolBody>,
) -> Result<(StatusCode, Json<PoolView>), ApiError> {
    let name = pool_name(&name)?;
    let spec = spec_of(body)?;
    let now = Millis::now();
    let audit = caller
        .audit(Action::PoolPut, name.as_str(), now)
        .detail(spec_detail(&spec));
    let (pool, created) = state.store().put_pool(&name, spec, now, &audit).await?;
    tracing::info!(pool = %pool.name, created, "pool written");
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(pool_view(&state, &pool, now).await?)))
}

/// How often a `PATCH` reads, merges and writes again when the pool changed under it. Of
/// writers racing on one pool one wins each round, so this many concurrent patches all land.
const PATCH_ATTEMPTS: usize = 32;

#[utoipa::path(patch, path = "/api/v1/admin/pools/{name}", tag = "admin",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    request_body(description = "A JSON merge patch (RFC 7396) of the pool's `PUT` body: a member sets that field, `null` returns it to its default, a field not named keeps the pool's value.",
        content((PoolPatch = "application/merge-patch+json"), (PoolPatch = "application/json"))),
    responses(
        (status = 200, description = "Changed; the pool.", body = PoolView),
        (status = 400, description = "`bad_request`: a bad name, or the patched body is one a `PUT` refuses (a bad digest, reference or number; not an object).", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`pool_image_unresolved`: the patched pool would be a `manual` pool with `enforce` and no image ids.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`unavailable`: the pool kept changing under the patch, or the database did not answer.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn patch_pool(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(patch): JsonBody<serde_json::Map<String, Value>>,
) -> Result<Json<PoolView>, ApiError> {
    let name = pool_name(&name)?;
    let named = patch.keys().cloned().collect::<Vec<_>>().join(", ");
    let patch = Value::Object(patch);
    for _ in 0..PATCH_ATTEMPTS {
        let base = state
            .store()
            .get_pool(&name)
            .await?
            .ok_or_else(|| ApiError::not_found("pool"))?;
        let mut body = put_body(&base);
        super::merge_patch::apply(&mut body, &patch);
        // Read exactly as a PUT body is, for the same answers.
        let spec = spec_of(super::json::parse_value::<PoolBody>(body)?)?;
        let now = Millis::now();
        let audit = caller
            .audit(Action::PoolPatch, name.as_str(), now)
            .detail(format!(
                "patched {}; {}",
                if named.is_empty() { "nothing" } else { &named },
                spec_detail(&spec)
            ));
        if let Some(pool) = state
            .store()
            .replace_pool(&name, spec, &base, now, &audit)
            .await?
        {
            tracing::info!(pool = %pool.name, "pool patched");
            return Ok(Json(pool_view(&state, &pool, now).await?));
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("the pool changed under the patch {PATCH_ATTEMPTS} times; try again"),
    )
    .retry_after(1))
}

#[utoipa::path(delete, path = "/api/v1/admin/pools/{name}", tag = "admin",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    responses(
        (status = 204, description = "Deleted, with its revoked runners, their history, its finished jobs and its registration tokens."),
        (status = 400, description = "`bad_request`: not a valid pool name.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`pool_in_use`: the pool has live (unrevoked) runners or unfinished jobs; nothing changed.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn delete_pool(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = pool_name(&name)?;
    let audit = caller.audit(Action::PoolDelete, name.as_str(), Millis::now());
    state.store().delete_pool(&name, &audit).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/admin/pools/{name}", tag = "admin",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    responses(
        (status = 200, description = "The pool.", body = PoolView),
        (status = 400, description = "`bad_request`: not a valid pool name.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_pool(
    _: AsViewer,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<PoolView>, ApiError> {
    let name = pool_name(&name)?;
    let pool = state
        .store()
        .get_pool(&name)
        .await?
        .ok_or_else(|| ApiError::not_found("pool"))?;
    Ok(Json(pool_view(&state, &pool, Millis::now()).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/pools", tag = "admin",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Every pool.", body = PoolList),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_pools(
    _: AsViewer,
    State(state): State<AppState>,
) -> Result<Json<PoolList>, ApiError> {
    let now = Millis::now();
    let pools = state.store().list_pools().await?;
    let runners = state.store().runner_summaries(None, false).await?;
    let mut depths = state.store().queue_depths().await?;
    let views: Vec<PoolView> = pools
        .iter()
        .map(|pool| {
            let standing = standing(&state, &runners, pool, now);
            views::pool(
                pool,
                &standing,
                depths.remove(&pool.name).unwrap_or_default(),
            )
        })
        .collect();
    Ok(Json(PoolList { pools: views }))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
// Named apart from the operators' `TokenBody`: one document has one schema per name.
#[schema(as = RegistrationTokenBody)]
struct TokenBody {
    /// 1 to 2592000 seconds, default 3600.
    #[serde(default, deserialize_with = "super::json::whole_number")]
    #[schema(minimum = 1, maximum = 2592000)]
    ttl_s: Option<i64>,
}

#[utoipa::path(post, path = "/api/v1/admin/pools/{name}/registration-tokens", tag = "admin",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    request_body(content = Option<TokenBody>, description = "Optional: an empty body counts as `{}`."),
    responses(
        (status = 201, description = "A single-use registration token.", body = RegistrationToken),
        (status = 400, description = "`bad_request`: a bad pool name or `ttl_s`.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn create_registration_token(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
    super::json::OptionalJson(body): super::json::OptionalJson<TokenBody>,
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

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct RunnerFilter {
    /// Only the runners of this pool.
    #[serde(default)]
    #[param(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pool: Option<String>,
    /// Only the runners of this status (as `status` in the runner view); empty: any.
    #[serde(default)]
    #[param(
        pattern = "^(healthy|probe_failed|probe_stale|pool_image_unresolved|image_unreported|drifted|cordoned|quarantined|ejected|revoked|stale|unknown)?$"
    )]
    status: Option<String>,
    /// A case-insensitive search over name, id, labels (`key=value`) and host.
    #[serde(default)]
    #[param(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    q: Option<String>,
    /// Runners per page: 1 to 1000, default 500.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// The `next_cursor` of the page before.
    #[serde(default)]
    #[param(pattern = "^[0-9]{1,9}$")]
    cursor: Option<String>,
}

/// Runners per page of `GET /api/v1/admin/runners`, by default and at most.
pub const RUNNER_PAGE_DEFAULT: i64 = 500;
pub const RUNNER_PAGE_MAX: i64 = 1000;

/// Pools by name, for rendering runners against their pool.
async fn pools_by_name(state: &AppState) -> Result<BTreeMap<PoolName, Pool>, ApiError> {
    Ok(state
        .store()
        .list_pools()
        .await?
        .into_iter()
        .map(|p| (p.name.clone(), p))
        .collect())
}

#[utoipa::path(get, path = "/api/v1/admin/runners", tag = "admin",
    security(("admin_token" = [])),
    params(RunnerFilter),
    responses(
        (status = 200, description = "The runners, by pool then name, a page at a time.", body = RunnerList),
        (status = 400, description = "`bad_request`: not a valid pool name, status, limit or cursor.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_runners(
    _: AsViewer,
    State(state): State<AppState>,
    Query(filter): Query<RunnerFilter>,
) -> Result<Json<RunnerList>, ApiError> {
    let pool = filter.pool.as_deref().map(pool_name).transpose()?;
    let limit = filter.limit.unwrap_or(RUNNER_PAGE_DEFAULT);
    if !(1..=RUNNER_PAGE_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: must be from 1 to {RUNNER_PAGE_MAX}"
        )));
    }
    let offset: usize = match filter.cursor.as_deref() {
        None => 0,
        Some(c) if (1..=9).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit()) => {
            c.parse().expect("nine digits fit")
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "cursor: not a cursor this service gave",
            ));
        }
    };
    let status = filter.status.unwrap_or_default();
    if !status.is_empty()
        && !crate::domain::status::RunnerStatus::ALL
            .iter()
            .any(|s| s.as_str() == status)
    {
        return Err(ApiError::bad_request(format!(
            "status: `{status}` is not a runner status"
        )));
    }
    let q = filter.q.unwrap_or_default().to_lowercase();
    crate::domain::text::without_controls("q", &q)?;
    if q.chars().count() > 200 {
        return Err(ApiError::bad_request("q: at most 200 characters"));
    }
    let store = state.store();
    let summaries = store.runner_summaries(pool.as_ref(), !q.is_empty()).await?;
    let pools = pools_by_name(&state).await?;
    let now = Millis::now();
    let rules = state.settings().status_rules();
    let wanted = crate::domain::status::RunnerStatus::ALL
        .into_iter()
        .find(|s| s.as_str() == status);
    let filter = Filter {
        pool: "",
        status: wanted,
        q: &q,
    };
    // Judged, filtered and paged from the summaries; only the page's runners are read whole.
    let judged = fleet::judge(&summaries, &pools, rules, now);
    let matching: Vec<&fleet::Judged> = judged.iter().filter(|j| filter.matches(j)).collect();
    let shown = fleet::page(matching.into_iter(), offset, limit as usize);
    let whole = store.runners_by_id(&fleet::ids(&shown.items)).await?;
    let page: Vec<RunnerView> = fleet::in_shown_order(&shown.items, whole)
        .iter()
        .map(|(runner, pool)| views::runner(runner, pool, state.settings(), now))
        .collect();
    let next_cursor = shown.next_offset.map(|n| n.to_string());
    Ok(Json(RunnerList {
        runners: page,
        next_cursor,
    }))
}

async fn runner_detail(state: &AppState, id: &RunnerId) -> Result<RunnerDetail, ApiError> {
    let runner = state
        .store()
        .get_runner(id)
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    let pool = state
        .store()
        .get_pool(&runner.pool)
        .await?
        .ok_or_else(|| ApiError::not_found("pool"))?;
    let history = state.store().runner_history(id).await?;
    let audit = state
        .store()
        .audit_trail(&AuditFilter {
            target: Some(id.to_string()),
            limit: views::RUNNER_AUDIT_SHOWN,
            ..AuditFilter::default()
        })
        .await?;
    let view = views::runner(&runner, &pool, state.settings(), Millis::now());
    let audit = audit.iter().map(views::audit_entry).collect();
    Ok(views::runner_detail(view, &history, audit))
}

#[utoipa::path(get, path = "/api/v1/admin/runners/{id}", tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "The runner and its history.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_runner(
    _: AsViewer,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    Ok(Json(
        runner_detail(&state, &RunnerId::parse("id", &id)?).await?,
    ))
}

async fn set_cordon(
    caller: &AsOperator,
    state: &AppState,
    id: String,
    cordoned: bool,
) -> Result<Json<RunnerDetail>, ApiError> {
    let id = RunnerId::parse("id", &id)?;
    let action = if cordoned {
        Action::RunnerCordon
    } else {
        Action::RunnerUncordon
    };
    state
        .store()
        .set_cordoned(
            &id,
            cordoned,
            &caller.audit(action, id.as_str(), Millis::now()),
        )
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    tracing::info!(runner_id = %id, cordoned, "runner cordon changed");
    Ok(Json(runner_detail(state, &id).await?))
}

#[utoipa::path(post, path = "/api/v1/admin/runners/{id}/cordon", tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Cordoned; the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn cordon(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    set_cordon(&caller, &state, id, true).await
}

#[utoipa::path(post, path = "/api/v1/admin/runners/{id}/uncordon", tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Uncordoned; the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn uncordon(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    set_cordon(&caller, &state, id, false).await
}

#[utoipa::path(post, path = "/api/v1/admin/runners/{id}/reinstate", tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Out of ejection at once (and no longer marked `would_eject`), its failures in a row forgotten; the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn reinstate(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    let id = RunnerId::parse("id", &id)?;
    let audit = caller.audit(Action::RunnerReinstate, id.as_str(), Millis::now());
    state
        .store()
        .reinstate_runner(&id, &audit)
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    tracing::info!(runner_id = %id, "runner reinstated");
    Ok(Json(runner_detail(&state, &id).await?))
}

#[utoipa::path(post, path = "/api/v1/admin/runners/{id}/revoke", tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    responses(
        (status = 200, description = "Revoked (its live leases end); the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn revoke(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetail>, ApiError> {
    let id = RunnerId::parse("id", &id)?;
    let now = Millis::now();
    state
        .revoke_runner(
            &id,
            now,
            &caller.audit(Action::RunnerRevoke, id.as_str(), now),
        )
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    Ok(Json(runner_detail(&state, &id).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ForgeRunnersBody {
    /// Every forge runner on the runner's machine; replaces what it had.
    forge_runners: Vec<super::forge_bindings::ForgeRunnerSpec>,
}

#[utoipa::path(put, path = "/api/v1/admin/runners/{id}/forge-runners", tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$")),
    request_body = ForgeRunnersBody,
    responses(
        (status = 200, description = "Replaced; the runner detail.", body = RunnerDetail),
        (status = 404, description = "`not_found`: no such runner.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`forge_runner_taken`: one of them is bound to another runner (nothing changed); `runner_revoked`.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn put_forge_runners(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ForgeRunnersBody>,
) -> Result<Json<RunnerDetail>, ApiError> {
    let id = RunnerId::parse("id", &id)?;
    let identities = super::forge_bindings::identities(&body.forge_runners)?;
    let now = Millis::now();
    let bound: Vec<String> = identities.iter().map(|i| i.label()).collect();
    let audit = caller
        .audit(Action::RunnerForgeRunners, id.as_str(), now)
        .detail(format!("forge_runners [{}]", bound.join(", ")));
    state
        .store()
        .set_forge_runners(&id, &identities, now, &audit)
        .await?
        .ok_or_else(|| ApiError::not_found("runner"))?;
    tracing::info!(runner_id = %id, forge_runners = identities.len(), "forge runners bound");
    Ok(Json(runner_detail(&state, &id).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/drift", tag = "admin",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Drifted and skipped runners, and each pool's roll health.", body = DriftReport),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn drift(_: AsViewer, State(state): State<AppState>) -> Result<Json<DriftReport>, ApiError> {
    let now = Millis::now();
    let pools = pools_by_name(&state).await?;
    let runners = state.store().runner_summaries(None, false).await?;
    let (mut drifted, mut skipped) = (Vec::new(), Vec::new());
    for runner in &runners {
        let Some(pool) = pools.get(&runner.pool) else {
            continue;
        };
        match drift_entry(runner, pool, now, state.settings().status_rules()) {
            DriftEntry::Drifted {
                runner_id,
                pool,
                running_image_id,
                expected_image_ids,
                images,
            } => drifted.push(DriftedRunner {
                runner_id,
                pool,
                running_image_id,
                expected_image_ids,
                images,
            }),
            DriftEntry::Skipped { runner_id, reason } => skipped.push(SkippedRunner {
                runner_id,
                reason: reason.to_string(),
            }),
            DriftEntry::Current => {}
        }
    }
    let settings = state.settings();
    let rolls: Vec<RollHealthView> = pools
        .values()
        .map(|pool| {
            let h = roll_health(
                pool,
                &runners,
                now,
                settings.status_rules(),
                settings.roll_stalled_share,
            );
            RollHealthView::new(&pool.name, &h)
        })
        .collect();
    Ok(Json(DriftReport {
        drifted,
        skipped,
        pools: rolls,
    }))
}

/// `POST /api/v1/admin/pools/{name}/resolve`: one attempt now; 200 with the pool when it is
/// over, 502 `pool_resolution_failed` (the set unchanged) when it failed.
#[utoipa::path(post, path = "/api/v1/admin/pools/{name}/resolve", tag = "admin",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The pool name: 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.", pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")),
    responses(
        (status = 200, description = "Resolved; the pool.", body = PoolView),
        (status = 400, description = "`bad_request`: not a valid pool name.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such pool.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`pool_not_registry` (a `manual` pool) or `pool_changed` (its `image_ref` changed meanwhile).", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "`pool_resolution_failed`: the pool keeps its image set.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: the forge token, or a viewer's token on a write.", body = Problem, content_type = "application/problem+json"),
    ))]
async fn resolve(
    caller: AsOperator,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<PoolView>, ApiError> {
    let name = pool_name(&name)?;
    let resolved = resolver::resolve_pool(state.store(), state.registry(), &name).await;
    // An attempt that reached the registry changed the pool's record, failed or not.
    let outcome = match &resolved {
        Ok(pool) => Some(format!(
            "resolved to {}",
            pool.resolved_image_id
                .as_ref()
                .map_or_else(|| "-".to_string(), |d| d.to_string())
        )),
        Err(ResolvePoolError::Failed { error, .. }) => Some(format!("failed: {error}")),
        Err(_) => None,
    };
    if let Some(detail) = outcome {
        let entry = caller
            .audit(Action::PoolResolve, name.as_str(), Millis::now())
            .detail(detail);
        state.store().record_audit(&entry).await?;
    }
    let pool = resolved.map_err(resolve_error)?;
    Ok(Json(pool_view(&state, &pool, Millis::now()).await?))
}

fn resolve_error(e: ResolvePoolError) -> ApiError {
    match e {
        ResolvePoolError::NotFound => ApiError::not_found("pool"),
        ResolvePoolError::NotRegistry(_) => ApiError::conflict("pool_not_registry", e.to_string()),
        ResolvePoolError::Failed { error, .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "pool_resolution_failed",
            format!("the pool keeps its image set: {error}"),
        ),
        ResolvePoolError::Changed(_) => ApiError::conflict("pool_changed", e.to_string()),
        ResolvePoolError::Store(s) => s.into(),
    }
}

#[cfg(test)]
mod tests {
    use crate::domain::status::RunnerStatus;
    use std::collections::BTreeSet;

    #[test]
    fn the_documented_status_filter_names_every_status_and_no_other() {
        let doc = crate::http::schema::document();
        let start = doc.find("^(healthy|").expect("the status pattern") + 2;
        let end = start + doc[start..].find(")?$").unwrap();
        let documented: BTreeSet<&str> = doc[start..end].split('|').collect();
        let statuses: BTreeSet<&str> = RunnerStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(documented, statuses);
    }
}

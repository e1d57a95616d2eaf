//! The body of `PUT /api/v1/admin/pools/{name}` and what is made of it: the pool's spec (or the
//! problem a PUT answers), the body that would make a pool again (which `PATCH` merges its patch
//! into), and the audit detail of a pool write. Apart from the handlers in `pools` because it
//! is the one place the API reads a pool's fields, and the longest.

use crate::domain::digest::ImageDigest;
use crate::domain::disk::DiskWarning;
use crate::domain::ejection::EjectionPolicy;
use crate::domain::github::{DEFAULT_RUNNER_GROUP_ID, GithubPool};
use crate::domain::image_set::ImageSource;
use crate::domain::images::{ImageSpec, Undescribed};
use crate::domain::json_object::ObjectOnly;
use crate::domain::pool::{
    DEFAULT_DRIFT_GRACE_S, DEFAULT_RESOLVE_INTERVAL_S, GateMode, ImagePolicy, Pool, PoolSpec,
    PoolSpecError,
};
use crate::problem::ApiError;
use crate::registry::reference::ImageRef;
use serde::Deserialize;
use serde_json::{Value, json};

/// Its schema is `constraints::pool_body`, which says `PoolSpec::validate`'s rules too.
/// A field added here must be written by `put_body` too, or `PATCH` resets it.
#[derive(Deserialize)]
pub(super) struct PoolBody {
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
    #[serde(default, deserialize_with = "crate::http::json::whole_number")]
    drift_grace_s: Option<i64>,
    /// 10 to 86400 seconds, default 300 (registry pools).
    #[serde(default, deserialize_with = "crate::http::json::whole_number")]
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
    #[serde(default, deserialize_with = "crate::http::json::whole_number")]
    consecutive_failures: Option<i64>,
    #[serde(default, deserialize_with = "crate::http::json::whole_number")]
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
    #[serde(default, deserialize_with = "crate::http::json::whole_number")]
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
    #[serde(default, deserialize_with = "crate::http::json::whole_number")]
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
        crate::http::constraints::placeholder()
    }
}

impl utoipa::ToSchema for PoolBody {
    fn name() -> std::borrow::Cow<'static, str> {
        "PoolBody".into()
    }
}

/// A JSON merge patch of a `PoolBody`; its schema is `constraints::pool_patch`.
pub(super) struct PoolPatch;

impl utoipa::PartialSchema for PoolPatch {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::http::constraints::placeholder()
    }
}

impl utoipa::ToSchema for PoolPatch {
    fn name() -> std::borrow::Cow<'static, str> {
        "PoolPatch".into()
    }
}

/// The spec a PUT body asks for, or the problem a PUT answers it with.
pub(super) fn spec_of(body: PoolBody) -> Result<PoolSpec, ApiError> {
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
pub(super) fn put_body(pool: &Pool) -> Value {
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
pub(super) fn spec_detail(spec: &PoolSpec) -> String {
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

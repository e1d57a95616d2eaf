//! The OpenAPI document, `GET /openapi.json`, generated from the code with `utoipa`.
//!
//! Handlers carry `#[utoipa::path]` (tag, credential, body, answers and the problems special
//! to them); request bodies derive `ToSchema` where they are defined, and so do the answers
//! `views` types (jobs, leases, registration, heartbeat, gate check, pools, registration
//! tokens, the drift report, registry events): there the struct is both the answer and its
//! schema. The shapes `views` still builds with `json!` (runners and their history) are
//! described here by structs that only exist for the document, and so are operators' tokens
//! and the audit trail, which `operators` builds from them.
//! `ApiDoc` lists every handler; the problems that any API endpoint may answer (PROTOCOL.md,
//! Conventions) are added to each operation by `CommonProblems`. `tests/openapi.rs` checks the
//! document against the router and real answers against its schemas.

// These structs describe JSON that `views` still builds with `json!`; they are never
// constructed. Every key is
// always sent, `null` where there is no value: optional fields are required and nullable.
#![allow(dead_code)]

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, OpenApi as OpenApiDoc, Ref, RefOr, Response, ResponseBuilder,
};
use utoipa::{Modify, OpenApi, ToSchema};

use super::{admin, forge, lease, operators, ops, page, registry_events, runners};

/// An RFC 9457 problem, the body of every error (`application/problem+json`).
#[derive(Serialize, ToSchema)]
pub struct Problem {
    /// `urn:leasegate:problem:<code>`.
    #[serde(rename = "type")]
    #[schema(example = "urn:leasegate:problem:probe_failed")]
    pub kind: String,
    /// The HTTP reason phrase.
    #[schema(example = "Conflict")]
    pub title: String,
    /// The HTTP status.
    #[schema(example = 409)]
    pub status: u16,
    /// For people; for a probe failure it quotes the container runtime.
    pub detail: String,
    /// Stable snake_case code that clients branch on.
    #[schema(example = "probe_failed")]
    pub code: String,
}

/// A runner's live lease.
#[derive(Serialize, ToSchema)]
pub struct CurrentLease {
    pub lease_id: String,
    pub job_id: String,
    pub state: String,
    pub expires_at: String,
}

/// A runner as the admin API lists it.
#[derive(Serialize, ToSchema)]
pub struct RunnerView {
    pub runner_id: String,
    pub name: String,
    pub pool: String,
    pub labels: BTreeMap<String, String>,
    /// `revoked`, `unknown`, `stale`, or one of the heartbeat's statuses.
    pub status: String,
    #[schema(required = true)]
    pub code: Option<String>,
    #[schema(required = true)]
    pub detail: Option<String>,
    #[schema(required = true)]
    pub last_attestation_at: Option<String>,
    #[schema(required = true)]
    pub probe_ok: Option<bool>,
    #[schema(required = true)]
    pub probe_checked_at: Option<String>,
    #[schema(required = true)]
    pub probe_error: Option<String>,
    #[schema(required = true)]
    pub runtime: Option<String>,
    #[schema(required = true)]
    pub runtime_version: Option<String>,
    #[schema(required = true)]
    pub image_id: Option<String>,
    #[schema(required = true)]
    pub image_digest: Option<String>,
    #[schema(required = true)]
    pub image_ref: Option<String>,
    pub expected_image_ids: Vec<String>,
    #[schema(required = true)]
    pub image_current: Option<bool>,
    pub cordoned: bool,
    #[schema(required = true)]
    pub quarantined_at: Option<String>,
    #[schema(required = true)]
    pub revoked_at: Option<String>,
    pub registered_at: String,
    #[schema(required = true)]
    pub current_lease: Option<CurrentLease>,
    /// The forge runners bound to it, for the forge gate.
    pub forge_runners: Vec<ForgeRunnerView>,
    /// Its last attestation signed by its key and refused under rules 3–4 (`attestation_invalid`,
    /// `attestation_expired`, `clock_skew`), with why; null when there was none.
    #[schema(required = true)]
    pub last_rejected_attestation: Option<RejectedAttestation>,
}

/// A forge runner bound to a leasegate runner: `uuid` for `forgejo`, `token_sha256` for
/// `gitlab`.
#[derive(Serialize, ToSchema)]
pub struct ForgeRunnerView {
    /// `forgejo` (Gitea's runners too) or `gitlab`.
    pub kind: String,
    pub uuid: Option<String>,
    pub token_sha256: Option<String>,
    /// The last time the gate saw it ask for work (written at most every 30 s).
    #[schema(required = true)]
    pub last_fetch_at: Option<String>,
}

/// An attestation the gate refused, as noted on its runner.
#[derive(Serialize, ToSchema)]
pub struct RejectedAttestation {
    pub at: String,
    pub code: String,
    pub detail: String,
}

/// `200` to `GET /api/v1/admin/runners`.
#[derive(Serialize, ToSchema)]
pub struct RunnerList {
    pub runners: Vec<RunnerView>,
}

/// One recorded attestation.
#[derive(Serialize, ToSchema)]
pub struct AttestationRecord {
    pub at: String,
    pub status: String,
    pub probe_ok: bool,
    pub runtime: String,
    #[schema(required = true)]
    pub runtime_version: Option<String>,
    pub checked_at: String,
    #[schema(required = true)]
    pub error: Option<String>,
    #[schema(required = true)]
    pub image_id: Option<String>,
    #[schema(required = true)]
    pub image_digest: Option<String>,
}

/// One change of a runner's status.
#[derive(Serialize, ToSchema)]
pub struct StatusChange {
    pub at: String,
    #[schema(required = true)]
    pub from: Option<String>,
    pub to: String,
    #[schema(required = true)]
    pub detail: Option<String>,
}

/// A run of refused leases, gate checks or forge fetches with one code, one entry however
/// many it holds.
#[derive(Serialize, ToSchema)]
pub struct RefusalRecord {
    /// The run's latest refusal.
    pub at: String,
    pub code: String,
    /// The latest refusal's detail.
    pub detail: String,
    /// How many refusals the run holds.
    pub count: i64,
    /// The run's first refusal.
    pub first_at: String,
}

/// One of a runner's leases.
#[derive(Serialize, ToSchema)]
pub struct LeaseRecord {
    pub lease_id: String,
    pub job_id: String,
    pub state: String,
    pub attempt: i64,
    pub granted_at: String,
    #[schema(required = true)]
    pub started_at: Option<String>,
    pub expires_at: String,
    #[schema(required = true)]
    pub ended_at: Option<String>,
}

/// A runner with its history, newest first (`GET /api/v1/admin/runners/{id}`, cordon,
/// uncordon, revoke).
#[derive(Serialize, ToSchema)]
pub struct RunnerDetail {
    #[serde(flatten)]
    pub runner: RunnerView,
    pub attestations: Vec<AttestationRecord>,
    pub status_changes: Vec<StatusChange>,
    pub refusals: Vec<RefusalRecord>,
    pub leases: Vec<LeaseRecord>,
    /// What operators did to this runner, newest first (at most 50).
    pub audit: Vec<AuditEntry>,
}

/// One change by an operator.
#[derive(Serialize, ToSchema)]
pub struct AuditEntry {
    /// The entry's place in the trail: pass it as `cursor` for the entries before it.
    pub seq: i64,
    pub at: String,
    /// The operator's name (`bootstrap` for the configured admin token).
    pub actor: String,
    /// `runner_cordon`, `runner_uncordon`, `runner_revoke`, `runner_forge_runners`,
    /// `pool_put`, `pool_delete`, `pool_resolve`, `registration_token_create`,
    /// `operator_token_create`, `operator_token_revoke`, `page_login`, `page_logout`.
    pub action: String,
    /// `runner`, `pool` or `operator`.
    pub target_kind: String,
    /// The runner id, pool name or operator name acted on.
    pub target: String,
    #[schema(required = true)]
    pub detail: Option<String>,
    /// The client's address.
    pub client: String,
}

/// `200` to `GET /api/v1/admin/audit`.
#[derive(Serialize, ToSchema)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    /// Pass as `cursor` for the next (older) page; `null` on the last.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// An operator's token as listed (the token itself is shown once, when created).
#[derive(Serialize, ToSchema)]
pub struct OperatorTokenView {
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    pub role: String,
    pub created_at: String,
    pub created_by: String,
}

/// `201` to `POST /api/v1/admin/tokens`: the token, shown this once.
#[derive(Serialize, ToSchema)]
pub struct CreatedOperatorToken {
    pub name: String,
    pub role: String,
    pub created_at: String,
    pub created_by: String,
    /// The bearer token (`lgo_…`): only its hash is kept.
    pub token: String,
}

/// `200` to `GET /api/v1/admin/tokens`.
#[derive(Serialize, ToSchema)]
pub struct OperatorTokenList {
    pub tokens: Vec<OperatorTokenView>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "leasegate",
        description = "Forge-side lease gate for self-hosted CI runners. The contract in words: docs/PROTOCOL.md."
    ),
    paths(
        ops::livez,
        ops::readyz,
        ops::metrics,
        ops::openapi_json,
        runners::register,
        runners::heartbeat,
        lease::lease,
        lease::start,
        lease::extend,
        lease::complete,
        lease::abandon,
        forge::enqueue,
        forge::read,
        forge::cancel,
        forge::gate_check,
        admin::list_pools,
        admin::get_pool,
        admin::put_pool,
        admin::create_registration_token,
        admin::resolve,
        admin::list_runners,
        admin::get_runner,
        admin::cordon,
        admin::uncordon,
        admin::revoke,
        admin::put_forge_runners,
        admin::drift,
        admin::delete_pool,
        operators::create_token,
        operators::list_tokens,
        operators::delete_token,
        operators::audit_trail,
        registry_events::registry_events,
        page::fleet,
        page::fleet_fragment,
        page::login_form,
        page::login,
        page::logout,
        page::runner_page,
        page::runner_action,
        page::job_page,
        page::css,
        page::js,
    ),
    components(schemas(Problem)),
    modifiers(&SecuritySchemes, &CommonProblems, &OptionalBodies),
    tags(
        (name = "runners", description = "Registration and the signed heartbeat."),
        (name = "leasing", description = "The gated lease and the lease-scoped calls."),
        (name = "forge", description = "Jobs and the gate check (forge token)."),
        (name = "admin", description = "Pools, registration tokens, runners, drift, operators' tokens and the audit trail (an operator's token: the admin token or a named one)."),
        (name = "operations", description = "Liveness, readiness, metrics, this document."),
        (name = "page", description = "The runner-health page (HTML, session cookie or admin token)."),
    )
)]
pub struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        let components = openapi.components.get_or_insert_with(Default::default);
        for (name, what) in [
            (
                "admin_token",
                "An operator's token: the configured admin token (current or previous), or a named token (`lgo_…`) whose role allows the call.",
            ),
            ("forge_token", "The forge's token."),
            (
                "lease_token",
                "The lease token (`lgl_…`) returned with the lease.",
            ),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(what))
                        .build(),
                ),
            );
        }
    }
}

const THROTTLED: &str =
    "`throttled`: too many failed credentials from this client (`Retry-After`).";

/// The problems any API endpoint may answer (PROTOCOL.md, Conventions), added to every
/// operation under `/api/` that does not already describe that status.
struct CommonProblems;

fn problem_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            super::problem::PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}

impl Modify for CommonProblems {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        let common = [
            ("400", "`bad_request`: a malformed body, path or query."),
            ("405", "`method_not_allowed`."),
            (
                "408",
                "`request_timeout`: the body arrived too slowly; the connection is closed.",
            ),
            (
                "413",
                "`payload_too_large`: the body is over the configured limit.",
            ),
            ("500", "`internal`."),
            (
                "503",
                "`unavailable`: the database does not answer (`Retry-After: 5`).",
            ),
        ];
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !path.starts_with("/api/") {
                page_problems(item);
                continue;
            }
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in operations.into_iter().flatten() {
                for (status, description) in common {
                    op.responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| RefOr::T(problem_response(description)));
                }
                // Every credential is checked under the throttle (registration's token too).
                let credentialed = op.security.as_ref().is_some_and(|s| !s.is_empty())
                    || path.as_str() == "/api/v1/runners";
                if credentialed {
                    op.responses
                        .responses
                        .entry("429".to_string())
                        .or_insert_with(|| RefOr::T(problem_response(THROTTLED)));
                }
            }
        }
    }
}

/// The problems of the page's forms and paths: a path that is not a valid id, or a form that
/// is not `application/x-www-form-urlencoded` or lacks a field.
fn page_problems(item: &mut utoipa::openapi::PathItem) {
    for op in [&mut item.get, &mut item.post].into_iter().flatten() {
        let has_params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
        let has_form = op.request_body.is_some();
        let mut add = |status: &str, description: &str| {
            op.responses
                .responses
                .entry(status.to_string())
                .or_insert_with(|| RefOr::T(problem_response(description)));
        };
        if has_params || has_form {
            add("400", "`bad_request`: a malformed path, query or form.");
        }
        if has_form {
            add(
                "415",
                "`bad_request`: the form is not `application/x-www-form-urlencoded`.",
            );
            add(
                "413",
                "`payload_too_large`: the body is over the configured limit.",
            );
            add("422", "`bad_request`: the form lacks a field.");
        }
    }
}

/// Optional bodies (`Option<T>` in `request_body`): utoipa describes them as `null` or `T`
/// and leaves `required` out. A `null` body is a 400 here; what is optional is the body
/// itself (empty counts as `{}`), so the schema becomes plain `T`, still not required.
struct OptionalBodies;

impl Modify for OptionalBodies {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        use utoipa::openapi::schema::{Schema, SchemaType, Type};
        let is_null = |s: &RefOr<Schema>| matches!(s, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null));
        for item in openapi.paths.paths.values_mut() {
            for op in [&mut item.put, &mut item.post].into_iter().flatten() {
                let Some(body) = op.request_body.as_mut() else {
                    continue;
                };
                for content in body.content.values_mut() {
                    if let Some(RefOr::T(Schema::OneOf(one))) = &content.schema
                        && one.items.len() == 2
                        && let Some(other) = one.items.iter().find(|s| !is_null(s))
                        && one.items.iter().any(is_null)
                    {
                        content.schema = Some(other.clone());
                    }
                }
            }
        }
    }
}

/// The document as JSON, built once.
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc =
            serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serializes");
        super::constraints::apply(&mut doc);
        serde_json::to_string_pretty(&doc).expect("the OpenAPI document serializes")
    })
}

//! The OpenAPI document, `GET /openapi.json`, generated from the code with `utoipa`.
//!
//! Handlers carry `#[utoipa::path]` (tag, credential, body, answers and the problems special
//! to them); request bodies derive `ToSchema` where they are defined, and so do the answers,
//! in `views` (and `problem::Problem`, the problems): each struct is both what a handler sends
//! and its schema. `constraints` adds what utoipa cannot say.
//! `ApiDoc` lists every handler; the problems that any API endpoint may answer (PROTOCOL.md,
//! Conventions) are added to each operation by `CommonProblems`, and those its credential
//! brings (a 401 per scheme, the forge's 403, a lease's own refusals) by `CredentialProblems`.
//! `tests/openapi.rs` checks the document against the router and real answers against its
//! schemas.
//!
//! Only the document is here: it names every handler, so nothing of the API imports it.

use axum::Router;
use axum::http::HeaderValue;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::get;
use std::sync::OnceLock;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, OpenApi as OpenApiDoc, Ref, RefOr, Response, ResponseBuilder,
};
use utoipa::{Modify, OpenApi};

use super::problem::Problem;
use super::{admin, forge, github, lease, operators, ops, page, registry_events, runners};
use crate::app::AppState;

/// `GET /openapi.json`.
pub fn router() -> Router<AppState> {
    Router::new().route("/openapi.json", get(openapi_json))
}

/// This document: the API as the code declares it (`schema::ApiDoc`), built once.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document.", body = Object, content_type = "application/json")))]
async fn openapi_json() -> HttpResponse {
    (
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        document(),
    )
        .into_response()
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
        openapi_json,
        runners::register,
        runners::heartbeat,
        lease::lease,
        lease::start,
        lease::extend,
        lease::complete,
        lease::abandon,
        github::register,
        forge::enqueue,
        forge::read,
        forge::cancel,
        forge::gate_check,
        admin::pools::list_pools,
        admin::pools::get_pool,
        admin::pools::put_pool,
        admin::pools::patch_pool,
        admin::registration_tokens::create_registration_token,
        admin::resolve::resolve,
        admin::runners::list_runners,
        admin::runners::get_runner,
        admin::runners::cordon,
        admin::runners::reinstate,
        admin::runners::uncordon,
        admin::runners::revoke,
        admin::forge_runners::put_forge_runners,
        admin::drift::drift,
        admin::pools::delete_pool,
        operators::create_token,
        operators::list_tokens,
        operators::delete_token,
        operators::audit_trail,
        registry_events::registry_events,
        page::fleet_page::fleet,
        page::fleet_page::fleet_fragment,
        page::login::login_form,
        page::login::login,
        page::login::logout,
        page::runner_page::runner_page,
        page::runner_actions::runner_action,
        page::job_page::job_page,
        page::assets::css,
        page::assets::js,
    ),
    components(schemas(Problem)),
    modifiers(&SecuritySchemes, &CredentialProblems, &CommonProblems, &OptionalBodies),
    tags(
        (name = "runners", description = "Registration, the signed heartbeat, and GitHub registrations."),
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

/// The problems a credential brings, added to every API operation from its security
/// requirement rather than written on each handler: the 401 of each scheme it names, the 403
/// of an admin token on a forge call and, for a lease token, the lease's own refusals. A
/// handler that describes one of these statuses keeps its own words (the 403s of the admin API
/// differ by the role a call needs).
struct CredentialProblems;

impl Modify for CredentialProblems {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            // The page answers a missing session with a redirect, not a problem.
            if !path.starts_with("/api/") {
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
                // `SecurityRequirement` keeps its schemes to itself; its JSON names them,
                // each with its scopes (for the admin token, the role the call needs).
                let requirements =
                    serde_json::to_value(&op.security).expect("security requirements serialize");
                let schemes: Vec<(String, Vec<String>)> = requirements
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.as_object())
                    .flat_map(|r| r.iter())
                    .map(|(scheme, scopes)| {
                        let scopes = scopes.as_array().into_iter().flatten();
                        let scopes = scopes.filter_map(|s| s.as_str().map(String::from));
                        (scheme.clone(), scopes.collect())
                    })
                    .collect();
                for (scheme, scopes) in schemes {
                    for (status, description) in credential_problems(&scheme, &scopes) {
                        op.responses
                            .responses
                            .entry(status.to_string())
                            .or_insert_with(|| RefOr::T(problem_response(description)));
                    }
                }
            }
        }
    }
}

/// What a call with the scheme's credential may be refused with, because of the credential.
fn credential_problems(scheme: &str, scopes: &[String]) -> &'static [(&'static str, &'static str)] {
    const NO_ADMIN_TOKEN: (&str, &str) = ("401", "`unauthorized`: no valid admin token.");
    let role = scopes.first().map(String::as_str);
    match (scheme, role) {
        ("admin_token", Some("read")) => {
            &[NO_ADMIN_TOKEN, ("403", "`forbidden`: the forge token.")]
        }
        ("admin_token", Some("write")) => &[
            NO_ADMIN_TOKEN,
            ("403", "`forbidden`: the forge token, or a viewer's token."),
        ],
        ("admin_token", Some("admin")) => &[
            NO_ADMIN_TOKEN,
            (
                "403",
                "`forbidden`: the forge token, or a token whose role is not `admin`.",
            ),
        ],
        // The page's calls: a session or the token, refused in words of their own.
        ("admin_token", _) => &[NO_ADMIN_TOKEN],
        ("forge_token", _) => &[
            ("401", "`unauthorized`: no valid forge token."),
            ("403", "`forbidden`: the admin token."),
        ],
        ("lease_token", _) => &[
            (
                "401",
                "`lease_token_invalid`: a missing or wrong token, or an unknown lease.",
            ),
            ("403", "`runner_revoked`: the lease's runner was revoked."),
            ("410", "`lease_expired`."),
        ],
        _ => &[],
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
            crate::problem::PROBLEM_JSON,
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

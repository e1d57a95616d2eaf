//! What the handlers enforce on a request, said in JSON Schema for the OpenAPI document.
//!
//! Most constraints sit on the request types as `#[schema(..)]` attributes. The ones utoipa
//! cannot say (property names, `anyOf` beside `properties`, `oneOf` of closed objects) are
//! written here as plain JSON Schema, and `apply` puts them into the built document, so that
//! a fuzzer reading it (schemathesis in `.ci/schemathesis.sh`) generates what the server
//! accepts and nothing else.

use serde_json::{Value, json};

/// Characters `char::is_control` refuses (`text::without_controls`): C0, DEL and C1.
const CONTROLS: &str = r"\u0000-\u001f\u007f-\u009f";

/// The format characters (Unicode category Cf) of the Basic Multilingual Plane, which
/// `text::plain_name` refuses beside the controls. (The few outside it cannot be written in
/// a pattern both ECMA-262 and Python read; the server refuses them too.)
const FORMATS: &str = r"\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb";

/// The whitespace `str::trim` removes, beyond the controls.
const SPACES: &str = r" \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";

/// Puts the schemas below into `doc`, the OpenAPI document as JSON.
pub fn apply(doc: &mut Value) {
    let schemas = &mut doc["components"]["schemas"];
    let mut set = |component: &str, field: Option<&str>, schema: Value| {
        let target = match field {
            None => schemas.get_mut(component),
            Some(f) => schemas
                .get_mut(component)
                .and_then(|c| c.get_mut("properties"))
                .and_then(|p| p.get_mut(f)),
        };
        *target.unwrap_or_else(|| panic!("the document has {component} {field:?}")) = schema;
    };
    set("PoolBody", None, pool_body());
    set("PoolPatch", None, pool_patch());
    set("ForgeRunnerSpec", None, forge_runner());
    set("RegisterBody", Some("name"), runner_name());
    set("RegisterBody", Some("labels"), labels());
    set("RegisterBody", Some("forge_runners"), forge_runners());
    set("ForgeRunnersBody", Some("forge_runners"), forge_runners());
}

/// What a request type whose schema `apply` writes answers to utoipa meanwhile.
pub fn placeholder() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    utoipa::openapi::schema::ObjectBuilder::new().into()
}

/// Text with no control character (`text::without_controls`), as a pattern.
pub fn no_controls_pattern() -> String {
    format!("^[^{CONTROLS}]*$")
}

/// Text fit to be a name people read (`text::plain_name`), as a pattern.
fn plain_pattern() -> String {
    format!("^[^{CONTROLS}{FORMATS}]*$")
}

/// A runner's `name`: 1-128 plain characters, not only whitespace.
pub fn runner_name() -> Value {
    let plain = format!("[^{CONTROLS}{FORMATS}]");
    let visible = format!("[^{CONTROLS}{FORMATS}{SPACES}]");
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 128,
        "pattern": format!("^{plain}*{visible}{plain}*$"),
        "description": "1-128 characters, not all whitespace, with no control or invisible format character.",
    })
}

/// A runner's `labels`: at most 64, keys of 1-128 plain characters, values of at most 1024.
pub fn labels() -> Value {
    json!({
        "type": "object",
        "maxProperties": 64,
        "propertyNames": {"minLength": 1, "maxLength": 128, "pattern": plain_pattern()},
        "additionalProperties": {"type": "string", "maxLength": 1024, "pattern": plain_pattern()},
        "description": "At most 64 labels: keys of 1-128 characters, values of at most 1024, with no control or invisible format character.",
    })
}

/// The forms of a uuid `uuid::Uuid::parse_str` reads, around whitespace `trim` removes.
fn uuid_pattern() -> String {
    let h = "[0-9A-Fa-f]";
    let hyphenated = format!("{h}{{8}}-{h}{{4}}-{h}{{4}}-{h}{{4}}-{h}{{12}}");
    format!("^\\s*({hyphenated}|{h}{{32}}|\\{{{hyphenated}\\}}|urn:uuid:{hyphenated})\\s*$")
}

/// One forge runner (`forge_bindings::ForgeRunnerSpec`): a Forgejo or Gitea runner by its
/// uuid (and its token's SHA-256, when given), or a GitLab runner by its token's SHA-256 (and
/// its machine's `system_id`, when given).
pub fn forge_runner() -> Value {
    let sha256 = "^[0-9a-f]{64}$";
    json!({
        "description": "A forge runner: `{\"kind\": \"forgejo\", \"uuid\": …, \"token_sha256\": …}` (`gitea` is the same; `token_sha256` optional), `{\"kind\": \"gitlab\", \"token_sha256\": …, \"system_id\": …}` (`system_id` optional: without it, the token alone, any machine), `{\"kind\": \"buildkite\", \"agent_name\": …}` (paused through Buildkite's API while refused) or `{\"kind\": \"woodpecker\", \"agent_id\": …}`. A GitLab runner's `uuid` may be sent and is ignored.",
        "oneOf": [
            {
                "type": "object",
                "required": ["kind", "uuid"],
                "additionalProperties": false,
                "properties": {
                    "kind": {"type": "string", "enum": ["forgejo", "gitea"]},
                    "uuid": {"type": "string", "pattern": uuid_pattern(),
                             "description": "The runner's uuid (its `.runner` file's `uuid`)."},
                    "token_sha256": {"type": ["string", "null"], "pattern": sha256,
                                     "description": "The SHA-256 of the runner's token, lowercase hex: only a fetch presenting that token is judged by this binding."},
                    "system_id": {"type": "null"},
                    "agent_name": {"type": "null"},
                    "agent_id": {"type": "null"},
                },
            },
            {
                "type": "object",
                "required": ["kind", "token_sha256"],
                "additionalProperties": false,
                "properties": {
                    "kind": {"type": "string", "enum": ["gitlab"]},
                    "token_sha256": {"type": "string", "pattern": sha256,
                                     "description": "The SHA-256 of the runner's authentication token, lowercase hex."},
                    "system_id": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_.-]{1,64}$",
                                  "description": "The machine's `system_id` (gitlab-runner's `.runner_system_id`); absent or null: the token alone, any machine."},
                    "uuid": {"type": ["string", "null"]},
                    "agent_name": {"type": "null"},
                    "agent_id": {"type": "null"},
                },
            },
            {
                "type": "object",
                "required": ["kind", "agent_name"],
                "additionalProperties": false,
                "properties": {
                    "kind": {"type": "string", "enum": ["buildkite"]},
                    "agent_name": {"type": "string", "minLength": 1, "maxLength": crate::domain::forge::AGENT_NAME_MAX_CHARS,
                                   "pattern": "^[^ \\u0000-\\u001f\\u007f-\\u009f]([^\\u0000-\\u001f\\u007f-\\u009f]*[^ \\u0000-\\u001f\\u007f-\\u009f])?$",
                                   "description": "The Buildkite agent's name as Buildkite shows it (compared exactly): leasegate pauses the agents of that name while the runner is refused."},
                    "uuid": {"type": "null"},
                    "token_sha256": {"type": "null"},
                    "system_id": {"type": "null"},
                    "agent_id": {"type": "null"},
                },
            },
            {
                "type": "object",
                "required": ["kind", "agent_id"],
                "additionalProperties": false,
                "properties": {
                    "kind": {"type": "string", "enum": ["woodpecker"]},
                    "agent_id": {"type": "integer", "format": "int64", "minimum": 1,
                                 "maximum": i64::MAX,
                                 "description": "The Woodpecker agent's id (its agent config file's `agent_id`; the `agent_id` of its access token)."},
                    "agent_name": {"type": "null"},
                    "uuid": {"type": "null"},
                    "token_sha256": {"type": "null"},
                    "system_id": {"type": "null"},
                },
            },
        ],
    })
}

/// The forge runners of a registration or of `PUT …/forge-runners`.
pub fn forge_runners() -> Value {
    json!({
        "type": "array",
        "maxItems": crate::domain::forge::MAX_FORGE_RUNNERS,
        "items": {"$ref": "#/components/schemas/ForgeRunnerSpec"},
        "description": "The forge runners on the runner's machine, at most 64 (repeats count once).",
    })
}

/// An image id as `ImageDigest::parse_image_id` reads it.
pub const IMAGE_ID_PATTERN: &str = "^(sha256:)?[0-9a-f]{64}$";

/// A registry reference `ImageRef::parse` reads: `[host[:port]/]path[:tag][@sha256:…]`.
/// This is its common form (host labels lowercase, a port of up to four digits); the server
/// reads a few more (IPv6 hosts, longer ports).
fn image_ref_pattern() -> String {
    let component = "[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
    let host = "(?:localhost|[a-z0-9]+(?:\\.[a-z0-9]+)+)(?::[1-9][0-9]{0,3})?";
    let tag = "[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}";
    format!("^(?:{host}/)?{component}(?:/{component})*(?::{tag})?(?:@sha256:[0-9a-f]{{64}})?$")
}

/// The body of `PATCH /api/v1/admin/pools/{name}`: a JSON merge patch of `pool_body`. Each
/// member is the field's own schema or `null` (back to the default); whether the patched pool
/// is valid depends on the pool, so `pool_body`'s `anyOf` is not said here.
pub fn pool_patch() -> Value {
    let mut patch = merge_patch_of(&pool_body());
    patch["description"] = json!(
        "A JSON merge patch (RFC 7396) of the pool's `PUT` body: a member sets that field, `null` returns it to its default, a field not named keeps the pool's value."
    );
    patch
}

/// The schema of a JSON merge patch (RFC 7396) of a document `schema` describes.
///
/// A patch of an object names any of its members, none required, each also `null` (remove);
/// a member that is itself an object is patched the same way, recursively, because a merge
/// patch merges into it rather than replacing it (`{"github": {"labels": [..]}}` keeps the
/// scope). What holds of the whole document (`anyOf`, `required`) is not a patch's to meet:
/// the patched pool is read as a PUT body and answered as one.
fn merge_patch_of(schema: &Value) -> Value {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return schema.clone();
    };
    let properties: serde_json::Map<String, Value> = properties
        .iter()
        .map(|(name, member)| {
            let mut field = merge_patch_of(member);
            let description = field.as_object_mut().and_then(|f| f.remove("description"));
            let mut either = json!({"anyOf": [field, {"type": "null"}]});
            if let Some(d) = description {
                either["description"] = d;
            }
            (name.clone(), either)
        })
        .collect();
    let mut patch = json!({"type": "object", "properties": properties});
    if let Some(extra) = schema.get("additionalProperties") {
        patch["additionalProperties"] = extra.clone();
    }
    if let Some(d) = schema.get("description") {
        patch["description"] = d.clone();
    }
    patch
}

/// The body of `PUT /api/v1/admin/pools/{name}` (`admin::pool_body::PoolBody`), with
/// `PoolSpec::validate`'s rules: a `registry` pool needs a reference to resolve, and a `manual`
/// pool that enforces needs at least one image id.
pub fn pool_body() -> Value {
    let ids = json!({"type": "array", "items": {"type": "string", "pattern": IMAGE_ID_PATTERN}});
    json!({
        "type": "object",
        "description": "A pool's image policy. `manual` pools list their image ids; `registry` pools name a reference the service resolves.",
        "properties": {
            "image_ref": {"type": ["string", "null"], "pattern": no_controls_pattern(),
                          "description": "For `registry` pools, the reference resolved; for `manual` ones, shown only."},
            "expected_image_ids": {
                "type": "array", "items": {"type": "string", "pattern": IMAGE_ID_PATTERN},
                "description": "Image ids (`sha256:` and 64 lowercase hex, or the bare 64 hex podman's `{{.Id}}` prints); for `manual` pools.",
            },
            "image_policy": {"type": "string", "enum": ["enforce", "report", "off"], "default": "enforce"},
            "image_source": {"type": "string", "enum": ["manual", "registry"], "default": "manual"},
            "gate_mode": {"type": "string", "enum": ["enforce", "observe"], "default": "enforce",
                          "description": "`enforce`: refusals refuse. `observe`: refusals are recorded and marked, and the runner gets its work all the same."},
            "drift_grace_s": {"type": ["integer", "null"], "minimum": 0, "maximum": 2_592_000,
                              "description": "0 to 2592000 seconds, default 900."},
            "resolve_interval_s": {"type": ["integer", "null"], "minimum": 10, "maximum": 86_400,
                                   "description": "10 to 86400 seconds, default 300 (registry pools)."},
            "github": github_pool(),
            "disk_warning": disk_warning(),
            "ejection": ejection_policy(),
            "images": {
                "type": "array", "maxItems": crate::domain::images::MAX_IMAGES,
                "description": "The images the pool's runners may run, each judged on its own against the entry for its ref (as the runner's configuration spells it).",
                "items": {
                    "type": "object", "additionalProperties": false,
                    "required": ["ref"],
                    "properties": {
                        "ref": {"type": "string", "minLength": 1, "maxLength": crate::domain::images::MAX_REF_BYTES, "pattern": no_controls_pattern()},
                        "image_source": {"type": "string", "enum": ["manual", "registry"], "default": "manual",
                                         "description": "manual: expected_image_ids is the set; registry: the set is what ref resolves to in its registry (ids named here stand until the next resolution)."},
                        "expected_image_ids": {"type": "array", "items": ids["items"]},
                        "drift_grace_s": {"type": ["integer", "null"], "minimum": 0, "maximum": 2_592_000},
                        "absent_ok": {"type": "boolean", "default": false},
                    },
                    "anyOf": [
                        {"required": ["expected_image_ids"], "properties": {
                            "image_source": {"const": "manual"},
                            "expected_image_ids": {"minItems": 1},
                        }},
                        {"required": ["image_source"], "properties": {
                            "image_source": {"const": "registry"},
                            "ref": {"maxLength": 237, "pattern": image_ref_pattern()},
                        }},
                    ],
                },
            },
            "undescribed_images": {"type": "string", "enum": ["refuse", "ignore"], "default": "refuse",
                                   "description": "What an attested image whose ref the pool does not describe does: refuse the runner, or nothing."},
        },
        "anyOf": [
            {"required": ["image_source", "image_ref"], "properties": {
                "image_source": {"const": "registry"},
                "image_ref": {"type": "string", "maxLength": 237, "pattern": image_ref_pattern(),
                              "description": "The server refuses a name (registry, `/`, repository) over 255 characters; the longest a reference is sure to fit, counting `docker.io/library/` for a bare name, is 237."},
            }},
            {"required": ["image_policy"], "properties": {
                "image_source": {"const": "manual"},
                "image_policy": {"enum": ["report", "off"]},
            }},
            {"required": ["expected_image_ids"], "properties": {
                "image_source": {"const": "manual"},
                "expected_image_ids": {"minItems": 1, "items": ids["items"]},
            }},
            {"required": ["images"], "properties": {
                "image_source": {"const": "manual"},
                "images": {"minItems": 1},
            }},
        ],
    })
}

/// A pool's `disk_warning` (`domain::disk::DiskWarning`): unknown fields are refused.
pub fn disk_warning() -> Value {
    json!({
        "type": ["object", "null"],
        "description": "Runners whose attested disk figures (`probe.disk`) fall below either line are shown and counted as warned; their status is unchanged.",
        "additionalProperties": false,
        "properties": {
            "min_free_bytes": {"type": ["integer", "null"], "minimum": 0, "maximum": i64::MAX},
            "min_free_inodes_percent": {"type": ["integer", "null"], "minimum": 0, "maximum": 100},
        },
    })
}

/// A pool's `ejection` object (`admin::pool_body::EjectionBody`,
/// `domain::ejection::EjectionPolicy`).
pub fn ejection_policy() -> Value {
    use crate::domain::ejection::{MAX_BASE_S, MAX_CONSECUTIVE_FAILURES};
    json!({
        "type": ["object", "null"],
        "description": "When the pool's runners are ejected for infrastructure failures in a row (PROTOCOL.md, \"Ejection\"); null, omitted or a field left out: the defaults.",
        "additionalProperties": false,
        "properties": {
            "consecutive_failures": {"type": ["integer", "null"], "minimum": 0,
                                     "maximum": MAX_CONSECUTIVE_FAILURES,
                                     "description": "Infrastructure failures in a row that eject a runner; default 3, 0 turns ejection off."},
            "base_s": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_BASE_S,
                       "description": "The first ejection's length in seconds; the nth lasts n times it, at most 8 times; default 300."},
            "max_share": {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                          "description": "At most max(1, floor(max_share x live runners)) of the pool's runners are ejected at once; default 0.34."},
        },
    })
}

/// A name in a GitHub scope (`domain::github::GithubScope`): 1-100 of `A-Z a-z 0-9 _ . -`, not
/// `.` or `..`.
fn github_name() -> &'static str {
    r"(?:[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}|\.[A-Za-z0-9_-][A-Za-z0-9_.-]{0,98}|\.\.[A-Za-z0-9_.-]{1,98})"
}

/// A pool's `github` object (`admin::pool_body::GithubBody`,
/// `domain::github::GithubPool::new`).
pub fn github_pool() -> Value {
    let name = github_name();
    let plain = format!("[^,{CONTROLS}{FORMATS}]");
    let visible = format!("[^,{CONTROLS}{FORMATS}{SPACES}]");
    let segment = "[A-Za-z0-9_-][A-Za-z0-9_.-]*";
    json!({
        "type": ["object", "null"],
        "description": "Where the pool's runners register with GitHub Actions (docs/FORGES.md); null or omitted: they do not.",
        "required": ["scope", "labels"],
        "additionalProperties": false,
        "properties": {
            "scope": {"type": "string",
                      "pattern": format!("^(?:(?:orgs|enterprises)/{name}|repos/{name}/{name})$"),
                      "description": "`orgs/ORG`, `repos/OWNER/REPO` or `enterprises/ENTERPRISE`."},
            "runner_group_id": {"type": ["integer", "null"], "minimum": 1,
                                "maximum": crate::domain::github::MAX_RUNNER_GROUP_ID,
                                "description": "The runner group registrations join; default 1, the default group."},
            "labels": {"type": "array", "minItems": 1, "maxItems": crate::domain::github::MAX_LABELS,
                       "items": {"type": "string", "minLength": 1,
                                 "maxLength": crate::domain::github::MAX_LABEL_CHARS,
                                 "pattern": format!("^{plain}*{visible}{plain}*$")},
                       "description": "The labels every registration carries (`runs-on:` matches them): 1 to 100, each 1-100 characters, no comma."},
            "work_folder": {"type": ["string", "null"], "minLength": 1,
                            "maxLength": crate::domain::github::MAX_WORK_FOLDER_CHARS,
                            "pattern": format!("^{segment}(?:/{segment})*$"),
                            "description": "The runner's work folder, relative to its directory; default `_work`."},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admits(schema: &Value, doc: Value) -> bool {
        jsonschema::validator_for(schema)
            .expect("the schema compiles")
            .is_valid(&doc)
    }

    /// A merge patch merges into a nested object, so the patch schema must not ask a nested
    /// object for the members a PUT requires; what it must not admit stays refused.
    #[test]
    fn a_pool_patch_may_name_part_of_the_github_object() {
        let patch = pool_patch();
        for ok in [
            json!({}),
            json!({"github": {}}),
            json!({"github": {"labels": ["gpu"]}}),
            json!({"github": {"work_folder": null}}),
            json!({"github": null, "drift_grace_s": null}),
        ] {
            assert!(admits(&patch, ok.clone()), "{ok}");
        }
        for refused in [
            json!({"github": 5}),
            json!({"github": {"runners_group_id": 2}}),
            json!({"github": {"labels": []}}),
            json!({"drift_grace_s": -1}),
        ] {
            assert!(!admits(&patch, refused.clone()), "{refused}");
        }
        // The PUT body still requires the whole object.
        assert!(!admits(
            &pool_body(),
            json!({"image_policy": "off", "github": {"labels": ["gpu"]}})
        ));
    }
}

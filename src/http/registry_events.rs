//! Registry push notifications: `POST /api/v1/admin/registry-events` (admin token).
//!
//! The distribution registry's notification envelope (`application/vnd.docker.distribution.
//! events.v1+json`, accepted whatever the content type) lists events; every `push` of a tag
//! starts a resolution of each pool whose `image_ref` (a registry pool) or registry entry of
//! `images` names that repository and tag.
//! The answer is 202 at once, with the pools being resolved: a registry waits for its
//! notification endpoint only briefly and retries on a timeout, so the resolutions run in the
//! background and their outcome shows on the pools. The registry notifies a manifest push
//! before it moves the tag, so a resolution that does not yet see the pushed digest under the
//! tag looks again a few times (`resolver::spawn_resolutions`). Pulls, deletes, blob events and pushes by
//! digest (which move no tag) resolve nothing. The registry host in the event is not compared:
//! a pusher may reach the registry under another name than leasegate does, and a resolution
//! too many is harmless.

use super::auth::AsOperator;
use super::json::JsonBody;
use super::views::PoolsResolving;
use crate::app::AppState;
use crate::domain::audit::Action;
use crate::domain::digest::ImageDigest;
use crate::domain::image_set::ImageSource;
use crate::domain::time::Millis;
use crate::problem::ApiError;
use crate::registry::reference::ImageRef;
use crate::registry::resolver;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/v1/admin/registry-events", post(registry_events))
}

/// A distribution registry's notification envelope.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = RegistryEnvelope)]
struct Envelope {
    #[serde(default)]
    events: Vec<Event>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = RegistryEvent)]
struct Event {
    #[serde(default)]
    action: String,
    #[serde(default)]
    target: Target,
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[schema(as = RegistryEventTarget)]
struct Target {
    #[serde(default)]
    repository: String,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    digest: Option<String>,
}

/// One tag push: the repository, the tag, and the digest pushed under it (when it is one).
#[derive(Debug, PartialEq, Eq)]
struct TagPush<'a> {
    repository: &'a str,
    tag: &'a str,
    digest: Option<ImageDigest>,
}

/// The tag pushes of `envelope`, in order.
fn pushed_tags(envelope: &Envelope) -> Vec<TagPush<'_>> {
    envelope
        .events
        .iter()
        .filter(|e| e.action == "push" && !e.target.repository.is_empty())
        .filter_map(|e| {
            let tag = e.target.tag.as_deref().filter(|t| !t.is_empty())?;
            Some(TagPush {
                repository: e.target.repository.as_str(),
                tag,
                digest: e
                    .target
                    .digest
                    .as_deref()
                    .and_then(|d| ImageDigest::parse(d).ok()),
            })
        })
        .collect()
}

#[utoipa::path(post, path = "/api/v1/admin/registry-events", tag = "admin",
    security(("admin_token" = ["write"])),
    request_body(content = Envelope, content_type = "application/vnd.docker.distribution.events.v1+json",
        description = "Accepted whatever the content type."),
    responses(
        (status = 202, description = "The registry pools whose tag was pushed, being resolved in the background.", body = PoolsResolving),
    ))]
async fn registry_events(
    caller: AsOperator,
    State(state): State<AppState>,
    JsonBody(envelope): JsonBody<Envelope>,
) -> Result<(StatusCode, Json<PoolsResolving>), ApiError> {
    let pushed = pushed_tags(&envelope);
    let mut pools = Vec::new();
    if !pushed.is_empty() {
        for pool in state.store().list_pools().await? {
            // Its single image's reference (a registry pool), and its registry entries'.
            let single = pool
                .image_ref
                .as_deref()
                .filter(|_| pool.image_source == ImageSource::Registry);
            let entries = pool
                .images
                .iter()
                .filter(|i| i.is_registry())
                .map(|i| i.image_ref.as_str());
            let references: Vec<ImageRef> = single
                .into_iter()
                .chain(entries)
                .filter_map(|r| ImageRef::parse(r).ok())
                .collect();
            // The last push of one of the pool's tags in the envelope is the one it ends on.
            let last = pushed.iter().rev().find(|p| {
                references.iter().any(|image| {
                    image.repository == p.repository && image.moving_tag() == Some(p.tag)
                })
            });
            if let Some(push) = last {
                let digest = push.digest.clone();
                pools.push((pool, digest));
            }
        }
    }
    let names: Vec<String> = pools.iter().map(|(p, _)| p.name.to_string()).collect();
    tracing::info!(
        events = envelope.events.len(),
        tag_pushes = pushed.len(),
        pools = ?names,
        "registry notification"
    );
    let now = Millis::now();
    for name in &names {
        let entry = caller
            .audit(Action::PoolResolve, name.as_str(), now)
            .detail("a registry notification of a push to its tag");
        state.store().record_audit(&entry).await?;
    }
    resolver::spawn_resolutions(state.store(), state.registry(), pools);
    Ok((StatusCode::ACCEPTED, Json(PoolsResolving { pools: names })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_tag_pushes_count() {
        let envelope: Envelope = serde_json::from_value(json!({"events": [
            {"action": "push", "target": {"repository": "ci/runner", "tag": "stable",
              "digest": "sha256:0fe3c799a0f15af08aae8de219301ea0d02ec887bd9ff650cda30239a4aa6982", "mediaType": "application/vnd.oci.image.manifest.v1+json"},
             "request": {"host": "127.0.0.1:5000"}},
            {"action": "push", "target": {"repository": "ci/runner", "tag": "stable"}},
            {"action": "push", "target": {"repository": "ci/runner", "digest": "sha256:y"}},
            {"action": "pull", "target": {"repository": "ci/other", "tag": "stable"}},
            {"action": "push", "target": {"repository": "ci/other", "tag": ""}},
            {"action": "push"},
            {"action": "delete", "target": {"repository": "ci/gone", "tag": "v1"}}
        ]}))
        .unwrap();
        let pushes = pushed_tags(&envelope);
        let summary: Vec<(&str, &str, bool)> = pushes
            .iter()
            .map(|p| (p.repository, p.tag, p.digest.is_some()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("ci/runner", "stable", true),
                ("ci/runner", "stable", false)
            ]
        );
    }
}

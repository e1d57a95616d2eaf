//! The operator's API, one resource per module: `pools` (with the body a `PUT` reads in
//! `pool_body`), `registration_tokens`, `runners` (list, detail, cordon, uncordon, reinstate,
//! revoke), a runner's `forge_runners`, the `drift` report a fleet roller polls (with each
//! pool's roll health) and `resolve` (a registry pool, now). Reads need a viewer's token,
//! writes an operator's; every write is recorded in the audit trail with its author.
//!
//! Here only the router. The handlers are visible to `http` so that `schema` can name them.

pub(super) mod drift;
pub(super) mod forge_runners;
mod pool_body;
pub(super) mod pools;
pub(super) mod registration_tokens;
pub(super) mod resolve;
pub(super) mod runners;

use crate::app::AppState;
use axum::Router;
use axum::routing::{get, post};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/admin/pools", get(pools::list_pools))
        .route(
            "/api/v1/admin/pools/{name}",
            get(pools::get_pool)
                .put(pools::put_pool)
                .patch(pools::patch_pool)
                .delete(pools::delete_pool),
        )
        .route(
            "/api/v1/admin/pools/{name}/registration-tokens",
            post(registration_tokens::create_registration_token),
        )
        .route("/api/v1/admin/runners", get(runners::list_runners))
        .route("/api/v1/admin/runners/{id}", get(runners::get_runner))
        .route("/api/v1/admin/runners/{id}/cordon", post(runners::cordon))
        .route(
            "/api/v1/admin/runners/{id}/uncordon",
            post(runners::uncordon),
        )
        .route(
            "/api/v1/admin/runners/{id}/reinstate",
            post(runners::reinstate),
        )
        .route("/api/v1/admin/runners/{id}/revoke", post(runners::revoke))
        .route(
            "/api/v1/admin/runners/{id}/forge-runners",
            axum::routing::put(forge_runners::put_forge_runners),
        )
        .route("/api/v1/admin/pools/{name}/resolve", post(resolve::resolve))
        .route("/api/v1/admin/drift", get(drift::drift))
}

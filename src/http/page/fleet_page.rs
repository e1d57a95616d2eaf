//! The fleet page (`/admin`) and its refresh (`/admin/fleet`): every pool's card and the runners
//! `fleet` selects, cut by `pieces` into what a refresh sends only when it changed.

use super::pieces::{self, FleetBody, FleetParts, Piece};
use super::session::{self, Viewer};
use super::views::{self, PoolCard};
use super::{PageViewer, fleet, html, render, rendered, template_failed, timeline, who};
use crate::app::AppState;
use crate::domain::fleet as fleet_rules;
use crate::domain::operator::Role;
use crate::domain::pool::Pool;
use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::http::problem::Problem;
use crate::problem::ApiError;
use askama::Template;
use axum::extract::{Query, State};
use axum::http::header::{CACHE_CONTROL, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;

/// The request header a refresh names the pieces it shows by (their hashes).
const FLEET_HAVE: &str = "x-fleet-have";
#[derive(Template)]
#[template(path = "fleet.html")]
struct FleetPage {
    logged_in: bool,
    who: String,
    csrf: String,
    /// The refresh's query (the filters and the page).
    query: String,
    body: FleetBody,
}

#[derive(Template)]
#[template(path = "fleet_fragment.html")]
struct FleetFragment<'a> {
    pieces: Vec<(&'static str, &'a Piece, bool)>,
}

/// Every status a runner may have, for the filter.
fn statuses() -> Vec<&'static str> {
    crate::domain::status::RunnerStatus::ALL
        .iter()
        .map(|s| s.as_str())
        .collect()
}

/// The fleet view for `viewer`, in pieces, and the refresh's query.
async fn fleet_view(
    state: &AppState,
    viewer: &Viewer,
    query: &fleet::FleetQuery,
) -> Result<(FleetBody, String), ApiError> {
    let now = Millis::now();
    let rules = state.settings().status_rules();
    let store = state.store();
    let pools: BTreeMap<PoolName, Pool> = store
        .list_pools()
        .await?
        .into_iter()
        .map(|p| (p.name.clone(), p))
        .collect();
    // Every runner judged from its summary; only the page's runners are read whole.
    let summaries = store.runner_summaries(None, query.searches()).await?;
    let judged = fleet_rules::judge(&summaries, &pools, rules, now);
    let tallies = fleet_rules::tally(&judged);
    let (shown, mut selection) = fleet::select(&judged, query);
    let whole = store.runners_by_id(&fleet_rules::ids(&shown)).await?;
    let refusals = store.refusal_counts_since(now.minus_secs(3600)).await?;
    selection.rows = fleet_rules::in_shown_order(&shown, whole)
        .iter()
        .map(|(runner, pool)| {
            let observed = runner.observe(pool, now, rules);
            let refused = refusals.get(&runner.id).copied().unwrap_or(0);
            let mut row = views::runner_row(runner, &observed, refused, now);
            row.images = views::image_rows(runner, pool);
            row
        })
        .collect();
    let mut depths = store.queue_depths().await?;
    // Every pool's day of samples in one read, not one per pool.
    let mut samples: BTreeMap<PoolName, Vec<_>> = BTreeMap::new();
    let since = now.minus_secs(crate::domain::timeline::SAMPLES_KEPT_S);
    for sample in store.pool_samples(since).await? {
        samples.entry(sample.pool.clone()).or_default().push(sample);
    }
    let cards: Vec<PoolCard> = pools
        .values()
        .map(|p| {
            let depth = depths.remove(&p.name).unwrap_or_default();
            let mut card = views::pool_card(p, tallies.get(&p.name), depth, now);
            let own = samples.get(&p.name).map_or(&[][..], Vec::as_slice);
            card.timelines = timeline::timelines(own, now);
            card
        })
        .collect();
    let body = FleetBody::render(&FleetParts {
        as_of: &now.rfc3339(),
        pools: &cards,
        sel: &selection,
        statuses: &statuses(),
        can_write: viewer.operator().may(Role::Operator),
        csrf: viewer.csrf(),
    })
    .map_err(template_failed)?;
    Ok((body, selection.query))
}

#[utoipa::path(get, path = "/admin", tag = "page",
    security((), ("admin_token" = [])),
    params(
        ("pool" = Option<String>, Query, description = "Only this pool's runners."),
        ("status" = Option<String>, Query, description = "Only runners of this status (`healthy` lists the healthy ones, otherwise a count)."),
        ("q" = Option<String>, Query, description = "A search over name, labels (`key=value`) and host."),
        ("limit" = Option<usize>, Query, description = "Runners per page, 1 to 500, default 50."),
        ("cursor" = Option<String>, Query, description = "The next page's cursor, from the page's own link."),
    ),
    responses(
        (status = 200, description = "The fleet page.", body = String, content_type = "text/html"),
        (status = 303, description = "No session: to `/admin/login`."),
    ))]
pub(super) async fn fleet(
    State(state): State<AppState>,
    PageViewer(viewer): PageViewer,
    Query(query): Query<fleet::FleetQuery>,
) -> Result<Response, ApiError> {
    let (body, query) = fleet_view(&state, &viewer, &query).await?;
    render(
        StatusCode::OK,
        &FleetPage {
            logged_in: viewer.is_session(),
            who: who(&viewer),
            csrf: viewer.csrf().into(),
            query,
            body,
        },
    )
}

#[utoipa::path(get, path = "/admin/fleet", tag = "page",
    security((), ("admin_token" = [])),
    params(
        ("pool" = Option<String>, Query, description = "As for `/admin`."),
        ("status" = Option<String>, Query, description = "As for `/admin`."),
        ("q" = Option<String>, Query, description = "As for `/admin`."),
        ("limit" = Option<usize>, Query, description = "As for `/admin`."),
        ("cursor" = Option<String>, Query, description = "As for `/admin`."),
        ("X-Fleet-Have" = Option<String>, Header, description = "The hashes (`data-hash`, 16 hex digits, space-separated) of the pieces the page shows: those are sent empty, to be kept."),
    ),
    responses(
        (status = 200, description = "The fleet's pieces in order, each a `<template>` naming its slot, key and hash; one named in `X-Fleet-Have` is empty (`data-kept`). With the view's `ETag`.", body = String, content_type = "text/html"),
        (status = 304, description = "`If-None-Match` named this view's `ETag`: nothing changed."),
        (status = 401, description = "`unauthorized`: no valid session (no redirect).", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn fleet_fragment(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<fleet::FleetQuery>,
) -> Result<Response, ApiError> {
    // The refresh script follows no redirect to a login page: an expired session is a 401.
    let viewer = session::viewer(&state, &headers, Millis::now())
        .await?
        .ok_or_else(|| ApiError::unauthorized("log in again"))?;
    let (body, _) = fleet_view(&state, &viewer, &query).await?;
    let have = pieces::have(headers.get(FLEET_HAVE).and_then(|v| v.to_str().ok()));
    let etag = body.etag.clone();
    let unchanged = headers
        .get(IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag);
    let mut response = if unchanged {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        r.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    } else {
        let fragment = FleetFragment {
            pieces: body.refresh(&have),
        };
        html(StatusCode::OK, rendered(&fragment)?)
    };
    response
        .headers_mut()
        .insert(ETAG, HeaderValue::from_str(&etag).expect("hex is ASCII"));
    Ok(response)
}

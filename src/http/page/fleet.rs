//! The fleet view at any size: which runners the page shows (filtered by pool, status and a
//! search over name, labels and host; the ones that need attention first, the healthy ones
//! collapsed behind their count; a page at a time), and the refresh's `ETag`, so that a
//! refresh of a fleet where nothing changed answers `304` with no body.
//!
//! Everything is decided here from the rows `views` made; the template lays it out. The
//! filters live in the URL, so a view can be bookmarked, shared, and refreshed as it is.

use super::views::RunnerRow;
use crate::domain::verdict::RunnerStatus;
use serde::Deserialize;

/// Rows per page by default, and at most.
pub const PAGE_DEFAULT: usize = 50;
pub const PAGE_MAX: usize = 500;

/// The page's query: `?pool=&status=&q=&limit=&cursor=`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct FleetQuery {
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub q: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub cursor: Option<String>,
}

/// What the runner table shows.
#[derive(Debug)]
pub struct FleetSelection {
    pub rows: Vec<RunnerRow>,
    /// Healthy runners left out of an unfiltered view, behind their count.
    pub healthy_hidden: usize,
    /// How many rows the filters matched, in all pages.
    pub matched: usize,
    /// The query of the next page, when there is one.
    pub next: Option<String>,
    /// The filters as given, for the form and the refresh.
    pub pool: String,
    pub status: String,
    pub q: String,
    /// The query string of this very view (without the cursor's page), for the refresh.
    pub query: String,
}

impl FleetQuery {
    fn limit(&self) -> usize {
        self.limit.unwrap_or(PAGE_DEFAULT).clamp(1, PAGE_MAX)
    }

    fn offset(&self) -> usize {
        self.cursor
            .as_deref()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }

    fn text(value: &Option<String>) -> String {
        value.as_deref().unwrap_or("").trim().to_string()
    }

    /// This query as a URL query string, with `cursor` as given (`None`: none).
    fn encode(&self, cursor: Option<usize>) -> String {
        let mut pairs = form_urlencoded::Serializer::new(String::new());
        for (key, value) in [
            ("pool", Self::text(&self.pool)),
            ("status", Self::text(&self.status)),
            ("q", Self::text(&self.q)),
        ] {
            if !value.is_empty() {
                pairs.append_pair(key, &value);
            }
        }
        if self.limit.is_some() {
            pairs.append_pair("limit", &self.limit().to_string());
        }
        if let Some(c) = cursor.filter(|c| *c > 0) {
            pairs.append_pair("cursor", &c.to_string());
        }
        pairs.finish()
    }
}

/// Whether `row` matches the search `q` (`domain::runner::matches_search`).
fn matches_search(row: &RunnerRow, q: &str) -> bool {
    let labels = row.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    crate::domain::runner::matches_search(
        &q.to_lowercase(),
        &row.name,
        &row.id,
        row.host.as_deref(),
        labels,
    )
}

/// The rows `query` selects from `all` (sorted, what needs attention first).
pub fn select(all: Vec<RunnerRow>, query: &FleetQuery) -> FleetSelection {
    let pool = FleetQuery::text(&query.pool);
    let status = FleetQuery::text(&query.status);
    let q = FleetQuery::text(&query.q);
    let filtered: Vec<RunnerRow> = all
        .into_iter()
        .filter(|r| pool.is_empty() || r.pool == pool)
        .filter(|r| status.is_empty() || r.status == status)
        .filter(|r| matches_search(r, &q))
        .collect();
    // Unfiltered by status, the healthy ones are a count: the table is for attention (and a
    // healthy runner on a superseded image needs it: the roll waits for its recycle).
    let quiet = |r: &RunnerRow| r.rank == RunnerStatus::Healthy && r.image_current != Some(false);
    let (shown, healthy_hidden): (Vec<RunnerRow>, usize) = if status.is_empty() {
        let healthy = filtered.iter().filter(|r| quiet(r)).count();
        let rest = filtered.into_iter().filter(|r| !quiet(r)).collect();
        (rest, healthy)
    } else {
        (filtered, 0)
    };
    let matched = shown.len();
    let (offset, limit) = (query.offset(), query.limit());
    let rows: Vec<RunnerRow> = shown.into_iter().skip(offset).take(limit).collect();
    let next = (offset + rows.len() < matched).then(|| query.encode(Some(offset + limit)));
    FleetSelection {
        rows,
        healthy_hidden,
        matched,
        next,
        pool,
        status,
        q,
        query: query.encode(Some(offset)),
    }
}

/// The refresh's validator: the view's content without the instant it was rendered at.
pub fn etag(body: &str, as_of: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(body.replace(as_of, "").as_bytes());
    format!("\"{}\"", &hex::encode(digest)[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, status: RunnerStatus, host: Option<&str>) -> RunnerRow {
        RunnerRow {
            id: format!("id-{name}"),
            name: name.into(),
            status: status.as_str(),
            rank: status,
            pool: "linux".into(),
            host: host.map(String::from),
            labels: vec![("os".into(), "linux".into())],
            ..RunnerRow::default()
        }
    }

    #[test]
    fn healthy_runners_are_a_count_unless_asked_for() {
        let all = vec![
            row("a", RunnerStatus::ProbeFailed, None),
            row("b", RunnerStatus::Healthy, None),
            row("c", RunnerStatus::Healthy, None),
        ];
        let s = select(all.clone(), &FleetQuery::default());
        assert_eq!((s.rows.len(), s.healthy_hidden), (1, 2));
        let q = FleetQuery {
            status: Some("healthy".into()),
            ..Default::default()
        };
        let s = select(all, &q);
        assert_eq!((s.rows.len(), s.healthy_hidden), (2, 0));
        assert_eq!(s.query, "status=healthy");
    }

    #[test]
    fn the_search_covers_name_labels_and_host_and_pages_follow() {
        let all: Vec<RunnerRow> = (0..7)
            .map(|i| {
                row(
                    &format!("r{i}"),
                    RunnerStatus::Stale,
                    Some(&format!("host-{i}.ci")),
                )
            })
            .collect();
        let q = |s: &str| FleetQuery {
            q: Some(s.into()),
            ..Default::default()
        };
        assert_eq!(select(all.clone(), &q("HOST-3")).rows.len(), 1);
        assert_eq!(select(all.clone(), &q("os=linux")).rows.len(), 7);
        assert_eq!(select(all.clone(), &q("nothing")).rows.len(), 0);
        let first = select(
            all.clone(),
            &FleetQuery {
                limit: Some(3),
                ..Default::default()
            },
        );
        assert_eq!(first.rows.len(), 3);
        assert_eq!(first.next.as_deref(), Some("limit=3&cursor=3"));
        let last = select(
            all,
            &FleetQuery {
                limit: Some(3),
                cursor: Some("6".into()),
                ..Default::default()
            },
        );
        assert_eq!((last.rows.len(), last.next), (1, None));
    }

    #[test]
    fn the_etag_ignores_the_render_instant_only() {
        assert_eq!(
            etag("as of 10:00 x", "10:00"),
            etag("as of 10:05 x", "10:05")
        );
        assert_ne!(
            etag("as of 10:00 x", "10:00"),
            etag("as of 10:00 y", "10:00")
        );
    }
}

//! The fleet view at any size: which runners the page shows (filtered by pool, status and a
//! search over name, labels and host; the ones that need attention first, the healthy ones
//! collapsed behind their count; a page at a time). `pieces` cuts what it selects into the
//! pieces a refresh sends when they changed.
//!
//! Everything is decided here from the rows `views` made; the template lays it out. The
//! filters live in the URL, so a view can be bookmarked, shared, and refreshed as it is.

use super::views::RunnerRow;
use crate::domain::fleet::{Filter, Judged, attention_order, page};
use crate::domain::status::RunnerStatus;
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

    /// Whether it searches (the runners' labels and host must be read).
    pub fn searches(&self) -> bool {
        !Self::text(&self.q).is_empty()
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

/// The runners `query` selects from the judged fleet, what needs attention first: the page's
/// runners, in order, and the selection around them. Its `rows` are left for the caller to
/// make from the page's whole runners (`views::runner_row`).
pub fn select<'a>(
    judged: &'a [Judged<'a>],
    query: &FleetQuery,
) -> (Vec<&'a Judged<'a>>, FleetSelection) {
    let pool = FleetQuery::text(&query.pool);
    let status = FleetQuery::text(&query.status);
    let q = FleetQuery::text(&query.q).to_lowercase();
    let wanted = RunnerStatus::ALL.into_iter().find(|s| s.as_str() == status);
    let filter = Filter {
        pool: &pool,
        status: wanted,
        q: &q,
    };
    // A status no runner can have matches none (rather than every one).
    let known_status = status.is_empty() || wanted.is_some();
    let mut matching: Vec<&Judged> = judged
        .iter()
        .filter(|j| known_status && filter.matches(j))
        .collect();
    // Unfiltered by status, the healthy ones are a count: the table is for attention.
    let mut healthy_hidden = 0;
    if status.is_empty() {
        healthy_hidden = matching.iter().filter(|j| j.is_quiet()).count();
        matching.retain(|j| !j.is_quiet());
    }
    // Mostly in this order already (the store lists by pool and name), which the stable sort
    // passes through in one sweep.
    matching.sort_by(|a, b| attention_order(a, b));
    let offset = query.offset();
    let shown = page(matching.into_iter(), offset, query.limit());
    let selection = FleetSelection {
        rows: Vec::new(),
        healthy_hidden,
        matched: shown.matched,
        next: shown.next_offset.map(|next| query.encode(Some(next))),
        pool,
        status,
        q: FleetQuery::text(&query.q),
        query: query.encode(Some(offset)),
    };
    (shown.items, selection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fleet::fixtures::{NOW, RULES, pools, runner};
    use crate::domain::fleet::judge;
    use crate::domain::runner::RunnerSummary;

    /// The names shown, and the selection.
    fn select_from(all: &[RunnerSummary], query: &FleetQuery) -> (Vec<String>, FleetSelection) {
        let pools = pools();
        let judged = judge(all, &pools, RULES, NOW);
        let (shown, selection) = select(&judged, query);
        let names = shown.iter().map(|j| j.runner.name.clone()).collect();
        (names, selection)
    }

    #[test]
    fn healthy_runners_are_a_count_unless_asked_for() {
        let all = vec![
            runner("a", false, 'a'),
            runner("b", true, 'a'),
            runner("c", true, 'a'),
        ];
        let (shown, s) = select_from(&all, &FleetQuery::default());
        assert_eq!((shown, s.healthy_hidden), (vec!["a".to_string()], 2));
        let q = FleetQuery {
            status: Some("healthy".into()),
            ..Default::default()
        };
        let (shown, s) = select_from(&all, &q);
        assert_eq!((shown.len(), s.healthy_hidden), (2, 0));
        assert_eq!(s.query, "status=healthy");
        let nonsense = FleetQuery {
            status: Some("splendid".into()),
            ..Default::default()
        };
        assert_eq!(select_from(&all, &nonsense).0.len(), 0);
    }

    #[test]
    fn the_search_covers_name_labels_and_host_and_pages_follow() {
        let all: Vec<RunnerSummary> = (0..7)
            .map(|i| {
                let mut r = runner(&format!("r{i}"), false, 'a');
                let search = r.search.as_mut().unwrap();
                search.host = Some(format!("host-{i}.ci"));
                search.labels.insert("os".into(), "linux".into());
                r
            })
            .collect();
        let q = |s: &str| FleetQuery {
            q: Some(s.into()),
            ..Default::default()
        };
        assert_eq!(select_from(&all, &q("HOST-3")).0.len(), 1);
        assert_eq!(select_from(&all, &q("os=linux")).0.len(), 7);
        assert_eq!(select_from(&all, &q("nothing")).0.len(), 0);
        let (first, first_sel) = select_from(
            &all,
            &FleetQuery {
                limit: Some(3),
                ..Default::default()
            },
        );
        assert_eq!(first, ["r0", "r1", "r2"]);
        assert_eq!(first_sel.next.as_deref(), Some("limit=3&cursor=3"));
        let (last, last_sel) = select_from(
            &all,
            &FleetQuery {
                limit: Some(3),
                cursor: Some("6".into()),
                ..Default::default()
            },
        );
        assert_eq!((last, last_sel.next), (vec!["r6".to_string()], None));
    }
}

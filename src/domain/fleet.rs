//! The fleet as the operators' views see it: every runner judged against its pool at one
//! instant, tallied per pool, filtered by pool, status and search, and paged.
//!
//! Judging is cheap (a verdict, no strings), and what a view shows of a runner is built only
//! for the runners of the page it answers: a view of ten thousand runners costs ten thousand
//! verdicts and fifty rows, not ten thousand rows. The page and the admin API's runner list
//! both go through here, so that they count, filter and page alike.

use super::ids::RunnerId;
use super::pool::Pool;
use super::pool_name::PoolName;
use super::runner::{Observed, Runner, RunnerSummary, StatusRules, matches_search};
use super::status::RunnerStatus;
use super::time::Millis;
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// One runner as judged at the view's instant.
#[derive(Debug)]
pub struct Judged<'a> {
    pub runner: &'a RunnerSummary,
    pub pool: &'a Pool,
    pub observed: Observed,
}

impl<'a> Judged<'a> {
    pub fn of(runner: &'a RunnerSummary, pool: &'a Pool, rules: StatusRules, now: Millis) -> Self {
        Judged {
            runner,
            pool,
            observed: runner.observe(pool, now, rules),
        }
    }

    pub fn status(&self) -> RunnerStatus {
        self.observed.status
    }

    /// Nothing to do about it: healthy, and not on a superseded image (a healthy runner on
    /// one needs attention: the roll waits for its recycle).
    pub fn is_quiet(&self) -> bool {
        self.status() == RunnerStatus::Healthy && self.observed.image_current != Some(false)
    }
}

/// Every runner whose pool is known, judged at `now`, in the order given.
pub fn judge<'a>(
    runners: &'a [RunnerSummary],
    pools: &'a BTreeMap<PoolName, Pool>,
    rules: StatusRules,
    now: Millis,
) -> Vec<Judged<'a>> {
    runners
        .iter()
        .filter_map(|runner| {
            let pool = pools.get(&runner.pool)?;
            Some(Judged::of(runner, pool, rules, now))
        })
        .collect()
}

/// What a view asks for: a pool, a status, a search (any of them empty: no filter).
#[derive(Clone, Copy, Debug, Default)]
pub struct Filter<'q> {
    pub pool: &'q str,
    pub status: Option<RunnerStatus>,
    /// Already lowercase (`matches_search`).
    pub q: &'q str,
}

impl Filter<'_> {
    /// Whether `j` passes. A search looks at labels and host only where the summaries were
    /// read with them (`wants_search_fields`).
    pub fn matches(&self, j: &Judged) -> bool {
        let r = j.runner;
        let search = r.search.as_ref();
        (self.pool.is_empty() || r.pool.as_str() == self.pool)
            && self.status.is_none_or(|s| s == j.status())
            && (self.q.is_empty()
                || matches_search(
                    self.q,
                    &r.name,
                    r.id.as_str(),
                    search.and_then(|s| s.host.as_deref()),
                    search
                        .into_iter()
                        .flat_map(|s| s.labels.iter())
                        .map(|(k, v)| (k.as_str(), v.as_str())),
                ))
    }

    /// Whether the summaries must carry labels and host (a search was asked for).
    pub fn wants_search_fields(&self) -> bool {
        !self.q.is_empty()
    }
}

/// What needs attention first: the worst status first, within a status a runner on a
/// superseded image before the others, then by pool and name.
pub fn attention_order(a: &Judged, b: &Judged) -> Ordering {
    let key = |j: &Judged| (j.status(), j.observed.image_current != Some(false));
    key(a)
        .cmp(&key(b))
        .then_with(|| a.runner.pool.cmp(&b.runner.pool))
        .then_with(|| a.runner.name.cmp(&b.runner.name))
}

/// The ids of `shown`, to read them whole.
pub fn ids(shown: &[&Judged]) -> Vec<RunnerId> {
    shown.iter().map(|j| j.runner.id.clone()).collect()
}

/// The whole runners read for `shown`, each with its pool, in `shown`'s order; one that went
/// away between the two reads is left out.
pub fn in_shown_order<'a>(shown: &[&Judged<'a>], whole: Vec<Runner>) -> Vec<(Runner, &'a Pool)> {
    let mut by_id: BTreeMap<RunnerId, Runner> =
        whole.into_iter().map(|r| (r.id.clone(), r)).collect();
    shown
        .iter()
        .filter_map(|j| Some((by_id.remove(&j.runner.id)?, j.pool)))
        .collect()
}

/// A pool's runners counted: by status, and the roll's progress among the live runners that
/// report an image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolTally {
    pub by_status: BTreeMap<RunnerStatus, usize>,
    /// Live runners that report an image, and how many of them run a current one.
    pub reporting: usize,
    pub on_current: usize,
    /// Runners under the pool's disk warning line, whatever their status.
    pub disk_warned: usize,
}

impl PoolTally {
    pub fn healthy(&self) -> usize {
        self.by_status
            .get(&RunnerStatus::Healthy)
            .copied()
            .unwrap_or(0)
    }
}

/// Every pool's tally, in one pass over the judged runners.
pub fn tally(judged: &[Judged]) -> BTreeMap<PoolName, PoolTally> {
    let mut tallies: BTreeMap<PoolName, PoolTally> = BTreeMap::new();
    for j in judged {
        let t = tallies.entry(j.runner.pool.clone()).or_default();
        *t.by_status.entry(j.status()).or_default() += 1;
        t.disk_warned += usize::from(j.observed.disk_warning.is_some());
        if let Some(current) = j.observed.image_current.filter(|_| !j.runner.is_revoked()) {
            t.reporting += 1;
            t.on_current += usize::from(current);
        }
    }
    tallies
}

/// One page of a sequence: its items, how many there were in all, and the next page's offset.
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub matched: usize,
    pub next_offset: Option<usize>,
}

pub fn page<T>(all: impl ExactSizeIterator<Item = T>, offset: usize, limit: usize) -> Page<T> {
    let matched = all.len();
    let items: Vec<T> = all.skip(offset).take(limit).collect();
    let next_offset = (offset.saturating_add(items.len()) < matched).then(|| offset + limit);
    Page {
        items,
        matched,
        next_offset,
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! A pool and runners to judge, for this module's tests and the views'.
    use super::*;
    use crate::domain::fixtures::{attested, digest};
    use crate::domain::image_set::ImageSource;
    use crate::domain::pool::{ImagePolicy, PoolSpec};
    use crate::domain::runner::SearchFields;
    use crate::domain::verdict::GateState;

    pub const NOW: Millis = Millis(1_900_000_000_000);
    pub const RULES: StatusRules = StatusRules {
        probe_max_age_s: 300,
        heartbeat_interval_s: 30,
    };

    pub fn pools() -> BTreeMap<PoolName, Pool> {
        let spec = PoolSpec {
            gate_mode: Default::default(),
            image_ref: None,
            expected_image_ids: vec![digest('a')],
            image_policy: ImagePolicy::Enforce,
            image_source: ImageSource::Manual,
            drift_grace_s: 900,
            resolve_interval_s: 300,
            github: None,
            disk_warning: None,
            ejection: Default::default(),
            images: Vec::new(),
            undescribed_images: Default::default(),
        };
        let pool = Pool::apply(
            PoolName::parse("linux").unwrap(),
            None,
            spec,
            NOW.minus_secs(3600),
        );
        BTreeMap::from([(pool.name.clone(), pool)])
    }

    pub fn runner(name: &str, probe_ok: bool, image: char) -> RunnerSummary {
        RunnerSummary {
            id: RunnerId(format!("id-{name}")),
            name: name.into(),
            pool: PoolName::parse("linux").unwrap(),
            search: Some(SearchFields::default()),
            gate: GateState::default(),
            revoked_at: None,
            latest: Some(attested(NOW.minus_secs(5), probe_ok, Some(image))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{NOW, RULES, pools, runner};
    use super::*;

    #[test]
    fn tallies_filters_and_orders_what_needs_attention_first() {
        let pools = pools();
        let runners = vec![
            runner("b-ok", true, 'a'),
            runner("a-broken", false, 'a'),
            runner("c-drifted", true, 'b'),
            runner("d-ok", true, 'a'),
        ];
        let judged = judge(&runners, &pools, RULES, NOW);
        let t = &tally(&judged)[&PoolName::parse("linux").unwrap()];
        assert_eq!(t.healthy(), 2);
        assert_eq!(t.by_status[&RunnerStatus::ProbeFailed], 1);
        assert_eq!((t.on_current, t.reporting), (3, 4));

        let mut attention: Vec<&Judged> = judged.iter().filter(|j| !j.is_quiet()).collect();
        attention.sort_by(|a, b| attention_order(a, b));
        let names: Vec<&str> = attention.iter().map(|j| j.runner.name.as_str()).collect();
        assert_eq!(names, ["a-broken", "c-drifted"]);

        let healthy = Filter {
            status: Some(RunnerStatus::Healthy),
            ..Filter::default()
        };
        assert_eq!(judged.iter().filter(|j| healthy.matches(j)).count(), 2);
        let search = Filter {
            q: "d-o",
            ..Filter::default()
        };
        assert_eq!(judged.iter().filter(|j| search.matches(j)).count(), 1);
        let elsewhere = Filter {
            pool: "arm",
            ..Filter::default()
        };
        assert_eq!(judged.iter().filter(|j| elsewhere.matches(j)).count(), 0);
    }

    #[test]
    fn pages_follow_each_other_to_the_end() {
        let first = page(0..7, 0, 3);
        assert_eq!(
            (first.items, first.matched, first.next_offset),
            (vec![0, 1, 2], 7, Some(3))
        );
        let last = page(0..7, 6, 3);
        assert_eq!((last.items, last.next_offset), (vec![6], None));
        let beyond = page(0..7, 9, 3);
        assert_eq!((beyond.items, beyond.next_offset), (vec![], None));
    }
}

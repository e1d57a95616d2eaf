//! A pool's timelines as small SVG pictures, drawn on the server (no script, no framework):
//! runners by status stacked a bar per bucket, the share on the current image as a line over
//! them, and the refusals as a strip below. The last hour is drawn a minute a bar; the last
//! day a quarter hour a bar.
//!
//! Only numbers and the service's own status names go into the picture, so it is written as
//! text here and placed in the page unescaped; a bar's `<title>` says what it holds on hover.

use super::status::status_class;
use crate::domain::status::RunnerStatus;
use crate::domain::time::Millis;
use crate::domain::timeline::{PoolSample, buckets};
use std::fmt::Write;

const WIDTH: f64 = 240.0;
const RUNNERS_H: f64 = 40.0;
const REFUSALS_H: f64 = 12.0;
const GAP: f64 = 3.0;

/// One picture: its caption and its SVG.
#[derive(Clone, Debug)]
pub struct Timeline {
    pub caption: &'static str,
    pub svg: String,
}

/// The last hour and the last day of `samples`, ending at `now`.
pub fn timelines(samples: &[PoolSample], now: Millis) -> Vec<Timeline> {
    vec![
        Timeline {
            caption: "last hour",
            svg: draw(&buckets(samples, now, 60, 60)),
        },
        Timeline {
            caption: "last day",
            svg: draw(&buckets(samples, now, 900, 96)),
        },
    ]
}

/// Statuses bottom to top: healthy first, what needs attention on top.
fn stack_order() -> impl Iterator<Item = RunnerStatus> {
    RunnerStatus::ALL
        .into_iter()
        .filter(|s| *s != RunnerStatus::Revoked)
        .rev()
}

fn draw(buckets: &[Option<PoolSample>]) -> String {
    let n = buckets.len().max(1);
    let w = WIDTH / n as f64;
    let total = |s: &PoolSample| s.counts.values().sum::<i64>();
    let most = buckets
        .iter()
        .flatten()
        .map(total)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let most_refused = buckets
        .iter()
        .flatten()
        .map(|s| s.refusals)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let height = RUNNERS_H + GAP + REFUSALS_H;
    let mut svg = format!(
        r#"<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img">"#
    );
    let mut line = Vec::new();
    for (i, bucket) in buckets.iter().enumerate() {
        let x = i as f64 * w;
        let Some(s) = bucket else { continue };
        let mut y = RUNNERS_H;
        let mut title = String::new();
        for status in stack_order() {
            let count = s.counts.get(status.as_str()).copied().unwrap_or(0);
            if count == 0 {
                continue;
            }
            let h = count as f64 / most * RUNNERS_H;
            y -= h;
            let _ = write!(
                svg,
                r#"<rect class="t-{}" x="{x:.2}" y="{y:.2}" width="{w:.2}" height="{h:.2}"/>"#,
                status_class(status)
            );
            let _ = write!(title, "{} {count}, ", status.as_str());
        }
        let _ = write!(
            svg,
            r#"<rect class="t-hover" x="{x:.2}" y="0" width="{w:.2}" height="{RUNNERS_H}"><title>{}{} live, {} on a superseded image; {} refusals</title></rect>"#,
            title, s.live, s.drifted, s.refusals
        );
        if s.refusals > 0 {
            let h = s.refusals as f64 / most_refused * REFUSALS_H;
            let _ = write!(
                svg,
                r#"<rect class="t-refusals" x="{x:.2}" y="{:.2}" width="{w:.2}" height="{h:.2}"/>"#,
                height - h
            );
        }
        if s.live > 0 {
            let current = (s.live - s.drifted) as f64 / s.live as f64;
            line.push(format!(
                "{:.2},{:.2}",
                x + w / 2.0,
                RUNNERS_H * (1.0 - current)
            ));
        }
    }
    if line.len() > 1 {
        let _ = write!(
            svg,
            r#"<polyline class="t-roll" points="{}"/>"#,
            line.join(" ")
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::pool_name::PoolName;
    use std::collections::BTreeMap;

    #[test]
    fn a_picture_has_a_bar_per_sampled_bucket_and_says_what_it_holds() {
        let now = Millis::from_secs(10_000);
        let samples: Vec<PoolSample> = (0..3)
            .map(|i| PoolSample {
                pool: PoolName::parse("linux").unwrap(),
                at: now.minus_secs(60 * i),
                counts: BTreeMap::from([("healthy".into(), 3), ("probe_failed".into(), 1)]),
                refusals: i,
                live: 4,
                drifted: 1,
            })
            .collect();
        let t = timelines(&samples, now);
        assert_eq!(t.len(), 2);
        let hour = &t[0].svg;
        assert!(hour.starts_with("<svg class=\"timeline\""));
        assert_eq!(hour.matches("class=\"t-ok\"").count(), 3);
        assert_eq!(hour.matches("class=\"t-bad\"").count(), 3);
        assert!(hour.contains("<title>probe_failed 1, healthy 3, 4 live, 1 on a superseded image"));
        assert!(hour.contains("class=\"t-roll\""));
        assert_eq!(timelines(&[], now)[0].svg.matches("<rect").count(), 0);
    }
}

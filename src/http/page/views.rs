//! What the page shows, computed from domain values: one plain struct per thing on screen, so
//! templates only lay out and never decide.

use super::status::status_class;
use crate::domain::digest::ImageDigest;
use crate::domain::disk::{DiskFigure, human_bytes};
use crate::domain::fleet::PoolTally;
use crate::domain::github::registration::{Registration, State};
use crate::domain::pool::Pool;
use crate::domain::runner::Observed;
use crate::domain::runner::Runner;
use crate::domain::status::RunnerStatus;
use crate::domain::time::Millis;
use crate::domain::verdict::Refusal;
use crate::store::QueueDepth;

/// A digest shown short, with the full value on hover.
#[derive(Clone, Debug)]
pub struct DigestView {
    pub short: String,
    pub full: String,
}

impl From<&ImageDigest> for DigestView {
    fn from(d: &ImageDigest) -> Self {
        DigestView {
            short: d.short().to_string(),
            full: d.to_string(),
        }
    }
}

/// A GitHub registration as the runner's page shows it: each step's time, and how it ended.
#[derive(Clone, Debug)]
pub struct GithubLine {
    pub id: String,
    pub name: String,
    pub scope: String,
    pub state: &'static str,
    /// `ok` while it is in use or ended after its job, `bad` when it was withdrawn for a
    /// refusal, `warn` for the rest.
    pub class: &'static str,
    pub minted: String,
    pub online: String,
    pub busy: String,
    pub ended: String,
    /// How it ended, in words (empty while it has not).
    pub why: String,
}

pub fn github_line(r: &Registration) -> GithubLine {
    let at = |m: Option<Millis>| m.map(Millis::rfc3339).unwrap_or_default();
    let reason = r.end_reason.as_deref().unwrap_or("");
    let why = match reason {
        "" => String::new(),
        "done" => "after its job".into(),
        "unused" => "withdrawn: never came online".into(),
        "offline" => "withdrawn: its listener went away".into(),
        code => format!("withdrawn: runner refused ({code})"),
    };
    let class = match (r.state, reason) {
        (State::Deleted, "unused" | "offline") => "warn",
        (State::Deleted, _) => "bad",
        _ => "ok",
    };
    let mut why = why;
    if let Some(code) = &r.would_refuse {
        why = format!("minted while the pool observes (would refuse {code}) {why}");
    }
    GithubLine {
        id: r
            .github_runner_id
            .map_or_else(|| "-".to_string(), |id| id.to_string()),
        name: r.name.clone(),
        scope: r.scope.as_str().to_string(),
        state: r.state.as_str(),
        class,
        minted: r.minted_at.rfc3339(),
        online: at(r.online_at),
        busy: at(r.busy_at),
        ended: at(r.ended_at),
        why: why.trim().to_string(),
    }
}

/// A line of the runner's Buildkite section: a pause leasegate made, or a note on an agent
/// name (a failed call, somebody else's pause left alone, an observing pool's would-be pause).
pub struct BuildkiteLine {
    pub at: String,
    pub agent: String,
    pub what: String,
    /// `bad` for a failed call, `warn` for a pause in force, `ok` for the rest.
    pub class: &'static str,
    pub why: String,
}

/// The notes first (they are about now), then the pauses, newest first.
pub fn buildkite_lines(
    watches: &[crate::domain::buildkite::AgentWatch],
    pauses: &[crate::domain::buildkite::Pause],
) -> Vec<BuildkiteLine> {
    let at = |m: Option<Millis>| m.map(Millis::rfc3339).unwrap_or_default();
    let mut out = Vec::new();
    for w in watches {
        if let Some(error) = &w.error {
            out.push(BuildkiteLine {
                at: at(w.error_at),
                agent: w.agent_name.clone(),
                what: format!("call failed ({} in a row)", w.failures),
                class: "bad",
                why: format!("{error}; tried again at {}", at(w.next_try_at)),
            });
        }
        if let Some(by) = &w.left_alone {
            out.push(BuildkiteLine {
                at: at(w.checked_at),
                agent: w.agent_name.clone(),
                what: "left alone".into(),
                class: "warn",
                why: by.clone(),
            });
        }
        if let Some(code) = &w.observed_code {
            out.push(BuildkiteLine {
                at: String::new(),
                agent: w.agent_name.clone(),
                what: "would pause".into(),
                class: "warn",
                why: format!("the pool observes: not paused for {code}"),
            });
        }
    }
    for p in pauses {
        let (what, class) = match p.end {
            None => ("paused".to_string(), "warn"),
            Some(end) => (format!("paused, then {}", end.as_str()), "ok"),
        };
        out.push(BuildkiteLine {
            at: p.paused_at.rfc3339(),
            agent: format!("{} ({})", p.agent_name, p.agent_id),
            what,
            class,
            why: match p.ended_at {
                Some(e) => format!("{} — ended {}", p.note, e.rfc3339()),
                None => format!("{} — until {}", p.note, p.until.rfc3339()),
            },
        });
    }
    out
}

/// "12 s ago", "3 min ago", "2 h ago", "4 d ago".
pub fn age(then: Millis, now: Millis) -> String {
    let s = now.secs_since(then).max(0);
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// An age to the minute ("under a minute ago", "3 min ago"): what the fleet table needs, and
/// steady while a runner heartbeats, so that a refresh of a steady fleet is the same page
/// (and answers `304`). The runner's own page gives the second.
pub fn coarse_age(then: Millis, now: Millis) -> String {
    if now.secs_since(then) < 60 {
        "under a minute ago".into()
    } else {
        age(then, now)
    }
}

fn duration(secs: i64) -> String {
    match secs.max(0) {
        s @ 0..120 => format!("{s} s"),
        s @ 120..7200 => format!("{} min", s / 60),
        s => format!("{} h", s / 3600),
    }
}

#[derive(Clone, Debug)]
pub struct StatusCount {
    pub status: &'static str,
    pub class: &'static str,
    pub count: usize,
}

#[derive(Clone, Debug)]
pub struct RollView {
    pub on_new: usize,
    pub total: usize,
    pub time_left: String,
}

#[derive(Clone, Debug)]
pub struct PoolCard {
    pub name: String,
    pub image_ref: String,
    pub policy: &'static str,
    pub expected: Vec<DigestView>,
    pub counts: Vec<StatusCount>,
    pub queued: i64,
    pub oldest_queued: Option<String>,
    pub roll: Option<RollView>,
    pub resolution_error: Option<String>,
    /// Jobs wait and no runner of the pool may take one: the on-call's first question.
    pub stuck: bool,
    /// The last hour and the last day, drawn.
    pub timelines: Vec<super::timeline::Timeline>,
    /// Runners under the pool's disk warning line.
    pub disk_warned: usize,
}

#[derive(Clone, Debug, Default)]
pub struct RunnerRow {
    pub id: String,
    pub name: String,
    /// The runner as a confirmation dialog names it: name, pool, id, and, for a name with
    /// characters beyond ASCII, their code points, so that a look-alike (a Cyrillic `а` for a
    /// Latin `a`) cannot pass for the runner meant.
    pub confirm_label: String,
    pub simulated: bool,
    pub pool: String,
    pub status: &'static str,
    pub class: &'static str,
    pub rank: RunnerStatus,
    pub last_seen: String,
    pub runtime: String,
    pub detail: Option<String>,
    /// The runtime's words when the probe failed but another reason (a cordon, say) is shown.
    pub probe_error: Option<String>,
    pub running: Option<DigestView>,
    pub image_current: Option<bool>,
    pub current_job: Option<String>,
    pub refusals_last_hour: i64,
    pub cordoned: bool,
    pub revoked: bool,
    /// The host and agent version its latest attestation named.
    pub host: Option<String>,
    pub agent_version: Option<String>,
    pub labels: Vec<(String, String)>,
    /// A second fact the status word would hide: a cordoned (or quarantined) runner whose
    /// runtime is broken too is "cordoned · probe failed"; a healthy one the ejection rule
    /// called for and spared is "healthy · would eject".
    pub also: Option<&'static str>,
    /// Since when its probe has been failing, when it is.
    pub failing_since: Option<String>,
    /// Each filesystem its latest probe measured, in one line.
    pub disk: Vec<String>,
    /// Why its disk is under its pool's warning line, when it is.
    pub disk_warning: Option<String>,
    /// Its several images: ref, labels, image id (short, whole), and how its pool sees it.
    pub images: Vec<ImageRow>,
}

#[derive(Clone, Debug, Default)]
pub struct ImageRow {
    pub image_ref: String,
    pub labels: String,
    pub running: Option<DigestView>,
    /// `current`, `superseded`, `absent`, `absent (accepted)`, `unresolved` (its entry has
    /// no set yet) or `not described`.
    pub standing: &'static str,
    pub class: &'static str,
}

impl ImageRow {
    /// Whether the fleet table lists it: what needs attention; the current ones are counted.
    pub fn needs_attention(&self) -> bool {
        self.standing != "current"
    }
}

pub fn is_simulated(runner: &Runner) -> bool {
    runner.labels.get("simulated").is_some_and(|v| v == "true")
}

/// A runner's several images as its pool sees them.
pub fn image_rows(runner: &Runner, pool: &Pool) -> Vec<ImageRow> {
    let Some(latest) = runner.latest.as_ref() else {
        return Vec::new();
    };
    latest
        .state
        .images
        .iter()
        .map(|i| {
            let entry = pool.images.iter().find(|d| d.image_ref == i.image_ref);
            let current = crate::domain::images::current(std::slice::from_ref(i), &pool.images);
            let (standing, class) = match (i.absent, entry, current) {
                (_, Some(e), _) if !e.is_resolved() => ("unresolved", "off"),
                (true, _, Some(true)) => ("absent (accepted)", "off"),
                (true, _, _) => ("absent", "bad"),
                (false, None, _) => ("not described", "off"),
                (false, Some(_), Some(false)) => ("superseded", "bad"),
                (false, Some(_), _) => ("current", "ok"),
            };
            ImageRow {
                image_ref: i.image_ref.clone(),
                labels: i.labels.join(", "),
                running: i.id.as_ref().map(DigestView::from),
                standing,
                class,
            }
        })
        .collect()
}

pub fn runner_row(runner: &Runner, observed: &Observed, refusals: i64, now: Millis) -> RunnerRow {
    let latest = runner.latest.as_ref();
    let probe = latest.map(|l| &l.state.probe);
    RunnerRow {
        id: runner.id.to_string(),
        name: runner.name.clone(),
        confirm_label: confirm_label(runner),
        simulated: is_simulated(runner),
        pool: runner.pool.to_string(),
        status: observed.status.as_str(),
        class: status_class(observed.status),
        rank: observed.status,
        last_seen: latest.map_or_else(|| "never".to_string(), |l| coarse_age(l.received_at, now)),
        runtime: probe.map_or_else(String::new, |p| match &p.runtime_version {
            Some(v) => format!("{} {v}", p.runtime),
            None => p.runtime.clone(),
        }),
        detail: observed
            .refusal
            .as_ref()
            .map(refusal_in_words)
            .or_else(|| probe.and_then(|p| p.error.clone()))
            .or_else(|| refused_since_latest(runner, now))
            .or_else(|| silent_for(runner, observed.status, now)),
        probe_error: probe
            .filter(|p| !p.ok && observed.status != RunnerStatus::ProbeFailed)
            .map(|p| {
                format!(
                    "cannot run a container with {}: {}",
                    p.runtime,
                    p.error.clone().unwrap_or_default()
                )
            }),
        running: latest.and_then(|l| l.state.image.id.as_ref().map(DigestView::from)),
        image_current: observed.image_current,
        current_job: runner.current_lease.as_ref().map(|l| l.job_id.to_string()),
        refusals_last_hour: refusals,
        cordoned: runner.gate.cordoned,
        revoked: runner.is_revoked(),
        host: runner.agent.host.clone(),
        agent_version: runner.agent.version.clone(),
        labels: runner.labels.clone().into_iter().collect(),
        also: probe
            .filter(|p| !p.ok && observed.status != RunnerStatus::ProbeFailed)
            .map(|_| "probe failed")
            .or_else(|| {
                let e = &runner.ejection;
                if e.ejected.is_some() && observed.status != RunnerStatus::Ejected {
                    Some("ejected")
                } else if e.would_eject.is_some() {
                    Some("would eject")
                } else {
                    None
                }
            }),
        failing_since: None,
        disk: probe.map_or_else(Vec::new, |p| p.disk.iter().map(disk_line).collect()),
        disk_warning: observed.disk_warning.clone(),
        images: Vec::new(),
    }
}

/// `71.3 GiB free of 250 GiB on /var/lib/containers/storage (storage), 97% of inodes free`.
fn disk_line(d: &DiskFigure) -> String {
    let mut line = format!(
        "{} free of {} on {}",
        human_bytes(d.free_bytes),
        human_bytes(d.total_bytes),
        d.path
    );
    if let Some(role) = &d.role {
        line.push_str(&format!(" ({role})"));
    }
    if let Some(p) = d.free_inodes_percent() {
        line.push_str(&format!(", {p}% of inodes free"));
    }
    line
}

/// A refusal as the table says it: digests short (the running image's cell and the pool's
/// card carry them whole, on hover and to copy), so that a drift reads in one line.
fn refusal_in_words(refusal: &Refusal) -> String {
    match refusal {
        Refusal::ImageDrift { running, expected } => {
            let short = |d: &str| {
                ImageDigest::parse(d).map_or_else(|_| d.to_string(), |d| d.short().to_string())
            };
            let expected: Vec<String> = expected.iter().map(|d| short(d.as_str())).collect();
            format!(
                "runs {} but its pool expects {}",
                short(running),
                expected.join(" or ")
            )
        }
        other => other.detail(),
    }
}

/// For a stale runner with nothing else to say: how long it has been silent.
fn silent_for(runner: &Runner, status: RunnerStatus, now: Millis) -> Option<String> {
    let latest = runner
        .latest
        .as_ref()
        .filter(|_| status == RunnerStatus::Stale)?;
    let quiet = coarse_age(latest.received_at, now).replace(" ago", "");
    Some(format!(
        "silent for {quiet}: no attestation has arrived since"
    ))
}

/// Why a runner that went silent is silent, when the gate refused what it sent since its
/// latest accepted attestation (its clock, most often).
fn refused_since_latest(runner: &Runner, now: Millis) -> Option<String> {
    let r = runner.last_rejection.as_ref()?;
    let accepted = runner.latest.as_ref().map(|l| l.received_at);
    (accepted < Some(r.at)).then(|| {
        format!(
            "its attestations are refused ({}, {}): {}",
            r.code,
            age(r.at, now),
            r.detail
        )
    })
}

fn confirm_label(runner: &Runner) -> String {
    let mut label = format!("{} (pool {}, id {})", runner.name, runner.pool, runner.id);
    let beyond_ascii: Vec<String> = runner
        .name
        .chars()
        .filter(|c| !c.is_ascii())
        .map(|c| format!("U+{:04X}", u32::from(c)))
        .collect();
    if !beyond_ascii.is_empty() {
        label.push_str(&format!(
            "; the name has characters beyond ASCII: {}",
            beyond_ascii.join(" ")
        ));
    }
    label
}

pub fn pool_card(
    pool: &Pool,
    tally: Option<&PoolTally>,
    depth: QueueDepth,
    now: Millis,
) -> PoolCard {
    let empty = PoolTally::default();
    let tally = tally.unwrap_or(&empty);
    let roll = pool
        .previous_valid_until
        .filter(|_| pool.previous_in_grace(now))
        .map(|until| RollView {
            on_new: tally.on_current,
            total: tally.reporting,
            time_left: duration(until.secs_since(now)),
        });
    PoolCard {
        name: pool.name.to_string(),
        image_ref: pool.image_ref.clone().unwrap_or_default(),
        policy: pool.image_policy.as_str(),
        expected: pool
            .expected_image_ids
            .iter()
            .map(DigestView::from)
            .collect(),
        counts: tally
            .by_status
            .iter()
            .map(|(s, count)| StatusCount {
                status: s.as_str(),
                class: status_class(*s),
                count: *count,
            })
            .collect(),
        stuck: depth.queued > 0 && tally.healthy() == 0,
        timelines: Vec::new(),
        queued: depth.queued,
        // To the minute, as the table's ages: a refresh a second later is the same view.
        oldest_queued: depth
            .oldest_queued_at
            .map(|t| coarse_age(t, now).replace(" ago", "")),
        roll,
        resolution_error: pool
            .last_resolution
            .as_ref()
            .filter(|r| !r.ok)
            .and_then(|r| r.error.clone()),
        disk_warned: tally.disk_warned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drift_reads_in_one_line_with_short_digests() {
        let d = crate::domain::fixtures::digest;
        let drift = Refusal::ImageDrift {
            running: d('b').to_string(),
            expected: vec![d('a'), d('c')],
        };
        assert_eq!(
            refusal_in_words(&drift),
            "runs bbbbbbbbbbbb but its pool expects aaaaaaaaaaaa or cccccccccccc"
        );
    }

    #[test]
    fn a_stale_runner_says_how_long_it_has_been_silent() {
        use crate::domain::attestation::{Probe, RunningImage};
        use crate::domain::ids::RunnerId;
        use crate::domain::pool_name::PoolName;
        use crate::domain::runner::LatestAttestation;
        use crate::domain::verdict::{AttestedState, GateState};
        let now = Millis(1_900_000_000_000);
        let runner = Runner {
            id: RunnerId("r".into()),
            name: "r".into(),
            pool: PoolName::parse("linux").unwrap(),
            labels: Default::default(),
            public_key_x: String::new(),
            gate: GateState::default(),
            revoked_at: None,
            registered_at: now.minus_secs(3600),
            latest: Some(LatestAttestation {
                received_at: now.minus_secs(400),
                state: AttestedState {
                    probe: Probe {
                        ok: true,
                        runtime: "podman".into(),
                        runtime_version: None,
                        checked_at: now.minus_secs(400),
                        error: None,
                        exit_code: None,
                        disk: Vec::new(),
                    },
                    image: RunningImage {
                        id: None,
                        digest: None,
                        image_ref: None,
                    },
                    images: Vec::new(),
                },
            }),
            current_lease: None,
            forge_runners: vec![],
            forge_runners_taken: vec![],
            last_rejection: None,
            agent: Default::default(),
            ejection: Default::default(),
        };
        assert_eq!(
            silent_for(&runner, RunnerStatus::Stale, now).as_deref(),
            Some("silent for 6 min: no attestation has arrived since")
        );
        assert_eq!(silent_for(&runner, RunnerStatus::Healthy, now), None);
    }

    #[test]
    fn ages_read_naturally() {
        let now = Millis(1_000_000_000);
        assert_eq!(age(now.minus_secs(5), now), "5 s ago");
        assert_eq!(age(now.minus_secs(125), now), "2 min ago");
        assert_eq!(age(now.minus_secs(7300), now), "2 h ago");
        assert_eq!(age(now.minus_secs(200_000), now), "2 d ago");
    }
}

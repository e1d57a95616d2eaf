//! What an accepted attestation writes: the pure bookkeeping of a write round.
//!
//! In the common case a heartbeat is one row update: its runner's latest attestation, kept in
//! place with the runner's recent jtis (`RecentJtis`, rule 5) and the run of refusals it is in.
//! The history is written only when it says something: an attestation is kept in the ring
//! (`attestation_history`, 20 per runner) when its status, probe, runtime version or image
//! changed, and otherwise one every `SAMPLE_INTERVAL_S`; a refusal opens an entry of the
//! refusal ring (50 per runner) when its code differs from the run it would continue, and the
//! open entry's count and last time are brought up to date every `REFUSAL_SYNC_S` (the row
//! always has them exact). A status change is written when the status changes.
//!
//! `plan` computes all of it from the runners' stored rows and the round's attestations in
//! arrival order; `store::sql::round` reads those rows and writes the plan, and nothing else.
//! Whether a probe lifts a quarantine is the verdict's rule (`GateState::quarantine_lifted_by`),
//! asked here too so that the gate and the record never disagree.

use super::ids::RunnerId;
use super::status::RunnerStatus;
use super::time::Millis;
use super::verdict::{AttestedState, GateState};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};

/// How many attestations and refusals are kept per runner (rings), and status changes.
pub const ATTESTATION_HISTORY: i64 = 20;
pub const REFUSAL_HISTORY: i64 = 50;
pub const STATUS_CHANGE_HISTORY: i64 = 100;

/// An attestation that passed rules 1–4, with the verdict it earned, to be recorded.
#[derive(Clone, Debug)]
pub struct AttestationRecord {
    pub runner_id: RunnerId,
    pub jti: String,
    /// Until when the jti must be remembered.
    pub replay_until: Millis,
    pub received_at: Millis,
    pub state: AttestedState,
    /// The attestation's `agent` object as the JSON text stored, made where the request is
    /// handled rather than in the round (on PostgreSQL, the one thread every round waits for).
    pub agent: Option<String>,
    /// The status this attestation gives the runner (for history and status changes).
    pub status: RunnerStatus,
    /// The refusal to record, for a lease or gate check refused under rules 7–13.
    pub refusal: Option<(String, String)>,
    /// The cordon, quarantine and ejection it was judged by (`status`, `refusal`): the
    /// cache's, which the round checks against the row it reads (`Plan::stale`).
    pub judged_gate: GateState,
}

/// Rules 5 and 6, decided inside the round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    Replayed,
    Revoked,
    /// Its replay window had ended by the time its round was planned: its jti may have been
    /// forgotten already (`FORGET_AFTER`), so it could not be told from a replay. Its runner
    /// attests again.
    Expired,
    /// Neither taken nor refused: found replayed in a round written again after its first
    /// write's answer was lost with its connection, it may be that write's own, which may have
    /// committed (`store::group_commit`). Its runner attests again.
    Undecided,
}

/// How many unexpired jtis a runner's row keeps before it spills into `seen_jtis`: a
/// heartbeat every 15 s and a long poll every 30 s leave about 10 in a window of 90 s and
/// the 15 s a jti is kept beyond it (`FORGET_AFTER`).
pub const IN_ROW: usize = 12;

/// How long after its replay window ends a jti is forgotten (dropped from its runner's row,
/// purged from `seen_jtis`). A round refuses every attestation whose window ended before the
/// round was planned (`Rejection::Expired`), by the clock of the replica that plans it; a jti
/// is forgotten by the clock of the replica that writes or sweeps. The margin is what the
/// replicas' clocks may differ by before a replay of a forgotten jti could pass one replica's
/// check after another forgot it.
pub const FORGET_AFTER: Millis = Millis(15_000);

/// Before when a jti's window must have ended for it to be forgotten at `now`: the one rule
/// for a row's jtis (`RecentJtis::prune`) and the spilled ones (`replay::purge`).
pub fn forget_before(now: Millis) -> Millis {
    Millis(now.0 - FORGET_AFTER.0)
}

/// The clock rounds are planned by and jtis forgotten by (`plan`'s `now`, `replay::purge`'s):
/// the system clock, never read in this process as earlier than it once was. A clock stepped
/// back (a service started before its host's time was synchronised, then corrected) would
/// otherwise find open again windows whose jtis it had already forgotten, and take a replay
/// of one. Read so, the step is time standing still until the clock catches up: an
/// attestation whose window ends before then is refused as expired (its runner attests
/// again), and nothing forgotten comes back.
pub fn forgetting_now() -> Millis {
    static LATEST: AtomicI64 = AtomicI64::new(i64::MIN);
    never_back(&LATEST, Millis::now())
}

/// `now`, or the latest reading `latest` holds when that is later; `latest` keeps the later.
fn never_back(latest: &AtomicI64, now: Millis) -> Millis {
    Millis(latest.fetch_max(now.0, Ordering::Relaxed).max(now.0))
}

/// What a jti is remembered as.
pub fn jti_key(jti: &str) -> String {
    hex::encode(&Sha256::digest(jti.as_bytes())[..8])
}

/// A runner's remembered jtis, oldest expiry first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecentJtis(Vec<(Millis, String)>);

impl RecentJtis {
    /// The stored form, read; entries that do not parse are dropped (they can only be stale).
    pub fn parse(stored: &str) -> Self {
        let mut entries: Vec<(Millis, String)> = stored
            .split_ascii_whitespace()
            .filter_map(|e| {
                let (exp, key) = e.split_once(':')?;
                Some((Millis(exp.parse().ok()?), key.to_string()))
            })
            .collect();
        entries.sort();
        RecentJtis(entries)
    }

    /// The stored form. Written into one string: every heartbeat's round formats its
    /// runner's, on the one thread PostgreSQL's rounds wait for.
    pub fn format(&self) -> String {
        use std::fmt::Write;
        // An expiry's 13 digits, a colon, a key's 16 hex digits and a space.
        let mut stored = String::with_capacity(self.0.len() * 31);
        for (exp, key) in &self.0 {
            if !stored.is_empty() {
                stored.push(' ');
            }
            write!(stored, "{}:{key}", exp.0).expect("writing to a String cannot fail");
        }
        stored
    }

    pub fn contains(&self, key: &str) -> bool {
        self.0.iter().any(|(_, k)| k == key)
    }

    /// Forgets what expired more than `FORGET_AFTER` before `now`.
    pub fn prune(&mut self, now: Millis) {
        let forget_before = forget_before(now);
        self.0.retain(|(exp, _)| *exp >= forget_before);
    }

    /// Remembers `key` until `until`; the entries that no longer fit, to spill.
    pub fn remember(&mut self, key: String, until: Millis) -> Vec<(Millis, String)> {
        self.0.push((until, key));
        self.0.sort();
        let over = self.0.len().saturating_sub(IN_ROW);
        self.0.drain(..over).collect()
    }
}

/// One kept attestation every this long, when nothing changed.
pub const SAMPLE_INTERVAL_S: i64 = 300;

/// How often an open refusal entry's count and last time are written to the ring.
pub const REFUSAL_SYNC_S: i64 = 60;

/// The run of refusals a runner is in, as its row keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefusalRun {
    /// The ring entry of the run (`refusal_seq`).
    pub seq: i64,
    /// `None`: the runner is in no run (its last verdict allowed it, or it was never refused).
    pub code: Option<String>,
    pub detail: Option<String>,
    pub count: i64,
    pub first_at: Option<Millis>,
    pub last_at: Option<Millis>,
    /// When the ring's entry of the run was last brought up to date.
    pub synced_at: Option<Millis>,
}

/// One write of the refusal ring: an entry opened or brought up to date.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusalWrite {
    pub seq: i64,
    pub code: String,
    pub detail: String,
    pub count: i64,
    pub first_at: Millis,
    pub last_at: Millis,
}

impl RefusalRun {
    fn entry(&self) -> Option<RefusalWrite> {
        Some(RefusalWrite {
            seq: self.seq,
            code: self.code.clone()?,
            detail: self.detail.clone().unwrap_or_default(),
            count: self.count,
            first_at: self.first_at?,
            last_at: self.last_at?,
        })
    }

    fn unsynced(&self) -> bool {
        self.code.is_some() && self.last_at > self.synced_at
    }

    /// A refusal with `code` at `at`: the run goes on (its entry written when a sync is due),
    /// or a new one opens (the old one's entry brought up to date first).
    pub fn refused(&mut self, code: &str, detail: &str, at: Millis) -> Vec<RefusalWrite> {
        let mut writes = Vec::new();
        if self.code.as_deref() == Some(code) {
            self.count += 1;
            self.last_at = Some(at);
            self.detail = Some(detail.to_string());
            if self
                .synced_at
                .is_none_or(|s| at.secs_since(s) >= REFUSAL_SYNC_S)
            {
                writes.extend(self.entry());
                self.synced_at = Some(at);
            }
            return writes;
        }
        if self.unsynced() {
            writes.extend(self.entry());
        }
        *self = RefusalRun {
            seq: self.seq + 1,
            code: Some(code.to_string()),
            detail: Some(detail.to_string()),
            count: 1,
            first_at: Some(at),
            last_at: Some(at),
            synced_at: Some(at),
        };
        writes.extend(self.entry());
        writes
    }

    /// The runner may lease again: the run ends, its entry brought up to date.
    pub fn ended(&mut self) -> Vec<RefusalWrite> {
        let writes: Vec<RefusalWrite> = if self.unsynced() {
            self.entry().into_iter().collect()
        } else {
            Vec::new()
        };
        self.code = None;
        writes
    }
}

/// The facts of a runner's latest attestation that decide whether a new one is worth keeping
/// in the history ring.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sampled {
    pub status: Option<String>,
    pub probe_ok: Option<bool>,
    pub probe_error: Option<String>,
    pub runtime_version: Option<String>,
    pub image_id: Option<String>,
    pub image_digest: Option<String>,
}

impl Sampled {
    fn of(rec: &AttestationRecord) -> Self {
        let probe = &rec.state.probe;
        Sampled {
            status: Some(rec.status.as_str().to_string()),
            probe_ok: Some(probe.ok),
            probe_error: probe.error.clone(),
            runtime_version: probe.runtime_version.clone(),
            image_id: rec.state.image.id.as_ref().map(|d| d.to_string()),
            image_digest: rec.state.image.digest.as_ref().map(|d| d.to_string()),
        }
    }
}

/// The fields of a runner's row that a round reads (under a row lock on PostgreSQL).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunnerRow {
    /// The history ring's counter: kept attestations.
    pub attestation_seq: i64,
    pub quarantined_at: Option<Millis>,
    /// The ejection in force ends at; lifted by a passing probe checked after it.
    pub ejected_until: Option<Millis>,
    pub revoked: bool,
    pub cordoned: bool,
    pub recent_jtis: RecentJtis,
    pub jtis_spilled_until: Option<Millis>,
    pub history_sampled_at: Option<Millis>,
    pub latest: Sampled,
    pub refusals: RefusalRun,
}

impl RunnerRow {
    /// May this runner be given a job now? (Rule 6, the operator's cordon and an ejection,
    /// as stored; `released`: the round's own attestation ended the ejection.)
    pub fn may_claim(&self, released: bool) -> bool {
        !self.revoked && !self.cordoned && (self.ejected_until.is_none() || released)
    }

    /// Whether this row holds the cordon, quarantine and ejection `gate` says.
    pub fn holds(&self, gate: &GateState) -> bool {
        self.cordoned == gate.cordoned
            && self.quarantined_at == gate.quarantined_at
            && self.ejected_until == gate.ejection.as_ref().map(|e| e.until)
    }
}

/// A runner's row after the round's attestations.
#[derive(Debug)]
pub struct RunnerUpdate<'a> {
    pub runner_id: &'a RunnerId,
    pub latest: &'a AttestationRecord,
    pub row: RunnerRow,
    /// The latest attestation's agent facts, as the JSON text stored.
    pub agent: Option<&'a str>,
}

impl RunnerUpdate<'_> {
    /// Whether what the gate holds of the runner, as the row was `before`, is out of date: the
    /// round lifted a quarantine or an ejection, or the latest attestation's facts or status
    /// changed (what the forge gate judges). An attestation that only repeats the previous
    /// one's facts, later, changes nothing the gate would judge otherwise but its age.
    pub fn changes_gate(&self, before: &RunnerRow) -> bool {
        (before.quarantined_at.is_some() && self.row.quarantined_at.is_none())
            || self.releases(before)
            || self.row.latest != before.latest
    }

    /// Whether the round ended the ejection the row held `before`: the runner may claim in
    /// this very round.
    pub fn releases(&self, before: &RunnerRow) -> bool {
        before.ejected_until.is_some() && self.row.ejected_until.is_none()
    }
}

/// One attestation-history ring entry.
#[derive(Debug)]
pub struct HistoryEntry<'a> {
    pub slot: i64,
    pub seq: i64,
    pub record: &'a AttestationRecord,
}

#[derive(Debug, PartialEq, Eq)]
pub struct StatusChangeEntry<'a> {
    pub runner_id: &'a RunnerId,
    pub at: Millis,
    pub from: Option<String>,
    pub to: &'static str,
    pub detail: Option<&'a str>,
}

/// Everything a round writes for its attestations, and what became of each.
#[derive(Debug, Default)]
pub struct Plan<'a> {
    /// Per attestation, by its index in the round: accepted, or why not.
    pub verdicts: BTreeMap<usize, Result<(), Rejection>>,
    pub updates: Vec<RunnerUpdate<'a>>,
    pub history: Vec<HistoryEntry<'a>>,
    pub status_changes: Vec<StatusChangeEntry<'a>>,
    pub refusals: Vec<(&'a RunnerId, RefusalWrite)>,
    /// jtis that no longer fit their runner's row, for `seen_jtis`.
    pub spills: Vec<(&'a RunnerId, Millis, String)>,
    /// Attestations accepted that were judged by a cordon, quarantine or ejection their
    /// runner's row, as read, no longer holds: the cache they were judged from missed a change
    /// (a notification lost), and their runners' entries are forgotten rather than renewed by
    /// the round (`group_commit`), so that the next attestation is judged by the row.
    pub stale: BTreeSet<usize>,
}

/// The writes of `attestations` (index in the round, record; in arrival order), from each
/// runner's stored row and the jtis `seen_jtis` holds for spilled runners.
///
/// Rule 5 comes first (a revoked runner's replayed jti is a replay), then rule 6. A runner may
/// appear several times in one round: its state advances once per attestation and the row
/// keeps the last one; a jti twice in a round is accepted for the first and a replay for the
/// second. A passing probe checked after the quarantine lifts it, as it would one attestation
/// at a time.
///
/// `now` is when the round is planned, by the planning replica's clock; the rows' jtis are
/// pruned by it, not by the attestations' own stamps, which another replica's clock made. An
/// attestation whose replay window ended before `now` is refused (`Rejection::Expired`) before
/// anything else is asked of it: a request can wait between its admission and its round (a
/// stalled lane, a lock), and meanwhile another attestation of the runner, or the sweeper, may
/// have forgotten the jti it repeats (`FORGET_AFTER`); forgotten only after its window ended,
/// a jti is then never asked of a round that would accept it.
pub fn plan<'a>(
    rows: &BTreeMap<RunnerId, RunnerRow>,
    attestations: &[(usize, &'a AttestationRecord)],
    spilled: &HashSet<(RunnerId, String)>,
    now: Millis,
) -> Plan<'a> {
    let mut plan = Plan::default();
    // Each runner's row as the round's attestations leave it, and its latest accepted one.
    let mut state: BTreeMap<&RunnerId, (RunnerRow, Option<&'a AttestationRecord>)> =
        BTreeMap::new();
    let mut history: BTreeMap<&RunnerId, VecDeque<HistoryEntry<'a>>> = BTreeMap::new();
    for &(i, rec) in attestations {
        let runner_id = &rec.runner_id;
        let Some(stored) = rows.get(runner_id) else {
            plan.verdicts.insert(i, Err(Rejection::Revoked));
            continue;
        };
        if rec.replay_until < now {
            plan.verdicts.insert(i, Err(Rejection::Expired));
            continue;
        }
        let (row, latest) = state
            .entry(runner_id)
            .or_insert_with(|| (stored.clone(), None));
        let key = jti_key(&rec.jti);
        row.recent_jtis.prune(now);
        // A key this round spilled out of the row (an attestation before this one pushed it
        // out, or it was the oldest when it came in) is not in `spilled`, read before the
        // round: it is asked of the round's own spills.
        // `spilled` is empty when the round was planned from the rows a lane knows (its
        // write asks the table instead): no key is built to look it up then.
        let replayed = row.recent_jtis.contains(&key)
            || (!spilled.is_empty()
                && (spilled.contains(&(runner_id.clone(), key.clone()))
                    || spilled.contains(&(runner_id.clone(), rec.jti.clone()))))
            || plan
                .spills
                .iter()
                .any(|(r, _, k)| *r == runner_id && *k == key);
        if replayed {
            plan.verdicts.insert(i, Err(Rejection::Replayed));
            continue;
        }
        if row.revoked {
            plan.verdicts.insert(i, Err(Rejection::Revoked));
            continue;
        }
        plan.verdicts.insert(i, Ok(()));
        if !stored.holds(&rec.judged_gate) {
            plan.stale.insert(i);
        }
        for (until, spilled_key) in row.recent_jtis.remember(key, rec.replay_until) {
            row.jtis_spilled_until = row.jtis_spilled_until.max(Some(until));
            plan.spills.push((runner_id, until, spilled_key));
        }

        let sampled = Sampled::of(rec);
        let status = rec.status.as_str();
        if row.latest.status.as_deref() != Some(status) {
            plan.status_changes.push(StatusChangeEntry {
                runner_id,
                at: rec.received_at,
                from: row.latest.status.clone(),
                to: status,
                detail: rec.refusal.as_ref().map(|(_, d)| d.as_str()).or(rec
                    .state
                    .probe
                    .error
                    .as_deref()),
            });
        }
        let sample_due = row
            .history_sampled_at
            .is_none_or(|at| rec.received_at.secs_since(at) >= SAMPLE_INTERVAL_S);
        if sampled != row.latest || sample_due {
            row.attestation_seq += 1;
            row.history_sampled_at = Some(rec.received_at);
            let ring = history.entry(runner_id).or_default();
            push_ring(
                ring,
                ATTESTATION_HISTORY,
                HistoryEntry {
                    slot: row.attestation_seq % ATTESTATION_HISTORY,
                    seq: row.attestation_seq,
                    record: rec,
                },
            );
        }
        row.latest = sampled;

        let probe = &rec.state.probe;
        let gate = GateState {
            quarantined_at: row.quarantined_at,
            ..GateState::default()
        };
        if gate.quarantine_lifted_by(probe) {
            row.quarantined_at = None;
        }
        if row
            .ejected_until
            .is_some_and(|until| rec.received_at >= until && probe.ok && until < probe.checked_at)
        {
            row.ejected_until = None;
        }
        let writes = match &rec.refusal {
            Some((code, detail)) => row.refusals.refused(code, detail, rec.received_at),
            None if rec.status == RunnerStatus::Healthy => row.refusals.ended(),
            None => Vec::new(),
        };
        plan.refusals
            .extend(writes.into_iter().map(|w| (runner_id, w)));
        *latest = Some(rec);
    }
    for (runner_id, (row, latest)) in state {
        // No attestation of this runner was accepted: nothing of it is written.
        let Some(latest) = latest else { continue };
        plan.updates.push(RunnerUpdate {
            runner_id,
            latest,
            agent: latest.agent.as_deref(),
            row,
        });
    }
    for (_, ring) in history {
        plan.history.extend(ring);
    }
    // A ring entry written twice in one round keeps its last write only.
    let mut last: BTreeMap<(&RunnerId, i64), usize> = BTreeMap::new();
    for (n, (r, w)) in plan.refusals.iter().enumerate() {
        last.insert((r, w.seq), n);
    }
    let keep: BTreeSet<usize> = last.into_values().collect();
    plan.refusals = plan
        .refusals
        .into_iter()
        .enumerate()
        .filter(|(n, _)| keep.contains(n))
        .map(|(_, w)| w)
        .collect();
    plan
}

/// Keeps the newest `capacity` entries: older ones would be overwritten in the same round.
fn push_ring<T>(ring: &mut VecDeque<T>, capacity: i64, entry: T) {
    if ring.len() as i64 == capacity {
        ring.pop_front();
    }
    ring.push_back(entry);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::attestation::{Probe, RunningImage};

    #[test]
    fn the_row_keeps_recent_jtis_and_spills_the_oldest_past_its_room() {
        let mut recent = RecentJtis::default();
        let mut spilled = Vec::new();
        for i in 0..(IN_ROW as i64 + 3) {
            spilled.extend(recent.remember(jti_key(&format!("j{i}")), Millis(1_000 + i)));
        }
        assert_eq!(spilled.len(), 3);
        assert_eq!(spilled[0], (Millis(1_000), jti_key("j0")));
        assert!(recent.contains(&jti_key("j5")) && !recent.contains(&jti_key("j0")));
        let again = RecentJtis::parse(&recent.format());
        assert_eq!(again, recent);
        // Kept until `FORGET_AFTER` past its expiry, then forgotten.
        recent.prune(Millis(1_009 + FORGET_AFTER.0));
        assert!(recent.contains(&jti_key("j9")));
        recent.prune(Millis(1_010 + FORGET_AFTER.0));
        assert!(!recent.contains(&jti_key("j9")) && recent.contains(&jti_key("j10")));
        assert_eq!(
            RecentJtis::parse("garbage 12:abc"),
            RecentJtis(vec![(Millis(12), "abc".into())])
        );
        // The stored form, as rows written by earlier versions hold it.
        assert_eq!(
            RecentJtis(vec![(Millis(12), "abc".into()), (Millis(34), "def".into())]).format(),
            "12:abc 34:def"
        );
        assert_eq!(RecentJtis::default().format(), "");
        assert_eq!(jti_key("x").len(), 16);
    }

    fn record(runner: &str, jti: &str, at: i64, ok: bool, refusal: bool) -> AttestationRecord {
        AttestationRecord {
            runner_id: RunnerId(runner.into()),
            jti: jti.into(),
            replay_until: Millis(at + 60_000),
            received_at: Millis(at),
            state: AttestedState {
                probe: Probe {
                    ok,
                    runtime: "podman".into(),
                    runtime_version: None,
                    checked_at: Millis(at),
                    error: (!ok).then(|| "crun not found".into()),
                    exit_code: None,
                    disk: Vec::new(),
                },
                image: RunningImage::default(),
                images: Vec::new(),
            },
            agent: None,
            status: if ok {
                RunnerStatus::Healthy
            } else {
                RunnerStatus::ProbeFailed
            },
            refusal: refusal.then(|| ("probe_failed".into(), "crun not found".into())),
            judged_gate: Default::default(),
        }
    }

    fn row(last: Option<&str>, quarantined_at: Option<i64>) -> RunnerRow {
        RunnerRow {
            attestation_seq: 7,
            quarantined_at: quarantined_at.map(Millis),
            latest: Sampled {
                status: last.map(String::from),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn plan_of<'a>(
        rows: &BTreeMap<RunnerId, RunnerRow>,
        records: &'a [AttestationRecord],
    ) -> Plan<'a> {
        let refs: Vec<(usize, &AttestationRecord)> = records.iter().enumerate().collect();
        // Planned as the first of them arrived: these cases are many rounds' worth of
        // attestations in one, none of which waited for it.
        let now = records
            .iter()
            .map(|r| r.received_at)
            .min()
            .unwrap_or_default();
        plan(rows, &refs, &HashSet::new(), now)
    }

    #[test]
    fn one_row_per_runner_keeps_the_last_attestation_and_its_jtis() {
        let rows = BTreeMap::from([(RunnerId("r1".into()), row(Some("healthy"), None))]);
        let records = [
            record("r1", "a", 10, true, false),
            record("r1", "b", 20, false, true),
            record("r1", "c", 30, true, false),
        ];
        let plan = plan_of(&rows, &records);
        assert_eq!(plan.updates.len(), 1);
        let u = &plan.updates[0];
        assert_eq!(u.latest.jti, "c");
        for jti in ["a", "b", "c"] {
            assert!(u.row.recent_jtis.contains(&jti_key(jti)));
        }
        let changes: Vec<(Option<String>, &str)> = plan
            .status_changes
            .iter()
            .map(|c| (c.from.clone(), c.to))
            .collect();
        assert_eq!(
            changes,
            vec![
                (Some("healthy".into()), "probe_failed"),
                (Some("probe_failed".into()), "healthy")
            ]
        );
        // The refusal opened a run, and the healthy attestation after it ended the run.
        assert_eq!(u.row.refusals.code, None);
        assert_eq!(plan.refusals.len(), 1);
        assert_eq!(plan.refusals[0].1.detail, "crun not found");
    }

    #[test]
    fn a_jti_the_round_itself_spilled_is_a_replay() {
        // A row full of unexpired jtis, the oldest of which a new one pushes out; then the
        // pushed-out one again, in the same round: it is in neither the row nor what was read
        // of the spills before the round.
        let mut full = row(Some("healthy"), None);
        for i in 0..IN_ROW as i64 {
            assert!(
                full.recent_jtis
                    .remember(jti_key(&format!("old-{i}")), Millis(60_000 + i))
                    .is_empty()
            );
        }
        let rows = BTreeMap::from([(RunnerId("r1".into()), full)]);
        let mut oldest_again = record("r1", "old-0", 10, true, false);
        oldest_again.replay_until = Millis(60_000);
        let records = [record("r1", "new", 10, true, false), oldest_again];
        let plan = plan_of(&rows, &records);
        assert_eq!(plan.verdicts[&0], Ok(()));
        assert_eq!(plan.verdicts[&1], Err(Rejection::Replayed));
        assert_eq!(plan.spills.len(), 1, "old-0 spilled once, by the new jti");

        // A jti so old that it spills as it comes in, twice in one round.
        let mut full = row(Some("healthy"), None);
        for i in 0..IN_ROW as i64 {
            full.recent_jtis
                .remember(jti_key(&format!("late-{i}")), Millis(90_000 + i));
        }
        let rows = BTreeMap::from([(RunnerId("r1".into()), full)]);
        let records = [
            record("r1", "early", 10, true, false),
            record("r1", "early", 11, true, false),
        ];
        let plan = plan_of(&rows, &records);
        assert_eq!(plan.verdicts[&0], Ok(()));
        assert_eq!(plan.verdicts[&1], Err(Rejection::Replayed));
    }

    #[test]
    fn a_jti_is_accepted_once_even_twice_in_one_round_and_a_revoked_runner_is_refused() {
        let mut revoked = row(None, None);
        revoked.revoked = true;
        let rows = BTreeMap::from([
            (RunnerId("r1".into()), row(None, None)),
            (RunnerId("gone".into()), revoked),
        ]);
        let records = [
            record("r1", "same", 10, true, false),
            record("r1", "same", 11, true, false),
            record("gone", "x", 12, true, false),
            record("nobody", "y", 13, true, false),
        ];
        let plan = plan_of(&rows, &records);
        assert_eq!(plan.verdicts[&0], Ok(()));
        assert_eq!(plan.verdicts[&1], Err(Rejection::Replayed));
        assert_eq!(plan.verdicts[&2], Err(Rejection::Revoked));
        assert_eq!(plan.verdicts[&3], Err(Rejection::Revoked));
        assert_eq!(
            plan.updates.len(),
            1,
            "only the accepted runner's row is written"
        );
    }

    #[test]
    fn a_steady_runner_keeps_one_sample_per_interval_and_every_change() {
        let rows = BTreeMap::from([(RunnerId("r1".into()), row(None, None))]);
        // 41 healthy heartbeats 15 s apart (10 minutes), then a failing one.
        let mut records: Vec<AttestationRecord> = (0..=40)
            .map(|i| record("r1", &format!("j{i}"), 1_000_000 + i * 15_000, true, false))
            .collect();
        records.push(record("r1", "fail", 1_000_000 + 41 * 15_000, false, false));
        let plan = plan_of(&rows, &records);
        let kept: Vec<i64> = plan
            .history
            .iter()
            .map(|h| h.record.received_at.0)
            .collect();
        // The first, one 300 s later, one 600 s later, and the change.
        assert_eq!(kept, vec![1_000_000, 1_300_000, 1_600_000, 1_615_000]);
        let seqs: Vec<i64> = plan.history.iter().map(|h| h.seq).collect();
        assert_eq!(seqs, vec![8, 9, 10, 11]);
    }

    #[test]
    fn repeated_refusals_are_one_entry_brought_up_to_date_once_a_minute() {
        let rows = BTreeMap::from([(RunnerId("r1".into()), row(None, None))]);
        // A refusal every second for 150 s.
        let records: Vec<AttestationRecord> = (0..150)
            .map(|i| record("r1", &format!("j{i}"), 1_000_000 + i * 1_000, false, true))
            .collect();
        let plan = plan_of(&rows, &records);
        let run = &plan.updates[0].row.refusals;
        assert_eq!(
            (run.seq, run.count, run.first_at),
            (1, 150, Some(Millis(1_000_000)))
        );
        assert_eq!(run.last_at, Some(Millis(1_149_000)));
        // The ring's entry, once in the round: its latest sync (at 120 s).
        assert_eq!(plan.refusals.len(), 1);
        let w = &plan.refusals[0].1;
        assert_eq!((w.seq, w.count, w.last_at), (1, 121, Millis(1_120_000)));
        // The row carried 150 jtis' worth of replay state: 12 kept, the rest spilled.
        assert_eq!(plan.spills.len(), 150 - IN_ROW);
    }

    #[test]
    fn a_new_code_opens_an_entry_and_closes_the_old_one() {
        let mut run = RefusalRun::default();
        let mut writes = run.refused("probe_failed", "crun", Millis(0));
        writes.extend(run.refused("probe_failed", "crun", Millis(10_000)));
        writes.extend(run.refused("image_drift", "old image", Millis(20_000)));
        let seen: Vec<(i64, &str, i64)> = writes
            .iter()
            .map(|w| (w.seq, w.code.as_str(), w.count))
            .collect();
        assert_eq!(
            seen,
            vec![
                (1, "probe_failed", 1),
                (1, "probe_failed", 2),
                (2, "image_drift", 1)
            ]
        );
        assert_eq!(run.ended(), vec![]);
        assert_eq!(run.code, None);
    }

    #[test]
    fn a_passing_probe_after_the_quarantine_lifts_it_an_earlier_one_does_not() {
        let rows = BTreeMap::from([
            (
                RunnerId("early".into()),
                row(Some("quarantined"), Some(100)),
            ),
            (RunnerId("late".into()), row(Some("quarantined"), Some(100))),
        ]);
        let records = [
            record("early", "a", 50, true, false),
            record("late", "b", 150, true, false),
        ];
        let plan = plan_of(&rows, &records);
        let q: BTreeMap<&str, Option<Millis>> = plan
            .updates
            .iter()
            .map(|u| (u.runner_id.as_str(), u.row.quarantined_at))
            .collect();
        assert_eq!(q["early"], Some(Millis(100)));
        assert_eq!(q["late"], None);
    }

    #[test]
    fn an_update_says_whether_the_gate_judges_otherwise_and_whether_it_ended_the_ejection() {
        let failing = [record("r1", "a", 90, false, true)];
        let mut held = plan_of(
            &BTreeMap::from([(RunnerId("r1".into()), row(None, None))]),
            &failing,
        )
        .updates[0]
            .row
            .clone();
        held.quarantined_at = Some(Millis(100));
        held.ejected_until = Some(Millis(120));
        let rows = BTreeMap::from([(RunnerId("r1".into()), held.clone())]);
        // Checked after the quarantine, but received before the ejection ends.
        let early = [record("r1", "b", 110, true, false)];
        let plan = plan_of(&rows, &early);
        assert!(plan.updates[0].changes_gate(&held) && !plan.updates[0].releases(&held));
        let late = [record("r1", "c", 150, true, false)];
        let plan = plan_of(&rows, &late);
        assert!(plan.updates[0].changes_gate(&held) && plan.updates[0].releases(&held));
        // The same failing facts again, later: only their age changed.
        let again = [record("r1", "d", 150, false, true)];
        let plan = plan_of(&rows, &again);
        assert!(!plan.updates[0].changes_gate(&held));
        // Facts that changed (another probe error) are judged anew.
        let mut other = record("r1", "e", 150, false, true);
        other.state.probe.error = Some("podman not found".into());
        let plan = plan_of(&rows, std::slice::from_ref(&other));
        assert!(plan.updates[0].changes_gate(&held));
    }

    /// J accepted, its window ending at `J_ENDS`, then another of the runner's attestations
    /// in a round planned `planned_at`: the row the runner is left with.
    fn row_after_j_then_another(planned_at: i64) -> (AttestationRecord, RunnerRow) {
        let j = record("r1", "J", 1_000_000, true, false);
        let rows = BTreeMap::from([(RunnerId("r1".into()), row(Some("healthy"), None))]);
        let first = plan(&rows, &[(0, &j)], &HashSet::new(), Millis(1_000_000));
        let rows = BTreeMap::from([(RunnerId("r1".into()), first.updates[0].row.clone())]);
        let other = record("r1", "X", planned_at, true, false);
        let second = plan(&rows, &[(0, &other)], &HashSet::new(), Millis(planned_at));
        assert_eq!(second.verdicts[&0], Ok(()));
        (j, second.updates[0].row.clone())
    }

    const J_ENDS: i64 = 1_060_000;

    #[test]
    fn a_jti_is_remembered_past_its_window_for_a_replica_whose_clock_is_behind() {
        // Another attestation in a round planned by a replica whose clock reads just past J's
        // window...
        let (j, after) = row_after_j_then_another(J_ENDS + 1);
        assert!(after.recent_jtis.contains(&jti_key("J")));
        // ...then J replayed to a replica whose clock is two seconds behind that one's, where
        // J's window is still open: a replay.
        let mut replay = j.clone();
        replay.received_at = Millis(J_ENDS - 1_000);
        let rows = BTreeMap::from([(RunnerId("r1".into()), after)]);
        let plan = plan(
            &rows,
            &[(0, &replay)],
            &HashSet::new(),
            Millis(J_ENDS - 1_000),
        );
        assert_eq!(plan.verdicts[&0], Err(Rejection::Replayed));
        assert!(plan.updates.is_empty());

        // Forgotten once the margin has passed too.
        let (_, after) = row_after_j_then_another(J_ENDS + FORGET_AFTER.0 + 1);
        assert!(!after.recent_jtis.contains(&jti_key("J")));
    }

    #[test]
    fn an_attestation_planned_after_its_window_ended_is_refused_expired_and_writes_nothing() {
        // J's jti already forgotten; J itself (a replay, or a request that waited) comes to a
        // round planned after its window: whichever it is, it is not taken.
        let (j, after) = row_after_j_then_another(J_ENDS + FORGET_AFTER.0 + 1);
        let rows = BTreeMap::from([(RunnerId("r1".into()), after)]);
        for planned_at in [J_ENDS + 1, J_ENDS + FORGET_AFTER.0 + 2] {
            let plan = plan(&rows, &[(0, &j)], &HashSet::new(), Millis(planned_at));
            assert_eq!(plan.verdicts[&0], Err(Rejection::Expired));
            assert!(plan.updates.is_empty() && plan.spills.is_empty());
        }
        // Planned at its window's last moment, it is judged as ever (here: a fresh jti).
        let mut fresh = j.clone();
        fresh.jti = "K".into();
        let plan = plan(&rows, &[(0, &fresh)], &HashSet::new(), Millis(J_ENDS));
        assert_eq!(plan.verdicts[&0], Ok(()));
    }

    #[test]
    fn an_attestation_judged_by_gate_facts_its_row_no_longer_holds_is_marked_stale() {
        let id = RunnerId("r1".into());
        let mut cordoned = row(Some("healthy"), None);
        cordoned.cordoned = true;
        let rows = BTreeMap::from([(id.clone(), cordoned)]);
        let judged_free = record("r1", "a", 1_000, true, false);
        let mut judged_cordoned = record("r1", "b", 1_001, true, false);
        judged_cordoned.judged_gate.cordoned = true;
        let records = [judged_free, judged_cordoned];
        let plan = plan_of(&rows, &records);
        assert_eq!(plan.verdicts[&0], Ok(()), "accepted all the same");
        assert_eq!(plan.stale, BTreeSet::from([0]));

        // A quarantine or an ejection the row holds and the judgment did not see, likewise.
        let mut ejected = row(Some("healthy"), Some(900));
        ejected.ejected_until = Some(Millis(5_000));
        let rows = BTreeMap::from([(id, ejected)]);
        let mut judged = record("r1", "c", 1_000, true, false);
        judged.judged_gate.quarantined_at = Some(Millis(900));
        assert_eq!(plan_of(&rows, &[judged.clone()]).stale, BTreeSet::from([0]));
        judged.judged_gate.ejection = Some(crate::domain::ejection::Ejection {
            at: Millis(800),
            until: Millis(5_000),
            failures: Default::default(),
            nth: 1,
        });
        assert!(plan_of(&rows, &[judged]).stale.is_empty());
    }

    #[test]
    fn the_forgetting_clock_never_goes_back_and_a_forgotten_jti_stays_expired() {
        // J forgotten by a clock that ran ahead; the clock then stepped back into J's window.
        let latest = AtomicI64::new(i64::MIN);
        let ahead = J_ENDS + FORGET_AFTER.0 + 1;
        assert_eq!(never_back(&latest, Millis(ahead)), Millis(ahead));
        let (j, after) = row_after_j_then_another(ahead);
        assert!(!after.recent_jtis.contains(&jti_key("J")));
        let stepped_back = never_back(&latest, Millis(J_ENDS - 1_000));
        assert_eq!(
            stepped_back,
            Millis(ahead),
            "time stands still until it catches up"
        );
        let rows = BTreeMap::from([(RunnerId("r1".into()), after)]);
        let plan = plan(&rows, &[(0, &j)], &HashSet::new(), stepped_back);
        assert_eq!(
            plan.verdicts[&0],
            Err(Rejection::Expired),
            "not taken again"
        );
        // Once the clock is past the latest reading, it is read as it is.
        assert_eq!(never_back(&latest, Millis(ahead + 5)), Millis(ahead + 5));
        assert!(forgetting_now() >= Millis::now().plus_secs(-1));
    }
}

//! Write rounds: many requests' writes in one transaction (group commit).
//!
//! Every attestation the gate admits needs a durable write before it is answered: its `jti`
//! (rule 5), its runner's latest state, and for a lease the claim. A round takes every request
//! waiting at that moment and writes them together, a few statements and one commit whatever
//! its size, then answers each with its own outcome.
//!
//! In the common case a heartbeat is one row update: its runner's latest attestation, kept in
//! place with the runner's recent jtis (`replay.rs`) and the run of refusals it is in. The
//! history is written only when it says something: an attestation is kept in the ring
//! (`attestation_history`, 20 per runner) when its status, probe, runtime version or image
//! changed, and otherwise one every `SAMPLE_INTERVAL_S`; a refusal opens an entry of the
//! refusal ring (50 per runner) when its code differs from the run it would continue, and the
//! open entry's count and last time are brought up to date every `REFUSAL_SYNC_S` (the row
//! always has them exact). A status change is written when the status changes.
//!
//! `plan` is the pure bookkeeping, from the locked runner rows and the attestations in arrival
//! order, unit-tested here; `write` runs the round's named steps over any engine.

use super::replay::{self, RecentJtis, jti_key};
use super::rows;
use super::{chunks, param_list, queue, write_rows};
use crate::domain::ids::RunnerId;
use crate::domain::lease::Lease;
use crate::domain::status::RunnerStatus;
use crate::domain::time::Millis;
use crate::store::engine::{Change, Db, Param, Row, Statement, Tail};
use crate::store::{
    ATTESTATION_HISTORY, AttestationRecord, Claim, REFUSAL_HISTORY, Rejection, RoundItem,
    RoundOutcome, STATUS_CHANGE_HISTORY, StoreError, StoreResult,
};
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

/// One kept attestation every this long, when nothing changed.
pub const SAMPLE_INTERVAL_S: i64 = 300;

/// How often an open refusal entry's count and last time are written to the ring.
pub const REFUSAL_SYNC_S: i64 = 60;

pub type RoundResult = Result<Vec<RoundOutcome>, StoreError>;

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

    fn read(row: &Row) -> StoreResult<(RunnerId, RunnerRow)> {
        let ok = row.opt_int("probe_ok")?;
        Ok((
            RunnerId(row.text("id")?),
            RunnerRow {
                attestation_seq: row.int("attestation_seq")?,
                quarantined_at: row.opt_int("quarantined_at")?.map(Millis),
                ejected_until: row.opt_int("ejected_until")?.map(Millis),
                revoked: row.opt_int("revoked_at")?.is_some(),
                cordoned: row.flag("cordoned")?,
                recent_jtis: RecentJtis::parse(&row.text("recent_jtis")?),
                jtis_spilled_until: row.opt_int("jtis_spilled_until")?.map(Millis),
                history_sampled_at: row.opt_int("history_sampled_at")?.map(Millis),
                latest: Sampled {
                    status: row.opt_text("last_status")?,
                    probe_ok: ok.map(|o| o != 0),
                    probe_error: row.opt_text("probe_error")?,
                    runtime_version: row.opt_text("probe_runtime_version")?,
                    image_id: row.opt_text("image_id")?,
                    image_digest: row.opt_text("image_digest")?,
                },
                refusals: RefusalRun {
                    seq: row.int("refusal_seq")?,
                    code: row.opt_text("refusal_code")?,
                    detail: row.opt_text("refusal_detail")?,
                    count: row.int("refusal_count")?,
                    first_at: row.opt_int("refusal_first_at")?.map(Millis),
                    last_at: row.opt_int("refusal_last_at")?.map(Millis),
                    synced_at: row.opt_int("refusal_synced_at")?.map(Millis),
                },
            },
        ))
    }
}

/// A runner's row after the round's attestations.
#[derive(Debug)]
pub struct RunnerUpdate<'a> {
    pub runner_id: &'a RunnerId,
    pub latest: &'a AttestationRecord,
    pub row: RunnerRow,
    /// The latest attestation's agent facts, as the JSON text stored.
    pub agent: Option<String>,
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
}

/// The writes of `attestations` (index in the round, record; in arrival order), from each
/// runner's stored row and the jtis `seen_jtis` holds for spilled runners.
///
/// Rule 5 comes first (a revoked runner's replayed jti is a replay), then rule 6. A runner may
/// appear several times in one round: its state advances once per attestation and the row
/// keeps the last one; a jti twice in a round is accepted for the first and a replay for the
/// second. A passing probe checked after the quarantine lifts it, as it would one attestation
/// at a time.
pub fn plan<'a>(
    rows: &BTreeMap<RunnerId, RunnerRow>,
    attestations: &[(usize, &'a AttestationRecord)],
    spilled: &HashSet<(RunnerId, String)>,
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
        let (row, latest) = state
            .entry(runner_id)
            .or_insert_with(|| (stored.clone(), None));
        let key = jti_key(&rec.jti);
        row.recent_jtis.prune(rec.received_at);
        let replayed = row.recent_jtis.contains(&key)
            || spilled.contains(&(runner_id.clone(), key.clone()))
            || spilled.contains(&(runner_id.clone(), rec.jti.clone()));
        if replayed {
            plan.verdicts.insert(i, Err(Rejection::Replayed));
            continue;
        }
        if row.revoked {
            plan.verdicts.insert(i, Err(Rejection::Revoked));
            continue;
        }
        plan.verdicts.insert(i, Ok(()));
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
        if probe.ok && row.quarantined_at.is_some_and(|q| q < probe.checked_at) {
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
            agent: latest.agent.as_ref().map(|a| a.to_string()),
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

// ---- The round's steps ----------------------------------------------------------------------

/// Locks (on PostgreSQL) and reads the rows of `ids`, in id order, so that no two rounds wait
/// on each other in a cycle.
async fn lock_runners<D: Db>(
    db: &mut D,
    ids: &[&str],
) -> StoreResult<BTreeMap<RunnerId, RunnerRow>> {
    let mut rows = BTreeMap::new();
    for part in chunks(ids) {
        let found = db
            .fetch(
                Statement::built(format!(
                    "SELECT id, attestation_seq, quarantined_at, ejected_until, revoked_at, \
                        cordoned, recent_jtis, \
                     jtis_spilled_until, history_sampled_at, last_status, probe_ok, probe_error, \
                     probe_runtime_version, image_id, image_digest, refusal_seq, refusal_code, \
                     refusal_detail, refusal_count, refusal_first_at, refusal_last_at, \
                     refusal_synced_at \
                     FROM runners WHERE id IN ({}) ORDER BY id",
                    param_list(part.len(), 1)
                ))
                .params(part.iter().map(|id| Param::Text(id)).collect())
                .tail(Tail::RowLock),
            )
            .await?;
        for row in &found {
            let (id, r) = RunnerRow::read(row)?;
            rows.insert(id, r);
        }
    }
    Ok(rows)
}

/// The jtis of this round that `seen_jtis` holds, for runners that spilled (rare).
async fn spilled_jtis<D: Db>(
    db: &mut D,
    rows: &BTreeMap<RunnerId, RunnerRow>,
    attestations: &[(usize, &AttestationRecord)],
) -> StoreResult<HashSet<(RunnerId, String)>> {
    // Both forms of each jti: its key, and itself (as remembered before keys were).
    let keys: Vec<(&RunnerId, String, &str)> = attestations
        .iter()
        .filter(|(_, r)| {
            rows.get(&r.runner_id)
                .and_then(|row| row.jtis_spilled_until)
                .is_some_and(|until| until >= r.received_at)
        })
        .map(|(_, r)| (&r.runner_id, jti_key(&r.jti), r.jti.as_str()))
        .collect();
    let asked: Vec<(&RunnerId, &str)> = keys
        .iter()
        .flat_map(|(runner, key, jti)| [(*runner, key.as_str()), (*runner, *jti)])
        .collect();
    replay::spilled(db, &asked).await
}

/// Each runner's row as its attestations in the round left it: one row update per runner.
async fn update_runners<D: Db>(db: &mut D, updates: &[RunnerUpdate<'_>]) -> StoreResult<()> {
    let sql = |values: &str| {
        format!(
            "WITH v (id, attested_at, probe_ok, probe_runtime, probe_runtime_version, \
             probe_checked_at, probe_error, probe_exit_code, probe_disk, image_id, image_digest, \
             image_ref, images, agent, last_status, attestation_seq, quarantined_at, \
             ejected_until, recent_jtis, \
             jtis_spilled_until, history_sampled_at, refusal_seq, refusal_code, refusal_detail, \
             refusal_count, refusal_first_at, refusal_last_at, refusal_synced_at) \
             AS (VALUES {values}) \
             UPDATE runners SET attested_at = v.attested_at, probe_ok = v.probe_ok, \
             probe_runtime = v.probe_runtime, probe_runtime_version = v.probe_runtime_version, \
             probe_checked_at = v.probe_checked_at, probe_error = v.probe_error, \
             probe_exit_code = v.probe_exit_code, probe_disk = v.probe_disk, \
             image_id = v.image_id, images = v.images, \
             image_digest = v.image_digest, image_ref = v.image_ref, agent = v.agent, \
             last_status = v.last_status, attestation_seq = v.attestation_seq, \
             quarantined_at = v.quarantined_at, ejected_until = v.ejected_until, \
             recent_jtis = v.recent_jtis, \
             jtis_spilled_until = v.jtis_spilled_until, \
             history_sampled_at = v.history_sampled_at, refusal_seq = v.refusal_seq, \
             refusal_code = v.refusal_code, refusal_detail = v.refusal_detail, \
             refusal_count = v.refusal_count, refusal_first_at = v.refusal_first_at, \
             refusal_last_at = v.refusal_last_at, refusal_synced_at = v.refusal_synced_at \
             FROM v WHERE runners.id = v.id"
        )
    };
    write_rows(db, updates, 28, sql, |u| {
        let rec = u.latest;
        let (probe, image, run) = (&rec.state.probe, &rec.state.image, &u.row.refusals);
        vec![
            Param::Text(u.runner_id.as_str()),
            Param::Int(rec.received_at.0),
            Param::Int(i64::from(probe.ok)),
            Param::Text(&probe.runtime),
            Param::OptText(probe.runtime_version.as_deref()),
            Param::Int(probe.checked_at.0),
            Param::OptText(probe.error.as_deref()),
            Param::OptInt(probe.exit_code),
            Param::Owned(rows::probe_disk_json(&probe.disk)),
            Param::OptText(image.id.as_ref().map(|d| d.as_str())),
            Param::OptText(image.digest.as_ref().map(|d| d.as_str())),
            Param::OptText(image.image_ref.as_deref()),
            Param::Owned(rows::attested_images_json(&rec.state.images)),
            Param::OptText(u.agent.as_deref()),
            Param::Text(rec.status.as_str()),
            Param::Int(u.row.attestation_seq),
            Param::OptInt(u.row.quarantined_at.map(|m| m.0)),
            Param::OptInt(u.row.ejected_until.map(|m| m.0)),
            Param::Owned(Some(u.row.recent_jtis.format())),
            Param::OptInt(u.row.jtis_spilled_until.map(|m| m.0)),
            Param::OptInt(u.row.history_sampled_at.map(|m| m.0)),
            Param::Int(run.seq),
            Param::OptText(run.code.as_deref()),
            Param::OptText(run.detail.as_deref()),
            Param::Int(run.count),
            Param::OptInt(run.first_at.map(|m| m.0)),
            Param::OptInt(run.last_at.map(|m| m.0)),
            Param::OptInt(run.synced_at.map(|m| m.0)),
        ]
    })
    .await
}

/// The attestations kept in the history ring: each upserted into its slot.
async fn upsert_history<D: Db>(db: &mut D, entries: &[HistoryEntry<'_>]) -> StoreResult<()> {
    let sql = |values: &str| {
        format!(
            "INSERT INTO attestation_history (runner_id, slot, seq, received_at, probe_ok, \
             probe_runtime, probe_runtime_version, probe_checked_at, probe_error, image_id, \
             image_digest, status) VALUES {values} \
             ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, \
             received_at = excluded.received_at, probe_ok = excluded.probe_ok, \
             probe_runtime = excluded.probe_runtime, \
             probe_runtime_version = excluded.probe_runtime_version, \
             probe_checked_at = excluded.probe_checked_at, probe_error = excluded.probe_error, \
             image_id = excluded.image_id, image_digest = excluded.image_digest, \
             status = excluded.status"
        )
    };
    write_rows(db, entries, 12, sql, |h| {
        let rec = h.record;
        let (probe, image) = (&rec.state.probe, &rec.state.image);
        vec![
            Param::Text(rec.runner_id.as_str()),
            Param::Int(h.slot),
            Param::Int(h.seq),
            Param::Int(rec.received_at.0),
            Param::Int(i64::from(probe.ok)),
            Param::Text(&probe.runtime),
            Param::OptText(probe.runtime_version.as_deref()),
            Param::Int(probe.checked_at.0),
            Param::OptText(probe.error.as_deref()),
            Param::OptText(image.id.as_ref().map(|d| d.as_str())),
            Param::OptText(image.digest.as_ref().map(|d| d.as_str())),
            Param::Text(rec.status.as_str()),
        ]
    })
    .await
}

/// The status changes, then each changed runner's trimmed to the newest.
async fn insert_status_changes<D: Db>(
    db: &mut D,
    changes: &[StatusChangeEntry<'_>],
) -> StoreResult<()> {
    let sql = |values: &str| {
        format!(
            "INSERT INTO status_changes (runner_id, at, from_status, to_status, detail) \
             VALUES {values}"
        )
    };
    write_rows(db, changes, 5, sql, |c| {
        vec![
            Param::Text(c.runner_id.as_str()),
            Param::Int(c.at.0),
            Param::OptText(c.from.as_deref()),
            Param::Text(c.to),
            Param::OptText(c.detail),
        ]
    })
    .await?;
    // Through the (runner_id, id) index: only for runners that changed, never a sweep over
    // everyone's history.
    let changed: Vec<&str> = changes
        .iter()
        .map(|c| c.runner_id.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let mut params: Vec<Param> = changed.iter().map(|r| Param::Text(r)).collect();
    params.push(Param::Int(STATUS_CHANGE_HISTORY));
    db.execute(
        Statement::built(format!(
            "DELETE FROM status_changes WHERE runner_id IN ({}) AND id <= \
             (SELECT t.id FROM status_changes t WHERE t.runner_id = status_changes.runner_id \
             ORDER BY t.id DESC LIMIT 1 OFFSET ${})",
            param_list(changed.len(), 1),
            changed.len() + 1
        ))
        .params(params),
    )
    .await?;
    Ok(())
}

/// Opens or brings up to date entries of the refusal ring.
pub async fn upsert_refusals<D: Db>(
    db: &mut D,
    writes: &[(&RunnerId, RefusalWrite)],
) -> StoreResult<()> {
    let sql = |values: &str| {
        format!(
            "INSERT INTO refusals (runner_id, slot, seq, at, last_at, count, code, detail) \
             VALUES {values} \
             ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, at = excluded.at, \
             last_at = excluded.last_at, count = excluded.count, code = excluded.code, \
             detail = excluded.detail"
        )
    };
    write_rows(db, writes, 8, sql, |(runner, w)| {
        vec![
            Param::Text(runner.as_str()),
            Param::Int(w.seq % REFUSAL_HISTORY),
            Param::Int(w.seq),
            Param::Int(w.first_at.0),
            Param::Int(w.last_at.0),
            Param::Int(w.count),
            Param::Text(&w.code),
            Param::Text(&w.detail),
        ]
    })
    .await
}

/// The claims: per pool, its oldest queued jobs, as many as are asked for, handed out in
/// arrival order to the items whose attestation (if any) was accepted and whose runner may
/// lease as stored now.
async fn claim<D: Db>(
    db: &mut D,
    items: &[RoundItem],
    outcomes: &mut [RoundOutcome],
    rows: &BTreeMap<RunnerId, RunnerRow>,
    released: &BTreeSet<&RunnerId>,
) -> StoreResult<()> {
    let mut wanting: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let Some(claim) = &item.claim else { continue };
        if matches!(outcomes[i].attestation, Some(Err(_)))
            || !rows
                .get(&claim.runner_id)
                .is_some_and(|r| r.may_claim(released.contains(&claim.runner_id)))
        {
            continue;
        }
        wanting.entry(claim.pool.as_str()).or_default().push(i);
    }
    for (pool, waiting) in wanting {
        let claims: Vec<&Claim> = waiting
            .iter()
            .map(|&i| items[i].claim.as_ref().expect("a claim"))
            .collect();
        // One job per claim, as ever; only when one of them is held from its claim's runner
        // (it abandoned it a moment ago) does the round look a few jobs further.
        let found = queue::candidates(db, pool, claims.len()).await?;
        let mut pairs = queue::assign(&found, &claims);
        if pairs.len() < claims.len() && found.len() == claims.len() {
            let further = queue::candidates(db, pool, claims.len() + queue::HELD_LOOKAHEAD).await?;
            pairs = queue::assign(&further, &claims);
        }
        let by_lease: BTreeMap<&str, usize> = waiting
            .iter()
            .map(|&i| {
                (
                    items[i].claim.as_ref().expect("a claim").lease_id.as_str(),
                    i,
                )
            })
            .collect();
        for part in chunks(&pairs) {
            for job in queue::lease_jobs(db, part).await? {
                let Some(&i) = job.lease_id.as_ref().and_then(|l| by_lease.get(l.as_str())) else {
                    return Err(StoreError::Internal(
                        "a claimed job lost its lease id".into(),
                    ));
                };
                let c = items[i].claim.as_ref().expect("a claim");
                let lease = Lease::granted(
                    c.lease_id.clone(),
                    job.id.clone(),
                    c.runner_id.clone(),
                    c.pool.clone(),
                    job.attempts,
                    c.now,
                    c.ttl_s,
                );
                outcomes[i].granted = Some((lease, job));
            }
        }
    }
    let granted: Vec<(&Lease, &str)> = items
        .iter()
        .zip(outcomes.iter())
        .filter_map(|(item, o)| {
            let (lease, _) = o.granted.as_ref()?;
            Some((lease, item.claim.as_ref()?.token_hash.as_str()))
        })
        .collect();
    queue::insert_leases(db, &granted).await?;
    queue::insert_leased_events(db, &granted).await?;
    Ok(())
}

/// Writes `items` as one round inside `db`'s transaction, and says what became of each.
pub async fn write<D: Db>(db: &mut D, items: &[RoundItem]) -> StoreResult<Vec<RoundOutcome>> {
    let ids: Vec<&str> = items
        .iter()
        .flat_map(|i| {
            let a = i.attestation.as_ref().map(|a| a.runner_id.as_str());
            let c = i.claim.as_ref().map(|c| c.runner_id.as_str());
            a.into_iter().chain(c)
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let rows = lock_runners(db, &ids).await?;
    let attestations: Vec<(usize, &AttestationRecord)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| item.attestation.as_ref().map(|a| (i, a)))
        .collect();
    let spilled = spilled_jtis(db, &rows, &attestations).await?;
    let plan = plan(&rows, &attestations, &spilled);

    let mut outcomes: Vec<RoundOutcome> = items
        .iter()
        .enumerate()
        .map(|(i, item)| RoundOutcome {
            attestation: item.attestation.as_ref().map(|_| {
                plan.verdicts
                    .get(&i)
                    .copied()
                    .unwrap_or(Err(Rejection::Revoked))
            }),
            granted: None,
        })
        .collect();
    update_runners(db, &plan.updates).await?;
    for u in &plan.updates {
        // A lifted quarantine or ejection changes what the gate holds of the runner.
        let before = rows.get(u.runner_id);
        let was_quarantined = before.is_some_and(|r| r.quarantined_at.is_some());
        let was_ejected = before.is_some_and(|r| r.ejected_until.is_some());
        if (was_quarantined && u.row.quarantined_at.is_none())
            || (was_ejected && u.row.ejected_until.is_none())
        {
            db.changed(Change::Runner(u.runner_id.clone())).await?;
        }
    }
    upsert_history(db, &plan.history).await?;
    insert_status_changes(db, &plan.status_changes).await?;
    upsert_refusals(db, &plan.refusals).await?;
    let spills: Vec<(&RunnerId, Millis, &str)> = plan
        .spills
        .iter()
        .map(|(r, u, k)| (*r, *u, k.as_str()))
        .collect();
    replay::spill(db, &spills).await?;
    let released: BTreeSet<&RunnerId> = plan
        .updates
        .iter()
        .filter(|u| {
            u.row.ejected_until.is_none()
                && rows
                    .get(u.runner_id)
                    .is_some_and(|r| r.ejected_until.is_some())
        })
        .map(|u| u.runner_id)
        .collect();
    claim(db, items, &mut outcomes, &rows, &released).await?;
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::attestation::{Probe, RunningImage};
    use crate::domain::verdict::AttestedState;

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
        plan(rows, &refs, &HashSet::new())
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
        assert_eq!(plan.spills.len(), 150 - replay::IN_ROW);
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
}

//! Write rounds: many requests' writes in one transaction (group commit).
//!
//! Every attestation the gate admits needs a durable write before it is answered: its `jti`
//! (rule 5), its runner's latest state, and for a lease the claim. A round takes every request
//! waiting at that moment and writes them together, a few statements and one commit whatever
//! its size, then answers each with its own outcome.
//!
//! What the attestations write is `domain::record::plan`'s, from the runners' rows as read
//! here; this file holds only the round's statements: `write` locks and reads the rows, writes
//! the plan and makes the claims, over any engine. On PostgreSQL the first step (lock the
//! rows, then read them and the spilled jtis asked) is one call of the function
//! `leasegate_read_round`, one round trip whatever the round's size; SQLite, whose one writer
//! holds the whole database and whose spills are looked up in memory, reads the rows. The
//! round's writes then go to the engine together (`Db::write_rows`): on PostgreSQL one
//! statement, so that a round is four round trips whatever its size (begin, lock and read,
//! write, commit).
//!
//! On PostgreSQL most rounds take one: a round of attestations that claims nothing and
//! changes nothing the gate judges (steady heartbeats, refused leases) is first offered to
//! `write_unlocked`, which writes its rows in one statement only where no version changed
//! since it had them, with no transaction around it. It has them from its lane, which keeps
//! the rows its rounds wrote (`store::known_rows`), or else reads them unlocked with their
//! versions first (two round trips). When a version changed (another replica, a revocation)
//! nothing of the round is kept, and `write` writes it.

use super::replay::{self, RecentJtis, jti_key};
use super::rows;
use super::{chunks, param_list, queue, write_rows};
use crate::domain::ids::RunnerId;
use crate::domain::lease::Lease;
use crate::domain::record::{
    AttestationRecord, HistoryEntry, Plan, REFUSAL_HISTORY, RefusalRun, RefusalWrite, Rejection,
    RunnerRow, RunnerUpdate, STATUS_CHANGE_HISTORY, Sampled, StatusChangeEntry, forgetting_now,
    plan,
};
use crate::domain::time::Millis;
use crate::store::engine::{Change, Db, Param, Row, RowsWrite, Statement};
use crate::store::known_rows::VersionedRows;
use crate::store::{Claim, RoundItem, RoundOutcome, StoreError, StoreResult};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// A runner's row as `read_runners` and `leasegate_read_round` select it.
fn runner_row(row: &Row) -> StoreResult<(RunnerId, RunnerRow)> {
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

pub type RoundResult = Result<Vec<RoundOutcome>, StoreError>;

// ---- The round's steps ----------------------------------------------------------------------

/// The round's runners' rows as read, and what else the round needs of them.
struct Read {
    rows: BTreeMap<RunnerId, RunnerRow>,
    /// Each row's version where the engine has one (PostgreSQL's `xmin`): an unlocked round
    /// writes a row only if it is still this (`write_unlocked`).
    versions: BTreeMap<RunnerId, String>,
    /// Which of the round's attestations' jtis their runners spilled.
    spilled: HashSet<(RunnerId, String)>,
}

/// The round's runners' rows, which of its attestations' jtis their runners spilled, and the
/// rows' versions: on PostgreSQL read (and, with `lock`, first locked) in one call, elsewhere
/// (one writer, whose transaction holds the whole database) read, and the spills asked of the
/// engine's index in memory.
async fn read_round<D: Db>(
    db: &mut D,
    ids: &[&str],
    attestations: &[(usize, &AttestationRecord)],
    lock: bool,
) -> StoreResult<Read> {
    if db.spill_index().is_some() {
        let rows = read_runners(db, ids).await?;
        let spilled = spilled_jtis(db, &rows, attestations).await?;
        return Ok(Read {
            rows,
            versions: BTreeMap::new(),
            spilled,
        });
    }
    // Both forms of each jti: its key, and itself (as remembered before keys were); the
    // function asks only those of runners whose row says they spilled since.
    let keys: Vec<String> = attestations.iter().map(|(_, r)| jti_key(&r.jti)).collect();
    let (mut runners, mut asked, mut at) = (Vec::new(), Vec::new(), Vec::new());
    for ((_, r), key) in attestations.iter().zip(&keys) {
        for k in [key.as_str(), r.jti.as_str()] {
            runners.push(r.runner_id.as_str());
            asked.push(k);
            at.push(r.received_at.0);
        }
    }
    let sql = format!(
        "SELECT *, {} AS version FROM leasegate_read_round({lock}, $1, $2, $3, $4)",
        row_version_sql("row_version")
    );
    let found = db
        .fetch(Statement::built(sql).params(vec![
            Param::Texts(ids.iter().map(|id| Some(*id)).collect()),
            Param::Texts(runners.iter().map(|r| Some(*r)).collect()),
            Param::Texts(asked.iter().map(|k| Some(*k)).collect()),
            Param::Ints(at.into_iter().map(Some).collect()),
        ]))
        .await?;
    let mut read = Read {
        rows: BTreeMap::new(),
        versions: BTreeMap::new(),
        spilled: HashSet::new(),
    };
    for row in &found {
        // The positions (from 1) of the asked keys that `seen_jtis` holds.
        for hit in row.opt_text("spilled_hits")?.unwrap_or_default().split(' ') {
            let Some(n) = hit
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=asked.len()).contains(n))
            else {
                continue;
            };
            read.spilled.insert((
                RunnerId(runners[n - 1].to_string()),
                asked[n - 1].to_string(),
            ));
        }
        let (id, r) = runner_row(row)?;
        read.versions.insert(id.clone(), row.text("version")?);
        read.rows.insert(id, r);
    }
    Ok(read)
}

/// Reads the rows of `ids` (SQLite: the write transaction holds the whole database).
async fn read_runners<D: Db>(
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
                .params(part.iter().map(|id| Param::Text(id)).collect()),
            )
            .await?;
        for row in &found {
            let (id, r) = runner_row(row)?;
            rows.insert(id, r);
        }
    }
    Ok(rows)
}

/// Whether `r`'s runner spilled jtis that `r` may repeat: its row says it spilled some whose
/// windows were still open when `r` came (what `leasegate_read_round` asks, on PostgreSQL).
fn may_have_spilled(rows: &BTreeMap<RunnerId, RunnerRow>, r: &AttestationRecord) -> bool {
    rows.get(&r.runner_id)
        .and_then(|row| row.jtis_spilled_until)
        .is_some_and(|until| until >= r.received_at)
}

/// The jtis of this round that the spilled ones hold, for runners that spilled (rare).
async fn spilled_jtis<D: Db>(
    db: &mut D,
    rows: &BTreeMap<RunnerId, RunnerRow>,
    attestations: &[(usize, &AttestationRecord)],
) -> StoreResult<HashSet<(RunnerId, String)>> {
    // Both forms of each jti: its key, and itself (as remembered before keys were).
    let keys: Vec<(&RunnerId, String, &str)> = attestations
        .iter()
        .filter(|(_, r)| may_have_spilled(rows, r))
        .map(|(_, r)| (&r.runner_id, jti_key(&r.jti), r.jti.as_str()))
        .collect();
    let asked: Vec<(&RunnerId, &str)> = keys
        .iter()
        .flat_map(|(runner, key, jti)| [(*runner, key.as_str()), (*runner, *jti)])
        .collect();
    replay::spilled(db, &asked).await
}

/// Each runner's row as its attestations in the round left it: one row update per runner.
fn runner_updates<'a>(updates: &'a [RunnerUpdate<'a>]) -> RowsWrite<'a> {
    RowsWrite::of(
        updates,
        28,
        |rows| runner_update_sql(rows, false),
        runner_update_values,
    )
}

/// `runner_updates`, each only where its row's version is still `versions`' (read with it, or
/// known to the lane: `KnownRows`) and, where `asked` names jtis of its runner, none of them
/// is among its spilled ones; all or none: a row changed since, or a jti found spilled, fails
/// the round's write whole (`write_unlocked`).
fn runner_updates_guarded<'a>(
    updates: &'a [RunnerUpdate<'a>],
    versions: &'a BTreeMap<RunnerId, String>,
    asked: &'a BTreeMap<&'a RunnerId, String>,
) -> RowsWrite<'a> {
    let sql = |rows: &str| runner_update_sql(rows, true);
    RowsWrite::of(updates, 30, sql, |u| {
        let mut values = runner_update_values(u);
        values.push(Param::OptText(
            versions.get(u.runner_id).map(String::as_str),
        ));
        values.push(Param::OptText(asked.get(u.runner_id).map(String::as_str)));
        values
    })
    .every_row()
}

/// A row's version as PostgreSQL's SQL makes it from `xid` (its `xmin`, or the transaction id
/// that wrote it): the id, and the server that gave it, named by when its postmaster started.
/// A transaction id alone names a row's version only on one server's timeline: a standby
/// promoted after a failover (or a server restarted after losing its last commits) hands out
/// again ids the lost transactions had, and a row written by one of those would pass a guard
/// that believed the lost write. With the server in it, no version known before the server
/// changed, even over a pooler's connection that stayed open across the change, ever matches
/// a row after it: the guard finds the row changed and the round is read again.
pub fn row_version_sql(xid: &str) -> String {
    format!(
        "(({xid})::text || '@' || \
         (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::int8::text)"
    )
}

/// The runners' update over `rows`; `guarded`, each row's two last values are the version
/// (`xmin`) its runner's row must still have to be written, and the jtis (their keys and
/// themselves, one a line; `NULL`: none) that must not be among its runner's spilled ones. A
/// jti holds no control character (`domain::attestation`) and a key is hex, so a line break
/// parts them. Each is looked up by the whole primary key, as `leasegate_read_round` does;
/// the `OFFSET 0` keeps the lookup a subquery per jti, whatever the planner guesses of
/// `seen_jtis`: joined to the list, the prepared statement's generic plan scanned every
/// spilled jti of the runner (a round of 32 took 1.4 ms instead of 0.4, more as spills grew).
fn runner_update_sql(rows: &str, guarded: bool) -> String {
    let (guard_columns, guard_test) = if guarded {
        (
            ", row_version, asked_jtis",
            format!(
                " AND {} = v.row_version \
                 AND NOT EXISTS (SELECT 1 FROM unnest(string_to_array(v.asked_jtis, E'\\n')) \
                     AS k(jti) WHERE EXISTS (SELECT 1 FROM seen_jtis s \
                     WHERE s.runner_id = v.id AND s.jti = k.jti OFFSET 0))",
                row_version_sql("runners.xmin")
            ),
        )
    } else {
        ("", String::new())
    };
    format!(
        "WITH v (id, attested_at, probe_ok, probe_runtime, probe_runtime_version, \
         probe_checked_at, probe_error, probe_exit_code, probe_disk, image_id, image_digest, \
         image_ref, images, agent, last_status, attestation_seq, quarantined_at, \
         ejected_until, recent_jtis, \
         jtis_spilled_until, history_sampled_at, refusal_seq, refusal_code, refusal_detail, \
         refusal_count, refusal_first_at, refusal_last_at, refusal_synced_at{guard_columns}) \
         AS ({rows}) \
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
         FROM v WHERE runners.id = v.id{guard_test}"
    )
}

/// A runner update's 28 values, in `runner_update_sql`'s order.
fn runner_update_values<'a>(u: &'a RunnerUpdate<'a>) -> Vec<Param<'a>> {
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
        Param::OptText(u.agent),
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
}

/// The attestations kept in the history ring: each upserted into its slot.
fn history_upserts<'a>(entries: &'a [HistoryEntry<'a>]) -> RowsWrite<'a> {
    let sql = |rows: &str| {
        format!(
            "INSERT INTO attestation_history (runner_id, slot, seq, received_at, probe_ok, \
             probe_runtime, probe_runtime_version, probe_checked_at, probe_error, image_id, \
             image_digest, status) {rows} \
             ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, \
             received_at = excluded.received_at, probe_ok = excluded.probe_ok, \
             probe_runtime = excluded.probe_runtime, \
             probe_runtime_version = excluded.probe_runtime_version, \
             probe_checked_at = excluded.probe_checked_at, probe_error = excluded.probe_error, \
             image_id = excluded.image_id, image_digest = excluded.image_digest, \
             status = excluded.status"
        )
    };
    RowsWrite::of(entries, 12, sql, |h| {
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
}

/// The status changes, then each changed runner's trimmed to the newest.
async fn insert_status_changes<D: Db>(
    db: &mut D,
    changes: &[StatusChangeEntry<'_>],
) -> StoreResult<()> {
    let sql = |rows: &str| {
        format!(
            "INSERT INTO status_changes (runner_id, at, from_status, to_status, detail) \
             {rows}"
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
    db.write_rows(vec![refusal_upserts(writes)]).await?;
    Ok(())
}

/// `upsert_refusals`' rows.
fn refusal_upserts<'a>(writes: &'a [(&'a RunnerId, RefusalWrite)]) -> RowsWrite<'a> {
    let sql = |rows: &str| {
        format!(
            "INSERT INTO refusals (runner_id, slot, seq, at, last_at, count, code, detail) \
             {rows} \
             ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, at = excluded.at, \
             last_at = excluded.last_at, count = excluded.count, code = excluded.code, \
             detail = excluded.detail"
        )
    };
    RowsWrite::of(writes, 8, sql, |(runner, w)| {
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
    // One statement on PostgreSQL: the events refer to the jobs, not to the leases.
    db.write_rows(vec![
        queue::lease_rows(&granted),
        queue::leased_event_rows(&granted),
    ])
    .await?;
    Ok(())
}

/// The ids of the runners `items` name (sorted, once each), and their attestations with
/// their places in the round.
fn round_of(items: &[RoundItem]) -> (Vec<&str>, Vec<(usize, &AttestationRecord)>) {
    let attestations: Vec<(usize, &AttestationRecord)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| item.attestation.as_ref().map(|a| (i, a)))
        .collect();
    let ids: Vec<&str> = items
        .iter()
        .flat_map(RoundItem::runners)
        .map(RunnerId::as_str)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    (ids, attestations)
}

/// Each item's outcome as the plan judged its attestation (claims are made after).
fn outcomes_of(items: &[RoundItem], plan: &Plan<'_>) -> Vec<RoundOutcome> {
    items
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
            judged_stale: plan.stale.contains(&i),
        })
        .collect()
}

/// The plan's spilled jtis, as `replay` writes them.
fn spills_of<'a>(plan: &'a Plan<'_>) -> Vec<(&'a RunnerId, Millis, &'a str)> {
    plan.spills
        .iter()
        .map(|(r, u, k)| (*r, *u, k.as_str()))
        .collect()
}

/// Writes `items` as one round inside `db`'s transaction, and says what became of each.
pub async fn write<D: Db>(db: &mut D, items: &[RoundItem]) -> StoreResult<Vec<RoundOutcome>> {
    let (ids, attestations) = round_of(items);
    let Read { rows, spilled, .. } = read_round(db, &ids, &attestations, true).await?;
    let plan = plan(&rows, &attestations, &spilled, forgetting_now());
    let mut outcomes = outcomes_of(items, &plan);
    let spills = spills_of(&plan);
    // The round's row writes together: on PostgreSQL one statement, one round trip. None of
    // them reads what another writes (runners, the two rings, the spilled jtis).
    db.write_rows(vec![
        runner_updates(&plan.updates),
        history_upserts(&plan.history),
        refusal_upserts(&plan.refusals),
        replay::spills(&spills),
    ])
    .await?;
    replay::note_spilled(db, &spills).await?;
    // Every accepted attestation reaches this process's cache once committed
    // (`group_commit`); what the gate judges differently reaches every replica's.
    for u in &plan.updates {
        if rows
            .get(u.runner_id)
            .is_some_and(|before| u.changes_gate(before))
        {
            db.changed(Change::Runner(u.runner_id.clone())).await?;
        }
    }
    // Statements of their own: the trim reads the rows the insert wrote.
    insert_status_changes(db, &plan.status_changes).await?;
    let released: BTreeSet<&RunnerId> = plan
        .updates
        .iter()
        .filter(|u| {
            rows.get(u.runner_id)
                .is_some_and(|before| u.releases(before))
        })
        .map(|u| u.runner_id)
        .collect();
    claim(db, items, &mut outcomes, &rows, &released).await?;
    Ok(outcomes)
}

/// What became of a round offered to `write_unlocked`.
pub enum Unlocked {
    /// Each item's outcome, the round's runners' rows as the round left them, with their
    /// versions, for the lane to know (`KnownRows`), and the runners whose rows the lane knew
    /// but another writer had changed since (the round was then read).
    Written {
        outcomes: Vec<RoundOutcome>,
        rows: VersionedRows,
        changed_behind: Vec<RunnerId>,
    },
    /// Nothing was written: the round is `write`'s, in a transaction under its rows' locks.
    NeedsLock,
    /// The connection was found gone (or silent) at the round's first statement: the round is
    /// `write`'s, on another connection. Nothing was written, unless the connection was lost
    /// after the server committed that statement (the round's one write, when its rows were
    /// known: then `write_sent`, also when the connection was found dead as it was sent) and
    /// before its answer came. Versions a lane knows are then forgotten: the server it reaches
    /// next may be another (a failover), which hands out transaction ids, and so versions, that
    /// the lost one already had.
    ConnectionLost { write_sent: bool },
}

/// A round of attestations and no claim, written with no transaction around it: one statement
/// or two (three, when a known row had changed), each committed by itself, where `write` sends
/// four (`BEGIN`, the locked read, the writes, `COMMIT`) and writes its row locks to the WAL. The runners' rows come with
/// their versions (`xmin`): as the lane knows them (`known`, every runner of the round), or
/// else read; then every write of the round goes in one statement that changes a runner's row
/// only where its version is still that one, and fails whole, as a conflict, when any is not
/// (`RowsWrite::every_row`). So whatever another writer did since (a jti accepted at another
/// replica, a revocation, a cordon, another round) is neither overwritten nor overlooked: the
/// round is then written again by `write`, locked, and judged on what it finds.
///
/// Planned from known rows, the round reads nothing: one round trip. Its write's guard then
/// also asks `seen_jtis` for the jtis the rows say their runners may have spilled, which the
/// read would have asked; one found there (a replay of a spilled jti) fails the write as a
/// row changed would, and the round is then read and planned again (a row another writer
/// changed costs one failed statement more than before lanes knew rows). Only acceptances
/// are planned so: a round that known rows would refuse anything (a replay, a revocation) is
/// read, so that every refusal rests on a read.
///
/// A round that would change what the gate judges (announced with its commit in `write`) or
/// record a status change (two statements, the trim reading the insert), or whose engine
/// keeps no row versions (SQLite), writes nothing here (`NeedsLock`); one whose first
/// statement found the connection gone, `ConnectionLost`.
pub async fn write_unlocked<D: Db>(
    db: &mut D,
    items: &[RoundItem],
    known: Option<VersionedRows>,
) -> StoreResult<Unlocked> {
    if items.iter().any(|i| i.claim.is_some()) {
        return Ok(Unlocked::NeedsLock);
    }
    let (ids, attestations) = round_of(items);
    let mut known_versions = BTreeMap::new();
    if let Some(known) = known {
        let plan = plan(
            &known.rows,
            &attestations,
            &HashSet::new(),
            forgetting_now(),
        );
        if plan.verdicts.values().all(Result::is_ok) {
            let asked = spill_asks(&known.rows, &attestations);
            match write_planned(db, items, &known, plan, &asked).await {
                // Sent, perhaps committed: the locked round on another connection cannot tell
                // this write's own attestations from replays (`group_commit` answers those it
                // finds replayed undecided). Nothing is accepted twice.
                Err(StoreError::Unavailable(e)) => {
                    tracing::warn!(error = %e, "a round's connection was lost at its one \
                        statement; writing it under its rows' locks on another");
                    return Ok(Unlocked::ConnectionLost { write_sent: true });
                }
                // A row changed since the lane wrote it (another replica's round, an operator)
                // or a jti was found spilled: nothing was kept, and the round is read, as it
                // was before lanes knew rows, rather than locked.
                Err(e) if e.is_conflict() => {
                    tracing::debug!(error = %e, "a known row changed or a jti was found \
                        spilled; reading the round");
                    known_versions = known.versions;
                }
                Err(e) => return Err(e),
                Ok(None) => return Ok(Unlocked::NeedsLock),
                Ok(Some(written)) => return Ok(written.applied_to(known, Vec::new())),
            }
        }
    }
    let read = match read_round(db, &ids, &attestations, false).await {
        Ok(read) => read,
        // Nothing was written; the locked way begins on another connection.
        Err(StoreError::Unavailable(_)) => {
            return Ok(Unlocked::ConnectionLost { write_sent: false });
        }
        Err(e) => return Err(e),
    };
    // What the lane knew that the read found changed (none, when a spilled jti failed the
    // known write): another replica may be taking turns with this one at these runners.
    let changed_behind: Vec<RunnerId> = known_versions
        .into_iter()
        .filter(|(id, known)| read.versions.get(id) != Some(known))
        .map(|(id, _)| id)
        .collect();
    let plan = plan(&read.rows, &attestations, &read.spilled, forgetting_now());
    let rows = VersionedRows {
        rows: read.rows,
        versions: read.versions,
    };
    // A write whose answer is lost here fails the round, 503 for each of its requests, which
    // their runners send again with fresh attestations.
    Ok(
        match write_planned(db, items, &rows, plan, &BTreeMap::new()).await? {
            Some(written) => written.applied_to(rows, changed_behind),
            None => Unlocked::NeedsLock,
        },
    )
}

/// What `write_planned` wrote: each item's outcome, and each runner's row it updated with the
/// version the write gave it.
struct PlannedWrite {
    outcomes: Vec<RoundOutcome>,
    updated: Vec<(RunnerId, RunnerRow)>,
    version: Option<String>,
}

impl PlannedWrite {
    /// The round as written: the rows it was planned from, with its updates.
    fn applied_to(self, mut rows: VersionedRows, changed_behind: Vec<RunnerId>) -> Unlocked {
        for (id, row) in self.updated {
            match &self.version {
                Some(v) => rows.versions.insert(id.clone(), v.clone()),
                None => rows.versions.remove(&id),
            };
            rows.rows.insert(id, row);
        }
        Unlocked::Written {
            outcomes: self.outcomes,
            rows,
            changed_behind,
        }
    }
}

/// Per runner, the jtis of the round (each as its key and as itself) that its row says it may
/// have spilled, one a line: what `read_round` would ask `seen_jtis`.
fn spill_asks<'a>(
    rows: &BTreeMap<RunnerId, RunnerRow>,
    attestations: &[(usize, &'a AttestationRecord)],
) -> BTreeMap<&'a RunnerId, String> {
    let mut asked: BTreeMap<&RunnerId, String> = BTreeMap::new();
    for (_, r) in attestations {
        if may_have_spilled(rows, r) {
            let lines = asked.entry(&r.runner_id).or_default();
            for k in [jti_key(&r.jti).as_str(), r.jti.as_str()] {
                if !lines.is_empty() {
                    lines.push('\n');
                }
                lines.push_str(k);
            }
        }
    }
    asked
}

/// `plan`, planned from `before`, written unlocked when nothing of it needs the locks; `None`
/// when it needs them.
async fn write_planned<D: Db>(
    db: &mut D,
    items: &[RoundItem],
    before: &VersionedRows,
    plan: Plan<'_>,
    asked: &BTreeMap<&RunnerId, String>,
) -> StoreResult<Option<PlannedWrite>> {
    let needs_lock = !plan.status_changes.is_empty()
        || plan.updates.iter().any(|u| {
            !before.versions.contains_key(u.runner_id)
                || before
                    .rows
                    .get(u.runner_id)
                    .is_none_or(|before| u.changes_gate(before))
        });
    if needs_lock {
        return Ok(None);
    }
    let outcomes = outcomes_of(items, &plan);
    let spills = spills_of(&plan);
    let version = db
        .write_rows(vec![
            runner_updates_guarded(&plan.updates, &before.versions, asked),
            history_upserts(&plan.history),
            refusal_upserts(&plan.refusals),
            replay::spills(&spills),
        ])
        .await?;
    replay::note_spilled(db, &spills).await?;
    Ok(Some(PlannedWrite {
        outcomes,
        updated: plan
            .updates
            .into_iter()
            .map(|u| (u.runner_id.clone(), u.row))
            .collect(),
        version,
    }))
}

//! Replay state (rule 5: a `jti` is accepted once), kept on the runner's row.
//!
//! Each accepted attestation's `jti` must be remembered until its attestation could no longer
//! be valid (its `exp` plus the leeway). A table of them costs a heartbeat two pages of writes
//! (the row and its index entry, scattered by random jtis); the runner's row is written by the
//! heartbeat anyway. So the row keeps its runner's recent jtis, as 64-bit hashes with their
//! expiry (`recent_jtis`: `expires_ms:hash …`, oldest first), and drops those whose window
//! ended more than `FORGET_AFTER` ago whenever it is written (`record::FORGET_AFTER` says why
//! the margin, and why a round refuses an attestation whose own window has ended). A runner
//! that presents more than `IN_ROW` unexpired attestations in one window (a client hammering
//! the lease endpoint) spills its oldest into `seen_jtis`, and `jtis_spilled_until` says until
//! when they must be asked too.
//!
//! Where the spilled jtis are looked up depends on who writes the database. PostgreSQL's
//! replicas share it, so the table is indexed by its primary key `(runner_id, jti)` and asked.
//! SQLite has one writer, this process, so the table is only its durable record (appended,
//! loaded at start, purged from its head) and the lookups go to `SpillIndex`, in memory: a
//! random key in an on-disk index costs a heartbeat two or three pages written (its insert and
//! its purge, each in a random leaf), where an append costs a share of one. It has no index at
//! all: one on the expiry cost each round that spilled a page or two more (entries of jtis
//! signed a moment apart land in several leaves), and the table's own order serves the purge,
//! since jtis spill in about the order their windows end.
//!
//! A hash is 64 bits of SHA-256: a fresh `jti` is mistaken for a replay with a chance of about
//! one in 2⁶⁴ per remembered one, far below anything else that can refuse an attestation.

use crate::domain::ids::RunnerId;
pub use crate::domain::record::{IN_ROW, RecentJtis, forget_before, jti_key};
use crate::domain::time::Millis;
use crate::store::StoreResult;
use crate::store::engine::{Change, Db, Param, RowsWrite, Statement, fetch_optional};
use crate::store::spills::SpillIndex;
use std::collections::HashSet;

/// Which of the asked (runner, key) pairs were spilled: one lookup for a whole round. A key is
/// a jti's key or, for what was remembered before keys were, the jti itself.
pub async fn spilled<D: Db>(
    db: &mut D,
    asked: &[(&RunnerId, &str)],
) -> StoreResult<HashSet<(RunnerId, String)>> {
    if asked.is_empty() {
        return Ok(HashSet::new());
    }
    if let Some(index) = db.spill_index() {
        return Ok(asked
            .iter()
            .filter(|(runner, key)| index.contains(runner, key))
            .map(|(runner, key)| ((*runner).clone(), key.to_string()))
            .collect());
    }
    let mut found = HashSet::new();
    for part in super::chunks(asked) {
        let params = part
            .iter()
            .flat_map(|(runner, key)| [Param::Text(runner.as_str()), Param::Text(key)])
            .collect();
        let rows = db
            .fetch(
                Statement::built(format!(
                    "SELECT runner_id, jti FROM seen_jtis WHERE (runner_id, jti) IN (VALUES {})",
                    super::values_list(part.len(), 2, 1)
                ))
                .params(params),
            )
            .await?;
        for r in &rows {
            found.insert((RunnerId(r.text("runner_id")?), r.text("jti")?));
        }
    }
    Ok(found)
}

/// Whether `jti` was accepted from `runner` (rule 5, as a read).
pub async fn seen<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    jti: &str,
    now: Millis,
) -> StoreResult<bool> {
    let row = fetch_optional(
        db,
        Statement::new("SELECT recent_jtis, jtis_spilled_until FROM runners WHERE id = $1")
            .bind(runner.as_str()),
    )
    .await?;
    let Some(row) = row else { return Ok(false) };
    let key = jti_key(jti);
    if RecentJtis::parse(&row.text("recent_jtis")?).contains(&key) {
        return Ok(true);
    }
    if row
        .opt_int("jtis_spilled_until")?
        .is_some_and(|u| u >= now.0)
    {
        return Ok(!spilled(db, &[(runner, &key), (runner, jti)])
            .await?
            .is_empty());
    }
    Ok(false)
}

/// Spilled entries into `seen_jtis`: a round writes them with its other rows, then notes them
/// (`note_spilled`) for the index in memory.
pub fn spills<'a>(entries: &'a [(&'a RunnerId, Millis, &'a str)]) -> RowsWrite<'a> {
    let sql = |rows: &str| {
        format!(
            "INSERT INTO seen_jtis (runner_id, jti, expires_at) {rows} \
             ON CONFLICT DO NOTHING"
        )
    };
    RowsWrite::of(entries, 3, sql, |(runner, until, key)| {
        vec![
            Param::Text(runner.as_str()),
            Param::Text(key),
            Param::Int(until.0),
        ]
    })
}

/// Notes `spills`' entries as changed: once committed they join the engine's index in memory
/// (SQLite's).
pub async fn note_spilled<D: Db>(
    db: &mut D,
    entries: &[(&RunnerId, Millis, &str)],
) -> StoreResult<()> {
    for (runner, until, key) in entries {
        db.changed(Change::Spilled {
            runner: (*runner).clone(),
            key: key.to_string(),
            until: *until,
        })
        .await?;
    }
    Ok(())
}

/// Every unexpired spilled jti, for the index in memory at start (SQLite's alone), in the
/// order they spilled, as the index keeps them.
pub async fn load<D: Db>(db: &mut D, now: Millis) -> StoreResult<SpillIndex> {
    let index = SpillIndex::default();
    let forget_before = forget_before(now);
    let rows = db
        .fetch(
            Statement::new(
                "SELECT runner_id, jti, expires_at FROM seen_jtis WHERE expires_at >= $1 \
                 ORDER BY rowid",
            )
            .bind(forget_before.0),
        )
        .await?;
    for r in &rows {
        index.remember(
            &RunnerId(r.text("runner_id")?),
            &r.text("jti")?,
            Millis(r.int("expires_at")?),
        );
    }
    Ok(index)
}

/// Forgets spilled jtis whose window ended more than `FORGET_AFTER` ago; how many.
///
/// SQLite's table is appended in the order jtis spill: what expired is its head, up to the
/// first entry that has not. An expired entry behind a longer-lived one waits for it (as in
/// the index in memory), which only keeps a jti that rule 4 refuses anyway a little longer.
pub async fn purge<D: Db>(db: &mut D, now: Millis) -> StoreResult<u64> {
    let forget_before = forget_before(now);
    let Some(index) = db.spill_index() else {
        return db
            .execute(
                Statement::new("DELETE FROM seen_jtis WHERE expires_at < $1").bind(forget_before.0),
            )
            .await;
    };
    index.purge(forget_before);
    db.execute(
        Statement::new(
            "DELETE FROM seen_jtis WHERE rowid < COALESCE(\
             (SELECT rowid FROM seen_jtis WHERE expires_at >= $1 ORDER BY rowid LIMIT 1), \
             (SELECT MAX(rowid) + 1 FROM seen_jtis))",
        )
        .bind(forget_before.0),
    )
    .await
}

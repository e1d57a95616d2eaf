//! Replay state (rule 5: a `jti` is accepted once), kept on the runner's row.
//!
//! Each accepted attestation's `jti` must be remembered until its attestation could no longer
//! be valid (its `exp` plus the leeway). A table of them costs a heartbeat two pages of writes
//! (the row and its index entry, scattered by random jtis); the runner's row is written by the
//! heartbeat anyway. So the row keeps its runner's recent jtis, as 64-bit hashes with their
//! expiry (`recent_jtis`: `expires_ms:hash …`, oldest first), and drops the expired ones
//! whenever it is written. A runner that presents more than `IN_ROW` unexpired attestations in
//! one window (a client hammering the lease endpoint) spills its oldest into `seen_jtis`, and
//! `jtis_spilled_until` says until when they must be asked too.
//!
//! Where the spilled jtis are looked up depends on who writes the database. PostgreSQL's
//! replicas share it, so the table is indexed by its primary key `(runner_id, jti)` and asked.
//! SQLite has one writer, this process, so the table is only its durable record (appended,
//! indexed by expiry alone, loaded at start) and the lookups go to `SpillIndex`, in memory: a
//! random key in an on-disk index costs a heartbeat two or three pages written (its insert and
//! its purge, each in a random leaf), where an append costs a share of one.
//!
//! A hash is 64 bits of SHA-256: a fresh `jti` is mistaken for a replay with a chance of about
//! one in 2⁶⁴ per remembered one, far below anything else that can refuse an attestation.

use crate::domain::ids::RunnerId;
use crate::domain::time::Millis;
use crate::store::StoreResult;
use crate::store::engine::{Change, Db, Param, Statement, fetch_optional};
use crate::store::spills::SpillIndex;
use sha2::{Digest, Sha256};
use std::collections::HashSet;

/// How many unexpired jtis a runner's row keeps before it spills into `seen_jtis`: a
/// heartbeat every 15 s and a long poll every 30 s leave about 9 in a window of 90 s.
pub const IN_ROW: usize = 12;

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

    pub fn format(&self) -> String {
        let parts: Vec<String> = self.0.iter().map(|(e, k)| format!("{}:{k}", e.0)).collect();
        parts.join(" ")
    }

    pub fn contains(&self, key: &str) -> bool {
        self.0.iter().any(|(_, k)| k == key)
    }

    /// Forgets what expired before `now`.
    pub fn prune(&mut self, now: Millis) {
        self.0.retain(|(exp, _)| *exp >= now);
    }

    /// Remembers `key` until `until`; the entries that no longer fit, to spill.
    pub fn remember(&mut self, key: String, until: Millis) -> Vec<(Millis, String)> {
        self.0.push((until, key));
        self.0.sort();
        let over = self.0.len().saturating_sub(IN_ROW);
        self.0.drain(..over).collect()
    }
}

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

/// Spilled entries into `seen_jtis` (and, once committed, into the index in memory).
pub async fn spill<D: Db>(db: &mut D, entries: &[(&RunnerId, Millis, &str)]) -> StoreResult<()> {
    let sql = |values: &str| {
        format!(
            "INSERT INTO seen_jtis (runner_id, jti, expires_at) VALUES {values} \
             ON CONFLICT DO NOTHING"
        )
    };
    super::write_rows(db, entries, 3, sql, |(runner, until, key)| {
        vec![
            Param::Text(runner.as_str()),
            Param::Text(key),
            Param::Int(until.0),
        ]
    })
    .await?;
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

/// Every unexpired spilled jti, for the index in memory at start.
pub async fn load<D: Db>(db: &mut D, now: Millis) -> StoreResult<SpillIndex> {
    let index = SpillIndex::default();
    let rows = db
        .fetch(
            Statement::new(
                "SELECT runner_id, jti, expires_at FROM seen_jtis WHERE expires_at >= $1 \
                 ORDER BY expires_at",
            )
            .bind(now.0),
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

/// Forgets spilled jtis past their window; how many.
pub async fn purge<D: Db>(db: &mut D, now: Millis) -> StoreResult<u64> {
    if let Some(index) = db.spill_index() {
        index.purge(now);
    }
    db.execute(Statement::new("DELETE FROM seen_jtis WHERE expires_at < $1").bind(now.0))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

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
        recent.prune(Millis(1_010));
        assert!(!recent.contains(&jti_key("j9")) && recent.contains(&jti_key("j10")));
        assert_eq!(
            RecentJtis::parse("garbage 12:abc"),
            RecentJtis(vec![(Millis(12), "abc".into())])
        );
        assert_eq!(jti_key("x").len(), 16);
    }

    #[test]
    fn the_index_in_memory_finds_each_runners_own_spills_until_they_expire() {
        let index = SpillIndex::default();
        let (r1, r2) = (RunnerId("r1".into()), RunnerId("r2".into()));
        index.remember(&r1, "k1", Millis(100));
        index.remember(&r1, "k2", Millis(300));
        index.remember(&r2, "k3", Millis(200));
        let found = |r: &RunnerId, keys: &[&str]| -> Vec<String> {
            keys.iter()
                .filter(|k| index.contains(r, k))
                .map(|k| k.to_string())
                .collect()
        };
        assert_eq!(found(&r1, &["k1", "k2", "k3"]), vec!["k1", "k2"]);
        assert_eq!(found(&r2, &["k1", "k3"]), vec!["k3"]);
        assert_eq!(index.purge(Millis(150)), 1);
        assert_eq!(found(&r1, &["k1", "k2"]), vec!["k2"]);
        // k3 (200) waits behind k2 (300): still found, as an expired jti is refused anyway.
        assert_eq!(index.purge(Millis(250)), 0);
        assert_eq!(index.purge(Millis(301)), 2);
        assert!(index.is_empty());
    }
}

//! What a lane of group commit knows of its runners' rows: each as its last round wrote it (or
//! read it), with the version the database gave it then (PostgreSQL's `xmin`).
//!
//! A round of attestations written without a transaction (`sql::round::write_unlocked`) needs
//! its runners' rows to plan its writes, and their versions, so that its one write changes a
//! row only where nobody else did since. Reading them costs a round trip before the write; but
//! a runner's requests always take the same lane, so the lane wrote most of them itself a
//! round or two ago and knows what they hold. A round whose every runner is known here is
//! planned from what is known and goes straight to its guarded write: one round trip. The
//! guard is what makes this sound: whatever changed a row since (another replica, an operator,
//! a raw `UPDATE`) changed its version, the write then keeps nothing, and the round is read and
//! written again. So an entry here can be out of date but never believed when it is.
//!
//! A runner whose row another writer changed behind the lane is not known for `CONTENDED_FOR`
//! after: replicas behind a load balancer that sends each request where it likes take turns
//! at a runner, and planning from a row the other replica has since written would cost each
//! round a failed statement before its read.
//!
//! An entry is forgotten whenever its runner's round was not written from it (a conflict, the
//! locked way, a failure), and is not used once `KEPT_FOR` has passed since the database last
//! confirmed it (a write guarded by its version, or a read): a version's transaction id has
//! 32 bits, which the server reuses after about four billion transactions. A standby promoted
//! after a failover hands out again the ids the lost primary's last transactions had; a
//! version names its server as well (`sql::round::row_version_sql`), so no entry from before
//! the change passes a guard after it, whichever connection (a new one, a pooler's that
//! outlived the change) the round goes over. A lost connection forgets every entry too: they
//! would only fail their guards.

use crate::domain::ids::RunnerId;
use crate::domain::record::RunnerRow;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How long after the database last confirmed it an entry may still plan a round.
pub const KEPT_FOR: Duration = Duration::from_secs(300);

/// How long a runner whose row changed behind the lane is read rather than known.
pub const CONTENDED_FOR: Duration = Duration::from_secs(300);

/// The most runners a lane keeps: past it, the entries the database confirmed longest ago
/// are dropped (a fleet that large reads some rows again, a round trip each round). An entry
/// is a runner's row as a round reads it, about a kilobyte with its recent jtis: tens of
/// megabytes a lane at most.
pub const MOST_KEPT: usize = 50_000;

/// Rows with their versions, by runner: what a round read, or what it left.
#[derive(Clone, Debug, Default)]
pub struct VersionedRows {
    pub rows: BTreeMap<RunnerId, RunnerRow>,
    pub versions: BTreeMap<RunnerId, String>,
}

struct Known {
    row: RunnerRow,
    version: String,
    confirmed: Instant,
}

/// One lane's rows, by runner id; owned by the lane's writer, so no lock.
#[derive(Default)]
pub struct KnownRows {
    entries: HashMap<String, Known>,
    /// Runners whose rows changed behind the lane, and when that was found.
    contended: HashMap<String, Instant>,
}

impl KnownRows {
    /// The rows of every runner of a round (`RoundItem::runners`), when all are known and
    /// confirmed within `KEPT_FOR` of `now`; else `None`, and the round reads them. (A lane
    /// that never learns, SQLite's, whose rounds all take the locked way, looks nothing up.)
    pub fn of<'a>(
        &self,
        runners: impl IntoIterator<Item = &'a RunnerId>,
        now: Instant,
    ) -> Option<VersionedRows> {
        if self.entries.is_empty() {
            return None;
        }
        let mut known = VersionedRows::default();
        for id in runners {
            let entry = self.entries.get(id.as_str())?;
            if now.saturating_duration_since(entry.confirmed) >= KEPT_FOR {
                return None;
            }
            known.rows.insert(id.clone(), entry.row.clone());
            known.versions.insert(id.clone(), entry.version.clone());
        }
        (!known.rows.is_empty()).then_some(known)
    }

    /// Takes `rows` as the database holds them at `now` (a round's read, or the rows it wrote
    /// with the version it gave them).
    pub fn learn(&mut self, rows: VersionedRows, now: Instant) {
        let VersionedRows { rows, mut versions } = rows;
        for (id, row) in rows {
            let Some(version) = versions.remove(&id) else {
                self.entries.remove(&id.0);
                continue;
            };
            if self.is_contended(&id.0, now) {
                continue;
            }
            self.entries.insert(
                id.0,
                Known {
                    row,
                    version,
                    confirmed: now,
                },
            );
        }
        if self.entries.len() > MOST_KEPT {
            self.drop_oldest(now);
        }
    }

    /// Forgets `runners`: their rows may have changed in a way only a read tells.
    pub fn forget<'a>(&mut self, runners: impl IntoIterator<Item = &'a RunnerId>) {
        if self.entries.is_empty() {
            return;
        }
        for id in runners {
            self.entries.remove(id.as_str());
        }
    }

    /// Forgets every runner: the connection to the server was lost, and the one reached next
    /// may hand out versions again (a failover to a standby).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Forgets the runners of `ids`, whose rows changed behind the lane, and learns none of
    /// them for `CONTENDED_FOR`.
    pub fn contend(&mut self, ids: &[RunnerId], now: Instant) {
        if self.contended.len() + ids.len() > MOST_KEPT {
            self.contended
                .retain(|_, at| now.saturating_duration_since(*at) < CONTENDED_FOR);
        }
        for id in ids {
            self.entries.remove(&id.0);
            self.contended.insert(id.0.clone(), now);
        }
    }

    fn is_contended(&mut self, id: &str, now: Instant) -> bool {
        match self.contended.get(id) {
            Some(at) if now.saturating_duration_since(*at) < CONTENDED_FOR => true,
            Some(_) => {
                self.contended.remove(id);
                false
            }
            None => false,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Keeps the newer half of `MOST_KEPT`: a pass over every entry is paid once per half of
    /// them learnt, not once per round.
    fn drop_oldest(&mut self, now: Instant) {
        let mut ages: Vec<Duration> = self
            .entries
            .values()
            .map(|k| now.saturating_duration_since(k.confirmed))
            .collect();
        let keep = MOST_KEPT / 2;
        let (_, &mut cut, _) = ages.select_nth_unstable(keep);
        self.entries
            .retain(|_, k| now.saturating_duration_since(k.confirmed) < cut);
        // Entries as old as the cut are all dropped, which may leave fewer than `keep`.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<RunnerId> {
        names.iter().map(|n| RunnerId(n.to_string())).collect()
    }

    fn rows(ids: &[&str], version: &str, seq: i64) -> VersionedRows {
        let mut r = VersionedRows::default();
        for id in ids {
            let row = RunnerRow {
                attestation_seq: seq,
                ..RunnerRow::default()
            };
            r.rows.insert(RunnerId(id.to_string()), row);
            r.versions
                .insert(RunnerId(id.to_string()), version.to_string());
        }
        r
    }

    #[test]
    fn a_round_is_known_only_when_every_runner_is() {
        let mut known = KnownRows::default();
        let now = Instant::now();
        known.learn(rows(&["a", "b"], "100", 1), now);
        let both = known.of(&ids(&["a", "b"]), now).expect("both known");
        assert_eq!(both.versions[&RunnerId("b".into())], "100");
        assert_eq!(both.rows[&RunnerId("a".into())].attestation_seq, 1);
        assert!(known.of(&ids(&["a", "c"]), now).is_none());

        known.learn(rows(&["a"], "101", 2), now);
        let a = known.of(&ids(&["a"]), now).unwrap();
        assert_eq!(a.versions[&RunnerId("a".into())], "101");
        assert_eq!(a.rows[&RunnerId("a".into())].attestation_seq, 2);

        known.forget(&ids(&["a"]));
        assert!(known.of(&ids(&["a", "b"]), now).is_none());
        assert!(known.of(&ids(&["b"]), now).is_some());
    }

    #[test]
    fn a_runner_whose_row_changed_behind_the_lane_is_read_for_a_while() {
        let mut known = KnownRows::default();
        let then = Instant::now();
        known.learn(rows(&["a", "b"], "100", 1), then);
        known.contend(&[RunnerId("a".into())], then);
        assert!(known.of(&ids(&["a"]), then).is_none());
        known.learn(rows(&["a", "b"], "101", 2), then + Duration::from_secs(1));
        assert!(
            known
                .of(&ids(&["a"]), then + Duration::from_secs(1))
                .is_none()
        );
        assert!(
            known
                .of(&ids(&["b"]), then + Duration::from_secs(1))
                .is_some()
        );
        // Once the while has passed, a read's rows are known again.
        let later = then + CONTENDED_FOR;
        known.learn(rows(&["a"], "102", 3), later);
        assert_eq!(
            known.of(&ids(&["a"]), later).unwrap().versions[&RunnerId("a".into())],
            "102"
        );
    }

    #[test]
    fn a_row_without_its_version_is_not_kept() {
        let mut known = KnownRows::default();
        let now = Instant::now();
        known.learn(rows(&["a"], "100", 1), now);
        let mut unversioned = rows(&["a"], "101", 2);
        unversioned.versions.clear();
        known.learn(unversioned, now);
        assert!(known.of(&ids(&["a"]), now).is_none());
    }

    #[test]
    fn an_entry_the_database_has_not_confirmed_for_kept_for_is_not_used() {
        let mut known = KnownRows::default();
        let then = Instant::now();
        known.learn(rows(&["a"], "100", 1), then);
        assert!(
            known
                .of(&ids(&["a"]), then + KEPT_FOR - Duration::from_secs(1))
                .is_some()
        );
        assert!(known.of(&ids(&["a"]), then + KEPT_FOR).is_none());
        // A write confirmed it again.
        known.learn(rows(&["a"], "102", 2), then + KEPT_FOR);
        assert!(known.of(&ids(&["a"]), then + KEPT_FOR).is_some());
    }

    #[test]
    fn past_most_kept_the_longest_unconfirmed_go() {
        let mut known = KnownRows::default();
        let start = Instant::now();
        let names: Vec<String> = (0..=MOST_KEPT).map(|i| format!("r{i}")).collect();
        for (i, id) in names.iter().enumerate() {
            known.learn(
                rows(&[id.as_str()], "1", 0),
                start + Duration::from_millis(i as u64),
            );
        }
        let now = start + Duration::from_millis(MOST_KEPT as u64);
        assert!(known.len() <= MOST_KEPT / 2 + 1, "{}", known.len());
        assert!(known.len() >= MOST_KEPT / 2 - 1, "{}", known.len());
        assert!(known.of(&ids(&[names[MOST_KEPT].as_str()]), now).is_some());
        assert!(known.of(&ids(&[names[0].as_str()]), now).is_none());
    }
}

//! Write rounds: many requests' writes in one transaction (group commit).
//!
//! Every attestation the gate admits needs a durable write before it is answered: its `jti`
//! for replay protection (rule 5), its runner's latest state and history, and, for a lease, the
//! claim. Done one request at a time that is a transaction, a commit and half a dozen
//! statements each. A round takes every request waiting at that moment and writes them together
//! with one statement per table and one commit, then answers each with its own outcome, so a
//! request is still answered only after what it asked for is committed.
//!
//! This module holds the round's types and its pure bookkeeping (`plan`): sequence numbers,
//! history-ring slots, status changes and quarantine lifts, computed from the locked runner
//! rows. The steps live in `round_writer.rs`, the statements in `round_sql.rs`, the batching of
//! waiting requests in `group_commit.rs`.

use super::{ATTESTATION_HISTORY, AttestationRecord, Claim, Lease, REFUSAL_HISTORY, StoreError};
use crate::domain::ids::RunnerId;
use crate::domain::job::Job;
use crate::domain::time::Millis;
use std::collections::{BTreeMap, VecDeque};

/// One request's share of a round: an attestation to accept and record, a claim, or both (a
/// lease: the claim happens only when the attestation is accepted).
#[derive(Clone, Debug, Default)]
pub struct RoundItem {
    pub attestation: Option<AttestationRecord>,
    pub claim: Option<Claim>,
}

/// Rules 5 and 6, decided inside the round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    Replayed,
    Revoked,
}

/// What a round did for one item.
#[derive(Clone, Debug, Default)]
pub struct RoundOutcome {
    /// `None` when the item carried no attestation.
    pub attestation: Option<Result<(), Rejection>>,
    /// The lease and job granted to the item's claim, if any.
    pub granted: Option<(Lease, Job)>,
}

pub type RoundResult = Result<Vec<RoundOutcome>, StoreError>;

/// The fields of a runner's row that a round reads (under a row lock on PostgreSQL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerRow {
    pub attestation_seq: i64,
    pub refusal_seq: i64,
    pub last_status: Option<String>,
    pub quarantined_at: Option<Millis>,
    pub revoked: bool,
    pub cordoned: bool,
}

impl RunnerRow {
    /// May this runner be given a job now? (Rule 6 and the operator's cordon, as stored.)
    pub fn may_claim(&self) -> bool {
        !self.revoked && !self.cordoned
    }
}

/// A runner's row after the round's attestations: the latest one in place, and the counters.
#[derive(Debug)]
pub struct RunnerUpdate<'a> {
    pub runner_id: &'a RunnerId,
    pub latest: &'a AttestationRecord,
    pub attestation_seq: i64,
    pub refusal_seq: i64,
    pub last_status: &'static str,
    pub quarantined_at: Option<Millis>,
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

#[derive(Debug, PartialEq, Eq)]
pub struct RefusalRingEntry<'a> {
    pub runner_id: &'a RunnerId,
    pub slot: i64,
    pub seq: i64,
    pub at: Millis,
    pub code: &'a str,
    pub detail: &'a str,
}

/// Everything a round writes for its accepted attestations.
#[derive(Debug, Default)]
pub struct Plan<'a> {
    pub updates: Vec<RunnerUpdate<'a>>,
    pub history: Vec<HistoryEntry<'a>>,
    pub status_changes: Vec<StatusChangeEntry<'a>>,
    pub refusals: Vec<RefusalRingEntry<'a>>,
}

/// The writes for `accepted` (in arrival order), starting from each runner's stored row.
///
/// A runner may appear several times in one round. Its counters advance once per attestation,
/// the row keeps the last one, and each ring keeps only the entries that would survive it (so
/// that no slot is written twice in one statement). A passing probe checked after the
/// quarantine lifts it, as it would one attestation at a time.
pub fn plan<'a>(
    rows: &BTreeMap<RunnerId, RunnerRow>,
    accepted: &[&'a AttestationRecord],
) -> Plan<'a> {
    let mut by_runner: BTreeMap<&RunnerId, Vec<&'a AttestationRecord>> = BTreeMap::new();
    for rec in accepted {
        by_runner.entry(&rec.runner_id).or_default().push(rec);
    }
    let mut plan = Plan::default();
    for (runner_id, records) in by_runner {
        let Some(row) = rows.get(runner_id) else {
            continue;
        };
        let runner_id = &records[0].runner_id;
        let mut seq = row.attestation_seq;
        let mut refusal_seq = row.refusal_seq;
        let mut last_status = row.last_status.clone();
        let mut quarantined_at = row.quarantined_at;
        let mut history = VecDeque::new();
        let mut refusals = VecDeque::new();
        for rec in &records {
            seq += 1;
            let status = rec.status.as_str();
            if last_status.as_deref() != Some(status) {
                plan.status_changes.push(StatusChangeEntry {
                    runner_id,
                    at: rec.received_at,
                    from: last_status.clone(),
                    to: status,
                    detail: rec.refusal.as_ref().map(|(_, d)| d.as_str()).or(rec
                        .state
                        .probe
                        .error
                        .as_deref()),
                });
                last_status = Some(status.to_string());
            }
            let probe = &rec.state.probe;
            if probe.ok && quarantined_at.is_some_and(|q| q < probe.checked_at) {
                quarantined_at = None;
            }
            push_ring(
                &mut history,
                ATTESTATION_HISTORY,
                HistoryEntry {
                    slot: seq % ATTESTATION_HISTORY,
                    seq,
                    record: rec,
                },
            );
            if let Some((code, detail)) = &rec.refusal {
                refusal_seq += 1;
                push_ring(
                    &mut refusals,
                    REFUSAL_HISTORY,
                    RefusalRingEntry {
                        runner_id,
                        slot: refusal_seq % REFUSAL_HISTORY,
                        seq: refusal_seq,
                        at: rec.received_at,
                        code,
                        detail,
                    },
                );
            }
        }
        let latest = records[records.len() - 1];
        plan.updates.push(RunnerUpdate {
            runner_id,
            latest,
            attestation_seq: seq,
            refusal_seq,
            last_status: latest.status.as_str(),
            quarantined_at,
            agent: latest.agent.as_ref().map(|a| a.to_string()),
        });
        plan.history.extend(history);
        plan.refusals.extend(refusals);
    }
    plan
}

/// Keeps the newest `capacity` entries: older ones would be overwritten in the same round.
fn push_ring<T>(ring: &mut VecDeque<T>, capacity: i64, entry: T) {
    if ring.len() as i64 == capacity {
        ring.pop_front();
    }
    ring.push_back(entry);
}

/// `items` in slices whose lengths are powers of two, largest first (13 = 8 + 4 + 1): the
/// multi-row statements of any round then come in a few sizes that stay prepared.
pub fn chunks<T>(items: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let size = 1usize << (usize::BITS - 1 - rest.len().leading_zeros());
        let (part, tail) = rest.split_at(size);
        rest = tail;
        Some(part)
    })
}

/// `($1, $2, $3), ($4, $5, $6), …` for `rows` rows of `cols` parameters, numbered from
/// `first`: the VALUES list of a multi-row statement.
pub fn values_list(rows: usize, cols: usize, first: usize) -> String {
    let mut out = String::with_capacity(rows * cols * 5);
    for r in 0..rows {
        if r > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for c in 0..cols {
            if c > 0 {
                out.push_str(", ");
            }
            out.push('$');
            out.push_str(&(first + r * cols + c).to_string());
        }
        out.push(')');
    }
    out
}

/// `$1, $2, …` for an `IN` list of `n` parameters numbered from `first`.
pub fn param_list(n: usize, first: usize) -> String {
    (0..n)
        .map(|i| format!("${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::attestation::{Probe, RunningImage};
    use crate::domain::verdict::{AttestedState, RunnerStatus};

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
                },
                image: RunningImage::default(),
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

    fn row(seq: i64, last: Option<&str>, quarantined_at: Option<i64>) -> RunnerRow {
        RunnerRow {
            attestation_seq: seq,
            refusal_seq: 0,
            last_status: last.map(String::from),
            quarantined_at: quarantined_at.map(Millis),
            revoked: false,
            cordoned: false,
        }
    }

    #[test]
    fn counters_advance_once_per_attestation_and_the_row_keeps_the_last() {
        let rows = BTreeMap::from([(RunnerId("r1".into()), row(7, Some("healthy"), None))]);
        let a = record("r1", "a", 10, true, false);
        let b = record("r1", "b", 20, false, true);
        let c = record("r1", "c", 30, true, false);
        let plan = plan(&rows, &[&a, &b, &c]);
        assert_eq!(plan.updates.len(), 1);
        let u = &plan.updates[0];
        assert_eq!((u.attestation_seq, u.refusal_seq), (10, 1));
        assert_eq!(u.latest.jti, "c");
        assert_eq!(u.last_status, "healthy");
        let seqs: Vec<i64> = plan.history.iter().map(|h| h.seq).collect();
        assert_eq!(seqs, vec![8, 9, 10]);
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
        assert_eq!(plan.refusals.len(), 1);
        assert_eq!(plan.refusals[0].detail, "crun not found");
    }

    #[test]
    fn rings_keep_only_what_survives_the_round_so_no_slot_is_written_twice() {
        let rows = BTreeMap::from([(RunnerId("r1".into()), row(0, None, None))]);
        let records: Vec<AttestationRecord> = (0..(ATTESTATION_HISTORY * 2 + 3))
            .map(|i| record("r1", &format!("j{i}"), i, false, true))
            .collect();
        let refs: Vec<&AttestationRecord> = records.iter().collect();
        let plan = plan(&rows, &refs);
        assert_eq!(plan.history.len() as i64, ATTESTATION_HISTORY);
        let mut slots: Vec<i64> = plan.history.iter().map(|h| h.slot).collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len() as i64, ATTESTATION_HISTORY);
        assert_eq!(
            plan.history.last().unwrap().seq,
            ATTESTATION_HISTORY * 2 + 3
        );
        assert_eq!(
            plan.refusals.len() as i64,
            (ATTESTATION_HISTORY * 2 + 3).min(REFUSAL_HISTORY)
        );
        // One change only: from nothing to probe_failed.
        assert_eq!(plan.status_changes.len(), 1);
    }

    #[test]
    fn a_passing_probe_after_the_quarantine_lifts_it_an_earlier_one_does_not() {
        let rows = BTreeMap::from([
            (
                RunnerId("early".into()),
                row(0, Some("quarantined"), Some(100)),
            ),
            (
                RunnerId("late".into()),
                row(0, Some("quarantined"), Some(100)),
            ),
        ]);
        let early = record("early", "a", 50, true, false);
        let late = record("late", "b", 150, true, false);
        let plan = plan(&rows, &[&early, &late]);
        let q: BTreeMap<&str, Option<Millis>> = plan
            .updates
            .iter()
            .map(|u| (u.runner_id.as_str(), u.quarantined_at))
            .collect();
        assert_eq!(q["early"], Some(Millis(100)));
        assert_eq!(q["late"], None);
    }

    #[test]
    fn unknown_runners_get_no_writes() {
        let a = record("gone", "a", 10, true, false);
        let plan = plan(&BTreeMap::new(), &[&a]);
        assert!(plan.updates.is_empty() && plan.history.is_empty());
    }

    #[test]
    fn chunks_are_powers_of_two_largest_first_and_cover_everything() {
        let items: Vec<usize> = (0..77).collect();
        let sizes: Vec<usize> = chunks(&items).map(<[usize]>::len).collect();
        assert_eq!(sizes, vec![64, 8, 4, 1]);
        assert_eq!(chunks(&items).flatten().copied().collect::<Vec<_>>(), items);
        assert_eq!(chunks::<u8>(&[]).count(), 0);
    }

    #[test]
    fn placeholder_lists_number_their_parameters() {
        assert_eq!(values_list(2, 3, 1), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(values_list(1, 2, 5), "($5, $6)");
        assert_eq!(param_list(3, 2), "$2, $3, $4");
    }
}

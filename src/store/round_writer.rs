//! A write round's steps, written once for both engines over `RoundDb`, a transaction that
//! can run the statements of `round_sql`.
//!
//! Lock the round's runner rows in id order (no two rounds wait on each other in a cycle);
//! rule 6 then rule 5 for each attestation; the plan's writes; then the claims, per pool, of the
//! items whose attestation (if any) was accepted and whose runner may lease as stored now. Each
//! multi-row statement takes its rows in power-of-two chunks (`round::chunks`), so that an
//! engine prepares a few statements once and keeps them.

use super::round::{Rejection, RoundItem, RoundOutcome, RunnerRow, chunks, plan};
use super::round_sql::{self, Statement};
use super::{AttestationRecord, Claim, Lease, StoreError, StoreResult};
use crate::domain::ids::RunnerId;
use crate::domain::job::Job;
use crate::domain::lease::LeaseState;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;

/// An open transaction of one engine, and what it reads back from a round's statements.
pub trait RoundDb {
    /// The engine's row lock (`FOR UPDATE`) and claim lock (`FOR UPDATE SKIP LOCKED`).
    const ROW_LOCK: &'static str;
    const CLAIM_LOCK: &'static str;
    /// How an `UPDATE … FROM` returns only the updated table's columns.
    const RETURNING_JOBS: &'static str;

    fn execute(&mut self, st: Statement<'_>) -> impl Future<Output = StoreResult<()>>;
    fn exists(&mut self, st: Statement<'_>) -> impl Future<Output = StoreResult<bool>>;
    fn runner_rows(
        &mut self,
        st: Statement<'_>,
    ) -> impl Future<Output = StoreResult<Vec<(RunnerId, RunnerRow)>>>;
    /// `(runner_id, jti)` of the inserted jtis.
    fn inserted_jtis(
        &mut self,
        st: Statement<'_>,
    ) -> impl Future<Output = StoreResult<Vec<(String, String)>>>;
    fn seqs(&mut self, st: Statement<'_>) -> impl Future<Output = StoreResult<Vec<i64>>>;
    fn jobs(&mut self, st: Statement<'_>) -> impl Future<Output = StoreResult<Vec<Job>>>;
}

/// Writes `items` inside `db`'s transaction (the caller commits) and says what became of each.
pub async fn write_round<D: RoundDb>(
    db: &mut D,
    items: &[RoundItem],
) -> StoreResult<Vec<RoundOutcome>> {
    let mut outcomes: Vec<RoundOutcome> = items
        .iter()
        .map(|i| RoundOutcome {
            attestation: i.attestation.as_ref().map(|_| Ok(())),
            granted: None,
        })
        .collect();

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
    let mut rows: BTreeMap<RunnerId, RunnerRow> = BTreeMap::new();
    for part in chunks(&ids) {
        rows.extend(
            db.runner_rows(round_sql::runner_rows(part, D::ROW_LOCK))
                .await?,
        );
    }

    // Rule 6 before anything is written; rule 5 still comes first, so a revoked runner's
    // replayed jti is a replay (a rare path: one read each).
    let mut candidates: Vec<(usize, &AttestationRecord)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(rec) = &item.attestation else {
            continue;
        };
        if rows.get(&rec.runner_id).is_some_and(|r| !r.revoked) {
            candidates.push((i, rec));
            continue;
        }
        let seen = db.exists(round_sql::jti_seen(rec)).await?;
        outcomes[i].attestation = Some(Err(if seen {
            Rejection::Replayed
        } else {
            Rejection::Revoked
        }));
    }

    // Rule 5: a jti is accepted once. A jti twice in one round is accepted for the first and a
    // replay for the second.
    let mut inserted: HashSet<(String, String)> = HashSet::new();
    let records: Vec<&AttestationRecord> = candidates.iter().map(|(_, r)| *r).collect();
    for part in chunks(&records) {
        inserted.extend(db.inserted_jtis(round_sql::insert_jtis(part)).await?);
    }
    let mut accepted: Vec<&AttestationRecord> = Vec::new();
    for (i, rec) in &candidates {
        if inserted.remove(&(rec.runner_id.as_str().to_string(), rec.jti.clone())) {
            accepted.push(rec);
        } else {
            outcomes[*i].attestation = Some(Err(Rejection::Replayed));
        }
    }

    let plan = plan(&rows, &accepted);
    for part in chunks(&plan.updates) {
        db.execute(round_sql::update_runners(part)).await?;
    }
    for part in chunks(&plan.history) {
        db.execute(round_sql::upsert_history(part)).await?;
    }
    for part in chunks(&plan.status_changes) {
        db.execute(round_sql::insert_status_changes(part)).await?;
    }
    if !plan.status_changes.is_empty() {
        let changed: Vec<&str> = plan
            .status_changes
            .iter()
            .map(|c| c.runner_id.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        db.execute(round_sql::trim_status_changes(&changed)).await?;
    }
    for part in chunks(&plan.refusals) {
        db.execute(round_sql::upsert_refusals(part)).await?;
    }

    // The claims: per pool, its oldest queued jobs, as many as are asked for, handed out in
    // arrival order.
    let mut wanting: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let Some(claim) = &item.claim else { continue };
        if matches!(outcomes[i].attestation, Some(Err(_)))
            || !rows.get(&claim.runner_id).is_some_and(RunnerRow::may_claim)
        {
            continue;
        }
        wanting.entry(claim.pool.as_str()).or_default().push(i);
    }
    for (pool, waiting) in wanting {
        let seqs = db
            .seqs(round_sql::claim_candidates(
                pool,
                waiting.len(),
                D::CLAIM_LOCK,
            ))
            .await?;
        let pairs: Vec<(i64, &Claim)> = seqs
            .into_iter()
            .zip(&waiting)
            .map(|(seq, &i)| (seq, items[i].claim.as_ref().expect("a claim")))
            .collect();
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
            for job in db
                .jobs(round_sql::lease_jobs(part, D::RETURNING_JOBS))
                .await?
            {
                let Some(&i) = job.lease_id.as_ref().and_then(|l| by_lease.get(l.as_str())) else {
                    return Err(StoreError::Internal(
                        "a claimed job lost its lease id".into(),
                    ));
                };
                let claim = items[i].claim.as_ref().expect("a claim");
                let lease = Lease {
                    id: claim.lease_id.clone(),
                    job_id: job.id.clone(),
                    runner_id: claim.runner_id.clone(),
                    pool: claim.pool.clone(),
                    state: LeaseState::Leased,
                    attempt: job.attempts + 1,
                    granted_at: claim.now,
                    started_at: None,
                    expires_at: claim.now.plus_secs(claim.ttl_s),
                    ended_at: None,
                };
                outcomes[i].granted = Some((lease, job));
            }
        }
    }
    let granted: Vec<(&Lease, &str)> = items
        .iter()
        .zip(&outcomes)
        .filter_map(|(item, o)| {
            let (lease, _) = o.granted.as_ref()?;
            Some((lease, item.claim.as_ref()?.token_hash.as_str()))
        })
        .collect();
    for part in chunks(&granted) {
        db.execute(round_sql::insert_leases(part)).await?;
    }
    for part in chunks(&granted) {
        db.execute(round_sql::insert_leased_events(part)).await?;
    }
    Ok(outcomes)
}

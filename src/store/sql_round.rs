//! The SQL of a write round (see `round.rs`), written once and instantiated per engine.
//!
//! A round of N requests costs a handful of statements per table, whatever N: lock the runners'
//! rows, insert the `jti`s, update the runners, insert the history rings' entries, and one claim
//! statement per lease asked for. Multi-row statements take their rows in power-of-two chunks
//! (`round::chunks`), so that each engine prepares a few statements once and keeps them, rather
//! than parsing a new one for every round size. Their text is built from literals and numbered
//! placeholders only (`AssertSqlSafe`); every value is bound.

macro_rules! impl_write_round {
    (
        store: $store:ty,
        db: $db:ty,
        row_lock: $row_lock:literal,
        claim_lock: $claim_lock:literal,
        returning_jobs: $returning_jobs:literal
    ) => {
        impl $store {
            /// Writes `items` in one transaction and says what became of each.
            async fn run_round(
                &self,
                items: &[$crate::store::round::RoundItem],
            ) -> $crate::store::round::RoundResult {
                use $crate::domain::ids::RunnerId;
                use $crate::domain::job::EventKind;
                use $crate::domain::lease::LeaseState;
                use $crate::domain::time::Millis;
                use $crate::store::round::*;
                use $crate::store::rows::{Decoders, get};
                use $crate::store::sql_store::claim_batch;
                use $crate::store::StoreError;
                use $crate::store::{AttestationRecord, Lease};
                use std::collections::{BTreeMap, BTreeSet, HashSet};

                let mut outcomes: Vec<RoundOutcome> = items
                    .iter()
                    .map(|i| RoundOutcome {
                        attestation: i.attestation.as_ref().map(|_| Ok(())),
                        granted: None,
                    })
                    .collect();
                let mut tx = self.begin().await?;

                // The rows of every runner in the round, locked in id order so that concurrent
                // rounds never wait on each other in a cycle.
                let ids: BTreeSet<&str> = items
                    .iter()
                    .flat_map(|i| {
                        let a = i.attestation.as_ref().map(|a| a.runner_id.as_str());
                        let c = i.claim.as_ref().map(|c| c.runner_id.as_str());
                        a.into_iter().chain(c)
                    })
                    .collect();
                let ids: Vec<&str> = ids.into_iter().collect();
                let mut rows: BTreeMap<RunnerId, RunnerRow> = BTreeMap::new();
                for part in chunks(&ids) {
                    let sql = format!(
                        "SELECT id, attestation_seq, refusal_seq, last_status, quarantined_at, revoked_at, cordoned \
                         FROM runners WHERE id IN ({}) ORDER BY id{}",
                        param_list(part.len(), 1),
                        $row_lock
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for id in part {
                        q = q.bind(*id);
                    }
                    for r in q.fetch_all(&mut *tx).await? {
                        rows.insert(
                            RunnerId(get(&r, "id")?),
                            RunnerRow {
                                attestation_seq: get(&r, "attestation_seq")?,
                                refusal_seq: get(&r, "refusal_seq")?,
                                last_status: get(&r, "last_status")?,
                                quarantined_at: get::<_, Option<i64>>(&r, "quarantined_at")?.map(Millis),
                                revoked: get::<_, Option<i64>>(&r, "revoked_at")?.is_some(),
                                cordoned: get::<_, i64>(&r, "cordoned")? != 0,
                            },
                        );
                    }
                }

                // Rule 6 before anything is written; rule 5 still comes first, so a revoked
                // runner's replayed jti is a replay (a rare path: one read each).
                let mut candidates: Vec<(usize, &AttestationRecord)> = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let Some(rec) = &item.attestation else { continue };
                    if rows.get(&rec.runner_id).is_some_and(|r| !r.revoked) {
                        candidates.push((i, rec));
                        continue;
                    }
                    let seen = sqlx::query("SELECT 1 FROM seen_jtis WHERE runner_id = $1 AND jti = $2")
                        .bind(rec.runner_id.as_str())
                        .bind(&rec.jti)
                        .fetch_optional(&mut *tx)
                        .await?;
                    outcomes[i].attestation = Some(Err(if seen.is_some() {
                        Rejection::Replayed
                    } else {
                        Rejection::Revoked
                    }));
                }

                // Rule 5: a jti is accepted once. A jti twice in one round is accepted for
                // the first and a replay for the second.
                let mut accepted: Vec<&AttestationRecord> = Vec::new();
                let mut inserted: HashSet<(String, String)> = HashSet::new();
                for part in chunks(&candidates) {
                    let sql = format!(
                        "INSERT INTO seen_jtis (runner_id, jti, expires_at) VALUES {} \
                         ON CONFLICT DO NOTHING RETURNING runner_id, jti",
                        values_list(part.len(), 3, 1)
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for (_, rec) in part {
                        q = q.bind(rec.runner_id.as_str()).bind(&rec.jti).bind(rec.replay_until.0);
                    }
                    for r in q.fetch_all(&mut *tx).await? {
                        inserted.insert((get(&r, "runner_id")?, get(&r, "jti")?));
                    }
                }
                for (i, rec) in &candidates {
                    if inserted.remove(&(rec.runner_id.as_str().to_string(), rec.jti.clone())) {
                        accepted.push(rec);
                    } else {
                        outcomes[*i].attestation = Some(Err(Rejection::Replayed));
                    }
                }

                let plan = plan(&rows, &accepted);
                write_plan(&mut tx, &plan).await?;

                // The claims, for items whose attestation (if any) was accepted and whose
                // runner may lease as stored now: per pool, its oldest queued jobs, as many as
                // are asked for, handed out in arrival order.
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
                let mut granted: Vec<(usize, &str)> = Vec::new();
                for (pool, waiting) in wanting {
                    let candidates = sqlx::query(concat!(claim_batch!(), $claim_lock))
                        .bind(pool)
                        .bind(waiting.len() as i64)
                        .fetch_all(&mut *tx)
                        .await?;
                    let mut pairs: Vec<(i64, usize)> = Vec::with_capacity(candidates.len());
                    for (row, i) in candidates.iter().zip(waiting) {
                        pairs.push((get(row, "seq")?, i));
                    }
                    let mut by_lease: BTreeMap<&str, usize> = BTreeMap::new();
                    for part in chunks(&pairs) {
                        let sql = format!(
                            "WITH v (seq, lease_id, updated_at) AS (VALUES {}) \
                             UPDATE jobs SET state = 'leased', lease_id = v.lease_id, updated_at = v.updated_at \
                             FROM v WHERE jobs.seq = v.seq AND jobs.state = 'queued' {}",
                            values_list(part.len(), 3, 1),
                            $returning_jobs
                        );
                        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                        for (seq, i) in part {
                            let claim = items[*i].claim.as_ref().expect("a claim");
                            by_lease.insert(claim.lease_id.as_str(), *i);
                            q = q.bind(*seq).bind(claim.lease_id.as_str()).bind(claim.now.0);
                        }
                        for row in q.fetch_all(&mut *tx).await? {
                            let job = row.job()?;
                            let Some(&i) = job.lease_id.as_ref().and_then(|l| by_lease.get(l.as_str())) else {
                                return Err(StoreError::Internal("a claimed job lost its lease id".into()));
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
                            granted.push((i, claim.token_hash.as_str()));
                            outcomes[i].granted = Some((lease, job));
                        }
                    }
                }
                granted.sort_by_key(|(i, _)| *i);
                for part in chunks(&granted) {
                    let sql = format!(
                        "INSERT INTO leases (id, job_id, runner_id, pool, token_hash, state, attempt, granted_at, expires_at) \
                         VALUES {}",
                        values_list(part.len(), 9, 1)
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for (i, token_hash) in part {
                        let (lease, _) = outcomes[*i].granted.as_ref().expect("granted");
                        q = q
                            .bind(lease.id.as_str())
                            .bind(lease.job_id.as_str())
                            .bind(lease.runner_id.as_str())
                            .bind(lease.pool.as_str())
                            .bind(*token_hash)
                            .bind(LeaseState::Leased.as_str())
                            .bind(lease.attempt)
                            .bind(lease.granted_at.0)
                            .bind(lease.expires_at.0);
                    }
                    q.execute(&mut *tx).await?;
                }
                for part in chunks(&granted) {
                    let sql = format!(
                        "INSERT INTO job_events (job_id, at, kind, runner_id, lease_id, reason, detail) VALUES {}",
                        values_list(part.len(), 7, 1)
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for (i, _) in part {
                        let (lease, _) = outcomes[*i].granted.as_ref().expect("granted");
                        q = q
                            .bind(lease.job_id.as_str())
                            .bind(lease.granted_at.0)
                            .bind(EventKind::Leased.as_str())
                            .bind(lease.runner_id.as_str())
                            .bind(lease.id.as_str())
                            .bind(None::<String>)
                            .bind(None::<String>);
                    }
                    q.execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(outcomes)
            }
        }

        /// The runner rows, history rings and status changes of a round's accepted attestations.
        async fn write_plan(
            tx: &mut sqlx::Transaction<'static, $db>,
            plan: &$crate::store::round::Plan<'_>,
        ) -> $crate::store::StoreResult<()> {
            use $crate::store::round::{chunks, values_list};
            use $crate::store::{STATUS_CHANGE_HISTORY, round::param_list};

            for part in chunks(&plan.updates) {
                let sql = format!(
                    "WITH v (id, attested_at, probe_ok, probe_runtime, probe_runtime_version, probe_checked_at, \
                     probe_error, probe_exit_code, image_id, image_digest, image_ref, agent, last_status, \
                     attestation_seq, refusal_seq, quarantined_at) AS (VALUES {}) \
                     UPDATE runners SET attested_at = v.attested_at, probe_ok = v.probe_ok, \
                     probe_runtime = v.probe_runtime, probe_runtime_version = v.probe_runtime_version, \
                     probe_checked_at = v.probe_checked_at, probe_error = v.probe_error, \
                     probe_exit_code = v.probe_exit_code, image_id = v.image_id, image_digest = v.image_digest, \
                     image_ref = v.image_ref, agent = v.agent, last_status = v.last_status, \
                     attestation_seq = v.attestation_seq, refusal_seq = v.refusal_seq, \
                     quarantined_at = v.quarantined_at FROM v WHERE runners.id = v.id",
                    values_list(part.len(), 16, 1)
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for u in part {
                    let rec = u.latest;
                    let probe = &rec.state.probe;
                    let image = &rec.state.image;
                    q = q
                        .bind(u.runner_id.as_str())
                        .bind(rec.received_at.0)
                        .bind(i64::from(probe.ok))
                        .bind(probe.runtime.as_str())
                        .bind(probe.runtime_version.as_deref())
                        .bind(probe.checked_at.0)
                        .bind(probe.error.as_deref())
                        .bind(probe.exit_code)
                        .bind(image.id.as_ref().map(|d| d.as_str()))
                        .bind(image.digest.as_ref().map(|d| d.as_str()))
                        .bind(image.image_ref.as_deref())
                        .bind(rec.agent.as_ref().map(|a| a.to_string()))
                        .bind(u.last_status)
                        .bind(u.attestation_seq)
                        .bind(u.refusal_seq)
                        .bind(u.quarantined_at.map(|m| m.0));
                }
                q.execute(&mut **tx).await?;
            }

            for part in chunks(&plan.history) {
                let sql = format!(
                    "INSERT INTO attestation_history (runner_id, slot, seq, received_at, probe_ok, probe_runtime, \
                     probe_runtime_version, probe_checked_at, probe_error, image_id, image_digest, status) \
                     VALUES {} \
                     ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, received_at = excluded.received_at, \
                     probe_ok = excluded.probe_ok, probe_runtime = excluded.probe_runtime, \
                     probe_runtime_version = excluded.probe_runtime_version, probe_checked_at = excluded.probe_checked_at, \
                     probe_error = excluded.probe_error, image_id = excluded.image_id, \
                     image_digest = excluded.image_digest, status = excluded.status",
                    values_list(part.len(), 12, 1)
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for h in part {
                    let rec = h.record;
                    let probe = &rec.state.probe;
                    let image = &rec.state.image;
                    q = q
                        .bind(rec.runner_id.as_str())
                        .bind(h.slot)
                        .bind(h.seq)
                        .bind(rec.received_at.0)
                        .bind(i64::from(probe.ok))
                        .bind(probe.runtime.as_str())
                        .bind(probe.runtime_version.as_deref())
                        .bind(probe.checked_at.0)
                        .bind(probe.error.as_deref())
                        .bind(image.id.as_ref().map(|d| d.as_str()))
                        .bind(image.digest.as_ref().map(|d| d.as_str()))
                        .bind(rec.status.as_str());
                }
                q.execute(&mut **tx).await?;
            }

            for part in chunks(&plan.status_changes) {
                let sql = format!(
                    "INSERT INTO status_changes (runner_id, at, from_status, to_status, detail) VALUES {}",
                    values_list(part.len(), 5, 1)
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for c in part {
                    q = q
                        .bind(c.runner_id.as_str())
                        .bind(c.at.0)
                        .bind(c.from.as_deref())
                        .bind(c.to)
                        .bind(c.detail);
                }
                q.execute(&mut **tx).await?;
                // Trimmed here, only for the runners that changed, through the
                // (runner_id, id) index: no sweep over every runner's history.
            }
            if !plan.status_changes.is_empty() {
                let mut changed: Vec<&str> = plan.status_changes.iter().map(|c| c.runner_id.as_str()).collect();
                changed.sort();
                changed.dedup();
                let sql = format!(
                    "DELETE FROM status_changes WHERE runner_id IN ({}) AND id <= (SELECT t.id FROM status_changes t \
                     WHERE t.runner_id = status_changes.runner_id ORDER BY t.id DESC LIMIT 1 OFFSET ${})",
                    param_list(changed.len(), 1),
                    changed.len() + 1
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).persistent(false);
                for id in &changed {
                    q = q.bind(*id);
                }
                q.bind(STATUS_CHANGE_HISTORY).execute(&mut **tx).await?;
            }

            for part in chunks(&plan.refusals) {
                let sql = format!(
                    "INSERT INTO refusals (runner_id, slot, seq, at, code, detail) VALUES {} \
                     ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, at = excluded.at, \
                     code = excluded.code, detail = excluded.detail",
                    values_list(part.len(), 6, 1)
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for r in part {
                    q = q
                        .bind(r.runner_id.as_str())
                        .bind(r.slot)
                        .bind(r.seq)
                        .bind(r.at.0)
                        .bind(r.code)
                        .bind(r.detail);
                }
                q.execute(&mut **tx).await?;
            }
            Ok(())
        }
    };
}
pub(crate) use impl_write_round;

//! The statements of a write round, as text and values, for both engines and both drivers.
//!
//! PostgreSQL runs a round through sqlx (`pg_rounds.rs`); SQLite runs it on a thread of its own
//! through the C library (`sqlite_rounds.rs`). Both execute exactly these statements, built
//! here once: the text from literals and numbered placeholders only, every value bound.

/// The seqs of the pool (bound at `$pool`) that are queued, oldest first: the queue's order,
/// written once for every claim. `EXPLAIN` tests check that it runs through the partial index
/// `jobs_queue_order`, whatever the queue's depth and however stale the planner's statistics.
/// It orders by `created_at, seq` rather than `seq` alone so that no other index can serve the
/// order: ordered by `seq`, PostgreSQL took the primary key whenever its statistics said most
/// jobs were queued (a deep queue, or one filled since the last analyze), and then stepped
/// over every finished job on each claim.
macro_rules! queued_in_order {
    ($pool:literal) => {
        concat!(
            "SELECT seq FROM jobs WHERE pool = ",
            $pool,
            " AND state = 'queued' ORDER BY created_at, seq"
        )
    };
}
pub(crate) use queued_in_order;

use super::round::{
    HistoryEntry, RefusalRingEntry, RunnerUpdate, StatusChangeEntry, param_list, values_list,
};
use super::{AttestationRecord, Claim, Lease, STATUS_CHANGE_HISTORY};
use crate::domain::job::EventKind;
use crate::domain::lease::LeaseState;

/// A bound value. Nulls carry their type: PostgreSQL types a `VALUES` column from its rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param<'a> {
    Text(&'a str),
    Int(i64),
    OptText(Option<&'a str>),
    OptInt(Option<i64>),
}

/// One statement of a round.
#[derive(Debug)]
pub struct Statement<'a> {
    pub sql: String,
    pub params: Vec<Param<'a>>,
}

/// Locks (where `row_lock` says so) and reads the rows of `ids`, in id order.
pub fn runner_rows<'a>(ids: &[&'a str], row_lock: &str) -> Statement<'a> {
    Statement {
        sql: format!(
            "SELECT id, attestation_seq, refusal_seq, last_status, quarantined_at, revoked_at, cordoned \
             FROM runners WHERE id IN ({}) ORDER BY id{row_lock}",
            param_list(ids.len(), 1)
        ),
        params: ids.iter().map(|id| Param::Text(id)).collect(),
    }
}

/// A revoked runner's jti: seen before (rule 5 comes first) or not.
pub fn jti_seen<'a>(rec: &'a AttestationRecord) -> Statement<'a> {
    Statement {
        sql: "SELECT 1 FROM seen_jtis WHERE runner_id = $1 AND jti = $2".into(),
        params: vec![Param::Text(rec.runner_id.as_str()), Param::Text(&rec.jti)],
    }
}

/// Rule 5: inserts the jtis, returning those that were new.
pub fn insert_jtis<'a>(records: &[&'a AttestationRecord]) -> Statement<'a> {
    let mut params = Vec::with_capacity(records.len() * 3);
    for rec in records {
        params.extend([
            Param::Text(rec.runner_id.as_str()),
            Param::Text(&rec.jti),
            Param::Int(rec.replay_until.0),
        ]);
    }
    Statement {
        sql: format!(
            "INSERT INTO seen_jtis (runner_id, jti, expires_at) VALUES {} \
             ON CONFLICT DO NOTHING RETURNING runner_id, jti",
            values_list(records.len(), 3, 1)
        ),
        params,
    }
}

/// Each runner's latest attestation, in place, with its counters.
pub fn update_runners<'a>(updates: &'a [RunnerUpdate<'a>]) -> Statement<'a> {
    let mut params = Vec::with_capacity(updates.len() * 16);
    for u in updates {
        let rec = u.latest;
        let probe = &rec.state.probe;
        let image = &rec.state.image;
        params.extend([
            Param::Text(u.runner_id.as_str()),
            Param::Int(rec.received_at.0),
            Param::Int(i64::from(probe.ok)),
            Param::Text(&probe.runtime),
            Param::OptText(probe.runtime_version.as_deref()),
            Param::Int(probe.checked_at.0),
            Param::OptText(probe.error.as_deref()),
            Param::OptInt(probe.exit_code),
            Param::OptText(image.id.as_ref().map(|d| d.as_str())),
            Param::OptText(image.digest.as_ref().map(|d| d.as_str())),
            Param::OptText(image.image_ref.as_deref()),
            Param::OptText(u.agent.as_deref()),
            Param::Text(u.last_status),
            Param::Int(u.attestation_seq),
            Param::Int(u.refusal_seq),
            Param::OptInt(u.quarantined_at.map(|m| m.0)),
        ]);
    }
    Statement {
        sql: format!(
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
            values_list(updates.len(), 16, 1)
        ),
        params,
    }
}

/// Entries of the attestation-history rings.
pub fn upsert_history<'a>(entries: &[HistoryEntry<'a>]) -> Statement<'a> {
    let mut params = Vec::with_capacity(entries.len() * 12);
    for h in entries {
        let rec = h.record;
        let probe = &rec.state.probe;
        let image = &rec.state.image;
        params.extend([
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
        ]);
    }
    Statement {
        sql: format!(
            "INSERT INTO attestation_history (runner_id, slot, seq, received_at, probe_ok, probe_runtime, \
             probe_runtime_version, probe_checked_at, probe_error, image_id, image_digest, status) \
             VALUES {} \
             ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, received_at = excluded.received_at, \
             probe_ok = excluded.probe_ok, probe_runtime = excluded.probe_runtime, \
             probe_runtime_version = excluded.probe_runtime_version, probe_checked_at = excluded.probe_checked_at, \
             probe_error = excluded.probe_error, image_id = excluded.image_id, \
             image_digest = excluded.image_digest, status = excluded.status",
            values_list(entries.len(), 12, 1)
        ),
        params,
    }
}

pub fn insert_status_changes<'a>(changes: &'a [StatusChangeEntry<'a>]) -> Statement<'a> {
    let mut params = Vec::with_capacity(changes.len() * 5);
    for c in changes {
        params.extend([
            Param::Text(c.runner_id.as_str()),
            Param::Int(c.at.0),
            Param::OptText(c.from.as_deref()),
            Param::Text(c.to),
            Param::OptText(c.detail),
        ]);
    }
    Statement {
        sql: format!(
            "INSERT INTO status_changes (runner_id, at, from_status, to_status, detail) VALUES {}",
            values_list(changes.len(), 5, 1)
        ),
        params,
    }
}

/// Trims the status changes of `runners` to the newest ones, through the (runner_id, id)
/// index: only for runners that changed, never a sweep over everyone's history.
pub fn trim_status_changes<'a>(runners: &[&'a str]) -> Statement<'a> {
    let mut params: Vec<Param> = runners.iter().map(|r| Param::Text(r)).collect();
    params.push(Param::Int(STATUS_CHANGE_HISTORY));
    Statement {
        sql: format!(
            "DELETE FROM status_changes WHERE runner_id IN ({}) AND id <= (SELECT t.id FROM status_changes t \
             WHERE t.runner_id = status_changes.runner_id ORDER BY t.id DESC LIMIT 1 OFFSET ${})",
            param_list(runners.len(), 1),
            runners.len() + 1
        ),
        params,
    }
}

pub fn upsert_refusals<'a>(entries: &[RefusalRingEntry<'a>]) -> Statement<'a> {
    let mut params = Vec::with_capacity(entries.len() * 6);
    for r in entries {
        params.extend([
            Param::Text(r.runner_id.as_str()),
            Param::Int(r.slot),
            Param::Int(r.seq),
            Param::Int(r.at.0),
            Param::Text(r.code),
            Param::Text(r.detail),
        ]);
    }
    Statement {
        sql: format!(
            "INSERT INTO refusals (runner_id, slot, seq, at, code, detail) VALUES {} \
             ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, at = excluded.at, \
             code = excluded.code, detail = excluded.detail",
            values_list(entries.len(), 6, 1)
        ),
        params,
    }
}

/// The round's choice of jobs for the claims it holds on one pool: the pool's `$2` oldest
/// queued ones, in the queue's order (`queued_in_order!`).
pub const CLAIM_BATCH_SQL: &str = concat!(queued_in_order!("$1"), " LIMIT $2");

pub fn claim_candidates<'a>(pool: &'a str, n: usize, claim_lock: &str) -> Statement<'a> {
    Statement {
        sql: format!("{CLAIM_BATCH_SQL}{claim_lock}"),
        params: vec![Param::Text(pool), Param::Int(n as i64)],
    }
}

/// Moves the chosen jobs to `leased`, each under its claim's lease, returning the jobs.
pub fn lease_jobs<'a>(pairs: &[(i64, &'a Claim)], returning_jobs: &str) -> Statement<'a> {
    let mut params = Vec::with_capacity(pairs.len() * 3);
    for (seq, claim) in pairs {
        params.extend([
            Param::Int(*seq),
            Param::Text(claim.lease_id.as_str()),
            Param::Int(claim.now.0),
        ]);
    }
    Statement {
        sql: format!(
            "WITH v (seq, lease_id, updated_at) AS (VALUES {}) \
             UPDATE jobs SET state = 'leased', lease_id = v.lease_id, updated_at = v.updated_at \
             FROM v WHERE jobs.seq = v.seq AND jobs.state = 'queued' {returning_jobs}",
            values_list(pairs.len(), 3, 1)
        ),
        params,
    }
}

pub fn insert_leases<'a>(granted: &[(&'a Lease, &'a str)]) -> Statement<'a> {
    let mut params = Vec::with_capacity(granted.len() * 9);
    for (lease, token_hash) in granted {
        params.extend([
            Param::Text(lease.id.as_str()),
            Param::Text(lease.job_id.as_str()),
            Param::Text(lease.runner_id.as_str()),
            Param::Text(lease.pool.as_str()),
            Param::Text(token_hash),
            Param::Text(LeaseState::Leased.as_str()),
            Param::Int(lease.attempt),
            Param::Int(lease.granted_at.0),
            Param::Int(lease.expires_at.0),
        ]);
    }
    Statement {
        sql: format!(
            "INSERT INTO leases (id, job_id, runner_id, pool, token_hash, state, attempt, granted_at, expires_at) \
             VALUES {}",
            values_list(granted.len(), 9, 1)
        ),
        params,
    }
}

/// The `leased` line of each granted job's story.
pub fn insert_leased_events<'a>(granted: &[(&'a Lease, &'a str)]) -> Statement<'a> {
    let mut params = Vec::with_capacity(granted.len() * 7);
    for (lease, _) in granted {
        params.extend([
            Param::Text(lease.job_id.as_str()),
            Param::Int(lease.granted_at.0),
            Param::Text(EventKind::Leased.as_str()),
            Param::Text(lease.runner_id.as_str()),
            Param::Text(lease.id.as_str()),
            Param::OptText(None),
            Param::OptText(None),
        ]);
    }
    Statement {
        sql: format!(
            "INSERT INTO job_events (job_id, at, kind, runner_id, lease_id, reason, detail) VALUES {}",
            values_list(granted.len(), 7, 1)
        ),
        params,
    }
}

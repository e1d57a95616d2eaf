//! A round's writes on an engine that binds arrays (PostgreSQL): one statement of fixed text,
//! whatever the round holds.
//!
//! On PostgreSQL every statement is a round trip to the server, made while the round's
//! runner rows are locked and while the requests behind it wait in their lane: a round that
//! wrote its sets one statement each (runner rows, history, status changes, refusal ring,
//! spilled jtis, leases, their events) waited for as many round trips. Here every set is a
//! data-modifying `WITH` over `UNNEST`ed arrays, one array a column, all in one statement
//! whose text never changes, so it stays prepared on each connection. What differs from
//! SQLite's steps (`round.rs`) is only how the same rows travel: `round.rs` plans them once
//! for both engines.
//!
//! The parts of one `WITH` see one snapshot and not each other's rows; none of these sets
//! reads another's, and the status changes' trim, which does, runs after them
//! (`round::trim_status_changes`). For the same reason the round's reads stay statements of
//! their own: a lookup of spilled jtis made in the statement that locks the runner rows would
//! read `seen_jtis` as it was when that statement began, before the round it waited for had
//! committed, and miss the jti that round spilled (a replay accepted twice, across replicas).

use super::round::{HistoryEntry, Plan, RunnerUpdate, StatusChangeEntry};
use super::rows;
use crate::domain::ids::RunnerId;
use crate::domain::job::EventKind;
use crate::domain::lease::{Lease, LeaseState};
use crate::store::engine::{Db, Param, Statement};
use crate::store::{REFUSAL_HISTORY, StoreResult};

/// The round's writes, every set in one statement.
const WRITE_SQL: &str = "WITH runner_rows AS (\
     UPDATE runners SET attested_at = v.attested_at, probe_ok = v.probe_ok, \
     probe_runtime = v.probe_runtime, probe_runtime_version = v.probe_runtime_version, \
     probe_checked_at = v.probe_checked_at, probe_error = v.probe_error, \
     probe_exit_code = v.probe_exit_code, probe_disk = v.probe_disk, image_id = v.image_id, \
     images = v.images, image_digest = v.image_digest, image_ref = v.image_ref, \
     agent = v.agent, last_status = v.last_status, attestation_seq = v.attestation_seq, \
     quarantined_at = v.quarantined_at, ejected_until = v.ejected_until, \
     recent_jtis = v.recent_jtis, jtis_spilled_until = v.jtis_spilled_until, \
     history_sampled_at = v.history_sampled_at, refusal_seq = v.refusal_seq, \
     refusal_code = v.refusal_code, refusal_detail = v.refusal_detail, \
     refusal_count = v.refusal_count, refusal_first_at = v.refusal_first_at, \
     refusal_last_at = v.refusal_last_at, refusal_synced_at = v.refusal_synced_at \
     FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::text[], $5::text[], $6::int8[], \
     $7::text[], $8::int8[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], \
     $14::text[], $15::text[], $16::int8[], $17::int8[], $18::int8[], $19::text[], \
     $20::int8[], $21::int8[], $22::int8[], $23::text[], $24::text[], $25::int8[], \
     $26::int8[], $27::int8[], $28::int8[]) AS v (id, attested_at, probe_ok, probe_runtime, \
     probe_runtime_version, probe_checked_at, probe_error, probe_exit_code, probe_disk, \
     image_id, image_digest, image_ref, images, agent, last_status, attestation_seq, \
     quarantined_at, ejected_until, recent_jtis, jtis_spilled_until, history_sampled_at, \
     refusal_seq, refusal_code, refusal_detail, refusal_count, refusal_first_at, \
     refusal_last_at, refusal_synced_at) \
     WHERE runners.id = v.id RETURNING 1), \
     history AS (\
     INSERT INTO attestation_history (runner_id, slot, seq, received_at, probe_ok, \
     probe_runtime, probe_runtime_version, probe_checked_at, probe_error, image_id, \
     image_digest, status) \
     SELECT * FROM UNNEST($29::text[], $30::int8[], $31::int8[], $32::int8[], $33::int8[], \
     $34::text[], $35::text[], $36::int8[], $37::text[], $38::text[], $39::text[], \
     $40::text[]) \
     ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, \
     received_at = excluded.received_at, probe_ok = excluded.probe_ok, \
     probe_runtime = excluded.probe_runtime, \
     probe_runtime_version = excluded.probe_runtime_version, \
     probe_checked_at = excluded.probe_checked_at, probe_error = excluded.probe_error, \
     image_id = excluded.image_id, image_digest = excluded.image_digest, \
     status = excluded.status RETURNING 1), \
     status_changed AS (\
     INSERT INTO status_changes (runner_id, at, from_status, to_status, detail) \
     SELECT * FROM UNNEST($41::text[], $42::int8[], $43::text[], $44::text[], $45::text[]) \
     RETURNING 1), \
     refusal_ring AS (\
     INSERT INTO refusals (runner_id, slot, seq, at, last_at, count, code, detail) \
     SELECT * FROM UNNEST($46::text[], $47::int8[], $48::int8[], $49::int8[], $50::int8[], \
     $51::int8[], $52::text[], $53::text[]) \
     ON CONFLICT (runner_id, slot) DO UPDATE SET seq = excluded.seq, at = excluded.at, \
     last_at = excluded.last_at, count = excluded.count, code = excluded.code, \
     detail = excluded.detail RETURNING 1), \
     spilled AS (\
     INSERT INTO seen_jtis (runner_id, jti, expires_at) \
     SELECT * FROM UNNEST($54::text[], $55::text[], $56::int8[]) \
     ON CONFLICT DO NOTHING RETURNING 1), \
     granted AS (\
     SELECT * FROM UNNEST($57::text[], $58::text[], $59::text[], $60::text[], $61::text[], \
     $62::int8[], $63::int8[], $64::int8[]) AS g (id, job_id, runner_id, pool, token_hash, \
     attempt, granted_at, expires_at)), \
     leases_granted AS (\
     INSERT INTO leases (id, job_id, runner_id, pool, token_hash, state, attempt, \
     granted_at, expires_at) \
     SELECT id, job_id, runner_id, pool, token_hash, $65, attempt, granted_at, expires_at \
     FROM granted RETURNING 1), \
     leased_events AS (\
     INSERT INTO job_events (job_id, at, kind, runner_id, lease_id) \
     SELECT job_id, granted_at, $66, runner_id, id FROM granted RETURNING 1) \
     SELECT 1";

/// Columns of a set of rows, each bound as one array.
#[derive(Default)]
struct Columns<'a>(Vec<Param<'a>>);

impl<'a> Columns<'a> {
    fn texts(&mut self, column: impl Iterator<Item = Option<&'a str>>) -> &mut Self {
        self.0.push(Param::Texts(column.collect()));
        self
    }

    fn ints(&mut self, column: impl Iterator<Item = Option<i64>>) -> &mut Self {
        self.0.push(Param::Ints(column.collect()));
        self
    }
}

/// The values made for the runner rows (JSON, the recent jtis), kept while they are bound.
struct Made {
    disk: Vec<Option<String>>,
    images: Vec<Option<String>>,
    recent_jtis: Vec<String>,
}

fn made(updates: &[RunnerUpdate<'_>]) -> Made {
    Made {
        disk: updates
            .iter()
            .map(|u| rows::probe_disk_json(&u.latest.state.probe.disk))
            .collect(),
        images: updates
            .iter()
            .map(|u| rows::attested_images_json(&u.latest.state.images))
            .collect(),
        recent_jtis: updates.iter().map(|u| u.row.recent_jtis.format()).collect(),
    }
}

fn runner_columns<'a>(c: &mut Columns<'a>, updates: &'a [RunnerUpdate<'a>], made: &'a Made) {
    let u = updates;
    let probe = |u: &'a RunnerUpdate<'a>| &u.latest.state.probe;
    let image = |u: &'a RunnerUpdate<'a>| &u.latest.state.image;
    let ms = |m: Option<crate::domain::time::Millis>| m.map(|m| m.0);
    c.texts(u.iter().map(|u| Some(u.runner_id.as_str())))
        .ints(u.iter().map(|u| Some(u.latest.received_at.0)))
        .ints(u.iter().map(|u| Some(i64::from(probe(u).ok))))
        .texts(u.iter().map(|u| Some(probe(u).runtime.as_str())))
        .texts(u.iter().map(|u| probe(u).runtime_version.as_deref()))
        .ints(u.iter().map(|u| Some(probe(u).checked_at.0)))
        .texts(u.iter().map(|u| probe(u).error.as_deref()))
        .ints(u.iter().map(|u| probe(u).exit_code))
        .texts(made.disk.iter().map(|d| d.as_deref()))
        .texts(u.iter().map(|u| image(u).id.as_ref().map(|d| d.as_str())))
        .texts(
            u.iter()
                .map(|u| image(u).digest.as_ref().map(|d| d.as_str())),
        )
        .texts(u.iter().map(|u| image(u).image_ref.as_deref()))
        .texts(made.images.iter().map(|i| i.as_deref()))
        .texts(u.iter().map(|u| u.agent.as_deref()))
        .texts(u.iter().map(|u| Some(u.latest.status.as_str())))
        .ints(u.iter().map(|u| Some(u.row.attestation_seq)))
        .ints(u.iter().map(|u| ms(u.row.quarantined_at)))
        .ints(u.iter().map(|u| ms(u.row.ejected_until)))
        .texts(made.recent_jtis.iter().map(|j| Some(j.as_str())))
        .ints(u.iter().map(|u| ms(u.row.jtis_spilled_until)))
        .ints(u.iter().map(|u| ms(u.row.history_sampled_at)))
        .ints(u.iter().map(|u| Some(u.row.refusals.seq)))
        .texts(u.iter().map(|u| u.row.refusals.code.as_deref()))
        .texts(u.iter().map(|u| u.row.refusals.detail.as_deref()))
        .ints(u.iter().map(|u| Some(u.row.refusals.count)))
        .ints(u.iter().map(|u| ms(u.row.refusals.first_at)))
        .ints(u.iter().map(|u| ms(u.row.refusals.last_at)))
        .ints(u.iter().map(|u| ms(u.row.refusals.synced_at)));
}

fn history_columns<'a>(c: &mut Columns<'a>, h: &'a [HistoryEntry<'a>]) {
    c.texts(h.iter().map(|h| Some(h.record.runner_id.as_str())))
        .ints(h.iter().map(|h| Some(h.slot)))
        .ints(h.iter().map(|h| Some(h.seq)))
        .ints(h.iter().map(|h| Some(h.record.received_at.0)))
        .ints(h.iter().map(|h| Some(i64::from(h.record.state.probe.ok))))
        .texts(
            h.iter()
                .map(|h| Some(h.record.state.probe.runtime.as_str())),
        )
        .texts(
            h.iter()
                .map(|h| h.record.state.probe.runtime_version.as_deref()),
        )
        .ints(h.iter().map(|h| Some(h.record.state.probe.checked_at.0)))
        .texts(h.iter().map(|h| h.record.state.probe.error.as_deref()))
        .texts(
            h.iter()
                .map(|h| h.record.state.image.id.as_ref().map(|d| d.as_str())),
        )
        .texts(
            h.iter()
                .map(|h| h.record.state.image.digest.as_ref().map(|d| d.as_str())),
        )
        .texts(h.iter().map(|h| Some(h.record.status.as_str())));
}

fn status_columns<'a>(c: &mut Columns<'a>, s: &'a [StatusChangeEntry<'a>]) {
    c.texts(s.iter().map(|s| Some(s.runner_id.as_str())))
        .ints(s.iter().map(|s| Some(s.at.0)))
        .texts(s.iter().map(|s| s.from.as_deref()))
        .texts(s.iter().map(|s| Some(s.to)))
        .texts(s.iter().map(|s| s.detail));
}

/// Writes the round's `plan` and the leases it `granted`, in one statement.
pub async fn write<D: Db>(
    db: &mut D,
    plan: &Plan<'_>,
    spills: &[(&RunnerId, crate::domain::time::Millis, &str)],
    granted: &[(&Lease, &str)],
) -> StoreResult<()> {
    if plan.updates.is_empty()
        && plan.history.is_empty()
        && plan.status_changes.is_empty()
        && plan.refusals.is_empty()
        && spills.is_empty()
        && granted.is_empty()
    {
        return Ok(());
    }
    let made = made(&plan.updates);
    let mut c = Columns::default();
    runner_columns(&mut c, &plan.updates, &made);
    history_columns(&mut c, &plan.history);
    status_columns(&mut c, &plan.status_changes);
    let r = &plan.refusals;
    c.texts(r.iter().map(|(runner, _)| Some(runner.as_str())))
        .ints(r.iter().map(|(_, w)| Some(w.seq % REFUSAL_HISTORY)))
        .ints(r.iter().map(|(_, w)| Some(w.seq)))
        .ints(r.iter().map(|(_, w)| Some(w.first_at.0)))
        .ints(r.iter().map(|(_, w)| Some(w.last_at.0)))
        .ints(r.iter().map(|(_, w)| Some(w.count)))
        .texts(r.iter().map(|(_, w)| Some(w.code.as_str())))
        .texts(r.iter().map(|(_, w)| Some(w.detail.as_str())));
    c.texts(spills.iter().map(|(runner, _, _)| Some(runner.as_str())))
        .texts(spills.iter().map(|(_, _, key)| Some(*key)))
        .ints(spills.iter().map(|(_, until, _)| Some(until.0)));
    let g = granted;
    c.texts(g.iter().map(|(l, _)| Some(l.id.as_str())))
        .texts(g.iter().map(|(l, _)| Some(l.job_id.as_str())))
        .texts(g.iter().map(|(l, _)| Some(l.runner_id.as_str())))
        .texts(g.iter().map(|(l, _)| Some(l.pool.as_str())))
        .texts(g.iter().map(|(_, token_hash)| Some(*token_hash)))
        .ints(g.iter().map(|(l, _)| Some(l.attempt)))
        .ints(g.iter().map(|(l, _)| Some(l.granted_at.0)))
        .ints(g.iter().map(|(l, _)| Some(l.expires_at.0)));
    c.0.push(Param::Text(LeaseState::Leased.as_str()));
    c.0.push(Param::Text(EventKind::Leased.as_str()));
    db.execute(Statement::new(WRITE_SQL).params(c.0)).await?;
    Ok(())
}

//! Rows into domain values, once for both engines.
//!
//! Both schemas use the same column names and the same portable types (64-bit integers for
//! instants, counters and booleans; text for ids, JSON and enums), so one decoder per thing
//! serves both.

use crate::domain::attestation::{Probe, RunningImage};
use crate::domain::digest::ImageDigest;
use crate::domain::disk::{DiskFigure, DiskWarning};
use crate::domain::ejection::{
    Ejection, EjectionPolicy, EjectionRecord, Tally, Withheld, WouldEject,
};
use crate::domain::forge::{ForgeBinding, ForgeIdentity, ForgeKind, ForgeRunner};
use crate::domain::github::registration::{Registration, State as RegistrationState};
use crate::domain::github::{GithubPool, GithubScope};
use crate::domain::ids::{JobId, LeaseId, RegistrationId, RunnerId};
use crate::domain::image_set::{ImageSource, Resolution};
use crate::domain::images::{AttestedImage, PoolImage, PoolImageRecord, Undescribed};
use crate::domain::job::{Job, JobEvent, JobState};
use crate::domain::lease::{Lease, LeaseState};
use crate::domain::pool::{GateMode, ImagePolicy, Pool};
use crate::domain::pool_name::PoolName;
use crate::domain::runner::{
    AgentInfo, CurrentLease, LatestAttestation, Rejection, Runner, RunnerSummary, SearchFields,
};
use crate::domain::time::Millis;
use crate::domain::verdict::{AttestedState, GateState};
use crate::store::engine::Row;
use crate::store::{AttestationEntry, RefusalEntry, StatusChange, StoreError, StoreResult};

pub fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Internal(format!("stored {what} is not valid: {value:?}"))
}

fn millis(row: &Row, column: &str) -> StoreResult<Millis> {
    row.int(column).map(Millis)
}

fn opt_millis(row: &Row, column: &str) -> StoreResult<Option<Millis>> {
    Ok(row.opt_int(column)?.map(Millis))
}

pub fn digests(json: &str) -> StoreResult<Vec<ImageDigest>> {
    serde_json::from_str(json).map_err(|_| corrupt("digest list", json))
}

pub fn digests_json(list: &[ImageDigest]) -> String {
    serde_json::to_string(list).expect("digests serialize")
}

/// A probe's disk figures as the `probe_disk` column holds them (JSON), or NULL when none.
pub fn probe_disk_json(disk: &[DiskFigure]) -> Option<String> {
    (!disk.is_empty()).then(|| serde_json::to_string(disk).expect("disk figures serialize"))
}

fn probe_disk(json: Option<String>) -> StoreResult<Vec<DiskFigure>> {
    match json {
        None => Ok(Vec::new()),
        Some(j) => serde_json::from_str(&j).map_err(|_| corrupt("disk figures", &j)),
    }
}

/// A pool's images as their column holds them (JSON), or NULL when it describes none.
pub fn pool_images_json(images: &[PoolImage]) -> Option<String> {
    (!images.is_empty()).then(|| {
        let records: Vec<_> = images.iter().map(PoolImage::record).collect();
        serde_json::to_string(&records).expect("pool images serialize")
    })
}

fn pool_images(json: Option<String>) -> StoreResult<Vec<PoolImage>> {
    let Some(j) = json else { return Ok(Vec::new()) };
    let records: Vec<PoolImageRecord> =
        serde_json::from_str(&j).map_err(|_| corrupt("pool images", &j))?;
    Ok(records.into_iter().map(PoolImage::from_record).collect())
}

/// A runner's attested images as their column holds them (JSON), or NULL when none.
pub fn attested_images_json(images: &[AttestedImage]) -> Option<String> {
    (!images.is_empty()).then(|| serde_json::to_string(images).expect("attested images serialize"))
}

fn attested_images(json: Option<String>) -> StoreResult<Vec<AttestedImage>> {
    match json {
        None => Ok(Vec::new()),
        Some(j) => serde_json::from_str(&j).map_err(|_| corrupt("attested images", &j)),
    }
}

/// A pool's disk warning as its column holds it (JSON), or NULL.
pub fn disk_warning_json(warning: Option<&DiskWarning>) -> Option<String> {
    warning.map(|w| serde_json::to_string(w).expect("a disk warning serializes"))
}

fn disk_warning(json: Option<String>) -> StoreResult<Option<DiskWarning>> {
    json.map(|j| serde_json::from_str(&j).map_err(|_| corrupt("disk warning", &j)))
        .transpose()
}

/// A pool's `github` object as its column holds it (JSON), or NULL.
pub fn github_pool_json(github: Option<&GithubPool>) -> Option<String> {
    github.map(|g| serde_json::to_string(&g.record()).expect("a github object serializes"))
}

fn github_pool(json: Option<String>) -> StoreResult<Option<GithubPool>> {
    json.map(|j| {
        serde_json::from_str(&j)
            .map(GithubPool::from_record)
            .map_err(|_| corrupt("github object", &j))
    })
    .transpose()
}

/// A GitHub registration.
pub fn registration(row: &Row) -> StoreResult<Registration> {
    let state = row.text("state")?;
    Ok(Registration {
        id: RegistrationId(row.text("id")?),
        runner_id: RunnerId(row.text("runner_id")?),
        pool: PoolName::from_trusted(row.text("pool")?),
        scope: GithubScope::from_trusted(row.text("scope")?),
        name: row.text("name")?,
        github_runner_id: row.opt_int("github_runner_id")?,
        state: RegistrationState::parse(&state)
            .ok_or_else(|| corrupt("registration state", &state))?,
        minted_at: millis(row, "minted_at")?,
        expires_at: millis(row, "expires_at")?,
        online_at: opt_millis(row, "online_at")?,
        busy_at: opt_millis(row, "busy_at")?,
        seen_at: opt_millis(row, "seen_at")?,
        ended_at: opt_millis(row, "ended_at")?,
        end_reason: row.opt_text("end_reason")?,
        would_refuse: row.opt_text("would_refuse")?,
        observed_code: row.opt_text("observed_code")?,
    })
}

fn opt_digest(value: Option<String>) -> StoreResult<Option<ImageDigest>> {
    value
        .map(|v| ImageDigest::parse(&v).map_err(|_| corrupt("image digest", &v)))
        .transpose()
}

fn lease_state(s: &str) -> StoreResult<LeaseState> {
    LeaseState::parse(s).ok_or_else(|| corrupt("lease state", s))
}

pub fn pool(row: &Row) -> StoreResult<Pool> {
    let policy = row.text("image_policy")?;
    let source = row.text("image_source")?;
    let gate_mode = row.text("gate_mode")?;
    Ok(Pool {
        name: PoolName::from_trusted(row.text("name")?),
        image_ref: row.opt_text("image_ref")?,
        image_policy: ImagePolicy::parse(&policy)
            .ok_or_else(|| corrupt("image policy", &policy))?,
        image_source: ImageSource::parse(&source)
            .ok_or_else(|| corrupt("image source", &source))?,
        gate_mode: GateMode::parse(&gate_mode).ok_or_else(|| corrupt("gate mode", &gate_mode))?,
        expected_image_ids: digests(&row.text("expected_image_ids")?)?,
        previous_image_ids: digests(&row.text("previous_image_ids")?)?,
        previous_valid_until: opt_millis(row, "previous_valid_until")?,
        drift_grace_s: row.int("drift_grace_s")?,
        resolve_interval_s: row.int("resolve_interval_s")?,
        last_resolution: match opt_millis(row, "last_resolution_at")? {
            Some(at) => Some(Resolution {
                at,
                ok: row.opt_int("last_resolution_ok")?.unwrap_or(0) != 0,
                error: row.opt_text("last_resolution_error")?,
            }),
            None => None,
        },
        resolution_failures: row.int("resolution_failures")?,
        resolved_digest: opt_digest(row.opt_text("resolved_digest")?)?,
        resolved_image_id: opt_digest(row.opt_text("resolved_image_id")?)?,
        next_resolve_at: opt_millis(row, "next_resolve_at")?,
        github: github_pool(row.opt_text("github")?)?,
        disk_warning: disk_warning(row.opt_text("disk_warning")?)?,
        ejection: ejection_policy(row.opt_text("ejection")?)?,
        images: pool_images(row.opt_text("images")?)?,
        undescribed_images: match row.opt_text("undescribed_images")?.as_deref() {
            None | Some("refuse") => Undescribed::Refuse,
            Some("ignore") => Undescribed::Ignore,
            Some(other) => return Err(corrupt("undescribed_images", other)),
        },
        created_at: millis(row, "created_at")?,
        updated_at: millis(row, "updated_at")?,
    })
}

/// A pool's `ejection` column: NULL for the defaults.
fn ejection_policy(json: Option<String>) -> StoreResult<EjectionPolicy> {
    json.map_or(Ok(EjectionPolicy::default()), |j| {
        serde_json::from_str(&j).map_err(|_| corrupt("ejection policy", &j))
    })
}

/// A pool's policy as its column holds it: NULL when it is the default.
pub fn ejection_policy_json(policy: &EjectionPolicy) -> Option<String> {
    (policy != &EjectionPolicy::default())
        .then(|| serde_json::to_string(policy).expect("a policy serializes"))
}

fn tally(row: &Row, column: &str) -> StoreResult<Tally> {
    Ok(row
        .opt_text(column)?
        .map_or_else(Tally::default, |t| Tally::from_json(&t)))
}

/// The ejection in force on a runners row (`ejected_*`), if any.
fn ejection_in_force(row: &Row) -> StoreResult<Option<Ejection>> {
    let Some(until) = opt_millis(row, "ejected_until")? else {
        return Ok(None);
    };
    Ok(Some(Ejection {
        at: opt_millis(row, "ejected_at")?.unwrap_or(until),
        until,
        failures: tally(row, "ejected_failures")?,
        nth: row.opt_int("ejected_nth")?.unwrap_or(1),
    }))
}

/// What a runners row keeps for ejection.
pub fn ejection_record(row: &Row) -> StoreResult<EjectionRecord> {
    let would_eject = match (
        opt_millis(row, "would_eject_at")?,
        row.opt_text("would_eject_why")?,
    ) {
        (Some(at), Some(why)) => Some(WouldEject {
            at,
            why: Withheld::parse(&why).ok_or_else(|| corrupt("would_eject_why", &why))?,
            until: opt_millis(row, "would_eject_until")?.unwrap_or(at),
            failures: tally(row, "would_eject_failures")?,
        }),
        _ => None,
    };
    Ok(EjectionRecord {
        streak: tally(row, "eject_streak")?,
        ejections: row.int("ejections")?,
        last_until: opt_millis(row, "ejection_last_until")?,
        ejected: ejection_in_force(row)?,
        would_eject,
    })
}

/// The latest attestation a runners row records, when it records one.
fn latest_attestation(row: &Row) -> StoreResult<Option<LatestAttestation>> {
    Ok(match opt_millis(row, "attested_at")? {
        Some(received_at) => Some(LatestAttestation {
            received_at,
            state: AttestedState {
                probe: Probe {
                    ok: row.opt_int("probe_ok")?.unwrap_or(0) != 0,
                    runtime: row.opt_text("probe_runtime")?.unwrap_or_default(),
                    runtime_version: row.opt_text("probe_runtime_version")?,
                    checked_at: opt_millis(row, "probe_checked_at")?.unwrap_or_default(),
                    error: row.opt_text("probe_error")?,
                    exit_code: row.opt_int("probe_exit_code")?,
                    disk: probe_disk(row.opt_text("probe_disk")?)?,
                },
                image: RunningImage {
                    id: opt_digest(row.opt_text("image_id")?)?,
                    digest: opt_digest(row.opt_text("image_digest")?)?,
                    image_ref: row.opt_text("image_ref")?,
                },
                images: attested_images(row.opt_text("images")?)?,
            },
        }),
        None => None,
    })
}

/// The columns `runner_summary` reads: what judging a runner needs.
pub const SUMMARY_COLUMNS: &str = "id, name, pool, cordoned, quarantined_at, revoked_at, \
     attested_at, probe_ok, probe_checked_at, probe_disk, image_id, image_digest, images, \
     ejected_at, ejected_until, ejected_failures, ejected_nth";

/// And what the operators' search needs besides.
pub const SEARCH_COLUMNS: &str = "labels, agent";

/// A runner's summary; its search fields when the row has `SEARCH_COLUMNS`.
pub fn runner_summary(row: &Row, with_search: bool) -> StoreResult<RunnerSummary> {
    let latest = match opt_millis(row, "attested_at")? {
        Some(received_at) => Some(LatestAttestation {
            received_at,
            state: AttestedState {
                probe: Probe {
                    ok: row.opt_int("probe_ok")?.unwrap_or(0) != 0,
                    checked_at: opt_millis(row, "probe_checked_at")?.unwrap_or_default(),
                    runtime: String::new(),
                    runtime_version: None,
                    error: None,
                    exit_code: None,
                    disk: probe_disk(row.opt_text("probe_disk")?)?,
                },
                image: RunningImage {
                    id: opt_digest(row.opt_text("image_id")?)?,
                    digest: opt_digest(row.opt_text("image_digest")?)?,
                    image_ref: None,
                },
                images: attested_images(row.opt_text("images")?)?,
            },
        }),
        None => None,
    };
    let search = if with_search {
        let labels = row.text("labels")?;
        Some(SearchFields {
            labels: serde_json::from_str(&labels).map_err(|_| corrupt("labels", &labels))?,
            host: agent(row)?.host,
        })
    } else {
        None
    };
    Ok(RunnerSummary {
        id: RunnerId(row.text("id")?),
        name: row.text("name")?,
        pool: PoolName::from_trusted(row.text("pool")?),
        gate: gate(row)?,
        revoked_at: opt_millis(row, "revoked_at")?,
        latest,
        search,
    })
}

fn gate(row: &Row) -> StoreResult<GateState> {
    Ok(GateState {
        cordoned: row.flag("cordoned")?,
        quarantined_at: opt_millis(row, "quarantined_at")?,
        ejection: ejection_in_force(row)?,
    })
}

fn agent(row: &Row) -> StoreResult<AgentInfo> {
    let recorded = row.opt_text("agent")?;
    let parsed = recorded.and_then(|a| serde_json::from_str(&a).ok());
    Ok(AgentInfo::from_recorded(parsed.as_ref()))
}

/// A runner row, joined with its newest live lease (`lease_*` columns), without its forge
/// runners (read apart).
pub fn runner(row: &Row) -> StoreResult<Runner> {
    let labels = row.text("labels")?;
    let latest = latest_attestation(row)?;
    let current_lease = match row.opt_text("lease_id")? {
        Some(id) => Some(CurrentLease {
            lease_id: LeaseId(id),
            job_id: JobId(row.text("lease_job_id")?),
            state: lease_state(&row.text("lease_state")?)?,
            expires_at: millis(row, "lease_expires_at")?,
        }),
        None => None,
    };
    Ok(Runner {
        id: RunnerId(row.text("id")?),
        name: row.text("name")?,
        pool: PoolName::from_trusted(row.text("pool")?),
        labels: serde_json::from_str(&labels).map_err(|_| corrupt("labels", &labels))?,
        public_key_x: row.text("public_key_x")?,
        gate: gate(row)?,
        revoked_at: opt_millis(row, "revoked_at")?,
        registered_at: millis(row, "registered_at")?,
        latest,
        current_lease,
        forge_runners: vec![],
        forge_runners_taken: forge_runners_taken(row)?,
        agent: agent(row)?,
        ejection: ejection_record(row)?,
        last_rejection: match opt_millis(row, "rejected_at")? {
            Some(at) => Some(Rejection {
                at,
                code: row.text("rejected_code")?,
                detail: row.text("rejected_detail")?,
            }),
            None => None,
        },
    })
}

/// The forge runners a runner's agent claimed and another runner holds, as written by
/// `forge_runners_taken_text`.
fn forge_runners_taken(row: &Row) -> StoreResult<Vec<ForgeRunner>> {
    let Some(text) = row.opt_text("forge_runners_taken")? else {
        return Ok(vec![]);
    };
    let values: Vec<serde_json::Value> =
        serde_json::from_str(&text).map_err(|_| corrupt("forge_runners_taken", &text))?;
    values
        .iter()
        .map(|v| ForgeRunner::from_json(v).map_err(|_| corrupt("forge_runners_taken", &text)))
        .collect()
}

/// The `forge_runners_taken` column for `taken`: NULL when empty.
pub fn forge_runners_taken_text(taken: &[ForgeRunner]) -> Option<String> {
    (!taken.is_empty()).then(|| {
        serde_json::Value::Array(taken.iter().map(ForgeRunner::to_json).collect()).to_string()
    })
}

pub fn forge_binding(row: &Row) -> StoreResult<ForgeBinding> {
    let kind = row.text("kind")?;
    let system_id = row.text("system_id")?;
    Ok(ForgeBinding {
        identity: ForgeIdentity {
            kind: ForgeKind::parse(&kind).ok_or_else(|| corrupt("forge kind", &kind))?,
            key: row.text("identity")?,
            system_id: (!system_id.is_empty()).then_some(system_id),
        },
        token_sha256: row.opt_text("token_sha256")?,
        last_fetch_at: opt_millis(row, "last_fetch_at")?,
    })
}

pub fn job(row: &Row) -> StoreResult<Job> {
    let payload = row.text("payload")?;
    let state = row.text("state")?;
    Ok(Job {
        payload: serde_json::from_str(&payload).map_err(|_| corrupt("payload", &payload))?,
        id: JobId(row.text("id")?),
        pool: PoolName::from_trusted(row.text("pool")?),
        state: JobState::parse(&state).ok_or_else(|| corrupt("job state", &state))?,
        attempts: row.int("attempts")?,
        max_attempts: row.int("max_attempts")?,
        returns: row.int("returns")?,
        last_error: row.opt_text("last_error")?,
        idempotency_key: row.opt_text("idempotency_key")?,
        lease_id: row.opt_text("lease_id")?.map(LeaseId),
        created_at: millis(row, "created_at")?,
        updated_at: millis(row, "updated_at")?,
    })
}

pub fn job_event(row: &Row) -> StoreResult<JobEvent> {
    Ok(JobEvent {
        at: millis(row, "at")?,
        kind: row.text("kind")?,
        runner_id: row.opt_text("runner_id")?.map(RunnerId),
        lease_id: row.opt_text("lease_id")?.map(LeaseId),
        reason: row.opt_text("reason")?,
        detail: row.opt_text("detail")?,
    })
}

pub fn lease(row: &Row) -> StoreResult<Lease> {
    Ok(Lease {
        id: LeaseId(row.text("id")?),
        job_id: JobId(row.text("job_id")?),
        runner_id: RunnerId(row.text("runner_id")?),
        pool: PoolName::from_trusted(row.text("pool")?),
        state: lease_state(&row.text("state")?)?,
        attempt: row.int("attempt")?,
        granted_at: millis(row, "granted_at")?,
        started_at: opt_millis(row, "started_at")?,
        expires_at: millis(row, "expires_at")?,
        ended_at: opt_millis(row, "ended_at")?,
    })
}

pub fn attestation_entry(row: &Row) -> StoreResult<AttestationEntry> {
    Ok(AttestationEntry {
        received_at: millis(row, "received_at")?,
        probe_ok: row.flag("probe_ok")?,
        runtime: row.text("probe_runtime")?,
        runtime_version: row.opt_text("probe_runtime_version")?,
        checked_at: millis(row, "probe_checked_at")?,
        error: row.opt_text("probe_error")?,
        image: RunningImage {
            id: opt_digest(row.opt_text("image_id")?)?,
            digest: opt_digest(row.opt_text("image_digest")?)?,
            image_ref: None,
        },
        status: row.text("status")?,
    })
}

pub fn status_change(row: &Row) -> StoreResult<StatusChange> {
    Ok(StatusChange {
        at: millis(row, "at")?,
        from: row.opt_text("from_status")?,
        to: row.text("to_status")?,
        detail: row.opt_text("detail")?,
    })
}

pub fn refusal(row: &Row) -> StoreResult<RefusalEntry> {
    let first_at = millis(row, "at")?;
    Ok(RefusalEntry {
        seq: row.int("seq")?,
        first_at,
        at: opt_millis(row, "last_at")?.unwrap_or(first_at),
        count: row.int("count")?,
        code: row.text("code")?,
        detail: row.text("detail")?,
    })
}

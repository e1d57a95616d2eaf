//! Turning rows into domain values, shared by both engines.
//!
//! Both schemas use the same column names and the same portable types (64-bit integers for
//! instants and counters, text for ids, JSON and enums), so one set of decoders serves both.

use super::{AttestationEntry, Lease, RefusalEntry, StatusChange, StoreError, StoreResult};
use crate::domain::attestation::{Probe, RunningImage};
use crate::domain::digest::ImageDigest;
use crate::domain::forge::{ForgeBinding, ForgeIdentity, ForgeKind};
use crate::domain::ids::{JobId, LeaseId, RunnerId};
use crate::domain::job::{Job, JobEvent, JobState};
use crate::domain::lease::LeaseState;
use crate::domain::pool::{GateMode, ImagePolicy, ImageSource, Pool, PoolName, Resolution};
use crate::domain::runner::{CurrentLease, LatestAttestation, Runner};
use crate::domain::time::Millis;
use crate::domain::verdict::{AttestedState, GateState};
use sqlx::{ColumnIndex, Decode, Row, Type};

fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Internal(format!("stored {what} is not valid: {value:?}"))
}

pub(super) fn get<'r, R, T>(row: &'r R, col: &str) -> StoreResult<T>
where
    R: Row,
    T: Decode<'r, R::Database> + Type<R::Database>,
    for<'a> &'a str: ColumnIndex<R>,
{
    row.try_get(col).map_err(StoreError::from)
}

pub(super) fn millis<R>(row: &R, col: &str) -> StoreResult<Millis>
where
    R: Row,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'a> &'a str: ColumnIndex<R>,
{
    Ok(Millis(get::<R, i64>(row, col)?))
}

pub(super) fn opt_millis<R>(row: &R, col: &str) -> StoreResult<Option<Millis>>
where
    R: Row,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    for<'a> &'a str: ColumnIndex<R>,
{
    Ok(get::<R, Option<i64>>(row, col)?.map(Millis))
}

pub(super) fn digests(json: &str) -> StoreResult<Vec<ImageDigest>> {
    serde_json::from_str(json).map_err(|_| corrupt("digest list", json))
}

pub(super) fn digests_json(list: &[ImageDigest]) -> String {
    serde_json::to_string(list).expect("digests serialize")
}

pub(super) fn opt_digest(value: Option<String>) -> StoreResult<Option<ImageDigest>> {
    value
        .map(|v| ImageDigest::parse(&v).map_err(|_| corrupt("image digest", &v)))
        .transpose()
}

pub(super) fn lease_state(s: &str) -> StoreResult<LeaseState> {
    LeaseState::parse(s).ok_or_else(|| corrupt("lease state", s))
}

pub(super) fn job_state(s: &str) -> StoreResult<JobState> {
    JobState::parse(s).ok_or_else(|| corrupt("job state", s))
}

/// Decoders over any engine's row type; implemented for both engines' rows below.
pub(super) trait Decoders: Row + Sized
where
    for<'r> i64: Decode<'r, Self::Database> + Type<Self::Database>,
    for<'r> Option<i64>: Decode<'r, Self::Database> + Type<Self::Database>,
    for<'r> String: Decode<'r, Self::Database> + Type<Self::Database>,
    for<'r> Option<String>: Decode<'r, Self::Database> + Type<Self::Database>,
    for<'a> &'a str: ColumnIndex<Self>,
{
    fn pool(&self) -> StoreResult<Pool> {
        let policy: String = get(self, "image_policy")?;
        let source: String = get(self, "image_source")?;
        let gate_mode: String = get(self, "gate_mode")?;
        let resolution_at = opt_millis(self, "last_resolution_at")?;
        Ok(Pool {
            name: PoolName::from_trusted(get(self, "name")?),
            image_ref: get(self, "image_ref")?,
            image_policy: ImagePolicy::parse(&policy)
                .ok_or_else(|| corrupt("image policy", &policy))?,
            image_source: ImageSource::parse(&source)
                .ok_or_else(|| corrupt("image source", &source))?,
            gate_mode: GateMode::parse(&gate_mode)
                .ok_or_else(|| corrupt("gate mode", &gate_mode))?,
            expected_image_ids: digests(&get::<_, String>(self, "expected_image_ids")?)?,
            previous_image_ids: digests(&get::<_, String>(self, "previous_image_ids")?)?,
            previous_valid_until: opt_millis(self, "previous_valid_until")?,
            drift_grace_s: get(self, "drift_grace_s")?,
            resolve_interval_s: get(self, "resolve_interval_s")?,
            last_resolution: match resolution_at {
                Some(at) => Some(Resolution {
                    at,
                    ok: get::<_, Option<i64>>(self, "last_resolution_ok")?.unwrap_or(0) != 0,
                    error: get(self, "last_resolution_error")?,
                }),
                None => None,
            },
            resolution_failures: get(self, "resolution_failures")?,
            resolved_digest: opt_digest(get(self, "resolved_digest")?)?,
            resolved_image_id: opt_digest(get(self, "resolved_image_id")?)?,
            next_resolve_at: opt_millis(self, "next_resolve_at")?,
            created_at: millis(self, "created_at")?,
            updated_at: millis(self, "updated_at")?,
        })
    }

    /// A row of `forge_runners`.
    fn forge_binding(&self) -> StoreResult<ForgeBinding> {
        let kind: String = get(self, "kind")?;
        Ok(ForgeBinding {
            identity: ForgeIdentity {
                kind: ForgeKind::parse(&kind).ok_or_else(|| corrupt("forge kind", &kind))?,
                key: get(self, "identity")?,
            },
            last_fetch_at: opt_millis(self, "last_fetch_at")?,
        })
    }

    /// A runner row, optionally joined with its live lease (`lease_*` columns).
    fn runner(&self) -> StoreResult<Runner> {
        let labels: String = get(self, "labels")?;
        let latest = match opt_millis(self, "attested_at")? {
            Some(received_at) => Some(LatestAttestation {
                received_at,
                state: AttestedState {
                    probe: Probe {
                        ok: get::<_, Option<i64>>(self, "probe_ok")?.unwrap_or(0) != 0,
                        runtime: get::<_, Option<String>>(self, "probe_runtime")?
                            .unwrap_or_default(),
                        runtime_version: get(self, "probe_runtime_version")?,
                        checked_at: opt_millis(self, "probe_checked_at")?.unwrap_or_default(),
                        error: get(self, "probe_error")?,
                        exit_code: get(self, "probe_exit_code")?,
                    },
                    image: RunningImage {
                        id: opt_digest(get(self, "image_id")?)?,
                        digest: opt_digest(get(self, "image_digest")?)?,
                        image_ref: get(self, "image_ref")?,
                    },
                },
            }),
            None => None,
        };
        let current_lease = match get::<_, Option<String>>(self, "lease_id")? {
            Some(id) => Some(CurrentLease {
                lease_id: LeaseId(id),
                job_id: JobId(get(self, "lease_job_id")?),
                state: lease_state(&get::<_, String>(self, "lease_state")?)?,
                expires_at: millis(self, "lease_expires_at")?,
            }),
            None => None,
        };
        Ok(Runner {
            id: RunnerId(get(self, "id")?),
            name: get(self, "name")?,
            pool: PoolName::from_trusted(get(self, "pool")?),
            labels: serde_json::from_str(&labels).map_err(|_| corrupt("labels", &labels))?,
            public_key_x: get(self, "public_key_x")?,
            gate: GateState {
                cordoned: get::<_, i64>(self, "cordoned")? != 0,
                quarantined_at: opt_millis(self, "quarantined_at")?,
            },
            revoked_at: opt_millis(self, "revoked_at")?,
            registered_at: millis(self, "registered_at")?,
            latest,
            current_lease,
            forge_runners: vec![],
        })
    }

    fn job(&self) -> StoreResult<Job> {
        JobColumns {
            id: get(self, "id")?,
            pool: get(self, "pool")?,
            payload: get(self, "payload")?,
            state: get(self, "state")?,
            attempts: get(self, "attempts")?,
            max_attempts: get(self, "max_attempts")?,
            returns: get(self, "returns")?,
            last_error: get(self, "last_error")?,
            idempotency_key: get(self, "idempotency_key")?,
            lease_id: get(self, "lease_id")?,
            created_at: get(self, "created_at")?,
            updated_at: get(self, "updated_at")?,
        }
        .into_job()
    }

    fn job_event(&self) -> StoreResult<JobEvent> {
        Ok(JobEvent {
            at: millis(self, "at")?,
            kind: get(self, "kind")?,
            runner_id: get::<_, Option<String>>(self, "runner_id")?.map(RunnerId),
            lease_id: get::<_, Option<String>>(self, "lease_id")?.map(LeaseId),
            reason: get(self, "reason")?,
            detail: get(self, "detail")?,
        })
    }

    fn lease(&self) -> StoreResult<Lease> {
        Ok(Lease {
            id: LeaseId(get(self, "id")?),
            job_id: JobId(get(self, "job_id")?),
            runner_id: RunnerId(get(self, "runner_id")?),
            pool: PoolName::from_trusted(get(self, "pool")?),
            state: lease_state(&get::<_, String>(self, "state")?)?,
            attempt: get(self, "attempt")?,
            granted_at: millis(self, "granted_at")?,
            started_at: opt_millis(self, "started_at")?,
            expires_at: millis(self, "expires_at")?,
            ended_at: opt_millis(self, "ended_at")?,
        })
    }

    fn attestation_entry(&self) -> StoreResult<AttestationEntry> {
        Ok(AttestationEntry {
            received_at: millis(self, "received_at")?,
            probe_ok: get::<_, i64>(self, "probe_ok")? != 0,
            runtime: get(self, "probe_runtime")?,
            runtime_version: get(self, "probe_runtime_version")?,
            checked_at: millis(self, "probe_checked_at")?,
            error: get(self, "probe_error")?,
            image: RunningImage {
                id: opt_digest(get(self, "image_id")?)?,
                digest: opt_digest(get(self, "image_digest")?)?,
                image_ref: None,
            },
            status: get(self, "status")?,
        })
    }

    fn status_change(&self) -> StoreResult<StatusChange> {
        Ok(StatusChange {
            at: millis(self, "at")?,
            from: get(self, "from_status")?,
            to: get(self, "to_status")?,
            detail: get(self, "detail")?,
        })
    }

    fn refusal(&self) -> StoreResult<RefusalEntry> {
        Ok(RefusalEntry {
            at: millis(self, "at")?,
            code: get(self, "code")?,
            detail: get(self, "detail")?,
        })
    }
}

impl Decoders for sqlx::sqlite::SqliteRow {}
impl Decoders for sqlx::postgres::PgRow {}

/// A job row's columns as stored, before its JSON and state are checked: shared by the sqlx
/// decoders above and SQLite's round thread (`sqlite_rounds`).
pub(super) struct JobColumns {
    pub id: String,
    pub pool: String,
    pub payload: String,
    pub state: String,
    pub attempts: i64,
    pub max_attempts: i64,
    pub returns: i64,
    pub last_error: Option<String>,
    pub idempotency_key: Option<String>,
    pub lease_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl JobColumns {
    pub fn into_job(self) -> StoreResult<Job> {
        Ok(Job {
            payload: serde_json::from_str(&self.payload)
                .map_err(|_| corrupt("payload", &self.payload))?,
            id: JobId(self.id),
            pool: PoolName::from_trusted(self.pool),
            state: job_state(&self.state)?,
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            returns: self.returns,
            last_error: self.last_error,
            idempotency_key: self.idempotency_key,
            lease_id: self.lease_id.map(LeaseId),
            created_at: Millis(self.created_at),
            updated_at: Millis(self.updated_at),
        })
    }
}

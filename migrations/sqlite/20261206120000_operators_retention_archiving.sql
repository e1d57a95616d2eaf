-- Named operators, the audit trail, retention and archiving.

-- Operators' tokens: only the SHA-256 of each is kept; a name is one operator.
CREATE TABLE operator_tokens (
    name         TEXT PRIMARY KEY,
    role         TEXT NOT NULL,
    token_hash   TEXT NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    created_by   TEXT NOT NULL
);

-- Every write an operator made, in order (seq is the paging cursor).
CREATE TABLE audit (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    target  TEXT NOT NULL,
    detail  TEXT,
    client  TEXT NOT NULL
);
CREATE INDEX audit_by_target ON audit (target, seq);
CREATE INDEX audit_by_actor ON audit (actor, seq);
CREATE INDEX audit_by_time ON audit (at);

-- Background tasks one replica at a time runs (the pruner): who holds each, until when.
CREATE TABLE maintenance (
    task          TEXT PRIMARY KEY,
    claimed_until INTEGER NOT NULL DEFAULT 0,
    last_run_at   INTEGER
);
INSERT INTO maintenance (task) VALUES ('prune');

-- Retention finds finished jobs by age, their leases by job, and old history by time.
CREATE INDEX jobs_finished_by_update ON jobs (updated_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX leases_by_job ON leases (job_id);
CREATE INDEX status_changes_by_time ON status_changes (at);
CREATE INDEX attestation_history_by_time ON attestation_history (received_at);
CREATE INDEX refusals_by_time ON refusals (at);
CREATE INDEX registration_tokens_by_expiry ON registration_tokens (expires_at);

-- A revoked runner's name may be registered again: names are unique among live runners only.
-- SQLite cannot drop a table constraint, so the table is rebuilt (foreign keys are off while
-- migrations run, and checked after them).
CREATE TABLE runners_rebuilt (
    id                    TEXT PRIMARY KEY,
    name                  TEXT NOT NULL,
    pool                  TEXT NOT NULL REFERENCES pools(name),
    labels                TEXT NOT NULL,
    public_key_x          TEXT NOT NULL,
    cordoned              INTEGER NOT NULL DEFAULT 0,
    quarantined_at        INTEGER,
    revoked_at            INTEGER,
    registered_at         INTEGER NOT NULL,
    attested_at           INTEGER,
    probe_ok              INTEGER,
    probe_runtime         TEXT,
    probe_runtime_version TEXT,
    probe_checked_at      INTEGER,
    probe_error           TEXT,
    probe_exit_code       INTEGER,
    image_id              TEXT,
    image_digest          TEXT,
    image_ref             TEXT,
    agent                 TEXT,
    last_status           TEXT,
    attestation_seq       INTEGER NOT NULL DEFAULT 0,
    refusal_seq           INTEGER NOT NULL DEFAULT 0,
    recent_jtis           TEXT NOT NULL DEFAULT '',
    jtis_spilled_until    INTEGER,
    history_sampled_at    INTEGER,
    refusal_code          TEXT,
    refusal_detail        TEXT,
    refusal_count         INTEGER NOT NULL DEFAULT 0,
    refusal_first_at      INTEGER,
    refusal_last_at       INTEGER,
    refusal_synced_at     INTEGER
);
INSERT INTO runners_rebuilt SELECT id, name, pool, labels, public_key_x, cordoned,
    quarantined_at, revoked_at, registered_at, attested_at, probe_ok, probe_runtime,
    probe_runtime_version, probe_checked_at, probe_error, probe_exit_code, image_id,
    image_digest, image_ref, agent, last_status, attestation_seq, refusal_seq, recent_jtis,
    jtis_spilled_until, history_sampled_at, refusal_code, refusal_detail, refusal_count,
    refusal_first_at, refusal_last_at, refusal_synced_at FROM runners;
DROP TABLE runners;
ALTER TABLE runners_rebuilt RENAME TO runners;
CREATE UNIQUE INDEX runners_live_name ON runners (pool, name) WHERE revoked_at IS NULL;
CREATE INDEX runners_by_pool ON runners (pool, name);

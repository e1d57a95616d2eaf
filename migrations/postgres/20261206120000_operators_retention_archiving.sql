-- Named operators, the audit trail, retention and archiving.

-- Operators' tokens: only the SHA-256 of each is kept; a name is one operator.
CREATE TABLE operator_tokens (
    name         TEXT PRIMARY KEY,
    role         TEXT NOT NULL,
    token_hash   TEXT NOT NULL UNIQUE,
    created_at   BIGINT NOT NULL,
    created_by   TEXT NOT NULL
);

-- Every write an operator made, in order (seq is the paging cursor).
CREATE TABLE audit (
    seq     BIGSERIAL PRIMARY KEY,
    at      BIGINT NOT NULL,
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
    claimed_until BIGINT NOT NULL DEFAULT 0,
    last_run_at   BIGINT
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
ALTER TABLE runners DROP CONSTRAINT runners_pool_name_key;
CREATE UNIQUE INDEX runners_live_name ON runners (pool, name) WHERE revoked_at IS NULL;
CREATE INDEX runners_by_pool ON runners (pool, name);

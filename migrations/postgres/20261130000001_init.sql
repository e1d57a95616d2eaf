-- leasegate schema, PostgreSQL engine. Instants are BIGINT milliseconds since the Unix epoch,
-- and every column has the same name and portable type as in the SQLite schema.

CREATE TABLE pools (
    name                  TEXT PRIMARY KEY,
    image_ref             TEXT,
    image_policy          TEXT NOT NULL,
    image_source          TEXT NOT NULL,
    expected_image_ids    TEXT NOT NULL,          -- JSON array of digests
    previous_image_ids    TEXT NOT NULL,          -- JSON array of digests
    previous_valid_until  BIGINT,
    drift_grace_s         BIGINT NOT NULL,
    resolve_interval_s    BIGINT NOT NULL,
    last_resolution_at    BIGINT,
    last_resolution_ok    BIGINT,
    last_resolution_error TEXT,
    created_at            BIGINT NOT NULL,
    updated_at            BIGINT NOT NULL
);

CREATE TABLE registration_tokens (
    token_hash  TEXT PRIMARY KEY,                 -- sha256 hex of the token; the token is never stored
    pool        TEXT NOT NULL REFERENCES pools(name),
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    used_at     BIGINT,
    used_by     TEXT
);

CREATE TABLE runners (
    id                    TEXT PRIMARY KEY,
    name                  TEXT NOT NULL,
    pool                  TEXT NOT NULL REFERENCES pools(name),
    labels                TEXT NOT NULL,          -- JSON object
    public_key_x          TEXT NOT NULL,
    cordoned              BIGINT NOT NULL DEFAULT 0,
    quarantined_at        BIGINT,
    revoked_at            BIGINT,
    registered_at         BIGINT NOT NULL,
    -- The latest attestation, kept in place.
    attested_at           BIGINT,
    probe_ok              BIGINT,
    probe_runtime         TEXT,
    probe_runtime_version TEXT,
    probe_checked_at      BIGINT,
    probe_error           TEXT,
    probe_exit_code       BIGINT,
    image_id              TEXT,
    image_digest          TEXT,
    image_ref             TEXT,
    agent                 TEXT,                   -- JSON, as sent
    last_status           TEXT,
    attestation_seq       BIGINT NOT NULL DEFAULT 0,
    refusal_seq           BIGINT NOT NULL DEFAULT 0,
    UNIQUE (pool, name)
);

-- The last N attestations per runner, as a ring: slot = seq % N.
CREATE TABLE attestation_history (
    runner_id             TEXT NOT NULL REFERENCES runners(id),
    slot                  BIGINT NOT NULL,
    seq                   BIGINT NOT NULL,
    received_at           BIGINT NOT NULL,
    probe_ok              BIGINT NOT NULL,
    probe_runtime         TEXT NOT NULL,
    probe_runtime_version TEXT,
    probe_checked_at      BIGINT NOT NULL,
    probe_error           TEXT,
    image_id              TEXT,
    image_digest          TEXT,
    status                TEXT NOT NULL,
    PRIMARY KEY (runner_id, slot)
);

-- The last N refusals per runner, as a ring.
CREATE TABLE refusals (
    runner_id  TEXT NOT NULL REFERENCES runners(id),
    slot       BIGINT NOT NULL,
    seq        BIGINT NOT NULL,
    at         BIGINT NOT NULL,
    code       TEXT NOT NULL,
    detail     TEXT NOT NULL,
    PRIMARY KEY (runner_id, slot)
);

-- Status changes only; trimmed to the last N per runner by the sweeper.
CREATE TABLE status_changes (
    id         BIGSERIAL PRIMARY KEY,
    runner_id  TEXT NOT NULL REFERENCES runners(id),
    at         BIGINT NOT NULL,
    from_status TEXT,
    to_status  TEXT NOT NULL,
    detail     TEXT
);
CREATE INDEX status_changes_by_runner ON status_changes (runner_id, id);

-- Replay protection: a jti is remembered while its attestation could still be valid.
CREATE TABLE seen_jtis (
    runner_id  TEXT NOT NULL,
    jti        TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (runner_id, jti)
);
CREATE INDEX seen_jtis_by_expiry ON seen_jtis (expires_at);

CREATE TABLE jobs (
    seq             BIGSERIAL PRIMARY KEY, -- queue order
    id              TEXT NOT NULL UNIQUE,
    pool            TEXT NOT NULL REFERENCES pools(name),
    payload         TEXT NOT NULL,                     -- JSON, as sent
    state           TEXT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    max_attempts    BIGINT NOT NULL,
    returns         BIGINT NOT NULL DEFAULT 0,
    last_error      TEXT,
    idempotency_key TEXT UNIQUE,
    lease_id        TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
-- The claim reads only queued rows, oldest first: a partial index keeps it flat.
CREATE INDEX jobs_queued ON jobs (pool, seq) WHERE state = 'queued';

CREATE TABLE leases (
    id          TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL REFERENCES jobs(id),
    runner_id   TEXT NOT NULL REFERENCES runners(id),
    pool        TEXT NOT NULL,
    token_hash  TEXT NOT NULL,
    state       TEXT NOT NULL,
    attempt     BIGINT NOT NULL,
    granted_at  BIGINT NOT NULL,
    started_at  BIGINT,
    expires_at  BIGINT NOT NULL,
    ended_at    BIGINT
);
CREATE INDEX leases_live_by_expiry ON leases (expires_at) WHERE state IN ('leased', 'running');
CREATE INDEX leases_by_runner ON leases (runner_id, granted_at);
-- At most one live lease per job, enforced by the engine as well as by the claim.
CREATE UNIQUE INDEX leases_one_live_per_job ON leases (job_id) WHERE state IN ('leased', 'running');

CREATE TABLE job_events (
    id         BIGSERIAL PRIMARY KEY,
    job_id     TEXT NOT NULL REFERENCES jobs(id),
    at         BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    runner_id  TEXT,
    lease_id   TEXT,
    reason     TEXT,
    detail     TEXT
);
CREATE INDEX job_events_by_job ON job_events (job_id, id);

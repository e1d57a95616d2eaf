-- The runner-health page's sessions, kept by the service so that logging out ends one at once
-- on every replica. The cookie holds a random token; only its hash is stored. A session is
-- bound to the credential it was opened with (`credential_hash`): when that credential stops
-- being valid (the admin token is rotated), the session ends with it.
CREATE TABLE page_sessions (
    token_hash      TEXT PRIMARY KEY,
    actor           TEXT NOT NULL,
    credential_hash TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL
);
CREATE INDEX page_sessions_by_expiry ON page_sessions (expires_at);

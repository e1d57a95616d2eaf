-- The forge gate. A pool either enforces its refusals or only observes them (records and
-- marks what it would have refused, and lets the runner have its work).
ALTER TABLE pools ADD COLUMN gate_mode TEXT NOT NULL DEFAULT 'enforce';

-- Forge runners bound to leasegate runners: a Forgejo/Gitea runner by its uuid, a GitLab
-- runner by the SHA-256 of its token (the token itself is never stored). A forge runner
-- belongs to one leasegate runner at most; revoking the runner frees its forge runners.
CREATE TABLE forge_runners (
    kind          TEXT NOT NULL,
    identity      TEXT NOT NULL,
    runner_id     TEXT NOT NULL REFERENCES runners (id),
    bound_at      BIGINT NOT NULL,
    last_fetch_at BIGINT,
    PRIMARY KEY (kind, identity)
);
CREATE INDEX forge_runners_by_runner ON forge_runners (runner_id);

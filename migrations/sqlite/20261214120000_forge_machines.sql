-- A forge runner is bound by what the forge knows it by, and now more precisely: a GitLab
-- token and the system_id of the machine presenting it (one token may serve a fleet; '' is
-- the token alone, any machine), and a Forgejo/Gitea runner's uuid with the SHA-256 of its
-- token when known (only a fetch presenting that token is judged by the binding). SQLite
-- changes a primary key by building the table anew.
CREATE TABLE forge_runners_by_machine (
    kind          TEXT NOT NULL,
    identity      TEXT NOT NULL,
    system_id     TEXT NOT NULL DEFAULT '',
    token_sha256  TEXT,
    runner_id     TEXT NOT NULL REFERENCES runners (id),
    bound_at      BIGINT NOT NULL,
    last_fetch_at BIGINT,
    PRIMARY KEY (kind, identity, system_id)
);
INSERT INTO forge_runners_by_machine (kind, identity, system_id, runner_id, bound_at, last_fetch_at)
    SELECT kind, identity, '', runner_id, bound_at, last_fetch_at FROM forge_runners;
DROP TABLE forge_runners;
ALTER TABLE forge_runners_by_machine RENAME TO forge_runners;
CREATE INDEX forge_runners_by_runner ON forge_runners (runner_id);

-- The forge runners a runner's agent last claimed that another runner holds (a JSON array of
-- the claim's objects; NULL when none): shown on the runner as forge_runner_taken.
ALTER TABLE runners ADD COLUMN forge_runners_taken TEXT;

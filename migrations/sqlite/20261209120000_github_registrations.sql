-- GitHub Actions (docs/FORGES.md): where a pool's runners register with GitHub, as JSON
-- {scope, runner_group_id, labels, work_folder}; NULL when they do not.
ALTER TABLE pools ADD COLUMN github TEXT;

-- The registrations leasegate minted in GitHub for its runners, one row each, kept through
-- their life (minting, minted, online, busy, done, deleted). Never the JIT config itself:
-- that goes to the runner and nowhere else.
CREATE TABLE github_registrations (
    id               TEXT PRIMARY KEY,
    runner_id        TEXT NOT NULL REFERENCES runners (id),
    pool             TEXT NOT NULL,
    scope            TEXT NOT NULL,
    name             TEXT NOT NULL,
    github_runner_id INTEGER,
    state            TEXT NOT NULL,
    minted_at        INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    online_at        INTEGER,
    busy_at          INTEGER,
    seen_at          INTEGER,
    ended_at         INTEGER,
    end_reason       TEXT,
    would_refuse     TEXT,
    observed_code    TEXT
);
-- A runner holds at most one registration that has not ended, whatever replicas race.
CREATE UNIQUE INDEX github_registrations_one_outstanding ON github_registrations (runner_id)
    WHERE state IN ('minting', 'minted', 'online', 'busy');
-- The watcher reads the outstanding ones by scope; a runner's detail, its latest.
CREATE INDEX github_registrations_watched ON github_registrations (scope)
    WHERE state IN ('minting', 'minted', 'online', 'busy');
CREATE INDEX github_registrations_by_runner ON github_registrations (runner_id, minted_at);
-- Retention finds ended ones by when they ended.
CREATE INDEX github_registrations_ended ON github_registrations (ended_at)
    WHERE ended_at IS NOT NULL;
-- The watcher's turn: one replica at a time lists GitHub's runners.
INSERT INTO maintenance (task) VALUES ('github');

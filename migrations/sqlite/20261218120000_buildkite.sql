-- Buildkite (docs/FORGES.md): the pauses leasegate made on bound agents, one row each from the
-- pause Buildkite accepted until it ended (resumed, lapsed, undone, replaced, gone). Every
-- replica reads them: only these pauses are ever resumed, never one somebody else made.
CREATE TABLE buildkite_pauses (
    agent_id   TEXT NOT NULL,
    paused_at  INTEGER NOT NULL,
    agent_name TEXT NOT NULL,
    runner_id  TEXT NOT NULL,
    code       TEXT NOT NULL,
    note       TEXT NOT NULL,
    until_at   INTEGER NOT NULL,
    ended_at   INTEGER,
    end_reason TEXT,
    PRIMARY KEY (agent_id, paused_at)
);
-- The watcher reads the ones not ended; a runner's detail, its latest; retention, the ended.
CREATE INDEX buildkite_pauses_live ON buildkite_pauses (agent_name) WHERE ended_at IS NULL;
CREATE INDEX buildkite_pauses_by_runner ON buildkite_pauses (runner_id, paused_at);
CREATE INDEX buildkite_pauses_ended ON buildkite_pauses (ended_at) WHERE ended_at IS NOT NULL;

-- The watcher's notes on each bound agent name: when it last listed it, what an observing
-- pool would have paused, a pause of somebody else's it left alone, and its failed calls
-- (shown on the runner, and retried after a back-off).
CREATE TABLE buildkite_agents (
    agent_name    TEXT PRIMARY KEY,
    runner_id     TEXT NOT NULL,
    checked_at    INTEGER,
    observed_code TEXT,
    left_alone    TEXT,
    failures      INTEGER NOT NULL DEFAULT 0,
    error         TEXT,
    error_at      INTEGER,
    next_try_at   INTEGER
);
CREATE INDEX buildkite_agents_by_runner ON buildkite_agents (runner_id);

-- The watcher's turn: one replica at a time pauses and resumes.
INSERT INTO maintenance (task) VALUES ('buildkite');

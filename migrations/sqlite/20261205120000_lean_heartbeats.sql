-- A heartbeat writes its runner's row and, in the common case, nothing else: the row keeps
-- the runner's recent jtis (replay state; older ones spill into seen_jtis only for a runner
-- that sends more than the row holds, until jtis_spilled_until), when the history was last
-- sampled, and the run of refusals the runner is in. The history keeps changes and one
-- sample per interval; the refusal ring keeps one entry per run of one code, with its count.
ALTER TABLE runners ADD COLUMN recent_jtis TEXT NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN jtis_spilled_until INTEGER;
ALTER TABLE runners ADD COLUMN history_sampled_at INTEGER;
ALTER TABLE runners ADD COLUMN refusal_code TEXT;
ALTER TABLE runners ADD COLUMN refusal_detail TEXT;
ALTER TABLE runners ADD COLUMN refusal_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN refusal_first_at INTEGER;
ALTER TABLE runners ADD COLUMN refusal_last_at INTEGER;
ALTER TABLE runners ADD COLUMN refusal_synced_at INTEGER;
ALTER TABLE refusals ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
ALTER TABLE refusals ADD COLUMN last_at INTEGER;

-- The jtis remembered before this version are in seen_jtis, as they were sent: ask it too
-- until the last of them expires.
UPDATE runners SET jtis_spilled_until =
    (SELECT MAX(expires_at) FROM seen_jtis WHERE seen_jtis.runner_id = runners.id);

-- The spill table is this process's durable record of spilled jtis, looked up in memory
-- (sql/replay.rs): appended and purged by expiry, with no index on the random key, whose
-- inserts and purges each cost a random page.
CREATE TABLE seen_jtis_log (
    runner_id  TEXT NOT NULL,
    jti        TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
INSERT INTO seen_jtis_log (runner_id, jti, expires_at)
    SELECT runner_id, jti, expires_at FROM seen_jtis ORDER BY expires_at;
DROP TABLE seen_jtis;
ALTER TABLE seen_jtis_log RENAME TO seen_jtis;
CREATE INDEX seen_jtis_by_expiry ON seen_jtis (expires_at);

-- A heartbeat writes its runner's row and, in the common case, nothing else: the row keeps
-- the runner's recent jtis (replay state; older ones spill into seen_jtis only for a runner
-- that sends more than the row holds, until jtis_spilled_until), when the history was last
-- sampled, and the run of refusals the runner is in. The history keeps changes and one
-- sample per interval; the refusal ring keeps one entry per run of one code, with its count.
ALTER TABLE runners ADD COLUMN recent_jtis TEXT NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN jtis_spilled_until BIGINT;
ALTER TABLE runners ADD COLUMN history_sampled_at BIGINT;
ALTER TABLE runners ADD COLUMN refusal_code TEXT;
ALTER TABLE runners ADD COLUMN refusal_detail TEXT;
ALTER TABLE runners ADD COLUMN refusal_count BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN refusal_first_at BIGINT;
ALTER TABLE runners ADD COLUMN refusal_last_at BIGINT;
ALTER TABLE runners ADD COLUMN refusal_synced_at BIGINT;
ALTER TABLE refusals ADD COLUMN count BIGINT NOT NULL DEFAULT 1;
ALTER TABLE refusals ADD COLUMN last_at BIGINT;

-- The jtis remembered before this version are in seen_jtis, as they were sent: ask it too
-- until the last of them expires.
UPDATE runners SET jtis_spilled_until =
    (SELECT MAX(expires_at) FROM seen_jtis WHERE seen_jtis.runner_id = runners.id);

-- Every heartbeat updates its runner's row in place; room on each page lets PostgreSQL keep
-- the new version beside the old (a HOT update) instead of adding index entries for it.
ALTER TABLE runners SET (fillfactor = 50);

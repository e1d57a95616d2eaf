-- A runner's last attestation that its own key signed and the gate refused under rules 3-4
-- (its clock, most often): kept on its row, so that a runner that turns stale says why.
ALTER TABLE runners ADD COLUMN rejected_at INTEGER;
ALTER TABLE runners ADD COLUMN rejected_code TEXT;
ALTER TABLE runners ADD COLUMN rejected_detail TEXT;

-- A job its runner abandoned is not handed back to that runner until held_until (any other
-- runner may take it at once).
ALTER TABLE jobs ADD COLUMN held_from TEXT;
ALTER TABLE jobs ADD COLUMN held_until INTEGER;

-- Each pool's recent past, for the page's timelines: one sample a minute, kept a day.
CREATE TABLE pool_samples (
    pool      TEXT NOT NULL,
    at        INTEGER NOT NULL,
    counts    TEXT NOT NULL,
    refusals  INTEGER NOT NULL,
    live      INTEGER NOT NULL,
    drifted   INTEGER NOT NULL,
    PRIMARY KEY (pool, at)
);
CREATE INDEX pool_samples_by_time ON pool_samples (at);
INSERT INTO maintenance (task) VALUES ('sample');

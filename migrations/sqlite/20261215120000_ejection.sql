-- Outlier ejection (PROTOCOL.md, "Ejection"): a pool's policy as JSON
-- {consecutive_failures, base_s, max_share}, NULL for the defaults.
ALTER TABLE pools ADD COLUMN ejection TEXT;

-- What is kept of a runner for ejection: its infrastructure failures in a row (by reason, as
-- JSON), its ejections so far and when the latest ended (decay counts from there), the
-- ejection in force (NULL ejected_until: none), and the ejection the rule called for and did
-- not make (would_eject_*).
ALTER TABLE runners ADD COLUMN eject_streak TEXT;
ALTER TABLE runners ADD COLUMN ejections INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN ejection_last_until INTEGER;
ALTER TABLE runners ADD COLUMN ejected_at INTEGER;
ALTER TABLE runners ADD COLUMN ejected_until INTEGER;
ALTER TABLE runners ADD COLUMN ejected_failures TEXT;
ALTER TABLE runners ADD COLUMN ejected_nth INTEGER;
ALTER TABLE runners ADD COLUMN would_eject_at INTEGER;
ALTER TABLE runners ADD COLUMN would_eject_why TEXT;
ALTER TABLE runners ADD COLUMN would_eject_until INTEGER;
ALTER TABLE runners ADD COLUMN would_eject_failures TEXT;

-- Job ends seen through the forge gate, so that a final update the runner repeats counts
-- once. Kept a day (retention).
CREATE TABLE job_ends (
    key       TEXT PRIMARY KEY,
    runner_id TEXT NOT NULL,
    at        INTEGER NOT NULL
);
CREATE INDEX job_ends_at ON job_ends (at);

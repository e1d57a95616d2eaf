-- A runner's last attestation that its own key signed and the gate refused under rules 3-4
-- (its clock, most often): kept on its row, so that a runner that turns stale says why.
ALTER TABLE runners ADD COLUMN rejected_at INTEGER;
ALTER TABLE runners ADD COLUMN rejected_code TEXT;
ALTER TABLE runners ADD COLUMN rejected_detail TEXT;

-- A job its runner abandoned is not handed back to that runner until held_until (any other
-- runner may take it at once).
ALTER TABLE jobs ADD COLUMN held_from TEXT;
ALTER TABLE jobs ADD COLUMN held_until INTEGER;

-- The filesystems a runner's latest probe measured (`probe.disk`), as JSON
-- [{path, role, free_bytes, total_bytes, free_inodes, total_inodes}]; NULL when none.
ALTER TABLE runners ADD COLUMN probe_disk TEXT;

-- A pool's warning line on those figures, as JSON {min_free_bytes, min_free_inodes_percent};
-- NULL when it warns of nothing.
ALTER TABLE pools ADD COLUMN disk_warning TEXT;

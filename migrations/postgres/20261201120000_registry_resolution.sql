-- Registry-backed pools: the resolver's record beside the last resolution's outcome.
-- resolution_failures counts consecutive failed resolutions since the last success;
-- resolved_digest / resolved_image_id are what image_ref last resolved to (the manifest or
-- index digest, and the service platform's config digest); next_resolve_at is when the
-- background resolver is next due; resolve_claimed_until is a replica's claim on a running
-- attempt, so that replicas never resolve the same pool at once.
ALTER TABLE pools ADD COLUMN resolution_failures BIGINT NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN resolved_digest TEXT;
ALTER TABLE pools ADD COLUMN resolved_image_id TEXT;
ALTER TABLE pools ADD COLUMN next_resolve_at BIGINT;
ALTER TABLE pools ADD COLUMN resolve_claimed_until BIGINT;

-- The claim orders the pool's queued jobs by (created_at, seq), an order only this index
-- serves. Ordered by seq alone, the primary key could serve it too, and PostgreSQL chose it
-- whenever its statistics said most jobs were queued (a deep queue, or one filled since the
-- last analyze): each claim then stepped over every finished job before the first queued one.
DROP INDEX jobs_queued;
CREATE INDEX jobs_queue_order ON jobs (pool, created_at, seq) WHERE state = 'queued';

-- The claim transaction of leasegate's PostgreSQL store, for pgbench: take the pool's oldest
-- queued job with FOR UPDATE SKIP LOCKED, record the lease, and refill the queue with one new
-- job, at the back of the queue, so that its depth stays constant for the whole run. Durable commits
-- (synchronous_commit=on), as the service runs them.
--
-- The pool and the runner are pgbench's variables (-D pool=… -D runner=…), which need
-- -M extended or -M prepared (the bench runs -M prepared): they are bound as parameters.
BEGIN;
WITH lease AS (SELECT gen_random_uuid()::text AS id, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now),
claimed AS (
    UPDATE jobs SET state = 'leased', lease_id = (SELECT id FROM lease), updated_at = (SELECT now FROM lease)
    WHERE seq = (SELECT seq FROM jobs WHERE pool = :pool AND state = 'queued' ORDER BY created_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED)
      AND state = 'queued'
    RETURNING id
)
INSERT INTO leases (id, job_id, runner_id, pool, token_hash, state, attempt, granted_at, expires_at)
SELECT lease.id, claimed.id, :runner, :pool, 'raw', 'leased', 1, lease.now, lease.now + 300000
FROM lease, claimed;
INSERT INTO jobs (id, pool, payload, state, max_attempts, created_at, updated_at)
SELECT gen_random_uuid()::text, :pool, '{}', 'queued', 3, now, now
FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now) AS t;
END;

-- pgbench's own pool, runner and a queue of 10,000 jobs, on a database leasegate migrated:
-- what bench/pgbench/claim.sql claims from and refills.
INSERT INTO pools (name, image_policy, image_source, expected_image_ids, previous_image_ids,
                   drift_grace_s, resolve_interval_s, created_at, updated_at)
VALUES ('pgbench', 'off', 'manual', '[]', '[]', 900, 300, 0, 0);
INSERT INTO runners (id, name, pool, labels, public_key_x, registered_at)
VALUES ('pgbench-runner', 'pgbench', 'pgbench', '{}', 'x', 0);
INSERT INTO jobs (id, pool, payload, state, max_attempts, created_at, updated_at)
SELECT gen_random_uuid()::text, 'pgbench', '{}', 'queued', 3, 0, 0 FROM generate_series(1, 10000);

-- Which leasegate runner took a forge's job, for the jobs whose end names only the job
-- (GitLab's `PUT /api/v4/jobs/{id}`): written when the gate relays the forge's `201` to the
-- runner's job request, read when the job's final update goes by. Kept as long as history.
CREATE TABLE forge_jobs (
    key       TEXT PRIMARY KEY,
    runner_id TEXT NOT NULL,
    at        BIGINT NOT NULL
);
CREATE INDEX forge_jobs_at ON forge_jobs (at);

-- A forge runner is bound by what the forge knows it by, and now more precisely: a GitLab
-- token and the system_id of the machine presenting it (one token may serve a fleet; '' is
-- the token alone, any machine), and a Forgejo/Gitea runner's uuid with the SHA-256 of its
-- token when known (only a fetch presenting that token is judged by the binding).
ALTER TABLE forge_runners ADD COLUMN system_id TEXT NOT NULL DEFAULT '';
ALTER TABLE forge_runners ADD COLUMN token_sha256 TEXT;
ALTER TABLE forge_runners DROP CONSTRAINT forge_runners_pkey;
ALTER TABLE forge_runners ADD PRIMARY KEY (kind, identity, system_id);

-- The forge runners a runner's agent last claimed that another runner holds (a JSON array of
-- the claim's objects; NULL when none): shown on the runner as forge_runner_taken.
ALTER TABLE runners ADD COLUMN forge_runners_taken TEXT;

-- A runner's live leases, newest first, for the runner views' current lease: the whole lease
-- history of a busy runner is never scanned for it.
CREATE INDEX leases_live_by_runner ON leases (runner_id, granted_at) WHERE state IN ('leased', 'running');

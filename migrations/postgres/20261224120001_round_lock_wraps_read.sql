-- `leasegate_lock_round`, which this version no longer calls (it reads with
-- `leasegate_read_round`), kept for replicas of the previous version during a rolling upgrade
-- as `leasegate_read_round` locked, without the rows' versions: one read of the rows in the
-- schema, not two copies of it.

CREATE OR REPLACE FUNCTION leasegate_lock_round(
    ids TEXT[], asked_runners TEXT[], asked_keys TEXT[], asked_at BIGINT[]
) RETURNS TABLE (
    id TEXT, attestation_seq BIGINT, quarantined_at BIGINT, ejected_until BIGINT,
    revoked_at BIGINT, cordoned BIGINT, recent_jtis TEXT, jtis_spilled_until BIGINT,
    history_sampled_at BIGINT, last_status TEXT, probe_ok BIGINT, probe_error TEXT,
    probe_runtime_version TEXT, image_id TEXT, image_digest TEXT, refusal_seq BIGINT,
    refusal_code TEXT, refusal_detail TEXT, refusal_count BIGINT, refusal_first_at BIGINT,
    refusal_last_at BIGINT, refusal_synced_at BIGINT, spilled_hits TEXT
) LANGUAGE sql VOLATILE AS $$
    SELECT r.id, r.attestation_seq, r.quarantined_at, r.ejected_until, r.revoked_at,
        r.cordoned, r.recent_jtis, r.jtis_spilled_until, r.history_sampled_at, r.last_status,
        r.probe_ok, r.probe_error, r.probe_runtime_version, r.image_id, r.image_digest,
        r.refusal_seq, r.refusal_code, r.refusal_detail, r.refusal_count, r.refusal_first_at,
        r.refusal_last_at, r.refusal_synced_at, r.spilled_hits
    FROM leasegate_read_round(true, ids, asked_runners, asked_keys, asked_at) r
$$;

-- A write round's first step in one round trip: lock the round's runners (in id order, so that
-- no two rounds wait on each other in a cycle), then read their rows and which of the asked
-- spilled jtis `seen_jtis` holds. Two statements, not one: in READ COMMITTED each statement of
-- a VOLATILE function takes a fresh snapshot, so the read after the lock sees what the round it
-- waited for committed (its spills too), which a lookup in the lock's own statement would miss.
--
-- Asked: each attestation's (runner, key, received_at), a key being a jti's key or the jti
-- itself (as remembered before keys were); one is looked up only while its runner's row says
-- its spills may hold it. `spilled_hits`: the 1-based positions of the asked keys found.
CREATE FUNCTION leasegate_lock_round(
    ids TEXT[], asked_runners TEXT[], asked_keys TEXT[], asked_at BIGINT[]
) RETURNS TABLE (
    id TEXT, attestation_seq BIGINT, quarantined_at BIGINT, ejected_until BIGINT,
    revoked_at BIGINT, cordoned BIGINT, recent_jtis TEXT, jtis_spilled_until BIGINT,
    history_sampled_at BIGINT, last_status TEXT, probe_ok BIGINT, probe_error TEXT,
    probe_runtime_version TEXT, image_id TEXT, image_digest TEXT, refusal_seq BIGINT,
    refusal_code TEXT, refusal_detail TEXT, refusal_count BIGINT, refusal_first_at BIGINT,
    refusal_last_at BIGINT, refusal_synced_at BIGINT, spilled_hits TEXT
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM runners r WHERE r.id = ANY(ids) ORDER BY r.id FOR UPDATE;
    RETURN QUERY
    SELECT r.id, r.attestation_seq, r.quarantined_at, r.ejected_until, r.revoked_at,
        r.cordoned, r.recent_jtis, r.jtis_spilled_until, r.history_sampled_at, r.last_status,
        r.probe_ok, r.probe_error, r.probe_runtime_version, r.image_id, r.image_digest,
        r.refusal_seq, r.refusal_code, r.refusal_detail, r.refusal_count, r.refusal_first_at,
        r.refusal_last_at, r.refusal_synced_at,
        (SELECT string_agg(a.n::TEXT, ' ')
         FROM unnest(asked_runners, asked_keys, asked_at) WITH ORDINALITY
             AS a(runner_id, jti, at, n)
         WHERE a.runner_id = r.id AND a.at <= r.jtis_spilled_until
           AND EXISTS (SELECT 1 FROM seen_jtis s
                       WHERE s.runner_id = a.runner_id AND s.jti = a.jti))
    FROM runners r WHERE r.id = ANY(ids) ORDER BY r.id;
END
$$;

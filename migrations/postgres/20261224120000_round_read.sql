-- A write round's read of its runners' rows and of the asked spilled jtis, as
-- `leasegate_lock_round` reads them, locked or not (`lock`), and each row's version: its
-- `xmin`, which every update of the row changes.
--
-- Locked, for a round written in a transaction under its rows' locks (`store/sql/round.rs`,
-- `write`). Not locked, for a round written without one (`write_unlocked`): its one write
-- changes each runner's row only where the version is still the one read here, and fails
-- whole when any is not (`leasegate_all_rows_written`), so that nothing another writer did in
-- between (a jti accepted at another replica, a revocation) is lost or overlooked.
--
-- `leasegate_lock_round` stays for replicas of the previous version during a rolling upgrade;
-- this version no longer calls it.
CREATE FUNCTION leasegate_read_round(
    lock BOOLEAN, ids TEXT[], asked_runners TEXT[], asked_keys TEXT[], asked_at BIGINT[]
) RETURNS TABLE (
    id TEXT, attestation_seq BIGINT, quarantined_at BIGINT, ejected_until BIGINT,
    revoked_at BIGINT, cordoned BIGINT, recent_jtis TEXT, jtis_spilled_until BIGINT,
    history_sampled_at BIGINT, last_status TEXT, probe_ok BIGINT, probe_error TEXT,
    probe_runtime_version TEXT, image_id TEXT, image_digest TEXT, refusal_seq BIGINT,
    refusal_code TEXT, refusal_detail TEXT, refusal_count BIGINT, refusal_first_at BIGINT,
    refusal_last_at BIGINT, refusal_synced_at BIGINT, spilled_hits TEXT, row_version TEXT
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    IF lock THEN
        PERFORM 1 FROM runners r WHERE r.id = ANY(ids) ORDER BY r.id FOR UPDATE;
    END IF;
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
                       WHERE s.runner_id = a.runner_id AND s.jti = a.jti)),
        r.xmin::TEXT
    FROM runners r WHERE r.id = ANY(ids) ORDER BY r.id;
END
$$;

-- A write's check that each of its rows wrote one (`engine::RowsWrite::every_row`): called
-- with how many it wrote and how many it had, it fails the whole statement as a serialization
-- failure (40001, which the store takes for a conflict) when they differ, so that nothing of
-- the statement is kept.
CREATE FUNCTION leasegate_all_rows_written(written BIGINT, expected BIGINT)
RETURNS BIGINT LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF written <> expected THEN
        RAISE EXCEPTION 'a row changed since it was read: % of % written', written, expected
            USING ERRCODE = '40001';
    END IF;
    RETURN written;
END
$$;

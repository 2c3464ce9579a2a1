-- runfleet schema v10: rq's per-run result_ttl / failure_ttl are enforced by retention
-- (store/sql/retention.sql, the expiry scan of prune_batch).

-- A settled run's own expiry (rq's result_ttl / failure_ttl, kept in its state by
-- broker/admission.py): settlement time + the TTL of its status. NULL when the run has
-- none (the fleet-wide RUNFLEET_RETENTION applies), the largest bigint when the TTL is
-- negative (rq's -1: kept forever). Only a JSON number counts and it is clamped to a
-- century, so no state a run can carry makes this index expression fail a write.
CREATE FUNCTION runfleet.run_expires_at_ms(status text, state jsonb, settled_at_ms bigint)
    RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN ttl IS NULL THEN NULL
               WHEN ttl < 0 THEN 9223372036854775807
               ELSE settled_at_ms + (least(ttl, 3153600000) * 1000)::bigint END
     FROM (SELECT CASE WHEN jsonb_typeof(t) = 'number' THEN (t #>> '{}')::numeric END AS ttl
             FROM (SELECT CASE status WHEN 'completed' THEN state->'result_ttl'
                                      WHEN 'failed' THEN state->'failure_ttl' END AS t) s) v $$;

-- The TTL pass of retention walks runs by their own expiry; only runs that carry a TTL
-- are in this index, so with none it is empty and the pass is one empty index probe.
CREATE INDEX runs_expiry_idx
    ON runfleet.runs (runfleet.run_expires_at_ms(status, state, updated_at_ms), id)
    WHERE runfleet.run_expires_at_ms(status, state, updated_at_ms) IS NOT NULL;
